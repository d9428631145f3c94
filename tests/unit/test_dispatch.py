# SPDX-License-Identifier: Apache-2.0
"""The generated chunk_kda_prefill: vLLM's op's signature and contract, dispatch decisions and errors.

Errors are raised before any kernel runs, so these tests need neither a GPU nor the interpreter.
"""

from __future__ import annotations

import inspect
import types

import pytest
import torch

import kdagen_kernels
from kdagen.runtime.errors import NoVariantError
from tests.kda_cases import make_inputs

# vLLM's chunk_kda_prefill (vllm.models.kimi_k3.amd.ops.kda_prefill): parameter names, order, defaults.
SEED_PARAMS = [
    ("q", inspect.Parameter.empty), ("k", inspect.Parameter.empty), ("v", inspect.Parameter.empty),
    ("raw_g", inspect.Parameter.empty), ("raw_beta", inspect.Parameter.empty), ("A_log", inspect.Parameter.empty),
    ("g_bias", None), ("scale", None), ("initial_state", None), ("output_final_state", False),
    ("lower_bound", None), ("use_qk_l2norm_in_kernel", False), ("cu_seqlens", None),
    ("chunk_indices", None), ("chunk_offsets", None), ("use_fused_chunk", False), ("out", None),
    ("checkpoint_state", None), ("checkpoint_offsets", None), ("checkpoint_state_indices", None),
    ("state_cache", None), ("state_indices", None), ("has_initial_state", None),
]


def test_signature_is_the_seeds():
    sig = inspect.signature(kdagen_kernels.chunk_kda_prefill)
    got = [(p.name, p.default) for p in sig.parameters.values()]
    assert got == SEED_PARAMS
    assert all(p.kind is inspect.Parameter.POSITIONAL_OR_KEYWORD for p in sig.parameters.values())
    assert sig.return_annotation == "tuple[torch.Tensor, torch.Tensor | None]"


def test_metadata_helper_signatures_are_the_seeds():
    assert list(inspect.signature(kdagen_kernels.prepare_chunk_metadata_device).parameters) == [
        "cu_seqlens", "cu_seqlens_cpu", "chunk_size"]
    assert list(inspect.signature(kdagen_kernels.build_conv1d_chunk_schedule).parameters) == [
        "query_start_loc_cpu", "block_m", "device"]


def _args(**kw):
    e = kdagen_kernels.VARIANTS[0]
    return make_inputs([9, 3], 2, e.head_dim_k, e.head_dim_v, torch.bfloat16, "cpu", **kw)


def test_no_fused_path_without_a_gpu():
    # CPU tests run in the interpreter or without CUDA: the fused path never serves them.
    assert not kdagen_kernels.can_use_fused_kda_chunk(128, 128, torch.bfloat16, 64)
    assert not kdagen_kernels.can_use_fused_kda_chunk(96, 96, torch.float32, 48)


def test_checkpoint_export_runs_on_the_triton_path(monkeypatch):
    # The Triton path writes checkpoints (tests/interp/test_checkpoints.py): a call whose fused path cannot run
    # (CPU tensors) hands them to the walk: checkpoint_state per run, offsets and rows fixed in the plan.
    from kdagen.runtime import pipeline
    from kdagen.runtime.run_values import RUN_ORDER

    runs = []
    monkeypatch.setattr(pipeline.Program, "run",
                        lambda self, values, state_in: runs.append((self, dict(zip(RUN_ORDER, values)))))
    ck = torch.full((3, 2, 128, 128), float("nan"))
    off = torch.tensor([0, 0], dtype=torch.int32)
    rows = torch.tensor([2, -1], dtype=torch.int32)
    kdagen_kernels.chunk_kda_prefill(**_args(), use_fused_chunk=True, checkpoint_state=ck, checkpoint_offsets=off,
                                     checkpoint_state_indices=rows)
    program, values = runs[0]
    assert (values["ckpt"], values["sck_n"], values["n_ckpt_rows"]) == (ck, ck.stride(0), 3)
    (walk,) = program.walks[1]
    assert walk.constexprs["CHECKPOINT"] == 2


def test_checkpoint_state_without_offsets_is_refused():
    with pytest.raises(ValueError, match="without checkpoint_offsets"):
        kdagen_kernels.chunk_kda_prefill(**_args(), checkpoint_state=torch.zeros(2, 2, 128, 128))


