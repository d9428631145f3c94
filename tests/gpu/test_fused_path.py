# SPDX-License-Identifier: Apache-2.0
"""The fused HIP path on a real GPU, through the public `kdagen_kernels.chunk_kda_prefill(...,
use_fused_chunk=True)`: numerics against the float64 reference and the Triton path, T = 0 sequences,
the state cache in place, checkpoints, strided `out` / projections, the Triton walk's group counts after the
HIP intra and CUDA graph capture. Tolerances: tests/kda_cases.py.

Skips without CUDA, on a device target no hip variant declares, and without the compiler the target
needs (the public call would then run the Triton path with a warning, which proves nothing here).
Every public fused call asserts that a fused plan ran, and that it launched the HIP kda_intra_kernel where the
gate is one kda_intra takes (Note [Pipelines]); a gate it cannot take runs the Triton pipeline.
"""

from __future__ import annotations

import dataclasses
import os
import re

import pytest
import torch

if not torch.cuda.is_available():
    pytest.skip("no GPU", allow_module_level=True)

import kdagen_kernels
from kdagen.reference import chunk_kda_prefill_reference, rel_l2
from kdagen.runtime import dispatch, fused_path, pipeline
from kdagen.runtime import plan as plan_mod
from kdagen.runtime.device import target_of
from kdagen.runtime.pipeline import intra_fits
from kdagen.runtime.settings import GROUPS_ENV
from tests.kda_cases import cu_of, graph_replay, make_inputs, poisoned_out
from tests.tolerances import check, within

DEV = "cuda"
BF16 = torch.bfloat16
NAN = float("nan")
H = 12
TARGET = target_of(torch.device("cuda", torch.cuda.current_device()))
TOKEN_ARGS = ("q", "k", "v", "raw_g", "raw_beta")
OUT, STATE, ADVERSARIAL = (("fused-gpu", "bf16", q) for q in ("output", "final_state", "adversarial"))
SEQLENS = [[1], [64], [1024], [4096], [513, 64, 1, 1200], [512] * 6]
# The HIP pair on every batch: hip_intra at any fill, hip_walk however short the sequences and whatever a split
# of the Triton walk would save.
ALWAYS_HIP_INTRA = dataclasses.replace(pipeline.H200_RULES, hip_intra_walks_per_sm=0.0,
                                       hip_walk_min_seq_chunks=0.0, hip_walk_step=0.0)

if not any(e.backend == "hip" and TARGET in e.targets for e in kdagen_kernels.VARIANTS):
    pytest.skip(f"no generated hip variant declares this device's target {TARGET}", allow_module_level=True)


@pytest.fixture(autouse=True)
def fused_runs(libs, monkeypatch):
    """Counts the runs of fused plans made by the dispatcher (and requires the libraries), and the HIP
    kda_intra_kernel launches among them (Note [Fused plans]): a bounded gate kda_intra takes must launch it."""
    calls: list[str] = []
    real_run, real_intra, real_walk, real_pair = (plan_mod.KdaPrefillPlan.run, fused_path.HipIntraLaunch.__call__,
                                                  fused_path.HipWalkLaunch.__call__, fused_path.HipPairLaunch.__call__)

    def run(self, *a, **kw):
        if self.path == "fused":
            calls.append("plan")
        return real_run(self, *a, **kw)

    def intra(self, *a, **kw):
        calls.append("hip_intra")
        return real_intra(self, *a, **kw)

    def walk(self, *a, **kw):
        calls.append("hip_walk")
        return real_walk(self, *a, **kw)

    def pair(self, *a, **kw):  # both kernels, one C call
        calls.extend(("hip_intra", "hip_walk"))
        return real_pair(self, *a, **kw)

    monkeypatch.setattr(plan_mod.KdaPrefillPlan, "run", run)
    monkeypatch.setattr(fused_path.HipPairLaunch, "__call__", pair)
    monkeypatch.setattr(fused_path.HipIntraLaunch, "__call__", intra)
    monkeypatch.setattr(fused_path.HipWalkLaunch, "__call__", walk)
    # Every fused plan here takes the HIP kernel, whatever the walks fill (pipeline.RULES): these are its
    # tests. test_fused_plan_below_half_the_gpu_is_the_triton_program checks the rule itself.
    monkeypatch.setattr(pipeline, "rules_for", lambda target: ALWAYS_HIP_INTRA)
    dispatch.clear_plans()
    yield calls
    dispatch.clear_plans()


