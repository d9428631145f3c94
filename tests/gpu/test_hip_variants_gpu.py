# SPDX-License-Identifier: Apache-2.0
"""Every hip variant of the registry with the HIP kernels forced (pipeline="hip_intra+hip_walk") on the H200,
against the float64 reference: tests/variant_cases.py's ragged batch (an empty and a one-token sequence, lengths
off the chunk grid, the paged cache with a NaN row behind a false flag and rows it must not touch, a poisoned
`out`), with a spy proving both HIP kernels ran and the plan's library being the named variant's. Tolerances:
tests/tolerances.py (fused-gpu). Then the fused path's guarantees, per variant: strided projections, a checkpoint
and a CUDA-graph replay, each bit for bit against the dense eager run it must equal. A variant is tested here the
moment the spec declares it."""

from __future__ import annotations

import dataclasses
import os

import pytest
import torch

import kdagen_kernels
from kdagen.runtime import dispatch, fused_path, pipeline
from kdagen.runtime.registry import TORCH_DTYPES
from tests.kda_cases import cu_of, graph_replay, make_inputs, poisoned_out
from tests.tolerances import check, check_output, output_terms
from tests.variant_cases import inputs

pytestmark = pytest.mark.skipif(not torch.cuda.is_available() or os.environ.get("TRITON_INTERPRET") == "1",
                                reason="needs a GPU (and not the interpreter)")

HIP_PIPELINE = "hip_intra+hip_walk"
HIP_VARIANTS = [pytest.param(e, id=e.name) for e in kdagen_kernels.VARIANTS if e.backend == "hip"]
# The HIP pair on every batch of the guarantees test (hip_intra at any fill, hip_walk however short the sequences
# and whatever a split of the Triton walk would save).
ALWAYS_HIP = dataclasses.replace(pipeline.H200_RULES, hip_intra_walks_per_sm=0.0, hip_walk_min_seq_chunks=0.0,
                                 hip_walk_step=0.0)
DEV = "cuda"
TOKEN_ARGS = ("q", "k", "v", "raw_g", "raw_beta")


@pytest.mark.parametrize("entry", HIP_VARIANTS)
def test_hip_variant_matches_reference_on_the_gpu(entry, monkeypatch, pipelines_ran):
    run, ref = inputs(entry, -5.0, "cuda", heads=4, scale=4)
    cu = run["cu_seqlens"]
    plan = kdagen_kernels.plan_kda_prefill(
        cu, cu.cpu(), num_heads=4, head_dim_k=entry.head_dim_k, head_dim_v=entry.head_dim_v, dtype=run["q"].dtype,
        device=run["q"].device, lower_bound=-5.0, has_g_bias=True, use_qk_l2norm_in_kernel=True,
        state_indices=run["state_indices"], has_initial_state=run["has_initial_state"], use_fused_chunk=True,
        pipeline=HIP_PIPELINE)
    assert plan.pipeline.name == HIP_PIPELINE and plan.lib is not None, plan.describe()
    assert plan.lib.name == entry.name, f"asked for {entry.name}, the plan's library is {plan.lib.name}"
    launched: list[str] = []
    for cls in (fused_path.HipIntraLaunch, fused_path.HipWalkLaunch, fused_path.HipPairLaunch):
        def spy(self, *a, _call=cls.__call__, _name=cls.__name__, **kw):
            launched.append(_name)
            return _call(self, *a, **kw)
        monkeypatch.setattr(cls, "__call__", spy)
    out = poisoned_out(run["v"])
    o, none = plan.run(run["q"], run["k"], run["v"], run["raw_g"], run["raw_beta"], run["A_log"], run["g_bias"],
                       out=out, state_cache=run["state_cache"])
    torch.cuda.synchronize()
    assert launched == ["HipPairLaunch"], launched  # both kernels in one C call (Note [Pair record])
    assert o is out and none is None
    ref_o, _, terms = output_terms(**ref)
    check_output(f"output of {entry.name}", o.cpu(), ref_o, terms, entry.head_dim_k, ("fused-gpu", entry.dtype, "output"))
    cache, ref_cache = run["state_cache"].cpu(), ref["state_cache"]
    rows = ref["state_indices"].tolist()
    for r in rows:
        check(f"cache row {r} of {entry.name}", cache[r], ref_cache[r], ("fused-gpu", entry.dtype, "final_state"))
    for r in sorted(set(range(cache.shape[0])) - set(rows)):
        assert torch.equal(cache[r], ref_cache[r]), f"cache row {r} outside state_indices changed: {entry.name}"
    pipelines_ran[f"test_hip_variants_gpu: {HIP_PIPELINE} ({entry.name})"] += 1