@pytest.mark.parametrize("extra", [{"initial_state": "keep"}, {"output_final_state": True}])
def test_state_cache_excludes_dense_state(extra):
    args = _args(h0=False)
    if extra.get("initial_state") == "keep":
        args["initial_state"] = torch.zeros(2, 2, 128, 128)
    else:
        args.update(extra)
    with pytest.raises(ValueError, match="state_cache replaces initial_state/output_final_state"):
        kdagen_kernels.chunk_kda_prefill(**args, state_cache=torch.zeros(4, 2, 128, 128),
                                         state_indices=torch.tensor([0, 1], dtype=torch.int32),
                                         has_initial_state=torch.tensor([True, True]))


def test_state_cache_needs_indices_and_flags():
    with pytest.raises(ValueError, match="state_cache needs state_indices and has_initial_state"):
        kdagen_kernels.chunk_kda_prefill(**_args(h0=False), state_cache=torch.zeros(4, 2, 128, 128))


def test_unknown_head_dims_name_the_spec_to_edit():
    args = make_inputs([9], 2, 96, 96, torch.bfloat16, "cpu")
    with pytest.raises(NoVariantError) as ei:
        kdagen_kernels.chunk_kda_prefill(**args)
    msg = str(ei.value)
    assert "head_dim_k=96" in msg and "specs/kda_chunk_fwd.yaml" in msg and "nox -s generate" in msg


@pytest.mark.parametrize("mutate,exc,needle", [
    (lambda a: a.update(k=a["k"][..., :64]), ValueError, "k must be of shape"),
    (lambda a: a.update(v=a["v"].float()), TypeError, "v must be torch.bfloat16 like q (q, k and v share one I/O dtype"),
    (lambda a: a.update(q=a["q"].float(), k=a["k"].float()), TypeError, "q must be one of"),
    (lambda a: a.update(raw_beta=a["raw_beta"][..., None]), ValueError, "raw_beta must be 3-D"),
    (lambda a: a.update(A_log=a["A_log"][:1]), ValueError, "A_log must be 2 values"),
    (lambda a: a.update(g_bias=a["g_bias"][:5]), ValueError, "g_bias must be 256 values"),
    (lambda a: a.update(cu_seqlens=a["cu_seqlens"].float()), TypeError, "cu_seqlens must be one of"),
    (lambda a: a.update(initial_state=a["initial_state"].transpose(2, 3)[:, :, :64]), ValueError,
     "initial_state must be of shape"),
    (lambda a: a.update(initial_state=a["initial_state"].double()), TypeError, "initial_state must be one of"),
    (lambda a: a.update(lower_bound=0.5), ValueError, "lower_bound must be None or a finite negative"),
    (lambda a: a.update({n: a[n].expand(2, *a[n].shape[1:]) for n in ("q", "k", "v", "raw_g", "raw_beta")}),
     ValueError, "batch size 1 when cu_seqlens"),
    (lambda a: a.update(q=a["q"].transpose(2, 3).contiguous().transpose(2, 3)), ValueError,
     "q must be dense in its last dim"),
    (lambda a: a.update(chunk_indices=torch.zeros(3, 3, dtype=torch.int32)), ValueError, "chunk_indices must be"),
    (lambda a: a.update(q="not a tensor"), TypeError, "q must be a torch.Tensor"),
])
def test_bad_arguments_get_clear_errors(mutate, exc, needle):
    args = _args()
    mutate(args)
    with pytest.raises(exc, match=needle.replace("(", r"\(").replace("[", r"\[")):
        kdagen_kernels.chunk_kda_prefill(**args)


def test_a_rejected_call_writes_nothing():
    args = _args(h0=False)
    out = torch.full_like(args["v"], 7.0)
    cache = torch.randn(4, 2, 128, 128)
    before = cache.clone()
    with pytest.raises(ValueError):
        kdagen_kernels.chunk_kda_prefill(**dict(args, g_bias=args["g_bias"][:3]), out=out, state_cache=cache,
                                         state_indices=torch.tensor([0, 1], dtype=torch.int32),
                                         has_initial_state=torch.tensor([True, False]))
    assert torch.equal(cache, before) and bool((out == 7.0).all())


def test_state_cache_shape_is_checked():
    args = _args(h0=False)
    with pytest.raises(ValueError, match=r"state_cache must be \[slots, 2, 128, 128\]"):
        kdagen_kernels.chunk_kda_prefill(**args, state_cache=torch.zeros(4, 2, 64, 128),
                                         state_indices=torch.tensor([0, 1], dtype=torch.int32),
                                         has_initial_state=torch.tensor([True, False]))