def _fused(fused_runs, args, **kw):
    """The public call with use_fused_chunk=True; asserts the fused path ran."""
    before = len(fused_runs)
    o, s = kdagen_kernels.chunk_kda_prefill(**args, use_fused_chunk=True, **kw)
    torch.cuda.synchronize()
    ran = fused_runs[before:]
    assert ran[:1] == ["plan"], "use_fused_chunk=True did not run the fused path"
    # Note [Pipelines]: kda_intra's gate takes the HIP kernel when there is a chunk to compute (and the
    # fixture's rule holds).
    if (intra_fits(args["lower_bound"], True) is None and int(args["cu_seqlens"][-1]) > 0
            and pipeline.rules_for(TARGET) is ALWAYS_HIP_INTRA):
        assert "hip_intra" in ran, "the fused plan did not launch kda_intra_kernel"
        if os.environ.get(GROUPS_ENV, "1") == "1":
            assert "hip_walk" in ran, "the fused plan did not launch kda_walk_kernel after kda_intra_kernel"
    return o, s


def _triton(args, **kw):
    o, s = kdagen_kernels.chunk_kda_prefill(**args, use_fused_chunk=False, **kw)
    torch.cuda.synchronize()
    return o, s


def _truncated(args, offs: list[int], keep: list[int]) -> dict:
    """args for the prefill of sequences `keep`, each cut after offs[n] tokens (same initial states)."""
    cu = args["cu_seqlens"].tolist()
    sel = torch.cat([torch.arange(cu[n], cu[n] + offs[n]) for n in keep]).to(DEV)
    t = {name: (x[:, sel] if name in TOKEN_ARGS else x) for name, x in args.items()}
    t["cu_seqlens"] = cu_of([offs[n] for n in keep], DEV)
    t["initial_state"] = args["initial_state"][keep].contiguous()
    return t


def _ids(lens):
    return "x".join(map(str, lens[:4])) + ("..." if len(lens) > 4 else "")


def _last_plan(registry):
    """The plan the wrapper cached last for `registry` (on this thread and stream)."""
    return next(c.plan for key, c in dispatch._last.items() if key[0] == id(registry))


# ---- numerics ------------------------------------------------------------------------------------



def test_can_use_fused_on_this_device():
    dtypes = {"bf16": BF16, "fp16": torch.float16}
    for e in kdagen_kernels.VARIANTS:
        if e.backend == "hip":
            assert kdagen_kernels.can_use_fused_kda_chunk(e.head_dim_k, e.head_dim_v, dtypes[e.dtype], 64), e.name
    assert not kdagen_kernels.can_use_fused_kda_chunk(64, 64, torch.float16, 64)  # no such hip variant
    assert not kdagen_kernels.can_use_fused_kda_chunk(128, 128, BF16, 32)


@pytest.mark.parametrize("K,V,lens", [(128, 128, L) for L in SEQLENS] + [(128, 256, [513, 64, 1, 200])],
                         ids=[_ids(L) for L in SEQLENS] + ["v256"])
def test_fused_matches_reference_and_triton(fused_runs, K, V, lens):
    args = make_inputs(lens, H, K, V, BF16, DEV, seed=100 + len(lens) + sum(lens))
    ref_o, ref_s = chunk_kda_prefill_reference(**args)
    o, s = _fused(fused_runs, args, out=poisoned_out(args["v"]))
    eo = check("fused output", o, ref_o, OUT)
    es = check("fused final state", s, ref_s, STATE)
    to, ts = _triton(args, out=poisoned_out(args["v"]))
    within("fused vs Triton output", rel_l2(o, to), ("fused-gpu", "bf16", "vs_triton"))
    within("fused vs Triton final state", rel_l2(s, ts), ("fused-gpu", "bf16", "vs_triton"))
    print(f"\n  fused K={K} V={V} {lens[:4]}: rel L2 output {eo:.2e}, state {es:.2e}", end="")


