# SPDX-License-Identifier: Apache-2.0
"""`kdagen::chunk_kda_prefill`, a torch custom op, so that torch.compile traces the prefill as one node.

Note [Custom op]
    The op's schema comes from the op schema (kernels/op_schema.py): vLLM's arguments, `out` required and
    a `final_state` buffer, the written ones declared mutated, no return value (an op may not return an
    alias of an input, which `out` and the fused path's output-into-`v` are). The generated
    `chunk_kda_prefill` is thin Python around it: eagerly it calls dispatch.chunk_kda_prefill directly (the
    dispatcher would add host time to every layer, Note [Plan cache]); while torch.compile traces it
    (`traced_call`) it picks the output destination, allocates `out` and the final state when needed,
    calls the op and returns `(out, final or None)`: the same values and the same buffers as eager.
    The fake implementation writes nothing and returns nothing. An `int registry` argument names the
    generated package whose variants run (`register`), so two packages in one process share the op.
"""

from __future__ import annotations

import functools

import torch

from ..kernels import op_schema
from . import dispatch, fused_choice
from .registry import VariantEntry

NAMESPACE, NAME = "kdagen", "chunk_kda_prefill"
QUALNAME = f"{NAMESPACE}::{NAME}"
_registries: list[tuple[VariantEntry, ...]] = []


def register(variants: tuple[VariantEntry, ...]) -> int:
    """The `registry` argument of the op for a package's variants."""
    for i, r in enumerate(_registries):
        if r is variants:
            return i
    _registries.append(variants)
    return len(_registries) - 1


def _impl(registry, q, k, v, raw_g, raw_beta, A_log, g_bias, scale, initial_state, output_final_state,
          lower_bound, use_qk_l2norm_in_kernel, cu_seqlens, chunk_indices, chunk_offsets, use_fused_chunk, out,
          checkpoint_state, checkpoint_offsets, checkpoint_state_indices, state_cache, state_indices,
          has_initial_state, final_state) -> None:
    _, final = dispatch.chunk_kda_prefill(
        _registries[registry], q, k, v, raw_g, raw_beta, A_log, g_bias, scale, initial_state, output_final_state,
        lower_bound, use_qk_l2norm_in_kernel, cu_seqlens, chunk_indices, chunk_offsets, use_fused_chunk, out,
        checkpoint_state, checkpoint_offsets, checkpoint_state_indices, state_cache, state_indices,
        has_initial_state)
    if final_state is not None and final is not None:
        final_state.copy_(final)  # the plan allocates its final state; the op's caller owns this buffer


def _fake(*args, **kwargs) -> None:
    return None


def _define() -> torch.library.CustomOpDef:
    lib_op = torch.library.custom_op(QUALNAME, _impl, mutates_args=op_schema.mutated_names(),
                                     schema=op_schema.custom_op_schema())
    lib_op.register_fake(_fake)
    return lib_op


chunk_kda_prefill_op = _define()


@functools.lru_cache(maxsize=None)
def _fused_writes_v(registry: int, use_fused_chunk: bool, use_qk_l2norm_in_kernel: bool, cu_seqlens_given: bool,
                    lower_bound_given: bool, g_bias_given: bool, K: int, V: int, dtype: torch.dtype,
                    device: torch.device) -> bool:
    """Whether the call takes the fused path, whose output goes into a contiguous `v` without `out`."""
    variants = _registries[registry]
    decision = fused_choice.decide_fused(
        variants, use_fused_chunk=use_fused_chunk, use_qk_l2norm_in_kernel=use_qk_l2norm_in_kernel,
        cu_seqlens_given=cu_seqlens_given, lower_bound_given=lower_bound_given, g_bias_given=g_bias_given,
        head_dim_k=K, head_dim_v=V, dtype=dtype,
        target=fused_choice.fused_target(device) if use_fused_chunk else None)
    return decision.entry is not None and fused_choice.can_use_fused(variants, K, V, dtype, decision.entry.chunk_size,
                                                                     device)


def assume_constant_result(fn):
    """torch.compiler.assume_constant_result without its import of torch._dynamo (0.8 s at package import,
    for a call that only ever runs under Dynamo): it marks the function, and so does this
    (tests/unit/test_op_schema.py checks that the marks agree)."""
    fn._dynamo_marked_constant = True
    return fn


@assume_constant_result
def _fused_writes_v_traced(*args) -> bool:
    # Dynamo calls it on the constant arguments and keeps the answer: it reads the environment and looks for
    # the compiler on disk, which Dynamo cannot trace.
    return _fused_writes_v(*args)


def traced_call(registry: int, q, k, v, raw_g, raw_beta, A_log, g_bias, scale, initial_state, output_final_state,
                lower_bound, use_qk_l2norm_in_kernel, cu_seqlens, chunk_indices, chunk_offsets, use_fused_chunk, out,
                checkpoint_state, checkpoint_offsets, checkpoint_state_indices, state_cache, state_indices,
                has_initial_state) -> tuple[torch.Tensor, torch.Tensor | None]:
    """chunk_kda_prefill through the custom op (Note [Custom op]); a v that overlaps a state is then
    refused as `out` where eager would write the result aside."""
    dest = out
    if dest is None:
        into_v = v.is_contiguous() and _fused_writes_v_traced(
            registry, use_fused_chunk, use_qk_l2norm_in_kernel, cu_seqlens is not None, lower_bound is not None,
            g_bias is not None, k.shape[-1], v.shape[-1], v.dtype, v.device)
        dest = v if into_v else torch.empty(v.shape, dtype=v.dtype, device=v.device)
    final = None
    if output_final_state and state_cache is None:
        n = cu_seqlens.shape[0] - 1 if cu_seqlens is not None else q.shape[0]
        final = torch.empty((n, q.shape[2], v.shape[-1], k.shape[-1]), dtype=torch.float32, device=v.device)
    chunk_kda_prefill_op(registry, q, k, v, raw_g, raw_beta, A_log, g_bias, scale, initial_state, output_final_state,
                         lower_bound, use_qk_l2norm_in_kernel, cu_seqlens, chunk_indices, chunk_offsets,
                         use_fused_chunk, dest, checkpoint_state, checkpoint_offsets, checkpoint_state_indices,
                         state_cache, state_indices, has_initial_state, final)
    return dest, final