@pytest.mark.parametrize("entry", HIP_VARIANTS)
def test_hip_variant_keeps_the_fused_paths_guarantees(entry, monkeypatch, pipelines_ran):
    monkeypatch.setattr(pipeline, "rules_for", lambda target: ALWAYS_HIP)
    dispatch.clear_plans()
    dtype, K, V, H = TORCH_DTYPES[entry.dtype], entry.head_dim_k, entry.head_dim_v, 4
    lens = [300, 5, 77, 1]
    args = make_inputs(lens, H, K, V, dtype, DEV, seed=71)

    def call(a: dict, **kw):
        o, s = kdagen_kernels.chunk_kda_prefill(**a, use_fused_chunk=True, **kw)
        torch.cuda.synchronize()
        plan = next(c.plan for key, c in dispatch._last.items() if key[0] == id(kdagen_kernels.VARIANTS))
        assert plan.pipeline.name == HIP_PIPELINE and plan.lib.name == entry.name, plan.describe()
        return o, s

    o_dense, s_dense = call(args, out=poisoned_out(args["v"]))

    # Strided projections: q, k, v as views of one fused buffer, g and beta of one wide projection.
    T = args["q"].shape[1]
    qkv = torch.randn(1, T, H, 2 * K + V + 8, device=DEV).to(dtype)
    proj = torch.randn(1, T, H * K + H + 5, device=DEV).to(dtype)
    views = dict(args, q=qkv[..., :K], k=qkv[..., K:2 * K], v=qkv[..., 2 * K:2 * K + V],
                 raw_g=proj[..., :H * K].unflatten(-1, (H, K)), raw_beta=proj[..., H * K:H * K + H])
    for name in TOKEN_ARGS:
        views[name].copy_(args[name])
        assert not views[name].is_contiguous(), name
    o_views, s_views = call(views, out=poisoned_out(args["v"]))
    assert torch.equal(o_views, o_dense) and torch.equal(s_views, s_dense), f"strided projections: {entry.name}"

    # A checkpoint equals the final state of the prefill cut at its offset (one group: bit for bit). Sequence 1
    # (5 tokens) and 3 (1 token) are shorter than their offsets and write nothing.
    offs, rows = [256, 64, 64, 64], [2, -1, 0, -1]
    ck = torch.full((3, H, V, K), float("nan"), device=DEV)
    o_ck, s_ck = call(args, out=poisoned_out(args["v"]), checkpoint_state=ck,
                      checkpoint_offsets=torch.tensor(offs, dtype=torch.int32, device=DEV),
                      checkpoint_state_indices=torch.tensor(rows, dtype=torch.int32, device=DEV))
    assert torch.equal(o_ck, o_dense) and torch.equal(s_ck, s_dense), f"exporting checkpoints changed {entry.name}"
    keep = [0, 2]
    cu = args["cu_seqlens"].tolist()
    sel = torch.cat([torch.arange(cu[n], cu[n] + offs[n]) for n in keep]).to(DEV)
    cut = {name: (x[:, sel] if name in TOKEN_ARGS else x) for name, x in args.items()}
    cut.update(cu_seqlens=cu_of([offs[n] for n in keep], DEV), initial_state=args["initial_state"][keep].contiguous())
    _, s_cut = call(cut)
    for j, n in enumerate(keep):
        assert torch.equal(ck[rows[n]], s_cut[j]), f"checkpoint of sequence {n}, {entry.name}"
    assert bool(torch.isnan(ck[1]).all()), f"a checkpoint row no sequence names was written: {entry.name}"

    # A CUDA-graph replay equals the eager call.
    ci, co = kdagen_kernels.prepare_chunk_metadata_device(args["cu_seqlens"], args["cu_seqlens"].cpu(), entry.chunk_size)
    meta = {"chunk_indices": ci, "chunk_offsets": co}
    out = poisoned_out(o_dense)
    (_, s_graph), graph = graph_replay(
        lambda: kdagen_kernels.chunk_kda_prefill(**args, use_fused_chunk=True, out=out, **meta), out)
    assert torch.equal(out, o_dense) and torch.equal(s_graph, s_dense), f"graph replay: {entry.name}"
    dispatch.clear_plans()
    pipelines_ran[f"test_hip_variants_gpu guarantees: {HIP_PIPELINE} ({entry.name})"] += 1