def test_a_bound_kda_intra_cannot_take_runs_the_triton_pipeline(fused_runs):
    """lower_bound -10 is past kda_intra's factor range (Note [Pipelines]): the fused request runs the Triton
    pipeline (triton_pair + triton_walk), against the reference, and bit for bit the Triton path's result."""
    args = make_inputs([513, 64, 1, 200], H, 128, 128, BF16, DEV, lower_bound=-10.0, seed=17)
    ref_o, ref_s = chunk_kda_prefill_reference(**args)
    before = len(fused_runs)
    o, s = _fused(fused_runs, args, out=poisoned_out(args["v"]))
    assert fused_runs[before:] == ["plan"]
    plan = _last_plan(kdagen_kernels.VARIANTS)
    assert plan.pipeline.name == "triton_pair+triton_walk" and "the HIP intra cannot take" in plan.describe()
    check("fused output (Triton pipeline)", o, ref_o, OUT)
    check("fused final state (Triton pipeline)", s, ref_s, STATE)
    to, ts = _triton(args, out=poisoned_out(args["v"]))
    assert torch.equal(o, to) and torch.equal(s, ts)


def test_fused_plan_below_half_the_gpu_is_the_triton_program(fused_runs, monkeypatch):
    """The H200's rule: 12 heads on one sequence fill less than half the SMs, so the fused plan is the Triton
    program at the Triton path's own knobs (bit for bit the Triton path's result); 12 heads on 16 sequences
    take the HIP kernel."""
    monkeypatch.setattr(pipeline, "rules_for", lambda target: pipeline.H200_RULES)
    one = make_inputs([700], H, 128, 128, BF16, DEV, seed=21)
    o, s = _fused(fused_runs, one, out=poisoned_out(one["v"]))
    assert "hip_intra" not in fused_runs
    to, ts = _triton(one, out=poisoned_out(one["v"]))
    assert torch.equal(o, to) and torch.equal(s, ts)
    many = make_inputs([64] * 16, H, 128, 128, BF16, DEV, seed=22)
    _fused(fused_runs, many, out=poisoned_out(many["v"]))
    assert "hip_intra" in fused_runs


def test_zero_length_sequences_in_a_ragged_batch(fused_runs):
    args = make_inputs([100, 0, 70, 0, 1], H, 128, 128, BF16, DEV, seed=31)
    ref_o, ref_s = chunk_kda_prefill_reference(**args)
    o, s = _fused(fused_runs, args, out=poisoned_out(args["v"]))
    check("output", o, ref_o, OUT)
    check("final state", s, ref_s, STATE)
    for n in (1, 3):  # a T = 0 sequence passes its initial state through unchanged
        assert torch.equal(s[n], args["initial_state"][n])
    _, s0 = _fused(fused_runs, dict(args, initial_state=None), out=poisoned_out(args["v"]))
    assert torch.count_nonzero(s0[1]) == 0 and torch.count_nonzero(s0[3]) == 0


def test_softplus_gate_runs_triton(fused_runs):
    args = make_inputs([300, 70], H, 128, 128, BF16, DEV, lower_bound=None, seed=32)
    ref_o, ref_s = chunk_kda_prefill_reference(**args)
    o, s = kdagen_kernels.chunk_kda_prefill(**args, use_fused_chunk=True, out=poisoned_out(args["v"]))
    torch.cuda.synchronize()
    assert fused_runs == [], "the softplus gate (no lower_bound) must run the Triton path"
    check("output", o, ref_o, OUT)
    check("final state", s, ref_s, STATE)
    # Checkpoints too stay on the Triton path, which writes them (tests/gpu/test_triton_checkpoints.py).
    ck = torch.full((2, H, 128, 128), float("nan"), device=DEV)
    kdagen_kernels.chunk_kda_prefill(**args, use_fused_chunk=True, checkpoint_state=ck,
                                     checkpoint_offsets=torch.tensor([256, 0], dtype=torch.int32, device=DEV))
    torch.cuda.synchronize()
    assert fused_runs == [] and torch.isfinite(ck[0]).all() and torch.isnan(ck[1]).all()