def test_cpu_tensors_without_the_interpreter_are_refused(monkeypatch, set_interpreting):
    set_interpreting(False)
    with pytest.raises(ValueError, match="TRITON_INTERPRET=1"):
        kdagen_kernels.chunk_kda_prefill(**_args())


def test_diagonal_block_mode_follows_the_gate_bound():
    from kdagen.runtime.triton_path import diag_ref

    # 16 rows of decay at |lower_bound| / ln 2 per token must stay a normal fp32 for the factored mode.
    assert [diag_ref(lb) for lb in (-1.0, -5.0, -5.415)] == [2, 2, 2]
    assert [diag_ref(lb) for lb in (-5.42, -8.0, -10.0)] == [1, 1, 1]
    assert [diag_ref(lb) for lb in (-10.01, -50.0, None)] == [0, 0, 0]


@pytest.mark.parametrize(("N", "H", "chunks", "want"), [
    # the measured best on the H200 with the one-stage walk (docs/performance-model.md, "The group count of the
    # Triton walk")
    (1, 12, 64, 6),      # one sequence of 4K tokens
    (1, 12, 256, 6),     # 16K
    (1, 12, 1024, 16),   # 64K
    (1, 32, 1024, 3),
    (2, 12, 512, 8),
    (1, 12, 1, 1),
    (0, 12, 0, 1),
])
def test_triton_group_count(N, H, chunks, want):
    from kdagen.runtime.group_scan import choose_groups
    from kdagen.runtime.pipeline import H200_RULES as R

    assert choose_groups(N, H, chunks, 128, 128, 64, 132, R.walk_programs_per_sm, pass1_step=R.pass1_step,
                         scan_step=R.scan_step, split_step=R.split_step) == want


def _walk_groups(n_seq, H, chunks, sms=132, *, checkpoints=False, groups=None, block_v=64):
    from kdagen.runtime import pipeline

    mod = types.SimpleNamespace(HEAD_DIM_K=128, HEAD_DIM_V=128, BK=128, BV=128)
    work = pipeline.Work(n_seq=n_seq, H=H, n_chunks=chunks, lower_bound=None, use_l2norm=False,
                         checkpoints=checkpoints)
    target = pipeline.Target("sm_90", sms, mod, {"block_v": block_v}, None)
    return pipeline.choose_pipeline(work, target, groups=groups).groups


def test_triton_group_count_keeps_full_gpus_on_one_walk():
    # H200 graph timings (docs/performance-model.md, "The group count of the Triton walk"): plain walks on up to
    # half the SMs gain from a split (64 programs: G=3, 10%), on more do not (96 programs, one 64K sequence at 48
    # heads or four at 12: G=1).
    assert _walk_groups(1, 32, 1024) == 3
    assert _walk_groups(1, 48, 1024) == 1
    assert _walk_groups(4, 12, 1024) == 1
    assert _walk_groups(1, 96, 1024) == 1
    assert _walk_groups(1, 12, 64) == 6
    # A batch that writes checkpoints keeps the plain walk (bit-exact snapshots) unless a count is asked for.
    assert _walk_groups(1, 12, 64, checkpoints=True) == 1
    assert _walk_groups(1, 12, 64, checkpoints=True, groups=3) == 3


def test_triton_group_count_env_and_cpu(monkeypatch):
    from kdagen.runtime.settings import GROUPS_ENV, read_settings

    # The interpreter has no SMs to fill: always the plain walk unless forced.
    assert _walk_groups(1, 12, 1024, sms=None) == 1
    assert _walk_groups(1, 12, 1024, sms=None, groups=7) == 7
    with pytest.raises(ValueError, match=r"groups must be an int in 1\.\.1024"):
        _walk_groups(1, 12, 1024, sms=None, groups=5000)
    monkeypatch.setenv(GROUPS_ENV, "7")
    assert read_settings().groups == 7
    for bad in ("5000", "two", "0"):
        monkeypatch.setenv(GROUPS_ENV, bad)
        with pytest.raises(ValueError, match=f"KDAGEN_TRITON_GROUPS='{bad}': expected an integer in 1..1024"):
            read_settings()


class _FakeKernel:
    """A generated kernel as a plan's launches see it: records (name, grid, PASS, BLOCK_V, num_stages, fp fusion)."""

    def __init__(self, name, calls):
        self.name, self.calls = name, calls

    def __getitem__(self, grid):
        from kdagen.kernels.kda import KERNELS

        names = [p.name for p in KERNELS[self.name].params]

        def launch(*a, **kw):
            args = dict(zip(names, a))
            self.calls.append((self.name, grid, args.get("PASS"), args.get("BLOCK_V"), kw["num_stages"],
                               kw.get("enable_fp_fusion")))

        return launch


