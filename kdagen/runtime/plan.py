# SPDX-License-Identifier: Apache-2.0
"""Plan once per batch, run once per layer (FlashInfer's plan()/run()). See Note [Plan and run].

Note [Plan and run]
    A `KdaPrefillPlan` holds everything that depends on the batch: its own copies of the packed metadata
    (cu_seqlens, chunk_indices, chunk_offsets), the state routing (state_indices, has_initial_state) and the
    checkpoint request (Note [Plan metadata]), the head counts and dims, dtype, gate form, device, the variant,
    the pipeline (Note [Pipelines]), the group count and the workspace. It is validated when it is made, the
    data-dependent checks included where the values are on the CPU (tensors on the CPU, or `cu_seqlens_cpu`;
    device tensors are read only under KDAGEN_DEBUG=1, which syncs). `run` checks only what can differ per layer
    (each tensor's shape, dtype, device and unit last stride against the plan) and launches. When a fast check
    fails, the full validators of validate.py run to say precisely what is wrong; nothing is written before
    that.
    A plan's workspace is reused by every run: runs of one plan must not overlap in time (one stream, one
    layer after another), like a serving engine's forward pass. Runs are graph-capturable.

Note [Fused plans]
    A fused plan (use_fused_chunk=True, Note [Fused path choice]) runs the pipeline choose_pipeline picks
    (Note [Pipelines], pipeline.py): hip_intra + hip_walk where the gate, the norm and the GPU's fill allow,
    hip_intra + triton_walk where a group split was asked for or the library has no walk, else the Triton
    program. Every stage reads the plan's one workspace and metadata, so state routing, checkpoints and graph
    capture are the Triton path's. With no `out` the output goes into v, the fused path's contract
    (fused_output). The HIP kernels' times beside the Triton kernels' they replace: docs/performance-model.md,
    "Per-kernel times as last measured".
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from types import ModuleType

import torch

from . import debug_checks
from .fused_path import HipIntraLaunch, HipWalkLaunch, pair_launches
from .jit_hip import HipLibrary
from .launch import KernelLaunch
from .pipeline import Pipeline, Program
from .plan_metadata import META_NAMES, PlanMetadata
from .registry import VariantEntry
from .stream import current_stream
from .triton_path import DESIGNS, chunk_buffers, chunk_launches, walk_buffers, walk_launches, walk_split
from .validate import (FLOAT_DTYPES, OP, Problem, check_checkpoint, check_checkpoint_rows_free, check_inputs,
                       check_state_cache, is_real, may_overlap, no_overlap, self_overlaps)
from .workspace import WorkspaceLayout, check_workspace


@dataclass(frozen=True)
class Batch:
    """The batch-level arguments of a plan, validated (validate.py) before a plan is made from them."""

    p: Problem
    dtype: torch.dtype
    device: torch.device
    lower_bound: float | None
    has_g_bias: bool
    use_qk_l2norm: bool
    cu_seqlens: torch.Tensor | None
    chunk_indices: torch.Tensor | None
    chunk_offsets: torch.Tensor | None
    state_indices: torch.Tensor | None  # paged state cache when given (with has_initial_state)
    has_initial_state: torch.Tensor | None
    output_final_state: bool
    checkpoint_offsets: torch.Tensor | None
    checkpoint_state_indices: torch.Tensor | None


class KdaPrefillPlan:
    """One batch's validated prefill: call `run` once per layer. Make it with `plan_kda_prefill` (public) or
    `make_plan` (after validation). See Note [Plan and run]."""

    def __init__(self, b: Batch, *, entry: VariantEntry, target: str, mod: ModuleType | None,
                 lib: HipLibrary | None, pipeline: Pipeline, tuning: Mapping[str, int] | None,
                 meta: PlanMetadata, workspace: torch.Tensor | None, data_checks: bool, into_v: bool,
                 sms: int | None, direct: bool, check_meta: Callable[[Mapping], None] | None = None):
        """From make_plan (planning.py), which chose the variant and the pipeline; builds the stages."""
        p = self.problem = b.p
        self.batch = b
        self.entry, self.target, self.mod, self.lib, self.pipeline = entry, target, mod, lib, pipeline
        self.metadata = meta
        # "fused": a fused request served with its library (whichever stages run), or a HIP stage asked for.
        self.path = "fused" if into_v or "hip" in pipeline.name else "triton"
        self.design = DESIGNS[pipeline.chunk]
        self.groups = pipeline.groups
        self.tuning = dict(tuning) if tuning is not None else None
        self.launch_tuning = dict(pipeline.knobs)
        self._into_v = into_v  # the fused path's contract: no `out` writes into v (fused_output)
        self._check_meta = check_meta
        self._data_checks = data_checks
        self._checked_rows: set[tuple[str, int]] = set()
        self._packed_shape = (1, p.B * p.T, p.H)
        self._in_shapes = {"q": (p.B, p.T, p.H, p.K), "v": (p.B, p.T, p.H, p.V)}
        self._dev_index = b.device.index if b.device.type == "cuda" else -1
        self._paged = b.state_indices is not None
        # The HIP launchers and the compiled Triton launches (Note [Compiled launch]) take the stream from the
        # run's values; Triton's JIT launch reads it itself.
        self._stream_needed = "hip" in pipeline.name or direct
        self._final_shape = (p.N, p.H, p.V, p.K)
        # What _fast_ok compares per layer, made once: beta's shape, a state row's shape and strides, H * K.
        self._beta_shape, self._row_shape, self._row_strides = (p.B, p.T, p.H), (p.H, p.V, p.K), (p.V * p.K, p.K, 1)
        self._hk = p.H * p.K
        cu, ci, co = meta["cu_seqlens"], meta["chunk_indices"], meta["chunk_offsets"]
        self._cu = cu
        n_chunks = ci.shape[0] if ci.numel() else 0
        rows = self.launch_tuning.get("intra_rows", 16)
        bk, bv = (mod.BK, mod.BV) if mod is not None else (p.K, p.V)
        split = walk_split(self.design, entry.chunk_size, rows)
        layout = WorkspaceLayout.of(
            chunk_buffers(self.design, p.B * p.T, p.H, bk, bv, entry.chunk_size, n_chunks, b.dtype, rows)
            + (walk_buffers(self.groups, p.N, p.H, bk, bv) if pipeline.walk != "hip_walk" else []))
        self.workspace_bytes = layout.nbytes
        storage = (torch.empty(layout.nbytes, dtype=torch.uint8, device=b.device) if workspace is None
                   else check_workspace(workspace, layout.nbytes, b.device, OP))
        self.workspace = storage
        ws = layout.views(storage)
        state_ins = (2,) if self._paged else (0, 1)
        state_out = 2 if self._paged else int(b.output_final_state)
        lt = self.launch_tuning
        if pipeline.chunk == "hip_intra":
            chunk = {} if n_chunks == 0 or p.H == 0 else {"intra": HipIntraLaunch(
                lib, ws, cu_seqlens=meta.converted("cu_seqlens", torch.int32),  # type: ignore[arg-type]
                chunk_indices=meta.converted("chunk_indices", torch.int32),  # type: ignore[arg-type]
                lower_bound=b.lower_bound, has_bias=b.has_g_bias, H=p.H)}  # type: ignore[arg-type]
        else:
            chunk = chunk_launches(mod, self.design, target=target, tuning=lt, ws=ws, H=p.H, n_chunks=n_chunks,
                                   lower_bound=b.lower_bound, has_bias=b.has_g_bias, use_l2norm=b.use_qk_l2norm,
                                   cu_seqlens=cu, chunk_indices=ci, direct=direct)
        routing = dict(state_indices=b.state_indices, has_initial_state=b.has_initial_state,
                       checkpoint_offsets=b.checkpoint_offsets, checkpoint_state_indices=b.checkpoint_state_indices)
        if pipeline.walk == "hip_walk":
            walks = {} if p.N == 0 or p.H == 0 else {s: (HipWalkLaunch(
                lib, ws, state_in=s, state_out=state_out, cu_seqlens=meta.converted("cu_seqlens", torch.int32),
                chunk_offsets=meta.converted("chunk_offsets", torch.int64), H=p.H, N=p.N,
                state_indices=meta.converted("state_indices", torch.int32),
                has_initial_state=_flag_bytes(meta.converted("has_initial_state", torch.bool)),
                checkpoint_offsets=meta.converted("checkpoint_offsets", torch.int32),
                checkpoint_state_indices=meta.converted("checkpoint_state_indices", torch.int32)),)
                for s in state_ins}
        else:
            walks = walk_launches(mod, split=split, target=target, tuning=lt, ws=ws, H=p.H, N=p.N,
                                  groups=self.groups, sms=sms, cu_seqlens=cu, chunk_offsets=co, state_ins=state_ins,
                                  state_out=state_out, direct=direct, u_from_v=pipeline.walk == "triton_walk_tb",
                                  **routing)
        if pipeline.chunk == "hip_intra" and pipeline.walk == "hip_walk":
            chunk, walks = pair_launches(chunk, walks)  # one C call per run
        self.program = Program(pipeline, chunk, walks, direct)

    def describe(self) -> str:
        """Which stages, groups and knobs this plan runs, and why."""
        p, b = self.problem, self.batch
        names = self.entry.name
        if self.lib is not None and self.path == "fused":
            names += f" (HIP library {getattr(self.lib, 'name', '?')})"
        into = "into v (the fused path's contract)" if self._into_v else "a new tensor"
        knobs = ", ".join(f"{k}={v}" for k, v in sorted(self.launch_tuning.items())) or "none (HIP stages only)"
        return "\n".join((
            f"kdagen plan on {self.target}: {names}",
            f"  batch: B={p.B} T={p.T} H={p.H} K={p.K} V={p.V}, {p.N} sequences, {self.entry.chunk_size}-token "
            f"metadata chunks, lower_bound={b.lower_bound}, L2 norm in kernel={b.use_qk_l2norm}",
            f"  pipeline: {self.pipeline.name}, {self.groups} group{'s' if self.groups > 1 else ''}",
            f"  stages: {self.pipeline.what}",
            f"  why: {self.pipeline.reason}",
            f"  knobs: {knobs}",
            f"  launches: {_launches(self.program)}",
            f"  workspace: {self.workspace_bytes} bytes; output without `out`: {into}"))

    @property
    def refreshable(self) -> bool:
        """Whether refresh_metadata can take new values of every metadata tensor the plan was made with (False
        when the plan built chunk_indices / chunk_offsets from cu_seqlens itself: make a new plan instead)."""
        return self.metadata.refreshable

    def refresh_metadata(self, cu_seqlens: torch.Tensor | None = None, chunk_indices: torch.Tensor | None = None,
                         chunk_offsets: torch.Tensor | None = None, state_indices: torch.Tensor | None = None,
                         has_initial_state: torch.Tensor | None = None,
                         checkpoint_offsets: torch.Tensor | None = None,
                         checkpoint_state_indices: torch.Tensor | None = None) -> None:
        """Copy new metadata and routing (same shapes and dtypes as planned; None where the plan has none)
        into the plan's own buffers, asynchronously on the current stream (Note [Plan metadata])."""
        new = dict(zip(META_NAMES, (cu_seqlens, chunk_indices, chunk_offsets, state_indices, has_initial_state,
                                    checkpoint_offsets, checkpoint_state_indices)))
        self.metadata.refresh(new, self._check_meta if self._data_checks else None)
        self._checked_rows.clear()

    # ------------------------------------------------------------------------------------------- run
    def run(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, raw_g: torch.Tensor, raw_beta: torch.Tensor,
            A_log: torch.Tensor, g_bias: torch.Tensor | None = None, *, scale: float | None = None,
            initial_state: torch.Tensor | None = None, out: torch.Tensor | None = None,
            state_cache: torch.Tensor | None = None, checkpoint_state: torch.Tensor | None = None,
            ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """One layer: writes and returns the output ([B, T, H, V], `out` itself when given) and the final
        state when the plan asked for it (None with a state cache, whose rows are updated in place)."""
        p = self.problem
        if scale is None:
            scale = p.K ** -0.5
        strides = self._fast_ok(q, k, v, raw_g, raw_beta, A_log, g_bias, initial_state, out, state_cache,
                                checkpoint_state, scale)
        if strides is None:
            self._explain(q, k, v, raw_g, raw_beta, A_log, g_bias, initial_state, out, state_cache,
                          checkpoint_state, scale)
        if self._data_checks:
            self._check_rows(state_cache, checkpoint_state)
        if self._into_v and out is None:
            out = fused_output(v, initial_state, state_cache, checkpoint_state)  # the fused path's contract
        values, state_in, o, o_packed, final = self.bind(q, k, v, raw_g, raw_beta, A_log, g_bias, scale,
                                                         initial_state, out, state_cache, strides, checkpoint_state)
        self.program.run(values, state_in)
        if o_packed is not o:
            o.copy_(o_packed.view(o.shape))
        return o, final

    def bind(self, q, k, v, raw_g, raw_beta, A_log, g_bias, scale, initial_state, out, state_cache,
             strides=None, checkpoint_state=None) -> tuple[list, int, torch.Tensor, torch.Tensor, torch.Tensor | None]:
        """The launches' per-run arguments for checked tensors, the recurrence's STATE_IN, the output,
        its packed view and the final state (allocated here). Tools time single kernels with it."""
        b, p = self.batch, self.problem
        if strides is None:
            strides = tuple(t.stride() for t in (q, k, v, raw_g, raw_beta))
        o = out if out is not None else torch.empty(v.shape, dtype=v.dtype, device=v.device)
        o_packed = o
        if p.B != 1:
            q, k, v, raw_g, raw_beta = (t.reshape(*self._packed_shape, *t.shape[3:]) for t in (q, k, v, raw_g, raw_beta))
            strides = tuple(t.stride() for t in (q, k, v, raw_g, raw_beta))
            try:
                o_packed = o.view(1, p.B * p.T, p.H, p.V)
            except RuntimeError:  # an `out` whose batch and token dims do not merge: write aside, copy once
                o_packed = torch.empty((1, p.B * p.T, p.H, p.V), dtype=v.dtype, device=v.device)
        final = None
        if self._paged:
            h0 = ht = state_cache
            state_in, n_slots = 2, state_cache.shape[0]  # type: ignore[union-attr]
        else:
            if b.output_final_state:
                final = torch.empty(self._final_shape, dtype=torch.float32, device=v.device)
            h0, ht = initial_state, final
            state_in, n_slots = (0 if initial_state is None else 1), 0
        sq, sk, sv, sg, sb = strides
        so = o_packed.stride()
        spare = self._cu  # any valid pointer for an unused state argument; the constexprs keep it unread
        sh0 = h0.stride() if h0 is not None else (0, 0)
        sht = sh0 if ht is h0 else ht.stride() if ht is not None else (0, 0)
        # In run_values.RUN_ORDER. The kernels read A_log and g_bias as ptr + i: a 1-D one is dense (checked), any
        # other rank is flattened into a dense copy (reshape alone may give a strided view, e.g. of [H, 1] rows).
        a_log = A_log if A_log.dim() == 1 else A_log.reshape(-1).contiguous()
        values = [q, k, v, raw_g, raw_beta, a_log,
                  a_log if g_bias is None else g_bias if g_bias.dim() == 1 else g_bias.reshape(-1).contiguous(),
                  float(scale),
                  sq[1], sq[2], sk[1], sk[2], sv[1], sv[2], sg[1], sg[2], sb[1], sb[2],
                  o_packed, so[1], so[2], h0 if h0 is not None else spare, ht if ht is not None else spare,
                  sh0[0], sh0[1], sht[0], sht[1], n_slots, checkpoint_state,
                  checkpoint_state.stride(0) if checkpoint_state is not None else None,
                  checkpoint_state.shape[0] if checkpoint_state is not None else None,
                  current_stream(self._dev_index) if self._stream_needed else 0]
        return values, state_in, o, o_packed, final

    def _fast_ok(self, q, k, v, raw_g, raw_beta, A_log, g_bias, initial_state, out, state_cache,
                 checkpoint_state, scale) -> tuple | None:
        """The per-layer checks, cheap: the strides of q, k, v, raw_g and raw_beta when every tensor matches
        the plan, None when one does not (then _explain says which and why)."""
        b, p = self.batch, self.problem
        dt, dev, qs, vs = b.dtype, self._dev_index, self._in_shapes["q"], self._in_shapes["v"]
        row_shape, row_strides = self._row_shape, self._row_strides
        try:
            if not (q.shape == qs and k.shape == qs and v.shape == vs and raw_g.shape == qs
                    and raw_beta.shape == self._beta_shape and q.dtype is dt and k.dtype is dt and v.dtype is dt
                    and raw_g.dtype in FLOAT_DTYPES and raw_beta.dtype in FLOAT_DTYPES
                    and A_log.numel() == p.H and A_log.dtype in FLOAT_DTYPES
                    and q.get_device() == dev and k.get_device() == dev and v.get_device() == dev
                    and raw_g.get_device() == dev and raw_beta.get_device() == dev and A_log.get_device() == dev
                    and (g_bias is not None) == b.has_g_bias and (type(scale) is float or is_real(scale))
                    and math.isfinite(scale)):
                return None
            strides = (q.stride(), k.stride(), v.stride(), raw_g.stride(), raw_beta.stride())
            if not (strides[0][3] == 1 and strides[1][3] == 1 and strides[2][3] == 1 and strides[3][3] == 1):
                return None
            if g_bias is not None and not (g_bias.numel() == self._hk and g_bias.dtype in FLOAT_DTYPES
                                           and g_bias.get_device() == dev
                                           and (g_bias.is_contiguous() or g_bias.dim() != 1)):
                return None
            if not A_log.is_contiguous() and A_log.dim() == 1:  # read as ptr + h (other ranks: a flat copy)
                return None
            if (state_cache is not None) != self._paged or (checkpoint_state is not None) != (
                    b.checkpoint_offsets is not None):
                return None
            if initial_state is not None and (self._paged or not (
                    initial_state.shape == self._final_shape and initial_state.dtype is torch.float32
                    and initial_state.get_device() == dev and initial_state.stride()[2:] == (p.K, 1))):
                return None
            for t in (state_cache, checkpoint_state):
                if t is not None and not (t.dim() == 4 and t.shape[1:] == row_shape
                                          and t.dtype is torch.float32 and t.get_device() == dev
                                          and t.stride()[1:] == row_strides):
                    return None
            if checkpoint_state is not None and b.checkpoint_state_indices is None and \
                    checkpoint_state.shape[0] < p.N:
                return None
            if out is not None:
                so = out.stride()
                if not (out.shape == vs and out.dtype is dt and out.get_device() == dev and so[3] == 1):
                    return None
                if not out.is_contiguous() and self_overlaps(out):  # an expanded or as_strided `out`
                    return None
                if out.numel() and (initial_state is not None or state_cache is not None
                                    or checkpoint_state is not None):
                    # `out` spans [o0, o1); a state is dense within its rows (checked above).
                    o0 = out.data_ptr()
                    o1 = o0 + ((vs[0] - 1) * so[0] + (vs[1] - 1) * so[1] + (vs[2] - 1) * so[2] + vs[3]) * 2
                    for t in (initial_state, state_cache, checkpoint_state):
                        if t is not None and t.numel():
                            st, s0 = t.stride(), t.data_ptr()  # t.shape[1] is H (checked above)
                            s1 = s0 + ((t.shape[0] - 1) * st[0] + (p.H - 1) * st[1] + p.V * p.K) * 4
                            if o0 < s1 and s0 < o1:
                                return None
            if checkpoint_state is not None and (initial_state is not None or state_cache is not None):
                # Raises: a snapshot row on a live state (the rows compared where they are readable).
                check_checkpoint_rows_free(p, checkpoint_state, b.checkpoint_offsets, b.checkpoint_state_indices,
                                           initial_state, state_cache, b.state_indices, self._data_checks)
        except (AttributeError, TypeError, IndexError):  # not a tensor where one belongs: _explain says which
            return None
        return strides

    def _explain(self, q, k, v, raw_g, raw_beta, A_log, g_bias, initial_state, out, state_cache,
                 checkpoint_state, scale) -> None:
        """A fast check failed: run the full validators, which raise with what is wrong and the fix."""
        b, p = self.batch, self.problem
        if state_cache is not None and not self._paged:
            raise ValueError(f"{OP}: state_cache was given to a plan made without state_indices/has_initial_state; "
                             "make the plan with them to use a paged state cache")
        if state_cache is None and self._paged:
            raise ValueError(f"{OP}: this plan routes a paged state (state_indices given); pass state_cache")
        if initial_state is not None and self._paged:
            raise ValueError(f"{OP}: state_cache replaces initial_state/output_final_state; pass "
                             "initial_state=None with a state_cache")
        if (checkpoint_state is not None) != (b.checkpoint_offsets is not None):
            raise ValueError(f"{OP}: checkpoint_state must be given exactly when the plan has checkpoint_offsets "
                             f"(it {'has' if b.checkpoint_offsets is not None else 'has none'})")
        if (g_bias is not None) != b.has_g_bias:
            raise ValueError(f"{OP}: g_bias {'missing' if g_bias is None else 'given'}, but the plan was made with "
                             f"has_g_bias={b.has_g_bias}; the gate form is a plan argument")
        got = check_inputs(q, k, v, raw_g, raw_beta, A_log, g_bias, scale, b.lower_bound, b.cu_seqlens,
                           b.chunk_indices, b.chunk_offsets, initial_state, out)
        for what, want, have in (("dtype", b.dtype, q.dtype), ("device", b.device, q.device),
                                 ("shape [B, T, H, K]", self._in_shapes["q"], tuple(q.shape)),
                                 ("V", p.V, got.V)):
            if want != have:
                raise ValueError(f"{OP}: q/v {what} {have} differs from the plan's {want}; make a plan for this batch")
        if state_cache is not None:
            check_state_cache(p, state_cache, b.state_indices, b.has_initial_state, b.device)
        if checkpoint_state is not None:
            check_checkpoint(p, b.device, checkpoint_state, b.checkpoint_offsets, b.checkpoint_state_indices)
        if out is not None:
            no_overlap("out", out, "state_cache", state_cache, "the walk reads and writes it while writing out")
            no_overlap("out", out, "checkpoint_state", checkpoint_state, "the walk writes it while writing out")
        raise AssertionError(f"{OP}: an argument failed the plan's checks but not validate.py's; please report")

    def _check_rows(self, state_cache, checkpoint_state) -> None:
        """Row ranges that depend on the layer's tensors (their row counts), once per count."""
        b = self.batch
        if state_cache is not None and ("state", state_cache.shape[0]) not in self._checked_rows:
            debug_checks.check_state_indices(b.state_indices, state_cache.shape[0])
            self._checked_rows.add(("state", state_cache.shape[0]))
        if checkpoint_state is not None and ("ckpt", checkpoint_state.shape[0]) not in self._checked_rows:
            debug_checks.check_checkpoint_rows(b.checkpoint_offsets, b.checkpoint_state_indices,
                                               checkpoint_state.shape[0])
            self._checked_rows.add(("ckpt", checkpoint_state.shape[0]))


def packed_metadata(p: Problem, chunk: int, device: torch.device, cu_seqlens, chunk_indices, chunk_offsets):
    """cu_seqlens / chunk_indices / chunk_offsets for the packed [1, B*T] view of the batch."""
    from .metadata import prepare_chunk_indices, prepare_chunk_offsets

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


def _launches(program: Program) -> str:
    """Each launch the plan makes and how (Note [Compiled launch]; the HIP launchers are C calls), in order."""
    seen: dict[str, str] = {}
    for state_in in (0, 1, 2):
        for launch in program.launches(state_in):
            if isinstance(launch, KernelLaunch):
                seen.setdefault(launch.abi.name, launch.launcher)
            else:
                seen.setdefault(type(launch).__name__, "one C call")
    return ", ".join(f"{name} ({how})" for name, how in seen.items()) or "none"


def fused_output(v: torch.Tensor, *others: torch.Tensor | None) -> torch.Tensor:
    """Where the fused path writes when the caller passed no `out`: into v, as vLLM's op does (the chunk
    stage has read v before the walk writes), when v is contiguous and shares no memory with a state the
    walk reads or writes; else a new tensor."""
    if v.is_contiguous() and not any(t is not None and may_overlap(v, t) for t in others):
        return v
    return torch.empty(v.shape, dtype=v.dtype, device=v.device)


def _flag_bytes(t: torch.Tensor | None) -> torch.Tensor | None:
    # has_initial_state as the HIP kernels read it: one byte per sequence (a view of the plan's bool copy).
    return t.view(torch.uint8) if t is not None else None