def test_adversarial_regime(fused_runs):
    # Near-duplicate keys, real K3 gate biases in [-7.8, -1.4], beta near 0.95 (raw_beta ~ logit 0.95), T = 1088.
    args = make_inputs([1088], H, 128, 128, BF16, DEV, adversarial=True, seed=5)
    ref_o, ref_s = chunk_kda_prefill_reference(**args)
    o, s = _fused(fused_runs, args, out=poisoned_out(args["v"]))
    eo = check("adversarial output", o, ref_o, ADVERSARIAL)
    es = check("adversarial final state", s, ref_s, ADVERSARIAL)
    print(f"\n  fused adversarial: rel L2 output {eo:.2e}, state {es:.2e}", end="")


# ---- state cache ---------------------------------------------------------------------------------

def test_state_cache_in_place(fused_runs):
    lens = [300, 0, 1, 130, 65]
    args = make_inputs(lens, H, 128, 128, BF16, DEV, h0=False, seed=33)
    slots = 9
    cache = 0.1 * torch.randn(slots, H, 128, 128, device=DEV)
    rows = torch.tensor([7, 0, 3, -1, 5], dtype=torch.int32, device=DEV)  # -1: vLLM's pad slot, skipped
    flags = torch.tensor([True, False, True, True, False], device=DEV)
    cache[0] = NAN  # flag False: never read
    cache[5] = NAN
    before = cache.clone()
    # The reference: rows read where the flag is set and the index is valid; the rest start from zero.
    h0 = torch.zeros(len(lens), H, 128, 128, device=DEV)
    h0[0], h0[2] = before[7], before[3]
    ref_o, ref_s = chunk_kda_prefill_reference(**args, initial_state=h0, output_final_state=True)
    o, s = _fused(fused_runs, args, out=poisoned_out(args["v"]), state_cache=cache, state_indices=rows,
                  has_initial_state=flags)
    assert s is None
    check("state-cache output", o, ref_o, OUT)
    for n, r in ((0, 7), (1, 0), (2, 3), (4, 5)):  # row 0: T = 0 and no initial state, so zeros are written
        check(f"cache row {r}", cache[r], ref_s[n], STATE)
    assert torch.count_nonzero(cache[0]) == 0
    for r in (1, 2, 4, 6, 8):
        assert torch.equal(cache[r], before[r]), f"cache row {r} (not in state_indices) changed"


# ---- checkpoints ---------------------------------------------------------------------------------

def test_checkpoints_bit_identical_to_a_truncated_prefill(fused_runs):
    # hip_intra + hip_walk walks as one group, the only order of operations that is bit-comparable between the
    # full and the truncated prefill.
    lens = [300, 200, 65, 128, 90, 150]
    offs = [128, 192, 64, 128, 100, 64]  # n=3: not below T; n=4: not a chunk multiple; both write nothing
    rows = [6, 0, 3, 1, 2, -1]  # n=5: -1, skipped
    args = make_inputs(lens, H, 128, 128, BF16, DEV, seed=34)
    ck = torch.full((8, H, 128, 128), NAN, device=DEV)
    o_ck, f_ck = _fused(fused_runs, args, out=poisoned_out(args["v"]), checkpoint_state=ck,
                        checkpoint_offsets=torch.tensor(offs, dtype=torch.int32, device=DEV),
                        checkpoint_state_indices=torch.tensor(rows, dtype=torch.int32, device=DEV))
    o_plain, f_plain = _fused(fused_runs, args, out=poisoned_out(args["v"]))
    assert torch.equal(o_ck, o_plain) and torch.equal(f_ck, f_plain), "exporting checkpoints changed the results"
    valid = [0, 1, 2]
    _, f_cut = _fused(fused_runs, _truncated(args, offs, valid))
    for j, n in enumerate(valid):
        assert torch.equal(ck[rows[n]], f_cut[j]), \
            f"checkpoint of sequence {n} (row {rows[n]}): max diff {(ck[rows[n]] - f_cut[j]).abs().max().item():.3e}"
    assert bool(torch.isnan(ck[[1, 2, 4, 5, 7]]).all()), "a checkpoint row that should stay untouched was written"