def _program(monkeypatch, *, BK, BV, V, T, N, H, groups, sms, tun=None, design="pair"):
    from kdagen.runtime import pipeline, triton_path
    from kdagen.runtime.run_values import RUN_ORDER

    calls = []
    names = ("kda_prologue", "kda_wu", "kda_intra", "kda_recurrence", "kda_group_scan")
    mod = types.SimpleNamespace(BK=BK, BV=BV, HEAD_DIM_V=V, CHUNK_SIZE=64, **{n: _FakeKernel(n, calls) for n in names})
    tun = tun or {"block_v": 64, "recurrence_warps": 4, "recurrence_stages": 2, "recurrence_stages_sparse": 2,
                  "prologue_block_k": 32, "prologue_warps": 1, "prologue_stages": 1, "wu_block_k": 64,
                  "wu_warps": 4, "wu_stages": 1, "intra_warps": 8, "intra_stages": 1, "intra_block_v": 32,
                  "intra_rows": 32}
    layout = triton_path.workspace_layout(mod, T, H, 2, N, groups, torch.bfloat16, design, tun["intra_rows"])
    ws = layout.views(torch.empty(layout.nbytes, dtype=torch.uint8))
    cu = torch.zeros(N + 1, dtype=torch.int32)
    chunk = triton_path.chunk_launches(
        mod, design, target="sm_90", tuning=tun, ws=ws, H=H, n_chunks=2, lower_bound=-5.0, has_bias=True,
        use_l2norm=True, cu_seqlens=cu, chunk_indices=torch.zeros(2, 2, dtype=torch.int32), direct=False)
    walks = triton_path.walk_launches(
        mod, split=triton_path.walk_split(design, 64, tun["intra_rows"]), target="sm_90", tuning=tun, ws=ws, H=H,
        N=N, groups=groups, sms=sms, cu_seqlens=cu, chunk_offsets=torch.zeros(N + 1, dtype=torch.int64),
        state_ins=(0, 1), state_out=1, state_indices=None, has_initial_state=None, checkpoint_offsets=None,
        checkpoint_state_indices=None, direct=False)
    stages = ("triton_intra" if design == "intra" else "triton_pair", "triton_walk")
    program = pipeline.Program(pipeline.Pipeline(stages, groups, dict(tun)), chunk, walks, direct=False)
    values = [0] * len(RUN_ORDER)
    return program, values, calls


def test_intra_design_launches_one_kernel_per_half_chunk(monkeypatch):
    # kda_intra on 2 x n_chunks programs per head, then the walk and the group scan on half chunks (SPLIT 2);
    # the pair's hand-off buffers are not allocated.
    from kdagen.runtime import triton_path

    program, values, calls = _program(monkeypatch, BK=128, BV=128, V=128, T=100, N=2, H=3, groups=2, sms=None,
                                      design="intra")
    program.run(values, 1)
    assert [(n, g) for n, g, *_ in calls] == [("kda_intra", (4, 3)), ("kda_recurrence", (6, 4, 1)),
                                              ("kda_group_scan", (6, 8)), ("kda_recurrence", (6, 2, 2))]
    launches = program.launches(1)
    assert [x.constexprs["SPLIT"] for x in launches] == [2, 2, 2, 2]
    mod = types.SimpleNamespace(BK=128, BV=128, CHUNK_SIZE=64)
    intra = triton_path.workspace_layout(mod, 100, 3, 2, 2, 1, torch.bfloat16, "intra")
    pair = triton_path.workspace_layout(mod, 100, 3, 2, 2, 1, torch.bfloat16, "pair")
    assert {b.name: b.shape for b in intra.buffers} == {
        "qg": (100, 3, 128), "w": (100, 3, 128), "kg": (100, 3, 128), "u": (100, 3, 128), "aqk": (100, 3, 32),
        "decay": (4, 3, 128)}
    assert {b.name: b.shape for b in pair.buffers}["decay"] == (2, 3, 128) and intra.nbytes < pair.nbytes


