# SPDX-License-Identifier: Apache-2.0
"""Making plans: `make_plan` from validated batch arguments, and the public `plan_kda_prefill`.

See Note [Plan and run] (plan.py) and Note [Fused path choice] (fused_choice.py).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from types import ModuleType

import torch

from . import debug_checks, fused_choice
from .device import check_interpreter_mode, interpreting, target_of
from .plan import Batch, KdaPrefillPlan
from .registry import NoVariantError, VariantEntry, select_variant
from .validate import (INDEX_DTYPES, IO_DTYPES, OP, Problem, check_batch_metadata, check_checkpoint_routing,
                       check_flags, check_gate_form, check_state_routing, fail, tensor)

log = logging.getLogger("kdagen")

_loaded: dict[str, ModuleType] = {}


def module_key(entry: VariantEntry, target: str) -> str:
    return f"{entry.name}@{target}"


def _module(entry: VariantEntry, target: str) -> ModuleType:
    key = module_key(entry, target)
    mod = _loaded.get(key)
    if mod is None:
        if not interpreting():
            log.info("kdagen: first use of %s on %s; Triton compiles its kernels on the first run and caches "
                     "them", entry.name, target)
        mod = _loaded[key] = entry.load()  # type: ignore[assignment]
    return mod  # type: ignore[return-value]


def _walk_module(variants: tuple[VariantEntry, ...], hip: VariantEntry, b: Batch, target: str) -> ModuleType | None:
    """The Triton variant whose walk a fused plan runs after the HIP kda_intra_kernel (Note [Fused plans],
    plan.py): same head dims, dtype and chunk size; None if the registry has none."""
    try:
        entry = select_variant(variants, backend="triton", head_dim_k=b.p.K, head_dim_v=b.p.V, dtype=b.dtype,
                               target=target)
    except NoVariantError:
        return None
    return _module(entry, target) if entry.chunk_size == hip.chunk_size else None


def make_plan(variants: tuple[VariantEntry, ...], b: Batch, *, use_fused_chunk: bool = False,
              groups: int | None = None, workspace: torch.Tensor | None = None,
              tuning: Mapping[str, int] | None = None, cu_seqlens_cpu: torch.Tensor | None = None,
              decision: fused_choice.FusedDecision | None = None, design: str | None = None) -> KdaPrefillPlan:
    """A plan from batch arguments validate.py has checked: picks the path and variant, runs the
    data-dependent checks it can, builds the fused library on first use. Nothing is written."""
    p, device = b.p, b.device
    check_interpreter_mode(device)
    if decision is None:
        decision = fused_choice.decide_fused(
            variants, use_fused_chunk=use_fused_chunk, use_qk_l2norm_in_kernel=b.use_qk_l2norm,
            cu_seqlens_given=b.cu_seqlens is not None, lower_bound_given=b.lower_bound is not None,
            g_bias_given=b.has_g_bias, head_dim_k=p.K, head_dim_v=p.V, dtype=b.dtype,
            target=fused_choice.fused_target(device) if use_fused_chunk else None)
    if use_fused_chunk and decision.entry is None:
        log.debug("kdagen: use_fused_chunk=True runs the Triton path: %s", "; ".join(decision.why_not))
    data_checks = debug_checks.should_check(device)
    meta = dict(cu_seqlens=b.cu_seqlens, cu_seqlens_cpu=cu_seqlens_cpu, chunk_indices=b.chunk_indices,
                chunk_offsets=b.chunk_offsets, checkpoint_offsets=b.checkpoint_offsets)
    checked_chunk = None
    if decision.entry is not None:
        assert decision.target is not None
        debug_checks.check_batch(p, decision.entry.chunk_size, device, **meta)
        checked_chunk = decision.entry.chunk_size
        lib = fused_choice.fused_library(decision.entry, decision.target)
        if lib is not None:
            return KdaPrefillPlan(b, entry=decision.entry, target=decision.target,
                                  mod=_walk_module(variants, decision.entry, b, decision.target), lib=lib,
                                  groups=groups, workspace=workspace, tuning=None, data_checks=data_checks)
    target = target_of(device)
    entry = select_variant(variants, backend="triton", head_dim_k=p.K, head_dim_v=p.V, dtype=b.dtype, target=target)
    if entry.chunk_size != checked_chunk:
        debug_checks.check_batch(p, entry.chunk_size, device, **meta)
    return KdaPrefillPlan(b, entry=entry, target=target, mod=_module(entry, target), lib=None, groups=groups,
                          workspace=workspace, tuning=tuning, data_checks=data_checks, design=design)


def plan_kda_prefill(variants: tuple[VariantEntry, ...], cu_seqlens: torch.Tensor | None = None,
                     cu_seqlens_cpu: torch.Tensor | None = None, *, num_heads: int, head_dim_k: int,
                     head_dim_v: int, num_tokens: int | None = None, batch_size: int = 1,
                     dtype: torch.dtype = torch.bfloat16, device: torch.device | str | None = None,
                     lower_bound: float | None = None, has_g_bias: bool = False,
                     use_qk_l2norm_in_kernel: bool = False, chunk_indices: torch.Tensor | None = None,
                     chunk_offsets: torch.Tensor | None = None, state_indices: torch.Tensor | None = None,
                     has_initial_state: torch.Tensor | None = None, output_final_state: bool = False,
                     checkpoint_offsets: torch.Tensor | None = None,
                     checkpoint_state_indices: torch.Tensor | None = None, use_fused_chunk: bool = False,
                     groups: int | None = None, workspace: torch.Tensor | None = None,
                     tuning: Mapping[str, int] | None = None, design: str | None = None,
                     chunk_size: int | None = None, pipeline: str | None = None) -> KdaPrefillPlan:
    """The public plan: validates the batch arguments, then `make_plan`. The generated package's
    `plan_kda_prefill` forwards here; its signature and docs are kernels/op_schema.PLAN_ARGS (Note [Op schema]).

    With cu_seqlens the batch is packed ([1, num_tokens, H, *]); num_tokens defaults to cu_seqlens_cpu[-1].
    Without it, inputs are [batch_size, num_tokens, H, *]: batch_size sequences of num_tokens tokens.
    """
    check_flags(output_final_state, use_qk_l2norm_in_kernel, use_fused_chunk)
    for name, x in (("num_heads", num_heads), ("head_dim_k", head_dim_k), ("head_dim_v", head_dim_v),
                    ("batch_size", batch_size)):
        if not isinstance(x, int) or isinstance(x, bool) or x < 0:
            fail(name, "a non-negative int", repr(x), exc=TypeError)
    if dtype not in IO_DTYPES:
        fail("dtype", "torch.bfloat16 or torch.float16 (the I/O dtype of q, k, v)", dtype, exc=TypeError)
    if cu_seqlens_cpu is not None:
        tensor("cu_seqlens_cpu", cu_seqlens_cpu, dims=1, dtypes=INDEX_DTYPES, device=torch.device("cpu"))
    if device is None:
        device = cu_seqlens.device if isinstance(cu_seqlens, torch.Tensor) else torch.device(
            "cuda", torch.cuda.current_device()) if torch.cuda.is_available() and not interpreting() else "cpu"
    device = torch.device(device)
    if device.type == "cuda" and device.index is None:
        device = torch.device("cuda", torch.cuda.current_device())
    if cu_seqlens is not None:
        if batch_size != 1:
            fail("batch_size", "1 with cu_seqlens (packed varlen)", batch_size)
        host = cu_seqlens_cpu is not None and isinstance(cu_seqlens, torch.Tensor) and cu_seqlens.device.type == "cpu"
        if host and not (cu_seqlens.shape == cu_seqlens_cpu.shape
                         and torch.equal(cu_seqlens.long(), cu_seqlens_cpu.long())):
            # Both on the host: free to compare, and the plan sizes its launches from cu_seqlens_cpu.
            fail("cu_seqlens_cpu", "equal to cu_seqlens (its CPU copy)",
                 f"{cu_seqlens_cpu.tolist()[:8]} with cu_seqlens {cu_seqlens.tolist()[:8]}",
                 "Pass cu_seqlens.cpu(), or leave cu_seqlens_cpu out with a CPU cu_seqlens")
        if num_tokens is None:
            if cu_seqlens_cpu is None and cu_seqlens.device.type != "cpu":
                fail("num_tokens", "given (or cu_seqlens_cpu) with a device cu_seqlens", "neither",
                     "Pass num_tokens=T or the CPU copy cu_seqlens_cpu; reading cu_seqlens[-1] would sync")
            num_tokens = int((cu_seqlens_cpu if cu_seqlens_cpu is not None else cu_seqlens)[-1])
    elif num_tokens is None:
        fail("num_tokens", "given without cu_seqlens (tokens per sequence)", "None")
    if not isinstance(num_tokens, int) or isinstance(num_tokens, bool) or num_tokens < 0:
        fail("num_tokens", "a non-negative int", repr(num_tokens), exc=TypeError)
    N = check_batch_metadata(batch_size, device, cu_seqlens, chunk_indices, chunk_offsets)
    p = Problem(batch_size, num_tokens, num_heads, head_dim_k, head_dim_v, N)
    check_gate_form(lower_bound)
    if not isinstance(has_g_bias, bool):
        fail("has_g_bias", "a bool", repr(has_g_bias), exc=TypeError)
    if (state_indices is None) != (has_initial_state is None):
        missing = "state_indices" if state_indices is None else "has_initial_state"
        fail(missing, "given with the other paged-state argument", "None",
             "A paged state cache needs both state_indices and has_initial_state")
    if state_indices is not None:
        if output_final_state:
            fail("output_final_state", "False with a paged state cache (its rows are the final states)", True)
        check_state_routing(p, device, state_indices, has_initial_state)
    if checkpoint_offsets is not None or checkpoint_state_indices is not None:
        if checkpoint_offsets is None:
            fail("checkpoint_state_indices", "given only together with checkpoint_offsets",
                 "it without checkpoint_offsets", "No snapshot would be written")
        check_checkpoint_routing(p, device, checkpoint_offsets, checkpoint_state_indices)
    b = Batch(p, dtype, device, float(lower_bound) if lower_bound is not None else None, has_g_bias,
              use_qk_l2norm_in_kernel, cu_seqlens, chunk_indices, chunk_offsets, state_indices, has_initial_state,
              output_final_state, checkpoint_offsets, checkpoint_state_indices)
    # chunk_size / pipeline: make_plan takes them once the pipeline rework lands; passed only when given.
    extra = {n: x for n, x in (("chunk_size", chunk_size), ("pipeline", pipeline)) if x is not None}
    return make_plan(variants, b, use_fused_chunk=use_fused_chunk, groups=groups, workspace=workspace,
                     tuning=tuning, cu_seqlens_cpu=cu_seqlens_cpu, design=design, **extra)
