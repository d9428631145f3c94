# SPDX-License-Identifier: Apache-2.0
"""chunk_kda_prefill: vLLM's Kimi-K3 prefill op's signature and contract, as a thin wrapper over a cached plan.

The generated package's `chunk_kda_prefill` forwards here with its registry. See Note [Dispatch order] and
Note [Plan cache] below, and Note [Plan and run] in plan.py.
"""

from __future__ import annotations

import operator
from threading import get_ident as _get_ident

import torch

from . import fused_choice, interpreter_compat
from .fused_choice import can_use_fused, decide_fused, fused_target  # noqa: F401  (the package's API)
from .plan import Batch, KdaPrefillPlan
from .planning import make_plan
from .registry import VariantEntry
from .stream import current_stream
from .validate import OP, check_flags, check_inputs, check_optional_args, check_state_cache

# Before any kernel runs: the interpreters of triton 3.6 and 3.9 each fail on one of our kernels without it.
interpreter_compat.apply()

# Note [Dispatch order]
# 1. scale defaults to K ** -0.5.
# 2. The fused path runs only when use_fused_chunk is asked for and every precondition holds (Note [Fused
#    path choice]); otherwise the Triton path runs. Both write checkpoints.
# 3. vLLM's op's contract errors come first, in its order, then the shape/dtype checks.
# 4. Nothing is written to caller-owned memory before every check has passed.
# 5. The fused library is built (first use) after the checks; without its compiler the call runs the
#    Triton path with one warning per variant and target. A compile error always propagates.
#
# Note [Plan cache]
# The wrapper keeps the plan of its last batch, one per (registry, thread, current stream): two threads or two
# streams (vLLM's dual-batch overlap) never share a plan, hence never a workspace. A plan is reused while the
# call's metadata tensors (cu_seqlens, chunk_indices, chunk_offsets, state_indices, has_initial_state,
# checkpoint_offsets and checkpoint_state_indices) are the same objects, unchanged, and the plan-level
# arguments are equal; the cached plan holds references to those tensors, so an id cannot be reused while it
# is cached. "Unchanged": a tensor with a version counter keeps its version (an in-place edit is seen). An
# inference tensor (made under torch.inference_mode(), as vLLM's metadata is) has none: on the CPU its values
# are compared with a copy taken at plan time; on a device the plan copies the current values into its own
# metadata buffers on every call (`refresh_metadata`, a few small device copies, graph-capturable), so a plan
# never runs on stale metadata. A hit runs only the plan's per-layer checks. Environment overrides
# (KDAGEN_TARGET, KDAGEN_TRITON_GROUPS, KDAGEN_DEBUG) are read when a plan is made.
_META = ("cu_seqlens", "chunk_indices", "chunk_offsets", "state_indices", "has_initial_state",
         "checkpoint_offsets", "checkpoint_state_indices")
_REFRESH = object()  # a device inference tensor's stamp: refresh the plan's copy on every call


def _stamp(t: torch.Tensor | None) -> object:
    if t is None:
        return -1
    if not t.is_inference():
        return t._version
    return t.clone() if t.device.type == "cpu" else _REFRESH


_VERSION = operator.attrgetter("_version")


class _Cached:
    __slots__ = ("key", "meta", "versioned", "versions", "by_value", "plan", "refresh")

    def __init__(self, key: tuple, meta: tuple, plan: KdaPrefillPlan):
        self.key, self.meta, self.plan = key, meta, plan
        stamps = [(t, _stamp(t)) for t in meta if t is not None]
        # The versioned tensors and their versions, compared in one C-level pass per call.
        self.versioned = tuple(t for t, st in stamps if type(st) is int)
        self.versions = [st for _, st in stamps if type(st) is int]
        self.by_value = tuple((t, st) for t, st in stamps if isinstance(st, torch.Tensor))
        # A plan that cannot refresh (it built chunk metadata from cu_seqlens itself) re-plans on such a tensor.
        self.refresh = any(st is _REFRESH for _, st in stamps)
        if self.refresh and not plan.refreshable:
            self.key = None

    def hit(self, key: tuple, meta: tuple) -> bool:
        if key != self.key or not all(map(operator.is_, meta, self.meta)):
            return False
        if list(map(_VERSION, self.versioned)) != self.versions:
            return False
        for t, copy in self.by_value:  # CPU inference tensors
            if not torch.equal(t, copy):
                return False
        if self.refresh:
            self.plan.refresh_metadata(*meta)  # type: ignore[attr-defined]
        return True


# (id(variants), thread, stream) -> the last plan of that registry there. A thread's entries outlive it
# until its id is reused (a serving engine's threads live as long as the process).
_last: dict[tuple[int, int, int], _Cached] = {}


def clear_plans() -> None:
    """Forget the cached plans (tests that change the environment between calls)."""
    _last.clear()