def test_the_chunk_stage_follows_the_gate_and_the_norm():
    from kdagen.runtime import pipeline
    from kdagen.runtime.triton_path import walk_split

    mod = types.SimpleNamespace(HEAD_DIM_K=128, HEAD_DIM_V=128, BK=128, BV=128)
    target = pipeline.Target("sm_90", None, mod, {"block_v": 64}, None)

    def chunk(lb, norm, asked=None):
        work = pipeline.Work(n_seq=1, H=4, n_chunks=4, lower_bound=lb, use_l2norm=norm, checkpoints=False)
        return pipeline.choose_pipeline(work, target, pipeline=asked).chunk

    # kda_intra's factors span 16 rows of decay (DIAG_REF 2's bound) on L2-normed q, k.
    assert [chunk(lb, True) for lb in (-1.0, -5.0, -5.415)] == ["triton_intra"] * 3
    assert [chunk(lb, True) for lb in (-5.42, -8.0, None)] == ["triton_pair"] * 3
    assert chunk(-5.0, False) == "triton_pair"
    assert chunk(-5.0, True, "triton_pair+triton_walk") == "triton_pair"
    with pytest.raises(ValueError, match="triton_intra cannot take this batch: q and k are not L2-normed"):
        chunk(-5.0, False, "triton_intra+triton_walk")
    with pytest.raises(ValueError, match="expected 'auto' or '<chunk>\\+<walk>'"):
        chunk(-5.0, True, "fast")
    assert (walk_split("intra", 64), walk_split("intra", 32), walk_split("intra", 16), walk_split("pair", 64)) == \
        (2, 1, 1, 1)
    # 16-row programs: a quarter of a 64-row chunk, half of a 32-row one.
    assert (walk_split("intra", 64, 16), walk_split("intra", 32, 16), walk_split("pair", 64, 16)) == (4, 2, 1)


def test_sixteen_row_programs_walk_in_quarter_chunks(monkeypatch):
    from kdagen.runtime import triton_path

    tun = {"block_v": 64, "recurrence_warps": 4, "recurrence_stages": 2, "recurrence_stages_sparse": 2,
           "intra_warps": 1, "intra_stages": 1, "intra_block_v": 128, "intra_rows": 16}
    program, values, calls = _program(monkeypatch, BK=128, BV=128, V=128, T=100, N=2, H=3, groups=1, sms=None,
                                      design="intra", tun=tun)
    program.run(values, 1)
    assert [(n, g) for n, g, *_ in calls] == [("kda_intra", (8, 3)), ("kda_recurrence", (6, 2, 1))]
    assert [x.constexprs["SPLIT"] for x in program.launches(1)] == [4, 4]
    mod = types.SimpleNamespace(BK=128, BV=128, CHUNK_SIZE=64)
    layout = triton_path.workspace_layout(mod, 100, 3, 2, 2, 1, torch.bfloat16, "intra", 16)
    assert {b.name: b.shape for b in layout.buffers}["aqk"] == (100, 3, 16)
    assert {b.name: b.shape for b in layout.buffers}["decay"] == (8, 3, 128)


def test_batches_whose_walks_fill_the_gpu_take_the_dense_knobs():
    from kdagen.runtime import pipeline

    mod = types.SimpleNamespace(HEAD_DIM_K=128, HEAD_DIM_V=128, BK=128, BV=128)
    tun = {"intra_rows": 32, "intra_warps": 2, "block_v": 64, "dense_intra_rows": 16, "dense_intra_warps": 1,
           "dense_block_v": 128, "intra_block_v": 128}
    dense = {**tun, "intra_rows": 16, "intra_warps": 1, "block_v": 128}

    def knobs(walks, groups=1, asked="triton_intra+triton_walk", sms=132, m=mod, t=tun):
        work = pipeline.Work(n_seq=1, H=walks, n_chunks=4, lower_bound=-5.0, use_l2norm=True, checkpoints=False)
        target = pipeline.Target("sm_90", sms, m, t, None)
        return pipeline.choose_pipeline(work, target, pipeline=asked, groups=groups).knobs

    # H=96 N=16 (1536 walks), H=12 N=16 (192), 132 walks on 132 SMs: dense; 96 walks or a split walk: the target's.
    assert [knobs(n) for n in (1536, 192, 132)] == [dense] * 3
    assert knobs(96) == tun
    assert knobs(1536, groups=2) == tun
    # The count is of programs at the dense slice: V = 256 has two per walk.
    wide = types.SimpleNamespace(HEAD_DIM_K=128, HEAD_DIM_V=256, BK=128, BV=256)
    assert knobs(66, m=wide)["intra_rows"] == 16
    # The pair's walk keeps the target's knobs; a dense_* knob of 0 keeps the knob it would replace.
    assert knobs(1536, asked="triton_pair+triton_walk") == tun
    assert knobs(1536, t={**tun, "dense_intra_warps": 0})["intra_warps"] == 2
    assert knobs(1536, sms=None) == tun


