# SPDX-License-Identifier: Apache-2.0
"""Which kdagen target the current device is, and the env switches (group_scan.py and cache.py read their own)."""

from __future__ import annotations

import functools
import os

import torch

INTERPRETER = "interpreter"

# Compile options every Triton launch (and the AOT compiles) passes. FP fusion (FMA contraction) is the
# default on every supported release, given explicitly: the kernels' numerics and tuning were measured
# with it, triton 3.9 warns once per process when it is left unset, and 3.10 turns it off by default.
TRITON_COMPILE_OPTIONS = {"enable_fp_fusion": True}


def interpreting() -> bool:
    """True when Triton runs kernels in its CPU interpreter (TRITON_INTERPRET=1 set before import)."""
    return os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")


def debug_enabled() -> bool:
    """KDAGEN_DEBUG=1: run the data-dependent argument checks on device tensors too (they sync)."""
    return os.environ.get("KDAGEN_DEBUG", "0") not in ("", "0")


@functools.lru_cache(maxsize=None)
def _device_target(device_type: str, index: int | None) -> str:
    if device_type == "cpu":
        return INTERPRETER
    props = torch.cuda.get_device_properties(index if index is not None else torch.cuda.current_device())
    if getattr(torch.version, "hip", None):
        # gcnArchName looks like "gfx942:sramecc+:xnack-"; the features do not change the code we emit.
        return str(getattr(props, "gcnArchName", "unknown")).split(":")[0]
    return f"sm_{props.major}{props.minor}"


def target_of(device: torch.device) -> str:
    """The kdagen target name for `device`: gfx942, gfx950, sm_90, ... or "interpreter" on the CPU.

    KDAGEN_TARGET overrides the detection (e.g. to run the sm_90 tuning on another NVIDIA part).
    """
    forced = os.environ.get("KDAGEN_TARGET")
    if forced:
        return forced
    return _device_target(device.type, device.index)
