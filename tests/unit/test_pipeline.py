# SPDX-License-Identifier: Apache-2.0
"""The pipeline choice (pipeline.choose_pipeline), explicit pipelines' errors, describe(), the plan's own
metadata (edits after planning, refresh_metadata) and variant selection by the metadata's chunk size."""

from __future__ import annotations

import os
import types

import pytest
import torch
from hypothesis import given, settings, strategies as st

import kdagen_kernels
from kdagen.runtime import dispatch, pipeline, planning
from kdagen.runtime.metadata import prepare_chunk_indices, prepare_chunk_offsets
from kdagen.runtime.registry import VariantEntry
from tests.kda_cases import make_inputs

NEEDS_INTERPRETER = pytest.mark.skipif(os.environ.get("TRITON_INTERPRET") != "1",
                                       reason="runs the Triton path: set TRITON_INTERPRET=1")
MOD = types.SimpleNamespace(HEAD_DIM_K=128, HEAD_DIM_V=128, BK=128, BV=128)
TUN = {"block_v": 64, "intra_rows": 32, "dense_intra_rows": 16, "dense_intra_warps": 1, "dense_block_v": 128,
       "intra_warps": 2}
SMALL_TRITON = next(e for e in kdagen_kernels.VARIANTS
                    if e.backend == "triton" and (e.dtype, e.head_dim_k, e.head_dim_v) == ("bf16", 64, 64))


def _work(n_seq=1, H=12, chunks=64, lb=-5.0, norm=True, checkpoints=False):
    return pipeline.Work(n_seq=n_seq, H=H, n_chunks=chunks, lower_bound=lb, use_l2norm=norm, checkpoints=checkpoints)


def _fused(sms=132, walk_threads=256, triton=True):
    return pipeline.Target("sm_90", sms, MOD if triton else None, TUN if triton else None, walk_threads,
                           triton_missing="no Triton variant for K=128, V=128", fused=True)


def _last_plan(registry):
    """The plan the wrapper cached last for `registry` (on this thread and stream)."""
    return next(c.plan for key, c in dispatch._last.items() if key[0] == id(registry))


# ---- the automatic choice ------------------------------------------------------------------------

@settings(max_examples=200, deadline=None)
@given(n_seq=st.integers(1, 64), H=st.integers(1, 128), more=st.integers(1, 64), per_seq=st.integers(1, 64),
       sms=st.sampled_from([8, 66, 132, 304]))
def test_more_heads_never_move_from_the_hip_pair_back_to_triton(n_seq, H, more, per_seq, sms):
    chunks = n_seq * per_seq
    a = pipeline.choose_pipeline(_work(n_seq, H, chunks), _fused(sms))
    b = pipeline.choose_pipeline(_work(n_seq, H + more, chunks), _fused(sms))
    if a.name == "hip_intra+hip_walk":
        assert b.name == "hip_intra+hip_walk"
    # Under the rules' model the HIP intra pays exactly where the walks fill half the SMs, or a fifth of them
    # over sequences of 8 chunks or more ...
    assert (a.chunk == "hip_intra") == (2 * n_seq * H >= sms or (5 * n_seq * H >= sms and per_seq >= 8)), a.reason
    if a.chunk == "hip_intra" and 2 * n_seq * H < sms:
        assert f"sequences averaging {per_seq:.1f} chunks" in a.reason, a.reason
    # ... and hip_walk after it where sequences average at least 1.5 chunks (else the grouped triton_walk), unless
    # the cost model's split of the Triton walk beats kda_walk_kernel.
    if a.chunk == "hip_intra":
        split = a.groups > 1 and "which has no split" in a.reason
        assert a.walk == ("hip_walk" if per_seq >= 1.5 and not split else "triton_walk"), a.reason