def test_checkpoints_through_the_public_call(fused_runs, monkeypatch):
    # One group in both calls, so the snapshot and the truncated prefill round alike: bit-identical.
    monkeypatch.setenv(GROUPS_ENV, "1")
    lens = [300, 200, 65, 150]
    offs = [128, 192, 64, 64]
    rows = [3, 0, 5, -1]  # -1: skipped
    args = make_inputs(lens, H, 128, 128, BF16, DEV, seed=35)
    ck = torch.full((6, H, 128, 128), NAN, device=DEV)
    o, s = _fused(fused_runs, args, out=poisoned_out(args["v"]), checkpoint_state=ck,
                  checkpoint_offsets=torch.tensor(offs, dtype=torch.int32, device=DEV),
                  checkpoint_state_indices=torch.tensor(rows, dtype=torch.int32, device=DEV))
    ref_o, ref_s = chunk_kda_prefill_reference(**args)
    check("output with checkpoints", o, ref_o, OUT)
    check("final state with checkpoints", s, ref_s, STATE)
    valid = [0, 1, 2]
    _, s_cut = _fused(fused_runs, _truncated(args, offs, valid))
    for j, n in enumerate(valid):
        assert torch.equal(ck[rows[n]], s_cut[j]), \
            f"checkpoint of sequence {n} (row {rows[n]}) vs the truncated prefill: {rel_l2(ck[rows[n]], s_cut[j]):.2e}"
    assert bool(torch.isnan(ck[[1, 2, 4]]).all()), "a checkpoint row no sequence names was written"


def test_misaligned_checkpoint_offsets_are_refused(fused_runs, monkeypatch):
    monkeypatch.setenv("KDAGEN_DEBUG", "1")  # the offsets' values are checked on the GPU only in debug mode
    args = make_inputs([300, 90], H, 128, 128, BF16, DEV, seed=36)
    out = torch.full_like(args["v"], 7.0)
    ck = torch.full((2, H, 128, 128), 3.0, device=DEV)
    with pytest.raises(ValueError, match=re.escape("checkpoint_offsets[0] must be 0 (no checkpoint) or a positive "
                                                   "multiple of 64 below the sequence's length 300, got 100")):
        kdagen_kernels.chunk_kda_prefill(**args, out=out, use_fused_chunk=True, checkpoint_state=ck,
                                         checkpoint_offsets=torch.tensor([100, 0], dtype=torch.int32, device=DEV))
    torch.cuda.synchronize()
    assert fused_runs == [] and bool((out == 7.0).all()) and bool((ck == 3.0).all())


# ---- output and projections ----------------------------------------------------------------------

def test_out_as_a_strided_view_of_a_larger_buffer(fused_runs):
    args = make_inputs([300, 5, 77], H, 128, 128, BF16, DEV, seed=37)
    T = args["q"].shape[1]
    ref_o, ref_s = chunk_kda_prefill_reference(**args)
    big = torch.full((1, T, H, 160), NAN, dtype=BF16, device=DEV)
    out = big[..., 16:144]
    o, s = _fused(fused_runs, args, out=out)
    assert o.data_ptr() == out.data_ptr()
    check("strided out", o, ref_o, OUT)
    check("final state", s, ref_s, STATE)
    assert torch.isnan(big[..., :16]).all() and torch.isnan(big[..., 144:]).all(), "wrote outside the out view"
    o_dense, _ = _fused(fused_runs, args, out=poisoned_out(args["v"]))
    assert torch.equal(o, o_dense)


def test_out_none_writes_into_a_contiguous_v(fused_runs):
    args = make_inputs([300, 77], H, 128, 128, BF16, DEV, seed=38)
    o_given, s_given = _fused(fused_runs, args, out=poisoned_out(args["v"]))  # v intact
    v = args["v"]
    o, s = _fused(fused_runs, args)  # as vLLM's op: the result lands in v (v is dead after the prologue)
    assert o.data_ptr() == v.data_ptr()
    assert torch.equal(o, o_given) and torch.equal(s, s_given)


