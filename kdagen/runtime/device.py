# SPDX-License-Identifier: Apache-2.0
"""Which kdagen target the current device is, the interpreter flag and KDAGEN_DEBUG (settings.py reads the plan's
overrides; cache.py and jit_hip.py the build cache's)."""

from __future__ import annotations

import functools
import os

import torch

INTERPRETER = "interpreter"

# Compile options every Triton launch (and the AOT compiles) passes. FP fusion (FMA contraction) is the
# default on every supported release, given explicitly: the kernels' numerics and tuning were measured
# with it, triton 3.9 warns once per process when it is left unset, and 3.10 turns it off by default.
TRITON_COMPILE_OPTIONS = {"enable_fp_fusion": True}


def _interpret_env() -> bool:
    return os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")


# Triton decides interpreted or compiled when a kernel module is imported; kdagen reads the flag once, here,
# so that a flag flipped later (a notebook) is caught by check_interpreter_mode instead of failing inside Triton.
_INTERPRETING = _interpret_env()


def interpreting() -> bool:
    """True when Triton runs kernels in its CPU interpreter (TRITON_INTERPRET=1 set before import)."""
    return _INTERPRETING


def check_interpreter_mode(device) -> None:
    """Tensors and the interpreter flag agree, and the flag has not changed since kdagen was imported."""
    now = _interpret_env()
    if now != _INTERPRETING:
        raise ValueError(
            f"chunk_kda_prefill: TRITON_INTERPRET={os.environ.get('TRITON_INTERPRET', '')!r} was "
            f"{'set' if now else 'unset'} after kdagen_kernels was imported (it was "
            f"{'on' if _INTERPRETING else 'off'} then), and Triton reads it at import. Set it before "
            "importing kdagen_kernels (first line of the notebook, or in the shell), then restart the process")
    if device.type == "cpu" and not _INTERPRETING:
        raise ValueError("chunk_kda_prefill: the tensors are on the CPU; run on a GPU, or set TRITON_INTERPRET=1 "
                         "before importing kdagen_kernels to use Triton's CPU interpreter")
    if device.type != "cpu" and _INTERPRETING:
        raise ValueError(f"chunk_kda_prefill: TRITON_INTERPRET=1 is set but the tensors are on {device}; unset it "
                         "to run the compiled kernels")


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
