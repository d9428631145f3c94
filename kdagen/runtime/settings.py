# SPDX-License-Identifier: Apache-2.0
"""The runtime's environment overrides, read once when a plan is made (never on the run path).

Production callers pass `pipeline=` and `groups=` to the plan; these variables let tools and A/B runs set
the same choices without changing the caller, and are documented as for experiments (docs/reference.md,
"Environment variables"). A malformed value is an error naming the variable. Variables of earlier releases that these
replace are refused with their replacement, so an experiment never silently measures the default.
KDAGEN_TARGET (device.target_of) and KDAGEN_DEBUG (device.debug_enabled) are read at plan time too; the
build cache's variables are cache.py's and jit_hip.py's.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from .group_scan import MAX_FORCED_GROUPS

PIPELINE_ENV = "KDAGEN_PIPELINE"
GROUPS_ENV = "KDAGEN_TRITON_GROUPS"
JIT_LAUNCH_ENV = "KDAGEN_TRITON_JIT_LAUNCH"
# Retired switches -> what replaces them.
RETIRED = {
    "KDAGEN_FUSED_INTRA": f"pipeline='hip_intra+hip_walk' (or {PIPELINE_ENV}=hip_intra+hip_walk); "
                          "pipeline='triton_intra+triton_walk' for 'never'",
    "KDAGEN_FUSED_WALK": f"pipeline='hip_intra+triton_walk' (or {PIPELINE_ENV}=hip_intra+triton_walk)",
    "KDAGEN_TRITON_DESIGN": f"pipeline='triton_intra+triton_walk' or 'triton_pair+triton_walk' (or {PIPELINE_ENV})",
    "KDAGEN_FUSED_GROUPS": f"groups= (or {GROUPS_ENV}); the fused path's own recurrence is gone",
}


@dataclass(frozen=True)
class Settings:
    pipeline: str | None  # KDAGEN_PIPELINE: "auto" / None or "<chunk>+<walk>" (pipeline.parse_pipeline checks it)
    groups: int | None  # KDAGEN_TRITON_GROUPS: a forced group count; None = the plan's choice
    jit_launch: bool  # KDAGEN_TRITON_JIT_LAUNCH=1: every Triton launch through JITFunction.run


def _flag(name: str) -> bool:
    raw = os.environ.get(name, "").strip()
    if raw not in ("", "0", "1"):
        raise ValueError(f"{name}={raw!r}: expected 0 or 1 (or unset)")
    return raw == "1"


def parse_groups(raw: str, name: str) -> int | None:
    raw = raw.strip()
    if not raw or raw == "auto":
        return None
    if not raw.isdigit() or not 1 <= int(raw) <= MAX_FORCED_GROUPS:
        raise ValueError(f"{name}={raw!r}: expected an integer in 1..{MAX_FORCED_GROUPS} (1 = the plain walk) "
                         "or 'auto'")
    return int(raw)


def read_settings() -> Settings:
    """The overrides in effect now; a plan reads them once, when it is made."""
    for name, instead in RETIRED.items():
        if os.environ.get(name, "").strip():
            raise ValueError(f"{name} is no longer read; use {instead}. Unset {name}")
    pipeline = os.environ.get(PIPELINE_ENV, "").strip() or None
    return Settings(pipeline=pipeline, groups=parse_groups(os.environ.get(GROUPS_ENV, ""), GROUPS_ENV),
                    jit_launch=_flag(JIT_LAUNCH_ENV))
