# SPDX-License-Identifier: Apache-2.0
"""Whether a call takes the fused HIP path, and its built library (or the reason it cannot be built).

Note [Fused path choice]
    The fused path runs only when use_fused_chunk is asked for and every precondition holds: vLLM's op's
    (L2 norm in kernel, cu_seqlens, lower_bound and g_bias given) and a registered hip variant for
    (K, V, dtype, chunk 64) whose targets include this device's, outside the interpreter (`decide_fused`).
    Otherwise the Triton path runs. The library is built on first use (`fused_library`); without its
    compiler the call runs the Triton path with one warning per variant and target. A compile error
    always propagates.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass

import torch

from . import jit_hip
from .device import interpreting, target_of
from .registry import DTYPE_NAMES, VariantEntry
from .validate import OP

FUSED_CHUNK = 64  # the chunk size of the fused kernels (and of vLLM's metadata)

_fused_libs: dict[tuple[str, str], jit_hip.HipLibrary] = {}
_no_compiler: dict[tuple[str, str], str] = {}  # (variant, target) -> CompilerNotFoundError message
_warned_no_compiler: set[tuple[str, str]] = set()


@dataclass(frozen=True)
class FusedDecision:
    """Which path a call takes: `entry` is the hip variant to run, or None for the Triton path."""

    entry: VariantEntry | None
    target: str | None
    why_not: tuple[str, ...]  # the preconditions that failed; empty when entry is set


def fused_variant(variants: tuple[VariantEntry, ...], head_dim_k: int, head_dim_v: int, dtype: torch.dtype,
                  chunk_size: int, target: str) -> VariantEntry | None:
    """The registered hip variant for (K, V, dtype, chunk_size) that declares `target`, if any."""
    dname = DTYPE_NAMES.get(dtype)
    for e in variants:
        if (e.backend == "hip" and e.head_dim_k == head_dim_k and e.head_dim_v == head_dim_v
                and e.dtype == dname and e.chunk_size == chunk_size and target in e.targets):
            return e
    return None


def fused_target(device: torch.device) -> str | None:
    """The target the fused path would build for on `device`; None where it cannot run (CPU, interpreter)."""
    if interpreting() or device.type != "cuda":
        return None
    return target_of(device)


def decide_fused(variants: tuple[VariantEntry, ...], *, use_fused_chunk: bool, use_qk_l2norm_in_kernel: bool,
                 cu_seqlens_given: bool, lower_bound_given: bool, g_bias_given: bool, head_dim_k: int,
                 head_dim_v: int, dtype: torch.dtype, target: str | None) -> FusedDecision:
    """Pure: whether the fused path serves a call, from its arguments, the registry and the device target
    (None = no device the fused path runs on: CPU tensors, the Triton interpreter)."""
    if not use_fused_chunk:
        return FusedDecision(None, target, ("use_fused_chunk is False",))
    why = [what for what, ok in (("use_qk_l2norm_in_kernel is False", use_qk_l2norm_in_kernel),
                                 ("no cu_seqlens", cu_seqlens_given), ("no lower_bound", lower_bound_given),
                                 ("no g_bias", g_bias_given)) if not ok]
    entry = None
    if target is None:
        why.append("no GPU target (CPU tensors or the Triton interpreter)")
    else:
        entry = fused_variant(variants, head_dim_k, head_dim_v, dtype, FUSED_CHUNK, target)
        if entry is None:
            why.append(f"no generated hip variant for K={head_dim_k}, V={head_dim_v}, "
                       f"dtype={DTYPE_NAMES.get(dtype, dtype)}, chunk {FUSED_CHUNK} on {target}")
    return FusedDecision(None if why else entry, target, tuple(why))


def can_use_fused(variants: tuple[VariantEntry, ...], head_dim_k: int, head_dim_v: int, dtype: torch.dtype,
                  chunk_size: int, device: torch.device | None = None) -> bool:
    """Whether the fused path serves (K, V, dtype, chunk_size) on `device` (default: the current GPU):
    a registered hip variant for this device's target and its compiler present. No build happens here."""
    if device is None:
        if interpreting() or not torch.cuda.is_available():
            return False
        device = torch.device("cuda", torch.cuda.current_device())
    target = fused_target(device)
    if target is None:
        return False
    entry = fused_variant(variants, head_dim_k, head_dim_v, dtype, chunk_size, target)
    return entry is not None and _toolchain_present(entry, target)


def _toolchain_present(entry: VariantEntry, target: str) -> bool:
    if (entry.name, target) in _fused_libs:
        return True
    if (entry.name, target) in _no_compiler:
        return False
    try:
        jit_hip.find_compiler(target)
    except jit_hip.CompilerNotFoundError:
        return False
    return _sources_installed(entry, target)


def _sources_installed(entry: VariantEntry, target: str) -> bool:
    """The variant's generated .hip source and its include/ folder are installed (a wheel without them falls
    back to Triton: can_use_fused answers as the call would run)."""
    import importlib
    from pathlib import Path

    from .fused_path import source_path

    package = Path(importlib.import_module(entry.module).__file__).parent
    src = source_path(package, entry.head_dim_k, entry.head_dim_v, target, entry.dtype)
    return src.is_file() and (src.parent / "include").is_dir()


def built_library(entry: VariantEntry, target: str) -> tuple[jit_hip.HipLibrary | None, str | None]:
    """The built library, or None and why not (its compiler or installed source is missing); no warning
    (explicit pipelines raise instead). jit_hip.HipCompileError propagates."""
    key = (entry.name, target)
    lib = _fused_libs.get(key)
    if lib is None and key not in _no_compiler:
        try:
            lib = _fused_libs[key] = entry.load(target)  # type: ignore[assignment]
        except jit_hip.ToolchainUnavailableError as exc:  # no compiler, or no installed source
            _no_compiler[key] = str(exc)
    if lib is not None:
        return lib, None
    return None, f"the fused variant {entry.name} cannot be built for {target}: {_no_compiler[key]}"


def fused_library(entry: VariantEntry, target: str) -> jit_hip.HipLibrary | None:
    """The built fused library, or None (after one warning) when its compiler is missing: the call then
    runs the Triton path, which computes the same results and writes checkpoints too.

    jit_hip.HipCompileError (a broken generated source or toolchain) propagates.
    """
    key = (entry.name, target)
    lib, _ = built_library(entry, target)
    if lib is not None:
        return lib
    if key not in _warned_no_compiler:
        _warned_no_compiler.add(key)
        warnings.warn(
            f"{OP}: use_fused_chunk=True, but the fused variant {entry.name} cannot be built for {target}: "
            f"{_no_compiler[key]}. Running the Triton path instead (same results; this warning is shown once "
            "per process).", RuntimeWarning, stacklevel=5)
    return None