def test_one_long_sequence_of_32_heads_takes_the_hip_intra_and_the_grouped_triton_walk():
    # H100, 2026-12-07: 32 heads over one sequence of 4096 / 16384 / 65536 tokens, hip_intra + triton_walk at G=3
    # 0.426 / 1.528 / 5.875 ms against the Triton pipeline's 0.455 / 1.638 / 6.355.
    for tokens in (4096, 16384, 65536):
        p = pipeline.choose_pipeline(_work(1, 32, tokens // 64), _fused())
        assert p.name == "hip_intra+triton_walk" and p.groups == 3, p.reason
        assert "sequences averaging" in p.reason and "which has no split" in p.reason, p.reason
    # 12 heads stay on the Triton pipeline (16384 tokens: 0.738 ms against hip_intra's 0.750), and so do 32 heads
    # over short sequences.
    assert pipeline.choose_pipeline(_work(1, 12, 256), _fused()).chunk == "triton_intra"
    assert pipeline.choose_pipeline(_work(8, 4, 56), _fused()).chunk == "triton_intra"


def test_a_long_ragged_batch_splits_the_triton_walk_after_the_hip_intra():
    # The sweep's H=6 N=8 batch, longest sequence 13,732 tokens (215 chunks) of 37,952: kda_walk_kernel walks the
    # longest alone (1.26 ms); hip_intra + triton_walk at G=6 took 0.90 ms, at G=1 1.59.
    ragged = pipeline.Work(n_seq=8, H=6, n_chunks=597, lower_bound=-5.0, use_l2norm=True, checkpoints=False,
                           max_seq_chunks=215)
    p = pipeline.choose_pipeline(ragged, _fused())
    assert p.name == "hip_intra+triton_walk" and p.groups >= 3 and "which has no split" in p.reason, p.reason
    # The same tokens in equal sequences keep every program busy: no split pays over kda_walk_kernel.
    even = pipeline.Work(n_seq=8, H=6, n_chunks=597, lower_bound=-5.0, use_l2norm=True, checkpoints=False,
                         max_seq_chunks=75)
    assert pipeline.choose_pipeline(even, _fused()).name == "hip_intra+hip_walk"


def test_a_split_of_a_few_step_walk_does_not_pay_its_launches():
    # The sweep's H=2 N=23 batch, longest sequence 19 chunks of 106: G=1 0.088 ms, G=4 0.125. Its busy programs
    # are few, so without split_step's fixed cost the model would split it.
    from kdagen.runtime.group_scan import choose_groups

    work = pipeline.Work(n_seq=23, H=2, n_chunks=106, lower_bound=None, use_l2norm=False, checkpoints=False,
                         max_seq_chunks=19)
    r = pipeline.H200_RULES
    assert pipeline.choose_pipeline(work, pipeline.Target("sm_90", 132, MOD, TUN, None)).groups == 1
    assert choose_groups(23, 2, 106, 128, 128, 64, 132, r.walk_programs_per_sm, pass1_step=r.pass1_step,
                         scan_step=r.scan_step, split_step=0.0, longest=19) > 1


def test_short_sequences_walk_on_triton_after_the_hip_intra():
    # 150 sequences of one chunk each at H = 21 (the sweep: 0.201 ms against the HIP pair's 0.259).
    p = pipeline.choose_pipeline(_work(150, 21, 150), _fused())
    assert p.name == "hip_intra+triton_walk" and "average 1.00 chunks" in p.reason, p.reason
    assert pipeline.choose_pipeline(_work(150, 21, 300), _fused()).name == "hip_intra+hip_walk"
    # Without a Triton variant to walk on, the HIP pair still serves them.
    assert pipeline.choose_pipeline(_work(150, 21, 150), _fused(triton=False)).name == "hip_intra+hip_walk"


@settings(max_examples=200, deadline=None)
@given(n_seq=st.integers(1, 8), H=st.integers(1, 64), chunks=st.integers(1, 4096), sms=st.sampled_from([66, 132]))
def test_the_group_count_is_the_cost_models_cheapest(n_seq, H, chunks, sms):
    # The Triton walk's group count never costs more than the plain walk under the model it was fitted with.
    from kdagen.runtime.group_scan import choose_groups

    p = pipeline.choose_pipeline(_work(n_seq, H, chunks, lb=None, norm=False),
                                 pipeline.Target("sm_90", sms, MOD, TUN, None))
    assert p.name == "triton_pair+triton_walk"
    r = pipeline.H200_RULES
    # Equal sequences but for the rounding of chunks over them: the busy programs are all of them, nearly.
    busy = n_seq * H * 2 * chunks / (n_seq * -(-chunks // n_seq))
    if busy > r.split_max_fill * sms:
        assert p.groups == 1
    else:
        assert p.groups == choose_groups(n_seq, H, chunks, 128, 128, 64, sms, r.walk_programs_per_sm,
                                         pass1_step=r.pass1_step, scan_step=r.scan_step, split_step=r.split_step)


def test_a_triton_chunk_stage_past_k128_is_the_pair():
    # H200, 96/16384/16, K = V = 256: kda_intra 31.1 ms, kda_prologue + kda_wu 15.1 (tools/time_variants.py).
    wide = types.SimpleNamespace(HEAD_DIM_K=256, HEAD_DIM_V=256, BK=256, BV=256)
    for fused in (False, True):  # the Triton program, and a fused request whose walks fill too little
        t = pipeline.Target("sm_90", 132, wide, TUN, 256 if fused else None, fused=fused)
        p = pipeline.choose_pipeline(_work(1, 4, 64), t)
        assert p.name == "triton_pair+triton_walk" and "K=256 is past the 128" in p.reason, p.reason
    assert pipeline.choose_pipeline(_work(1, 4, 64), pipeline.Target("sm_90", 132, MOD, TUN, None)).chunk == "triton_intra"


def test_the_group_model_sizes_a_ragged_batch_by_its_longest_sequence():
    from kdagen.runtime.group_scan import choose_groups

    # Two short sequences and one of 1500 chunks, 4 heads: the mean (502) hides the walk that ends last.
    mean_only = choose_groups(3, 4, 1504, 128, 128, 64, 132, 2, pass1_step=0.5, scan_step=2.5)
    longest = choose_groups(3, 4, 1504, 128, 128, 64, 132, 2, pass1_step=0.5, scan_step=2.5, longest=1500)
    assert longest > mean_only >= 1
    work = pipeline.Work(n_seq=3, H=4, n_chunks=1504, lower_bound=-5.0, use_l2norm=True, checkpoints=False,
                         max_seq_chunks=1500)
    p = pipeline.choose_pipeline(work, pipeline.Target("sm_90", 132, MOD, TUN, None))
    assert p.groups == longest, p.reason


def test_the_plan_knows_its_longest_sequence_from_the_host_lengths(monkeypatch):
    cu = torch.tensor([0, 10, 1000, 1070], dtype=torch.int32)
    b = types.SimpleNamespace(cu_seqlens=cu, p=types.SimpleNamespace(T=1070))
    assert planning._longest_chunks(b, 64, planning._host_lengths(cu, None)) == 16  # a CPU cu_seqlens: free to read
    assert planning._longest_chunks(types.SimpleNamespace(cu_seqlens=None, p=types.SimpleNamespace(T=130)), 64, None) == 3
    on_device = types.SimpleNamespace(device=types.SimpleNamespace(type="cuda"))
    assert planning._host_lengths(on_device, None) is None  # unknown without a device read: the mean stands in
    assert planning._longest_chunks(types.SimpleNamespace(cu_seqlens=on_device, p=b.p), 64, None) == 0
    assert planning._longest_chunks(b, 64, planning._host_lengths(on_device, cu)) == 16
    # A plan on a ragged batch hands the chooser its longest sequence.
    args = make_inputs([9, 3, 200], 2, 64, 64, torch.bfloat16, "cpu")
    seen = []
    real = pipeline.choose_pipeline
    monkeypatch.setattr(planning, "choose_pipeline",
                        lambda work, *a, **kw: (seen.append(work.max_seq_chunks), real(work, *a, **kw))[1])
    kdagen_kernels.plan_kda_prefill(args["cu_seqlens"], num_heads=2, head_dim_k=64, head_dim_v=64,
                                    lower_bound=None, use_qk_l2norm_in_kernel=True)
    assert seen == [4], seen  # 200 tokens: 4 chunks of 64


def test_a_fused_request_with_a_gate_the_hip_intra_cannot_take_runs_triton():
    for lb, norm in ((-10.0, True), (None, True), (-5.0, False)):
        p = pipeline.choose_pipeline(_work(8, 96, lb=lb, norm=norm), _fused())
        assert p.name == "triton_pair+triton_walk" and "the HIP intra cannot take this batch" in p.reason
    with pytest.raises(ValueError, match="no Triton pipeline for it: no Triton variant for K=128"):
        pipeline.choose_pipeline(_work(lb=-10.0), _fused(triton=False))


def test_a_hip_variant_without_a_triton_variant_runs_triton_free():
    p = pipeline.choose_pipeline(_work(1, 2), _fused(triton=False))
    assert p.name == "hip_intra+hip_walk" and p.knobs == {"intra_rows": 16} and "no Triton pipeline" in p.reason
    with pytest.raises(ValueError, match="triton_walk cannot follow hip_intra here"):
        pipeline.choose_pipeline(_work(1, 2), _fused(walk_threads=0, triton=False))


def test_a_forced_split_takes_the_triton_walk_after_the_hip_intra():
    p = pipeline.choose_pipeline(_work(8, 96), _fused(), groups=3)
    assert (p.name, p.groups) == ("hip_intra+triton_walk", 3) and p.knobs["intra_rows"] == 16


# ---- explicit pipelines --------------------------------------------------------------------------

@pytest.mark.parametrize("asked,target,work,groups,why", [
    ("hip_intra+hip_walk", pipeline.Target("sm_90", 132, MOD, TUN, None, hip_missing="no GPU target"), _work(),
     None, "hip_intra needs the HIP library: no GPU target"),
    ("hip_intra+hip_walk", _fused(), _work(lb=-8.0), None, "hip_intra cannot take this batch: the gate is not"),
    ("triton_intra+triton_walk", _fused(), _work(norm=False), None, "q and k are not L2-normed in kernel"),
    ("triton_pair+hip_walk", _fused(), _work(), None, "hip_walk reads the 16-row walk chunks hip_intra writes"),
    ("hip_intra+hip_walk", _fused(walk_threads=0), _work(), None, "built on the FMA fallback"),
    ("hip_intra+hip_walk", _fused(), _work(), 2, "hip_walk walks each sequence as one group, got groups=2"),
    ("triton_pair+triton_walk", _fused(triton=False), _work(), None, "triton_pair needs a Triton variant"),
    ("hip_intra+triton_walk", _fused(triton=False), _work(), None, "triton_walk needs a Triton variant"),
    ("triton_intra_tb+triton_walk_tb", _fused(), _work(lb=-8.0), None, "triton_intra_tb cannot take this batch"),
    ("triton_intra_tb+triton_walk", _fused(), _work(), None, "triton_intra_tb and triton_walk_tb run only together"),
    ("triton_intra+triton_walk_tb", _fused(), _work(), None, "triton_intra_tb and triton_walk_tb run only together"),
    ("triton_intra_tb+triton_walk_tb", _fused(triton=False), _work(), None, "triton_intra_tb needs a Triton variant"),
], ids=lambda x: x if isinstance(x, str) else None)
def test_an_explicit_pipeline_that_cannot_run_is_an_error(asked, target, work, groups, why):
    with pytest.raises(ValueError, match=f"pipeline={asked.replace('+', '.')} cannot run this batch: .*{why}"):
        pipeline.choose_pipeline(work, target, pipeline=asked, groups=groups)


def test_explicit_pipelines_that_can_run_are_taken_as_asked():
    for asked in ("hip_intra+hip_walk", "hip_intra+triton_walk", "triton_intra+triton_walk", "triton_pair+triton_walk",
                  "triton_intra_tb+triton_walk_tb"):
        p = pipeline.choose_pipeline(_work(1, 2), _fused(), pipeline=asked)
        assert p.name == asked and p.reason.startswith(f"pipeline={asked} was asked for")


@NEEDS_INTERPRETER
def test_an_explicit_hip_pipeline_on_the_cpu_names_what_is_missing():
    args = make_inputs([9, 3], 2, 64, 64, torch.bfloat16, "cpu")
    b = planning.Batch(_problem(args), torch.bfloat16, torch.device("cpu"), -5.0, True, True, args["cu_seqlens"],
                       None, None, None, None, True, None, None)
    with pytest.raises(ValueError, match="pipeline=hip_intra\\+hip_walk cannot run this batch: hip_intra needs the "
                                         "HIP library: no GPU target"):
        planning.make_plan(kdagen_kernels.VARIANTS, b, pipeline="hip_intra+hip_walk")


def _problem(args):
    from kdagen.runtime.validate import Problem

    _, T, H, K = args["q"].shape
    return Problem(1, T, H, K, args["v"].shape[-1], args["cu_seqlens"].numel() - 1)


# ---- describe ------------------------------------------------------------------------------------

@NEEDS_INTERPRETER
def test_describe_names_the_stages_groups_knobs_and_why():
    args = make_inputs([9, 3], 2, 64, 64, torch.bfloat16, "cpu")
    plan = kdagen_kernels.plan_kda_prefill(args["cu_seqlens"], num_heads=2, head_dim_k=64, head_dim_v=64,
                                           lower_bound=None, use_qk_l2norm_in_kernel=True)
    text = plan.describe()
    assert "kdagen plan on interpreter: kda_chunk_fwd__triton__bf16__k64_v64_c64" in text
    assert "pipeline: triton_pair+triton_walk, 1 group" in text
    assert "why: the Triton pipeline (use_fused_chunk is False); triton_pair: the gate is not bounded" in text
    assert "one group (no GPU to fill)" in text and "knobs: block_v=" in text and "a new tensor" in text
    assert "stages: kda_prologue + kda_wu on whole chunks (any gate); kda_recurrence reads u" in text
    # The interpreter's plans launch through JITFunction.run (no direct launches without a GPU).
    assert "launches: kda_prologue (jit), kda_wu (jit), kda_recurrence (jit)" in text, text


def test_auto_never_picks_the_tb_pair_and_it_takes_the_intra_knobs():
    # An option until the H200 has timed it; on walks that fill the GPU it takes the dense knobs kda_intra does.
    for sms, fused in ((132, True), (132, False), (8, True)):
        target = _fused(sms) if fused else pipeline.Target("sm_90", sms, MOD, TUN, None)
        assert "_tb" not in pipeline.choose_pipeline(_work(16, 96), target).name
    intra = pipeline.choose_pipeline(_work(16, 96), _fused(), pipeline="triton_intra+triton_walk")
    tb = pipeline.choose_pipeline(_work(16, 96), _fused(), pipeline="triton_intra_tb+triton_walk_tb")
    assert tb.knobs == intra.knobs and tb.knobs["intra_rows"] == 16 and tb.groups == intra.groups
    assert "T diag(beta)" in tb.what and "forms u" in tb.what


# ---- the plan owns its metadata ------------------------------------------------------------------

def _paged_call(lens=(40, 30)):
    args = make_inputs(list(lens), 2, 64, 64, torch.bfloat16, "cpu", h0=False)
    args.pop("initial_state", None)
    cache = torch.zeros(4, 2, 64, 64)
    route = dict(state_indices=torch.tensor([3, 1], dtype=torch.int32), has_initial_state=torch.tensor([False, False]))
    return args, cache, route


@NEEDS_INTERPRETER
def test_edits_to_the_callers_metadata_after_planning_change_nothing():
    args, cache, route = _paged_call()
    cu = args["cu_seqlens"]
    plan = kdagen_kernels.plan_kda_prefill(cu, num_heads=2, head_dim_k=64, head_dim_v=64, lower_bound=-5.0,
                                           has_g_bias=True, use_qk_l2norm_in_kernel=True, **route)
    run = dict(q=args["q"], k=args["k"], v=args["v"], raw_g=args["raw_g"], raw_beta=args["raw_beta"],
               A_log=args["A_log"], g_bias=args["g_bias"])
    o1, _ = plan.run(**run, state_cache=cache)
    want = cache.clone()
    cu[1] = 1000  # would read past q and write past out if a kernel saw it
    route["state_indices"][0] = 0  # would write another sequence's row
    cache2 = torch.zeros_like(cache)
    o2, _ = plan.run(**run, state_cache=cache2)
    assert torch.equal(o1, o2) and torch.equal(cache2, want)


@NEEDS_INTERPRETER
def test_refresh_metadata_copies_new_routing_and_refuses_bad_input_before_copying():
    args, cache, route = _paged_call()
    plan = kdagen_kernels.plan_kda_prefill(args["cu_seqlens"], num_heads=2, head_dim_k=64, head_dim_v=64,
                                           lower_bound=-5.0, has_g_bias=True, use_qk_l2norm_in_kernel=True, **route)
    run = dict(q=args["q"], k=args["k"], v=args["v"], raw_g=args["raw_g"], raw_beta=args["raw_beta"],
               A_log=args["A_log"], g_bias=args["g_bias"])
    plan.run(**run, state_cache=cache)
    first = cache.clone()
    meta = dict(cu_seqlens=args["cu_seqlens"], state_indices=route["state_indices"],
                has_initial_state=route["has_initial_state"])
    with pytest.raises(ValueError, match=r"refresh_metadata: state_indices must be torch.int32 \(2,\)"):
        plan.refresh_metadata(**{**meta, "state_indices": torch.tensor([0, 1, 2], dtype=torch.int32)})
    with pytest.raises(ValueError, match="refresh_metadata: has_initial_state is None, but the plan was made with it"):
        plan.refresh_metadata(**{**meta, "has_initial_state": None})
    with pytest.raises(ValueError, match="a new cu_seqlens needs the new chunk_indices too"):
        plan.refresh_metadata(**meta)
    bad = torch.tensor([0, 50, 60], dtype=torch.int32)  # ends short of T = 70: refused, nothing copied
    ci, co = prepare_chunk_indices(bad, 64), prepare_chunk_offsets(bad, 64)
    with pytest.raises(ValueError, match="cu_seqlens\\[-1\\] must be T = 70"):
        plan.refresh_metadata(**{**meta, "cu_seqlens": bad}, chunk_indices=ci, chunk_offsets=co)
    assert plan.metadata["cu_seqlens"].tolist() == [0, 40, 70]
    swapped = torch.tensor([0, 2], dtype=torch.int32)
    cu = args["cu_seqlens"]
    plan.refresh_metadata(cu, prepare_chunk_indices(cu, 64), prepare_chunk_offsets(cu, 64), swapped,
                          route["has_initial_state"])
    cache2 = torch.zeros_like(cache)
    plan.run(**run, state_cache=cache2)
    assert torch.equal(cache2[0], first[3]) and torch.equal(cache2[2], first[1]) and not cache2[[1, 3]].any()


# ---- variant selection by the metadata's chunk size ----------------------------------------------

class _Spy:
    """A generated kernel as a plan's launches see it: records its name and grid, writes nothing."""

    def __init__(self, name, calls):
        self.name, self.calls = name, calls

    def __getitem__(self, grid):
        return lambda *a, **kw: self.calls.append((self.name, grid))


def _c32(calls):
    real = SMALL_TRITON.load()
    names = ("kda_prologue", "kda_wu", "kda_intra", "kda_recurrence", "kda_group_scan")
    mod = types.SimpleNamespace(NAME="fake_c32", HEAD_DIM_K=64, HEAD_DIM_V=64, CHUNK_SIZE=32, BK=64, BV=64,
                                TUNING=real.TUNING, **{n: _Spy(n, calls) for n in names})
    entry = VariantEntry(name="fake__triton__bf16__k64_v64_c32", op="kda_chunk_fwd", backend="triton", dtype="bf16",
                         head_dim_k=64, head_dim_v=64, chunk_size=32, targets=("sm_90",), module="fake_c32",
                         spec="specs/fake.yaml:1")
    return entry, mod


@NEEDS_INTERPRETER
@pytest.mark.parametrize("chunk", [32, 64])
def test_chunk_32_metadata_runs_the_chunk_32_variant(monkeypatch, chunk):
    calls = []
    entry, mod = _c32(calls)
    monkeypatch.setitem(planning._loaded, planning.module_key(entry, "interpreter"), mod)
    ran = []
    real_run = pipeline.Program.run
    monkeypatch.setattr(pipeline.Program, "run", lambda self, values, s: (ran.append(self), real_run(self, values, s)
                                                                          if chunk == 32 else None))
    registry = (SMALL_TRITON, entry)
    args = make_inputs([40, 30], 2, 64, 64, torch.bfloat16, "cpu")
    cu = args["cu_seqlens"]
    dispatch.clear_plans()
    dispatch.chunk_kda_prefill(registry, **args, chunk_indices=prepare_chunk_indices(cu, chunk),
                               chunk_offsets=prepare_chunk_offsets(cu, chunk))
    plan = _last_plan(registry)
    dispatch.clear_plans()
    assert plan.entry is (entry if chunk == 32 else SMALL_TRITON)
    if chunk == 32:  # 2 + 1 chunks of 32 tokens, each kda_intra program a whole 32-row chunk
        assert calls[0] == ("kda_intra", (3, 2)) and calls[-1][0] == "kda_recurrence"
    else:
        assert calls == []


def test_the_metadata_chunk_is_read_from_lengths_or_bounds():
    from kdagen.runtime.validate import Problem

    p = Problem(1, 70, 2, 64, 64, 2)
    lens = torch.tensor([40, 30])
    ci = lambda n: torch.zeros(n, 2, dtype=torch.int32)  # noqa: E731
    assert planning.metadata_chunk([64, 32], p, ci(2), None, lens) == 64
    assert planning.metadata_chunk([64, 32], p, ci(3), None, lens) == 32
    assert planning.metadata_chunk([64, 32], p, None, None, lens) == 64  # the plan builds its own: the preference
    long = Problem(1, 4096, 2, 64, 64, 2)  # lengths unknown (device cu_seqlens): the count's bounds tell them apart
    assert planning.metadata_chunk([64, 32], long, ci(65), None, None) == 64
    assert planning.metadata_chunk([64, 32], long, ci(129), None, None) == 32


def test_the_run_path_reads_no_environment(monkeypatch):
    # Settings are read when a plan is made: a malformed override set afterwards never reaches a run.
    ran = []
    monkeypatch.setattr(pipeline.Program, "run", lambda self, values, state_in: ran.append(state_in))
    args = make_inputs([9, 3], 2, 64, 64, torch.bfloat16, "cpu")
    plan = kdagen_kernels.plan_kda_prefill(args["cu_seqlens"], num_heads=2, head_dim_k=64, head_dim_v=64,
                                           lower_bound=-5.0, has_g_bias=True, use_qk_l2norm_in_kernel=True)
    for name in ("KDAGEN_PIPELINE", "KDAGEN_TRITON_GROUPS", "KDAGEN_TRITON_JIT_LAUNCH", "KDAGEN_FUSED_GROUPS"):
        monkeypatch.setenv(name, "not a value")
    plan.run(args["q"], args["k"], args["v"], args["raw_g"], args["raw_beta"], args["A_log"], args["g_bias"],
             initial_state=args["initial_state"])
    assert ran == [1]
    # A plan made now names each malformed variable in turn.
    for name, why in (("KDAGEN_FUSED_GROUPS", " is no longer read"),
                      ("KDAGEN_TRITON_GROUPS", "='not a value': expected an"),
                      ("KDAGEN_TRITON_JIT_LAUNCH", "='not a value': expected 0 or 1"),
                      ("KDAGEN_PIPELINE", "='not a value': expected 'auto' or")):
        with pytest.raises(ValueError, match=name + why):
            kdagen_kernels.plan_kda_prefill(args["cu_seqlens"], num_heads=2, head_dim_k=64, head_dim_v=64,
                                            lower_bound=-5.0, has_g_bias=True, use_qk_l2norm_in_kernel=True)
        monkeypatch.delenv(name)


@NEEDS_INTERPRETER
def test_a_plan_that_built_chunk_metadata_from_cu_seqlens_is_not_refreshable():
    args = make_inputs([40, 30], 2, 64, 64, torch.bfloat16, "cpu")
    cu = args["cu_seqlens"]
    kw = dict(num_heads=2, head_dim_k=64, head_dim_v=64, lower_bound=-5.0, has_g_bias=True,
              use_qk_l2norm_in_kernel=True)
    assert not kdagen_kernels.plan_kda_prefill(cu, **kw).refreshable
    assert kdagen_kernels.plan_kda_prefill(cu, chunk_indices=prepare_chunk_indices(cu, 64),
                                           chunk_offsets=prepare_chunk_offsets(cu, 64), **kw).refreshable
    assert kdagen_kernels.plan_kda_prefill(None, num_tokens=35, batch_size=2, **kw).refreshable