def test_recurrence_passes_and_their_row_blocks(monkeypatch):
    # The plain walk and pass 2 keep the spec's V slice; only pass 1 (rows BV + BK, split at BV) needs a
    # block that divides BK too. Here K = 32 < block_v = 64 < V = 128.
    program, values, calls = _program(monkeypatch, BK=32, BV=128, V=128, T=300, N=2, H=3, groups=1, sms=None)
    program.run(values, 1)
    walks = [(n, g, p, b) for n, g, p, b, _, _ in calls if n in ("kda_recurrence", "kda_group_scan")]
    assert walks == [("kda_recurrence", (6, 2, 1), 0, 64)]
    program, values, calls = _program(monkeypatch, BK=32, BV=128, V=128, T=300, N=2, H=3, groups=3, sms=None)
    program.run(values, 1)
    walks = [(n, g, p, b) for n, g, p, b, _, _ in calls if n in ("kda_recurrence", "kda_group_scan")]
    assert walks == [("kda_recurrence", (6, 5, 2), 1, 32), ("kda_group_scan", (6, 8), None, 16),
                     ("kda_recurrence", (6, 2, 3), 2, 64)]


def test_walk_stages_follow_the_programs_per_sm(monkeypatch):
    # recurrence_stages when a walk launch has more programs than SMs (fewer stages, more walks per SM),
    # recurrence_stages_sparse when each program has an SM to itself; no GPU: recurrence_stages.
    from kdagen.runtime import triton_path

    tun = {"block_v": 64, "recurrence_warps": 4, "recurrence_stages": 1, "recurrence_stages_sparse": 2,
           "prologue_block_k": 32, "prologue_warps": 1, "prologue_stages": 1, "wu_block_k": 64, "wu_warps": 4,
           "wu_stages": 1, "intra_rows": 32}
    assert triton_path.recurrence_stages(tun, 132, 132) == 2
    assert triton_path.recurrence_stages(tun, 133, 132) == 1
    assert triton_path.recurrence_stages(tun, 1, None) == 1
    # H=12 T=4096 at G=4 on 132 SMs: pass 1 has 12 x 4 x 3 = 144 programs (> 132 SMs), pass 2 12 x 2 x 4 = 96.
    program, values, calls = _program(monkeypatch, BK=128, BV=128, V=128, T=4096, N=1, H=12, groups=4, sms=132,
                                      tun=tun)
    program.run(values, 0)
    assert [(p, st) for n, _, p, _, st, _ in calls if n == "kda_recurrence"] == [(1, 1), (2, 2)]


def test_every_triton_launch_pins_fp_fusion(monkeypatch):
    # Triton 3.9 warns when enable_fp_fusion is left unset and 3.10 changes its default; the kernels were
    # measured with it on, so each launch (and aot.compile_variant) passes TRITON_COMPILE_OPTIONS.
    from kdagen.runtime import metadata
    from kdagen.runtime.device import TRITON_COMPILE_OPTIONS

    assert TRITON_COMPILE_OPTIONS == {"enable_fp_fusion": True}
    program, values, calls = _program(monkeypatch, BK=128, BV=128, V=128, T=128, N=1, H=2, groups=2, sms=None)
    program.run(values, 0)
    names = ["kda_prologue", "kda_wu", "kda_recurrence", "kda_group_scan", "kda_recurrence"]
    assert [(n, f) for n, *_, f in calls] == [(n, True) for n in names]
    launched = {}

    class Kernel:
        def __init__(self, name):
            self.name = name

        def __getitem__(self, grid):
            return lambda *a, **kw: launched.setdefault(self.name, []).append(kw.get("enable_fp_fusion"))

    meta = ("chunk_block_sums_kernel", "chunk_metadata_fill_kernel")
    cu = torch.tensor([0, 128], dtype=torch.int32)
    metadata.prepare_chunk_metadata_device(cu, cu, 64, kernels=types.SimpleNamespace(**{n: Kernel(n) for n in meta}),
                                           chunk_sizes=(64,))
    assert launched == {n: [True] for n in meta}


def test_device_sms_is_none_on_the_cpu_and_per_index_on_a_gpu(monkeypatch):
    from kdagen.runtime import group_scan

    monkeypatch.setattr(group_scan, "_sm_count", lambda index: 100 + index)
    assert group_scan.device_sms(torch.device("cpu")) is None
    assert group_scan.device_sms(torch.device("cuda", 1)) == 101


