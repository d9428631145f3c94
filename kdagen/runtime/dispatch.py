# SPDX-License-Identifier: Apache-2.0
"""chunk_kda_prefill: vLLM's Kimi-K3 ROCm prefill contract over the generated variants.

The generated package's `chunk_kda_prefill` has the seed's exact signature and forwards here with
its registry. See Note [Dispatch order] below.
"""

from __future__ import annotations

import logging
import warnings
from dataclasses import dataclass
from types import ModuleType

import torch

from . import fused_path, interpreter_compat, jit_hip, triton_path
from .device import interpreting, target_of
from .metadata import prepare_chunk_indices, prepare_chunk_offsets
from .registry import DTYPE_NAMES, VariantEntry, select_variant
from .validate import OP, Problem, check_inputs, check_state_cache, may_overlap
from . import debug_checks  # hardening: data-dependent checks
from .validate import check_flags, check_optional_args  # hardening: flags, optional args, aliasing

# Before any kernel runs: the interpreters of triton 3.6 and 3.9 each fail on one of our kernels without it.
interpreter_compat.apply()

log = logging.getLogger("kdagen")

# Note [Dispatch order]
# 1. scale defaults to K ** -0.5.
# 2. The fused path runs only when use_fused_chunk is asked for and every precondition holds
#    (the seed's: L2 norm in kernel, cu_seqlens, lower_bound and g_bias given; and a registered hip
#    variant for (K, V, dtype, chunk 64) whose targets include this device's, outside the interpreter);
#    see `decide_fused`. Otherwise the Triton path runs.
# 3. The seed's contract errors come first, in the seed's order, then the shape/dtype checks.
# 4. Nothing is written to caller-owned memory before every check has passed.
# 5. The fused library is built (first use) after the checks. Without its compiler the call runs the
#    Triton path with one warning per variant and target, unless it asked for checkpoints, which only
#    the fused path writes: then it is an error. A compile error always propagates.

FUSED_CHUNK = fused_path.CHUNK  # the chunk size of the fused kernels (and of vLLM's metadata)

_loaded: dict[str, ModuleType] = {}
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
    return entry is not None and _compiler_present(entry, target)


def _compiler_present(entry: VariantEntry, target: str) -> bool:
    if (entry.name, target) in _fused_libs:
        return True
    if (entry.name, target) in _no_compiler:
        return False
    try:
        jit_hip.find_compiler(target)
    except jit_hip.CompilerNotFoundError:
        return False
    return True


def _fused_library(entry: VariantEntry, target: str, *, checkpoints: bool) -> jit_hip.HipLibrary | None:
    """The built fused library, or None (after one warning) when its compiler is missing.

    A call that asked for checkpoints cannot fall back: only the fused path writes them.
    jit_hip.HipCompileError (a broken generated source or toolchain) propagates.
    """
    key = (entry.name, target)
    lib = _fused_libs.get(key)
    if lib is not None:
        return lib
    if key not in _no_compiler:
        try:
            lib = _fused_libs[key] = entry.load(target)
            return lib
        except jit_hip.CompilerNotFoundError as exc:
            _no_compiler[key] = str(exc)
    missing = _no_compiler[key]
    if checkpoints:
        raise jit_hip.CompilerNotFoundError(
            f"{OP}: checkpoint_offsets asks for a checkpoint export, which only the fused path writes, and "
            f"the fused variant {entry.name} cannot be built for {target}: {missing}. Install the compiler, "
            "or call without checkpoint_state/checkpoint_offsets to run the Triton path")
    if key not in _warned_no_compiler:
        _warned_no_compiler.add(key)
        warnings.warn(
            f"{OP}: use_fused_chunk=True, but the fused variant {entry.name} cannot be built for {target}: "
            f"{missing}. Running the Triton path instead (same results; this warning is shown once per "
            "process).", RuntimeWarning, stacklevel=4)
    return None


