# SPDX-License-Identifier: Apache-2.0
"""chunk_kda_prefill: vLLM's Kimi-K3 ROCm prefill contract over the generated variants.

The generated package's `chunk_kda_prefill` has the seed's exact signature and forwards here with
its registry. See Note [Dispatch order] below.
"""

from __future__ import annotations

import logging
from types import ModuleType

import torch

from . import triton_path
from .device import interpreting, target_of
from .metadata import prepare_chunk_indices, prepare_chunk_offsets
from .registry import DTYPE_NAMES, VariantEntry, select_variant
from .validate import OP, Problem, check_inputs, check_state_cache
from . import debug_checks  # hardening: data-dependent checks
from .validate import check_flags, check_optional_args  # hardening: flags, optional args, aliasing

log = logging.getLogger("kdagen")

# Note [Dispatch order]
# 1. scale defaults to K ** -0.5.
# 2. The fused path runs only when use_fused_chunk is asked for and every precondition holds
#    (the seed's: L2 norm in kernel, cu_seqlens, lower_bound and g_bias given, and a generated
#    fused variant for (K, V, dtype, chunk 64) on this device); otherwise the Triton path runs.
# 3. The seed's contract errors come first, in the seed's order, then the shape/dtype checks.
# 4. Nothing is written to caller-owned memory before every check has passed.

_loaded: dict[str, ModuleType] = {}


def can_use_fused(variants: tuple[VariantEntry, ...], head_dim_k: int, head_dim_v: int, dtype: torch.dtype,
                  chunk_size: int, device: torch.device | None = None) -> bool:
    """Whether a generated fused (HIP) variant serves (K, V, dtype, chunk_size) on the current device."""
    dname = DTYPE_NAMES.get(dtype)
    fused = [e for e in variants if e.backend == "hip" and e.head_dim_k == head_dim_k
             and e.head_dim_v == head_dim_v and e.dtype == dname and e.chunk_size == chunk_size]
    if not fused:
        return False
    if device is None:
        if not torch.cuda.is_available():
            return False
        device = torch.device("cuda", torch.cuda.current_device())
    target = target_of(device)
    return any(target in e.targets for e in fused)


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

    fused = bool(use_fused_chunk and use_qk_l2norm_in_kernel and cu_seqlens is not None
                 and lower_bound is not None and g_bias is not None
                 and can_use_fused(variants, k.shape[-1], v.shape[-1], k.dtype, 64, k.device))
    if checkpoint_offsets is not None and not fused:
        raise NotImplementedError(
            f"{OP}: the prefill checkpoint export (checkpoint_offsets) needs the fused path, which did not "
            "run for this call (use_fused_chunk=True with use_qk_l2norm_in_kernel, cu_seqlens, lower_bound "
            "and g_bias, and a generated fused variant for this device); the Triton path cannot write "
            "checkpoints")
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

    target = target_of(device)
    entry = select_variant(variants, backend="triton", head_dim_k=p.K, head_dim_v=p.V, dtype=q.dtype,
                           target=target)
    # hardening: value checks (CPU tensors always, device tensors with KDAGEN_DEBUG=1); the chunk size is
    # the selected variant's, so they run here, still before anything is written.
    debug_checks.check_data(p, entry.chunk_size, device, cu_seqlens=cu_seqlens, chunk_indices=chunk_indices,
                            chunk_offsets=chunk_offsets, state_cache=state_cache, state_indices=state_indices,
                            checkpoint_state=checkpoint_state, checkpoint_offsets=checkpoint_offsets,
                            checkpoint_state_indices=checkpoint_state_indices)
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