def test_strided_projections(fused_runs):
    # raw_g and raw_beta as views of one wide projection [1, T, H*K + H + 5] (built on the device: a
    # strided CPU view moved with .to() arrives contiguous), then raw_beta with a non-unit last stride.
    args = make_inputs([300, 5, 77], H, 128, 128, BF16, DEV, seed=39)
    T, K = args["q"].shape[1], 128
    proj = torch.randn(1, T, H * K + H + 5, device=DEV).to(BF16)
    proj[..., :H * K] = args["raw_g"].flatten(-2)
    proj[..., H * K:H * K + H] = args["raw_beta"]
    views = dict(args, raw_g=proj[..., :H * K].unflatten(-1, (H, K)), raw_beta=proj[..., H * K:H * K + H])
    assert not views["raw_g"].is_contiguous() and not views["raw_beta"].is_contiguous()
    wide = torch.randn(1, T, 3 * H, device=DEV).to(BF16)
    wide[..., 1::3] = args["raw_beta"]
    ref_o, ref_s = chunk_kda_prefill_reference(**args)
    o_dense, s_dense = _fused(fused_runs, args, out=poisoned_out(args["v"]))
    o, s = _fused(fused_runs, views, out=poisoned_out(args["v"]))
    check("strided projections output", o, ref_o, OUT)
    check("strided projections state", s, ref_s, STATE)
    o_beta, s_beta = _fused(fused_runs, dict(args, raw_beta=wide[..., 1::3]), out=poisoned_out(args["v"]))
    assert torch.equal(o, o_dense) and torch.equal(s, s_dense)
    assert torch.equal(o_beta, o_dense) and torch.equal(s_beta, s_dense)


# ---- group scan ----------------------------------------------------------------------------------

def test_group_counts_match_one_group(fused_runs, monkeypatch):
    # A forced split takes the Triton walk after the HIP intra (hip_walk has no groups).
    lens = [1024, 513, 64, 1]  # 16 + 9 + 1 + 1 = 27 chunks
    args = make_inputs(lens, H, 128, 128, BF16, DEV, seed=40)
    ref_o, ref_s = chunk_kda_prefill_reference(**args)
    o1, s1 = _fused(fused_runs, args, out=poisoned_out(args["v"]))
    for g in (2, 4, 8, 32):  # 32: more groups than chunks (27 in all, 16 in the longest sequence)
        monkeypatch.setenv(GROUPS_ENV, str(g))
        dispatch.clear_plans()  # the variable is read when a plan is made
        og, sg = _fused(fused_runs, args, out=poisoned_out(args["v"]))
        plan = _last_plan(kdagen_kernels.VARIANTS)
        assert (plan.pipeline.name, plan.groups) == ("hip_intra+triton_walk", g)
        # The group operators round differently from the one-pass walk, and each run must still meet the
        # reference tolerance.
        within(f"groups={g} vs groups=1 output", rel_l2(og, o1), ("fused-gpu", "bf16", "vs_one_group"))
        within(f"groups={g} vs groups=1 final state", rel_l2(sg, s1), ("fused-gpu", "bf16", "vs_one_group"))
        check(f"output, groups={g}", og, ref_o, OUT)
        check(f"final state, groups={g}", sg, ref_s, STATE)


# ---- CUDA graphs ---------------------------------------------------------------------------------

def test_graph_capture_equals_eager(fused_runs):
    args = make_inputs([513, 64, 1, 1200], H, 128, 128, BF16, DEV, seed=41)
    ci, co = kdagen_kernels.prepare_chunk_metadata_device(args["cu_seqlens"], args["cu_seqlens"].cpu(), 64)
    meta = {"chunk_indices": ci, "chunk_offsets": co}
    o_eager, s_eager = _fused(fused_runs, args, out=poisoned_out(args["v"]), **meta)
    out = poisoned_out(o_eager)
    (_, s_graph), graph = graph_replay(
        lambda: kdagen_kernels.chunk_kda_prefill(**args, use_fused_chunk=True, out=out, **meta), out)
    assert fused_runs.count("plan") == 3, "the captured call did not take the fused path"
    assert torch.equal(out, o_eager) and torch.equal(s_graph, s_eager)


def test_dispatch_picks_the_fused_variant_for_this_device():
    d = dispatch.decide_fused(kdagen_kernels.VARIANTS, use_fused_chunk=True, use_qk_l2norm_in_kernel=True,
                              cu_seqlens_given=True, lower_bound_given=True, g_bias_given=True, head_dim_k=128,
                              head_dim_v=128, dtype=BF16, target=dispatch.fused_target(torch.device(DEV)))
    assert d.entry is not None and d.entry.backend == "hip" and d.target == TARGET, d.why_not