def _module(entry: VariantEntry, target: str) -> ModuleType:
    key = f"{entry.name}@{target}"
    mod = _loaded.get(key)
    if mod is None:
        log.info("kdagen: first use of %s on %s; Triton compiles its kernels on this call and caches them",
                 entry.name, target)
        mod = _loaded[key] = entry.load()
    return mod


def _packed_metadata(p: Problem, chunk: int, device: torch.device, cu_seqlens, chunk_indices, chunk_offsets):
    """cu_seqlens / chunk_indices / chunk_offsets for the packed [1, B*T] view of the batch."""
    if cu_seqlens is None:
        # B equal sequences of T tokens: everything follows from the shapes, so no sync is needed.
        nt = -(-p.T // chunk)
        cu_seqlens = (torch.arange(p.B + 1, dtype=torch.int32) * p.T).to(device)
        seq = torch.arange(p.B, dtype=torch.int32).repeat_interleave(nt)
        idx = torch.arange(nt, dtype=torch.int32).repeat(p.B)
        chunk_indices = torch.stack([seq, idx], 1).to(device)
        chunk_offsets = (torch.arange(p.B + 1, dtype=torch.int64) * nt).to(device)
        return cu_seqlens, chunk_indices, chunk_offsets
    # Host-built metadata syncs on cu_seqlens; callers that capture graphs pass both tensors.
    if chunk_indices is None:
        chunk_indices = prepare_chunk_indices(cu_seqlens, chunk)
    if chunk_offsets is None:
        chunk_offsets = prepare_chunk_offsets(cu_seqlens, chunk)
    return cu_seqlens, chunk_indices, chunk_offsets


def _packed(t: torch.Tensor, B: int, T: int) -> torch.Tensor:
    return t if B == 1 else t.reshape(1, B * T, *t.shape[2:])


def chunk_kda_prefill(variants: tuple[VariantEntry, ...], q, k, v, raw_g, raw_beta, A_log, g_bias=None,
                      scale=None, initial_state=None, output_final_state=False, lower_bound=None,
                      use_qk_l2norm_in_kernel=False, cu_seqlens=None, chunk_indices=None, chunk_offsets=None,
                      use_fused_chunk=False, out=None, checkpoint_state=None, checkpoint_offsets=None,
                      checkpoint_state_indices=None, state_cache=None, state_indices=None,
                      has_initial_state=None) -> tuple[torch.Tensor, torch.Tensor | None]:
    if not isinstance(k, torch.Tensor) or k.dim() < 1:
        raise TypeError(f"{OP}: k must be a [B, T, H, K] torch.Tensor, got {type(k).__name__}")
    check_flags(output_final_state, use_qk_l2norm_in_kernel, use_fused_chunk)  # hardening
    if scale is None:
        scale = k.shape[-1] ** -0.5

    decision = decide_fused(
        variants, use_fused_chunk=use_fused_chunk, use_qk_l2norm_in_kernel=use_qk_l2norm_in_kernel,
        cu_seqlens_given=cu_seqlens is not None, lower_bound_given=lower_bound is not None,
        g_bias_given=g_bias is not None, head_dim_k=k.shape[-1], head_dim_v=_last_dim(v), dtype=k.dtype,
        target=fused_target(k.device) if use_fused_chunk else None)
    if use_fused_chunk and decision.entry is None:
        log.debug("kdagen: use_fused_chunk=True runs the Triton path: %s", "; ".join(decision.why_not))
    if checkpoint_offsets is not None and decision.entry is None:
        raise NotImplementedError(
            f"{OP}: the prefill checkpoint export (checkpoint_offsets) needs the fused path, which did not "
            "run for this call (use_fused_chunk=True with use_qk_l2norm_in_kernel, cu_seqlens, lower_bound "
            "and g_bias, and a generated fused variant for this device); the Triton path cannot write "
            f"checkpoints. Here: {'; '.join(decision.why_not)}")
    if checkpoint_state is not None and checkpoint_offsets is None:
        raise ValueError(f"{OP}: checkpoint_state was given without checkpoint_offsets, so no snapshot "
                         "would be written; pass both or neither")
    if state_cache is not None:
        if initial_state is not None or output_final_state:
            raise ValueError(f"{OP}: state_cache replaces initial_state/output_final_state; pass "
                             "initial_state=None and output_final_state=False with a state_cache")
        if state_indices is None or has_initial_state is None:
            raise ValueError(f"{OP}: state_cache needs state_indices and has_initial_state")

    p = check_inputs(q, k, v, raw_g, raw_beta, A_log, g_bias, scale, lower_bound, cu_seqlens,
                     chunk_indices, chunk_offsets, initial_state, out)
    device = q.device
    if state_cache is not None:
        check_state_cache(p, state_cache, state_indices, has_initial_state, device)
    check_optional_args(p, device, out=out, state_cache=state_cache, state_indices=state_indices,  # hardening
                        has_initial_state=has_initial_state, checkpoint_state=checkpoint_state,
                        checkpoint_offsets=checkpoint_offsets, checkpoint_state_indices=checkpoint_state_indices)
    if device.type == "cpu" and not interpreting():
        raise ValueError(f"{OP}: the tensors are on the CPU; run on a GPU, or set TRITON_INTERPRET=1 "
                         "before importing kdagen_kernels to use Triton's CPU interpreter")
    if device.type != "cpu" and interpreting():
        raise ValueError(f"{OP}: TRITON_INTERPRET=1 is set but the tensors are on {device}; unset it to run "
                         "the compiled kernels")

    data = {"cu_seqlens": cu_seqlens, "chunk_indices": chunk_indices, "chunk_offsets": chunk_offsets,
            "state_cache": state_cache, "state_indices": state_indices, "checkpoint_state": checkpoint_state,
            "checkpoint_offsets": checkpoint_offsets, "checkpoint_state_indices": checkpoint_state_indices}
    checked_chunk = None
    if decision.entry is not None:
        assert decision.target is not None
        # hardening: value checks (CPU tensors always, device tensors with KDAGEN_DEBUG=1), still before
        # anything is written; then the build (first use), which may fall back to Triton.
        debug_checks.check_data(p, decision.entry.chunk_size, device, **data)
        checked_chunk = decision.entry.chunk_size
        lib = _fused_library(decision.entry, decision.target, checkpoints=checkpoint_offsets is not None)
        if lib is not None:
            return _run_fused(
                lib, p, q=q, k=k, v=v, raw_g=raw_g, raw_beta=raw_beta, A_log=A_log, g_bias=g_bias,
                scale=float(scale), lower_bound=lower_bound, cu_seqlens=cu_seqlens, chunk_indices=chunk_indices,
                chunk_offsets=chunk_offsets, initial_state=initial_state, output_final_state=output_final_state,
                out=out, checkpoint_state=checkpoint_state, checkpoint_offsets=checkpoint_offsets,
                checkpoint_state_indices=checkpoint_state_indices, state_cache=state_cache,
                state_indices=state_indices, has_initial_state=has_initial_state)

    target = target_of(device)
    entry = select_variant(variants, backend="triton", head_dim_k=p.K, head_dim_v=p.V, dtype=q.dtype,
                           target=target)
    # hardening: value checks; the chunk size is the selected variant's, so they run here, still before
    # anything is written (skipped when the fused path already ran them for this chunk size).
    if entry.chunk_size != checked_chunk:
        debug_checks.check_data(p, entry.chunk_size, device, **data)
    mod = _module(entry, target)
    cu, ci, co = _packed_metadata(p, entry.chunk_size, device, cu_seqlens, chunk_indices, chunk_offsets)

    o = out if out is not None else torch.empty(v.shape, dtype=v.dtype, device=device)
    try:
        o_packed = o if p.B == 1 else o.view(1, p.B * p.T, p.H, p.V)
    except RuntimeError:  # an `out` whose batch and token dims do not merge: write aside, copy once
        o_packed = torch.empty((1, p.B * p.T, p.H, p.V), dtype=v.dtype, device=device)

    final = None
    if state_cache is not None:
        state = triton_path.StateArgs(2, 2, state_cache, state_cache, state_indices, has_initial_state)
    else:
        if output_final_state:
            final = torch.empty((p.N, p.H, p.V, p.K), dtype=torch.float32, device=device)
        state = triton_path.StateArgs(1 if initial_state is not None else 0, 1 if final is not None else 0,
                                      initial_state, final)
    triton_path.run(
        mod, target=target,
        q=_packed(q, p.B, p.T), k=_packed(k, p.B, p.T), v=_packed(v, p.B, p.T),
        raw_g=_packed(raw_g, p.B, p.T), raw_beta=_packed(raw_beta, p.B, p.T),
        A_log=A_log.reshape(-1), g_bias=g_bias.reshape(-1) if g_bias is not None else None,
        scale=float(scale), lower_bound=lower_bound, use_qk_l2norm=use_qk_l2norm_in_kernel,
        cu_seqlens=cu, chunk_indices=ci, chunk_offsets=co, out=o_packed, state=state)
    if o_packed.data_ptr() != o.data_ptr():
        o.copy_(o_packed.view(o.shape))
    # The seed returns the output and, when requested, the final state; with a state_cache the final
    # states are in the cache and the second value is None.
    return o, final


def _last_dim(t: object) -> int:
    # v is checked later (check_inputs); a non-tensor here must still reach that check's message.
    return t.shape[-1] if isinstance(t, torch.Tensor) and t.dim() >= 1 else -1


def _fused_output(v: torch.Tensor, *others: torch.Tensor | None) -> torch.Tensor:
    """Where the fused path writes when the caller passed no `out`: into v, as the seed does (the prologue
    has read v before the recurrence writes), when v is contiguous and shares no memory with a state the
    walk reads or writes; else a new tensor."""
    if v.is_contiguous() and not any(t is not None and may_overlap(v, t) for t in others):
        return v
    return torch.empty(v.shape, dtype=v.dtype, device=v.device)


def _dense_rows(t: torch.Tensor | None, p: Problem) -> torch.Tensor | None:
    # The fused kernels index a state row as one dense [H, V, K] block; validate.py allows a padded head
    # stride, which only initial_state (read-only) can have here.
    if t is None or t.stride()[1:] == (p.V * p.K, p.K, 1):
        return t
    return t.contiguous()


def _run_fused(lib: jit_hip.HipLibrary, p: Problem, *, q, k, v, raw_g, raw_beta, A_log, g_bias, scale: float,
               lower_bound: float, cu_seqlens, chunk_indices, chunk_offsets, initial_state,
               output_final_state: bool, out, checkpoint_state, checkpoint_offsets, checkpoint_state_indices,
               state_cache, state_indices, has_initial_state) -> tuple[torch.Tensor, torch.Tensor | None]:
    """The fused launches (prologue + recurrence) for a validated packed call (B == 1: cu_seqlens given)."""
    device = q.device
    cu, ci, co = _packed_metadata(p, FUSED_CHUNK, device, cu_seqlens, chunk_indices, chunk_offsets)
    o = out if out is not None else _fused_output(v, initial_state, state_cache, checkpoint_state)
    final = None
    if state_cache is None and output_final_state:
        final = torch.empty((p.N, p.H, p.V, p.K), dtype=torch.float32, device=device)
    # `groups` (the group scan's split) is left to run_fused's automatic choice.
    fused_path.run_fused(
        lib, q=q, k=k, v=v, raw_g=raw_g, raw_beta=raw_beta, A_log=A_log, g_bias=g_bias, scale=scale,
        lower_bound=lower_bound, cu_seqlens=cu, chunk_indices=ci, chunk_offsets=co, out=o,
        initial_state=_dense_rows(initial_state, p), final_state=final, state_cache=state_cache,
        state_indices=state_indices, has_initial_state=has_initial_state, checkpoint_state=checkpoint_state,
        checkpoint_offsets=checkpoint_offsets, checkpoint_state_indices=checkpoint_state_indices,
        use_qk_l2norm=True)
    return o, final