def test_the_interpreter_flag_flipped_after_import_is_named(monkeypatch):
    # A notebook that sets TRITON_INTERPRET=1 after importing kdagen_kernels gets this, not Triton's error
    # from inside a kernel.
    from kdagen.runtime import device

    monkeypatch.setattr(device, "_INTERPRETING", False)
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    with pytest.raises(ValueError, match="was set after kdagen_kernels was imported.*Set it before importing"):
        kdagen_kernels.chunk_kda_prefill(**_args())


def test_compiled_launches_follow_the_specialisation_key():
    # Note [Compiled launch]: the first run goes through Triton's JIT launcher, a run with the same key calls
    # the compiled kernel's own launcher with the same arguments, a run whose values specialise otherwise (a
    # misaligned tensor, a stride of 1) goes through the JIT again.
    from kdagen.kernels.schema import KernelABI, constexpr, i32, ptr
    from kdagen.runtime.launch import KernelLaunch, spec_key

    log = []

    class Compiled:
        def __getitem__(self, grid):
            return lambda *a: log.append(("direct", grid, a))

    class Jit:
        def __getitem__(self, grid):
            return lambda *a, **kw: (log.append(("jit", grid, a)), Compiled())[1]

    abi = KernelABI("kern", (ptr("x", "fp32"), i32("n"), ptr("y", "fp32", writes=True), constexpr("B")))
    launch = KernelLaunch(types.SimpleNamespace(kern=Jit()), abi, (4,), constexprs={"B": 16}, options={"num_warps": 4},
                          static={"y": "Y"}, run_order=("x", "n"), direct=True)
    x = torch.zeros(64)
    for values in ([x, 32], [x, 48], [x[1:], 48], [x, 1]):
        launch(values, spec_key(values))
    assert [(how, a[1]) for how, _, a in log] == [("jit", 32), ("direct", 48), ("jit", 48), ("jit", 1)]
    assert all(a[2:] == ("Y", 16) for _, _, a in log)
    log.clear()
    off = KernelLaunch(types.SimpleNamespace(kern=Jit()), abi, (4,), constexprs={"B": 16}, options={},
                       static={"y": "Y"}, run_order=("x", "n"))
    off([x, 32], spec_key([x, 32]))
    off([x, 32], spec_key([x, 32]))
    assert [how for how, _, _ in log] == ["jit", "jit"]


def test_a_plan_s_run_key_separates_what_the_specialisation_key_separates():
    # Program.run keys its compiled launchers with RunKey: runs with equal RunKeys have equal spec_keys, and every
    # change spec_key sees (an int's 1 / % 16 / 32-bit class, a tensor's dtype or alignment, a None or a float
    # where an int was) changes the RunKey too, also after runs with other ints in between (its int cache).
    from kdagen.runtime.launch import RunKey, spec_key

    x = torch.zeros(64)
    base = [x, x, 32, 48, 2.0, None]
    variants = [base, [x, x, 32, 1, 2.0, None], [x, x, 32, 40, 2.0, None], [x, x, 2**31, 48, 2.0, None],
                [x, x[1:], 32, 48, 2.0, None], [x, x.double(), 32, 48, 2.0, None], [x, x, 32, None, 2.0, None],
                [x, x, 32, 48.0, 2.0, None], [x, x, 32, 48, 2.0, x], [x[4:], x, 32, 48, 2.0, None],
                [x, x, 64, 16, 2.0, None]]
    key = RunKey()
    runs = [(values, key(values), spec_key(values)) for values in variants + variants[::-1] + [base] * 2]
    for a, ka, sa in runs:
        for b, kb, sb in runs:
            assert ka != kb or sa == sb, (a, b)  # equal RunKeys, equal spec_keys
    assert runs[0][1] == runs[-1][1]  # the same values, the same key
    assert len({k for _, k, _ in runs}) == len({s for _, _, s in runs})  # here: exactly spec_key's classes


