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
from .group_scan import device_sms
from .pipeline import Target, Work, choose_pipeline, parse_pipeline
from .plan import Batch, KdaPrefillPlan, packed_metadata
from .plan_metadata import PlanMetadata
from .registry import DTYPE_NAMES, NoVariantError, VariantEntry, chunk_sizes, select_variant
from .settings import PIPELINE_ENV, read_settings
from .triton_path import tuning_for
from .validate import (INDEX_DTYPES, IO_DTYPES, OP, Problem, check_batch_metadata, check_checkpoint_routing,
                       check_flags, check_gate_form, check_state_routing, fail, tensor)
from ..targets import refused_config, vendor_of

log = logging.getLogger("kdagen")

_loaded: dict[str, ModuleType] = {}
# design= of earlier releases, as the pipeline it names.
DESIGN_PIPELINES = {"intra": "triton_intra+triton_walk", "pair": "triton_pair+triton_walk"}


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


def metadata_chunk(sizes: list[int], p: Problem, chunk_indices: torch.Tensor | None,
                   chunk_offsets: torch.Tensor | None, lens: torch.Tensor | None) -> int:
    """The chunk size the caller's metadata counts, among `sizes` (preference order; the first when it cannot
    tell, or when no metadata was passed and the plan builds its own).

    With the sequence lengths on the host (`lens`) the chunk count of each size is exact; without them the
    count of N sequences of T tokens in all lies in [ceil(T / c), (T + N (c - 1)) // c], which tells the sizes
    apart wherever the batch is long against its sequence count. No device value is read."""
    if len(sizes) == 1:
        return sizes[0]
    if chunk_indices is not None:
        n = chunk_indices.shape[0] if chunk_indices.numel() else 0
    elif chunk_offsets is not None and chunk_offsets.device.type == "cpu":
        n = int(chunk_offsets[-1])
    else:
        return sizes[0]
    if lens is not None:
        fits = [c for c in sizes if int(((lens + (c - 1)) // c).sum()) == n]
    else:
        T = p.B * p.T
        fits = [c for c in sizes if -(-T // c) <= n <= (T + p.N * (c - 1)) // c]
    return fits[0] if fits else sizes[0]


def make_plan(variants: tuple[VariantEntry, ...], b: Batch, *, use_fused_chunk: bool = False,
              groups: int | None = None, workspace: torch.Tensor | None = None,
              tuning: Mapping[str, int] | None = None, cu_seqlens_cpu: torch.Tensor | None = None,
              decision: fused_choice.FusedDecision | None = None, design: str | None = None,
              chunk_size: int | None = None, pipeline: str | None = None) -> KdaPrefillPlan:
    """A plan from batch arguments validate.py has checked: picks the variant (chunk_size, or the one the
    metadata counts) and the pipeline (Note [Pipelines]), runs the data-dependent checks it can, builds the
    fused library on first use, copies the metadata it validated. Nothing the caller owns is written.

    pipeline: None / "auto" (choose_pipeline decides) or "<chunk>+<walk>"; design: "intra" / "pair", the
    Triton pipelines of earlier releases' design=. KDAGEN_PIPELINE / KDAGEN_TRITON_GROUPS set pipeline /
    groups for experiments when the caller leaves them None."""
    p, device = b.p, b.device
    check_interpreter_mode(device)
    settings = read_settings()
    source = "pipeline"
    if design is not None:
        if design not in DESIGN_PIPELINES:
            raise ValueError(f"{OP}: design={design!r}; use one of {', '.join(DESIGN_PIPELINES)}, or leave it unset "
                             "for the plan's choice")
        if pipeline is not None and pipeline != "auto":
            raise ValueError(f"{OP}: design={design!r} and pipeline={pipeline!r} both given; pass one")
        pipeline = DESIGN_PIPELINES[design]
    if pipeline is None and settings.pipeline is not None:
        pipeline, source = settings.pipeline, PIPELINE_ENV
    asked = parse_pipeline(pipeline, source)
    if groups is None:
        groups = settings.groups
    target = target_of(device)
    sizes = chunk_sizes(variants, head_dim_k=p.K, head_dim_v=p.V, dtype=b.dtype, target=target)
    if not sizes:  # nothing generated for these dims here: select_variant says what is and how to add it
        select_variant(variants, backend="triton", head_dim_k=p.K, head_dim_v=p.V, dtype=b.dtype, target=target)
    lens = _host_lengths(b.cu_seqlens, cu_seqlens_cpu)  # None: only the device holds them
    if chunk_size is None:
        chunk = metadata_chunk(sizes, p, b.chunk_indices, b.chunk_offsets, lens)
    else:
        if chunk_size not in sizes:
            fail("chunk_size", f"one of the chunk sizes generated for K={p.K}, V={p.V}, "
                 f"dtype={DTYPE_NAMES.get(b.dtype, b.dtype)} ({', '.join(map(str, sizes)) or 'none'})", chunk_size,
                 "Add a variant of that chunk size to the spec and regenerate, or pass chunk_size=None")
        chunk = chunk_size
    data_checks = debug_checks.should_check(device)
    meta_args = dict(cu_seqlens=b.cu_seqlens, cu_seqlens_cpu=cu_seqlens_cpu, chunk_indices=b.chunk_indices,
                     chunk_offsets=b.chunk_offsets, checkpoint_offsets=b.checkpoint_offsets)
    debug_checks.check_batch(p, chunk, device, **meta_args)

    # The Triton variant of the batch's chunk size, if the registry has one.
    entry = mod = None
    triton_missing = ""
    try:
        entry = select_variant(variants, backend="triton", head_dim_k=p.K, head_dim_v=p.V, dtype=b.dtype,
                               target=target, chunk_size=chunk)
    except NoVariantError as exc:
        triton_missing = str(exc)

    # The HIP library: for a fused request whose preconditions hold, or an explicit pipeline with a HIP stage.
    if decision is None:
        decision = fused_choice.decide_fused(
            variants, use_fused_chunk=use_fused_chunk, use_qk_l2norm_in_kernel=b.use_qk_l2norm,
            cu_seqlens_given=b.cu_seqlens is not None, lower_bound_given=b.lower_bound is not None,
            g_bias_given=b.has_g_bias, head_dim_k=p.K, head_dim_v=p.V, dtype=b.dtype,
            target=fused_choice.fused_target(device) if use_fused_chunk else None)
    why_not = decision.why_not
    hip_entry, hip_target = decision.entry, decision.target
    if hip_entry is not None and hip_entry.chunk_size != chunk:
        why_not = (f"the metadata counts {chunk}-token chunks; the fused kernels take {hip_entry.chunk_size}",)
        hip_entry = None
    wants_hip = asked is not None and "hip" in "".join(asked)
    hip_missing = "; ".join(why_not) or "use_fused_chunk is False"
    if wants_hip and hip_entry is None:
        hip_target = fused_choice.fused_target(device)
        hip_entry = None if hip_target is None else fused_choice.fused_variant(
            variants, p.K, p.V, b.dtype, chunk, hip_target)
        hip_missing = ("no GPU target (CPU tensors or the Triton interpreter)" if hip_target is None else
                       f"no generated hip variant for K={p.K}, V={p.V}, dtype={DTYPE_NAMES.get(b.dtype, b.dtype)}, "
                       f"chunk {chunk} on {hip_target}" if hip_entry is None else "")
    lib = None
    if hip_entry is not None and (wants_hip or (asked is None and use_fused_chunk)):
        assert hip_target is not None
        if asked is None:
            lib = fused_choice.fused_library(hip_entry, hip_target)  # warns once when the compiler is missing
            hip_missing = "its compiler is missing (see the warning)" if lib is None else ""
        else:
            lib, why = fused_choice.built_library(hip_entry, hip_target)
            hip_missing = why or ""
    if use_fused_chunk and lib is None:
        log.debug("kdagen: use_fused_chunk=True runs the Triton path: %s", hip_missing)
    if entry is None and lib is None:
        raise NoVariantError(triton_missing)
    plan_target = hip_target if lib is not None else target
    assert plan_target is not None
    if entry is not None:
        mod = _module(entry, plan_target)
    tun = (dict(tuning) if tuning is not None else tuning_for(mod, plan_target)) if mod is not None else None
    if tun is not None and (why := refused_config(plan_target, tun)) is not None:
        raise ValueError(f"{OP}: tuning {tun} refused on {plan_target}: {why}")

    meta = _own_metadata(b, chunk, cu_seqlens_cpu)
    ci = meta["chunk_indices"]
    work = Work(n_seq=p.N, H=p.H, n_chunks=ci.shape[0] if ci.numel() else 0, lower_bound=b.lower_bound,
                use_l2norm=b.use_qk_l2norm, checkpoints=b.checkpoint_offsets is not None,
                max_seq_chunks=_longest_chunks(b, chunk, lens))
    facts = Target(name=plan_target, sms=device_sms(device), triton=mod, tuning=tun,
                   hip_walk_threads=lib.walk_threads if lib is not None else None, hip_missing=hip_missing,
                   triton_missing=triton_missing, fused=use_fused_chunk and hip_entry is not None,
                   fused_why_not=why_not if use_fused_chunk else ())
    try:
        chosen = choose_pipeline(work, facts, pipeline=pipeline, groups=groups)
    except ValueError as exc:
        raise ValueError(f"{OP}: {exc}" if source == "pipeline" else f"{OP}: {PIPELINE_ENV}: {exc}") from None
    if tun is not None and (why := refused_config(plan_target, chosen.knobs)) is not None:
        raise ValueError(f"{OP}: tuning {chosen.knobs} (its dense_* knobs: the walks fill the GPU) refused on "
                         f"{plan_target}: {why}")
    direct = (not interpreting() and device.type == "cuda" and vendor_of(plan_target) == "nvidia"
              and not settings.jit_launch)  # Note [Compiled launch]
    owned = Batch(**{**{f: getattr(b, f) for f in b.__dataclass_fields__},
                     **{n: meta[n] for n in ("cu_seqlens", "chunk_indices", "chunk_offsets", "state_indices",
                                              "has_initial_state", "checkpoint_offsets", "checkpoint_state_indices")
                        if getattr(b, n) is not None}})
    plan_entry = entry if entry is not None else hip_entry
    assert plan_entry is not None
    return KdaPrefillPlan(owned, entry=plan_entry, target=plan_target, mod=mod, lib=lib, pipeline=chosen,
                          tuning=tun, meta=meta, workspace=workspace, data_checks=data_checks,
                          into_v=use_fused_chunk and lib is not None, sms=facts.sms, direct=direct,
                          check_meta=lambda m: debug_checks.check_batch(
                              p, chunk, device, cu_seqlens=m["cu_seqlens"], chunk_indices=m["chunk_indices"],
                              chunk_offsets=m["chunk_offsets"], checkpoint_offsets=m["checkpoint_offsets"]))


def _host_lengths(cu_seqlens: torch.Tensor | None, cu_seqlens_cpu: torch.Tensor | None) -> torch.Tensor | None:
    """The sequence lengths where they are free to read (a CPU cu_seqlens or cu_seqlens_cpu), else None."""
    host = cu_seqlens_cpu if cu_seqlens_cpu is not None else cu_seqlens
    if host is None or host.device.type != "cpu":
        return None
    host = host.to(torch.int64)
    return host[1:] - host[:-1]


def _longest_chunks(b: Batch, chunk: int, lens: torch.Tensor | None) -> int:
    """The longest sequence's chunks, where the host knows it without reading the device (0 otherwise); `lens`:
    _host_lengths'."""
    if b.cu_seqlens is None:
        return -(-b.p.T // chunk)
    return -(-int(lens.max()) // chunk) if lens is not None and lens.numel() else 0


def _own_metadata(b: Batch, chunk: int, cu_seqlens_cpu: torch.Tensor | None) -> PlanMetadata:
    """The plan's copies of the batch's metadata and routing (Note [Plan metadata]): the caller's cu_seqlens
    uploaded from cu_seqlens_cpu where given, chunk metadata the plan builds from its own cu_seqlens."""
    caller = dict(cu_seqlens=b.cu_seqlens, chunk_indices=b.chunk_indices, chunk_offsets=b.chunk_offsets,
                  state_indices=b.state_indices, has_initial_state=b.has_initial_state,
                  checkpoint_offsets=b.checkpoint_offsets, checkpoint_state_indices=b.checkpoint_state_indices)
    host = {"cu_seqlens": cu_seqlens_cpu} if cu_seqlens_cpu is not None and b.cu_seqlens is not None else {}
    built: dict[str, torch.Tensor] = {}
    if b.cu_seqlens is None or b.chunk_indices is None or b.chunk_offsets is None:
        own_cu = None
        if b.cu_seqlens is not None:
            own_cu = torch.empty(b.cu_seqlens.shape, dtype=b.cu_seqlens.dtype, device=b.device)
            own_cu.copy_(host.get("cu_seqlens", b.cu_seqlens))
            built["cu_seqlens"] = own_cu
        cu, ci, co = packed_metadata(b.p, chunk, b.device, own_cu, b.chunk_indices, b.chunk_offsets)
        built.update({n: t for n, t, mine in (("cu_seqlens", cu, b.cu_seqlens is None),
                                               ("chunk_indices", ci, b.chunk_indices is None),
                                               ("chunk_offsets", co, b.chunk_offsets is None)) if mine})
    return PlanMetadata(b.device, caller, built, host)


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
    return make_plan(variants, b, use_fused_chunk=use_fused_chunk, groups=groups, workspace=workspace,
                     tuning=tuning, cu_seqlens_cpu=cu_seqlens_cpu, design=design, chunk_size=chunk_size,
                     pipeline=pipeline)