def chunk_kda_prefill(variants: tuple[VariantEntry, ...], q, k, v, raw_g, raw_beta, A_log, g_bias=None,
                      scale=None, initial_state=None, output_final_state=False, lower_bound=None,
                      use_qk_l2norm_in_kernel=False, cu_seqlens=None, chunk_indices=None, chunk_offsets=None,
                      use_fused_chunk=False, out=None, checkpoint_state=None, checkpoint_offsets=None,
                      checkpoint_state_indices=None, state_cache=None, state_indices=None,
                      has_initial_state=None) -> tuple[torch.Tensor, torch.Tensor | None]:
    meta = (cu_seqlens, chunk_indices, chunk_offsets, state_indices, has_initial_state, checkpoint_offsets,
            checkpoint_state_indices)
    try:
        key = (q.shape, v.shape[-1], q.dtype, lower_bound, g_bias is None, use_qk_l2norm_in_kernel,
               use_fused_chunk, output_final_state, initial_state is None, state_cache is None,
               checkpoint_state is None)
        # Inline (every layer): which (registry, thread, stream) this call's plan belongs to.
        where = (id(variants), _get_ident(), current_stream(q.get_device()) if q.is_cuda else 0)
        cached = _last.get(where)
        fast = (cached is not None and type(output_final_state) is bool and type(use_qk_l2norm_in_kernel) is bool
                and type(use_fused_chunk) is bool and cached.hit(key, meta))
    except (AttributeError, IndexError, TypeError):  # a non-tensor q or v: the slow path says which
        fast = False
    if fast:
        return cached.plan.run(q, k, v, raw_g, raw_beta, A_log, g_bias, scale=scale, initial_state=initial_state,
                               out=out, state_cache=state_cache, checkpoint_state=checkpoint_state)
    plan = _make_call_plan(variants, q, k, v, raw_g, raw_beta, A_log, g_bias, scale, initial_state,
                           output_final_state, lower_bound, use_qk_l2norm_in_kernel, cu_seqlens, chunk_indices,
                           chunk_offsets, use_fused_chunk, out, checkpoint_state, checkpoint_offsets,
                           checkpoint_state_indices, state_cache, state_indices, has_initial_state)
    _last[(id(variants), _get_ident(), current_stream(q.get_device()) if q.is_cuda else 0)] = _Cached(key, meta, plan)
    return plan.run(q, k, v, raw_g, raw_beta, A_log, g_bias, scale=scale, initial_state=initial_state, out=out,
                    state_cache=state_cache, checkpoint_state=checkpoint_state)


def _make_call_plan(variants, q, k, v, raw_g, raw_beta, A_log, g_bias, scale, initial_state, output_final_state,
                    lower_bound, use_qk_l2norm_in_kernel, cu_seqlens, chunk_indices, chunk_offsets, use_fused_chunk,
                    out, checkpoint_state, checkpoint_offsets, checkpoint_state_indices, state_cache, state_indices,
                    has_initial_state) -> KdaPrefillPlan:
    """Every check of Note [Dispatch order], in order, then the plan of this call's batch."""
    if not isinstance(k, torch.Tensor) or k.dim() < 1:
        raise TypeError(f"{OP}: k must be a [B, T, H, K] torch.Tensor, got {type(k).__name__}")
    check_flags(output_final_state, use_qk_l2norm_in_kernel, use_fused_chunk)
    if scale is None:
        scale = k.shape[-1] ** -0.5
    decision = decide_fused(
        variants, use_fused_chunk=use_fused_chunk, use_qk_l2norm_in_kernel=use_qk_l2norm_in_kernel,
        cu_seqlens_given=cu_seqlens is not None, lower_bound_given=lower_bound is not None,
        g_bias_given=g_bias is not None, head_dim_k=k.shape[-1], head_dim_v=_last_dim(v), dtype=k.dtype,
        target=fused_choice.fused_target(k.device) if use_fused_chunk else None)
    if checkpoint_state is not None and checkpoint_offsets is None:
        raise ValueError(f"{OP}: checkpoint_state was given without checkpoint_offsets, so no snapshot "
                         "would be written; pass both or neither")
    if state_cache is not None:
        if initial_state is not None or output_final_state:
            raise ValueError(f"{OP}: state_cache replaces initial_state/output_final_state; pass "
                             "initial_state=None and output_final_state=False with a state_cache")
        missing = [n for n, t in (("state_indices", state_indices), ("has_initial_state", has_initial_state))
                   if t is None]
        if missing:
            raise ValueError(f"{OP}: state_cache needs state_indices and has_initial_state; "
                             f"{' and '.join(missing)} {'is' if len(missing) == 1 else 'are'} missing")
    p = check_inputs(q, k, v, raw_g, raw_beta, A_log, g_bias, scale, lower_bound, cu_seqlens,
                     chunk_indices, chunk_offsets, initial_state, out)
    device = q.device
    if state_cache is not None:
        check_state_cache(p, state_cache, state_indices, has_initial_state, device)
    check_optional_args(p, device, out=out, state_cache=state_cache, state_indices=state_indices,
                        has_initial_state=has_initial_state, checkpoint_state=checkpoint_state,
                        checkpoint_offsets=checkpoint_offsets, checkpoint_state_indices=checkpoint_state_indices)
    b = Batch(p, q.dtype, device, float(lower_bound) if lower_bound is not None else None, g_bias is not None,
              use_qk_l2norm_in_kernel, cu_seqlens, chunk_indices, chunk_offsets, state_indices, has_initial_state,
              output_final_state, checkpoint_offsets, checkpoint_state_indices)
    return make_plan(variants, b, use_fused_chunk=use_fused_chunk, decision=decision)


def _last_dim(t: object) -> int:
    # v is checked later (check_inputs); a non-tensor here must still reach that check's message.
    return t.shape[-1] if isinstance(t, torch.Tensor) and t.dim() >= 1 else -1