def test_compiled_launches_take_the_run_s_stream():
    # The compiled launcher gets the stream of the run's values (each run's own), not a lookup of its own; the
    # JIT launch reads the stream itself.
    from kdagen.kernels.schema import KernelABI, i32, ptr
    from kdagen.runtime.launch import KernelLaunch, spec_key

    log = []

    class Compiled:
        def __getitem__(self, grid):
            return lambda *a, **kw: log.append(("direct", a, kw))

    class Jit:
        def __getitem__(self, grid):
            return lambda *a, **kw: (log.append(("jit", a, {k: v for k, v in kw.items() if k == "stream"})),
                                     Compiled())[1]

    abi = KernelABI("kern", (ptr("x", "fp32"), i32("n")))
    launch = KernelLaunch(types.SimpleNamespace(kern=Jit()), abi, (4,), constexprs={}, options={}, static={},
                          run_order=("x", "n", "stream"), direct=True)
    x = torch.zeros(64)
    for stream in (7, 7, 9):
        values = [x, 32, stream]
        launch(values, spec_key(values[:2]))
    assert [(how, a[1], kw) for how, a, kw in log] == [("jit", 32, {}), ("direct", 32, {"stream": 7}),
                                                       ("direct", 32, {"stream": 9})]


def test_offline_builds_model_the_jit_specialisation_of_a_contiguous_call():
    # kdagen.aot compiles what Triton's JIT builds for contiguous, aligned tensors: 16-divisible pointers and
    # strides (attributes), ints equal to 1 as constants; AMD's buffer ops add the 32-bit pointer range.
    from triton._C.libtriton import native_specialize_impl
    from triton.backends.compiler import BaseBackend

    from kdagen.kernels.kda import KDA_INTRA
    from kdagen.kernels.schema import KernelABI, Param, constexpr, i32, ptr

    abi = KernelABI("kern", (ptr("x", "fp32"), i32("s", typical="aligned"), i32("n"), i32("one", typical="one"),
                             i32("m", specialize=False, typical="aligned"), constexpr("B")))
    assert abi.aot_specialization() == ({"one": 1}, {(0,): [["tt.divisibility", 16]], (1,): [["tt.divisibility", 16]]})
    assert abi.aot_specialization(buffer_ops=True)[1][(0,)] == [["tt.divisibility", 16], ["tt.pointer_range", 32]]
    # Each declared form is what the JIT makes of such a value.
    assert native_specialize_impl(BaseBackend, 1, False, True, True)[0] == "constexpr"
    assert native_specialize_impl(BaseBackend, 96 * 128, False, True, True)[1] == "D"
    # kda_intra on q, k, v, raw_g [1, T, H, 128] and raw_beta [1, T, H] contiguous: beta's head stride is the one
    # constant, its token stride (H) and H carry nothing, every other stride is aligned.
    ones, attrs = KDA_INTRA.aot_specialization()
    names = [p.name for p in KDA_INTRA.params]
    aligned = {names[i] for (i,) in attrs}
    assert ones == {"sb_h": 1}
    assert {"sb_t", "H"}.isdisjoint(aligned)
    assert {p.name for p in KDA_INTRA.params if p.kind == "ptr"} | {"sq_t", "sq_h", "sv_t", "sg_h"} <= aligned
    with pytest.raises(ValueError):  # only ints have a typical value
        Param("x", "ptr", "fp32", typical="aligned")


@pytest.mark.parametrize("which", ["A_log", "g_bias"])
def test_a_strided_multi_dim_A_log_or_g_bias_reaches_the_kernels_dense(set_interpreting, which):
    """The kernels read A_log and g_bias as ptr + i: a 2-D strided view ([H, 1] rows of a wider tensor, every
    other key channel of [H, 2K]) whose reshape(-1) is still a strided view is bound as a dense copy."""
    set_interpreting(True)
    args = make_inputs([9, 3], 2, 64, 64, torch.bfloat16, "cpu", h0=False)
    H, K = 2, 64
    flat = args[which]
    wide = torch.zeros(H, 2 if which == "A_log" else 2 * K)
    view = wide[:, :1] if which == "A_log" else wide[:, ::2]
    view.copy_(flat.view(view.shape))
    assert not view.reshape(-1).is_contiguous()  # the case: reshape alone keeps the stride
    args[which] = view
    plan = kdagen_kernels.plan_kda_prefill(args["cu_seqlens"], num_heads=H, head_dim_k=K, head_dim_v=K,
                                           lower_bound=-5.0, has_g_bias=True, use_qk_l2norm_in_kernel=True)
    values = plan.bind(*(args[n] for n in ("q", "k", "v", "raw_g", "raw_beta", "A_log", "g_bias")), K ** -0.5,
                       None, None, None)[0]
    from kdagen.runtime.run_values import RUN_INDEX

    bound = values[RUN_INDEX[which]]
    assert bound.is_contiguous() and torch.equal(bound, flat)
