# SPDX-License-Identifier: Apache-2.0
"""Dispatch to the fused HIP path, on the CPU with fakes: which path a call takes, what the fused launch
receives, and what happens without the compiler or with a compile error.

The decision itself is a pure function (dispatch.decide_fused) tested directly. Calls through
chunk_kda_prefill pretend the tensors sit on an sm_90 GPU (dispatch.fused_target is patched) and replace
fused_path.load_fused with a recorder and the plan's Program.run with one that records the run's values, so
no GPU, compiler or kernel is involved, except the no-compiler fallback, which really runs the Triton path in
the interpreter.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import re
import warnings
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

import kdagen_kernels
from kdagen.kernels.hip import KDA_PAIR_LAUNCH
from kdagen.runtime import dispatch, fused_choice, fused_path, jit_hip, pipeline
from kdagen.runtime.launch import KernelLaunch
from kdagen.runtime.registry import VariantEntry
from tests.kda_cases import make_inputs

KIMI = next(e for e in kdagen_kernels.VARIANTS if e.backend == "hip" and (e.head_dim_k, e.head_dim_v) == (128, 128))
PACKAGE_DIR = Path(kdagen_kernels.__file__).resolve().parent
H = 2
NEEDS_INTERPRETER = pytest.mark.skipif(os.environ.get("TRITON_INTERPRET") != "1",
                                       reason="runs the Triton path: set TRITON_INTERPRET=1")
NO_NVCC = ("kdagen's fused path for sm_90 needs nvcc (the CUDA compiler) and none was found: set "
           "KDAGEN_NVCC=/path/to/nvcc")


def _hip_entry(K: int = 128, V: int = 128, *, dtype: str = "bf16", chunk: int = 64,
               targets: tuple[str, ...] = ("sm_90",)) -> VariantEntry:
    return VariantEntry(name=f"fake__hip__{dtype}__k{K}_v{V}_c{chunk}", op="kda_chunk_fwd", backend="hip",
                        dtype=dtype, head_dim_k=K, head_dim_v=V, chunk_size=chunk, targets=targets,
                        module="kdagen_kernels", spec="specs/fake.yaml:1")


# A registry whose fused variant is small (K = V = 64), so the fallback's Triton run is quick.
SMALL_TRITON = next(e for e in kdagen_kernels.VARIANTS
                    if e.backend == "triton" and (e.dtype, e.head_dim_k, e.head_dim_v) == ("bf16", 64, 64))
SMALL_REGISTRY = (SMALL_TRITON, _hip_entry(64, 64))


class Recorder:
    """Fake fused_path.load_fused: records calls."""

    def __init__(self, load_error: Exception | None = None):
        self.load_error = load_error
        self.loads: list[tuple] = []
        # A library with kda_walk_kernel (not the FMA fallback) whose launchers record their arguments by name.
        self.lib = SimpleNamespace(walk_threads=256, launcher=self.launcher, pair_launcher=self.pair_launcher)
        self.launches: list[tuple[str, dict]] = []

    def launcher(self, abi, static, dynamic):
        def launch(values):
            assert len(values) == len(dynamic)
            self.launches.append((abi.name, {**static, **dict(zip(dynamic, values))}))
        return launch

    def pair_launcher(self, plan):
        """kda_pair_launch read back as the two launches it makes: both records unpacked by their fields'
        names (the layout kdagen/kernels/hip.py declares), each launcher's arguments by name, null pointers None."""
        pair = KDA_PAIR_LAUNCH
        p = dict(zip(pair.plan.names, pair.plan.packer.unpack(pair.plan.pack(plan))))

        def launch(record: bytes):
            r = dict(zip(pair.run.names, pair.run.packer.unpack(record)))
            for st, run in ((pair.intra, pair.intra_run), (pair.walk, pair.walk_run)):
                prefix = st.abi.name.removeprefix("kda_").removesuffix("_launch") + "_"
                args = {q.name: r[q.name] if q.name in run else p[prefix + q.name] for q in st.abi.params}
                self.launches.append((st.abi.name, {n: None if x == 0 and q.kind == "ptr" else x
                                                    for (n, x), q in zip(args.items(), st.abi.params)}))
        return launch

    def load_fused(self, package_dir, head_dim_k, head_dim_v, target, dtype="bf16"):
        self.loads.append((Path(package_dir).resolve(), head_dim_k, head_dim_v, target, dtype))
        if self.load_error is not None:
            raise self.load_error
        return self.lib


@pytest.fixture(autouse=True)
def fresh_dispatch_state(monkeypatch):
    """Each test starts with no built library, no known-missing compiler and no warning shown yet."""
    monkeypatch.setattr(fused_choice, "_fused_libs", {})
    monkeypatch.setattr(fused_choice, "_no_compiler", {})
    monkeypatch.setattr(fused_choice, "_warned_no_compiler", set())


@pytest.fixture
def on_sm90(monkeypatch, set_interpreting):
    """The CPU tensors count as sitting on an sm_90 GPU for the fused decision; the interpreter flag lets
    them past the device check (no kernel runs unless a test falls back to Triton)."""
    monkeypatch.setattr(fused_choice, "fused_target", lambda device: "sm_90")
    # These tests' batches are one-chunk sequences, which the fitted rules walk on triton_walk after hip_intra
    # (test_pipeline covers that rule); here they test the HIP pair's wiring, so hip_walk takes any length.
    monkeypatch.setattr(pipeline, "rules_for",
                        lambda target: dataclasses.replace(pipeline.H200_RULES, hip_walk_min_seq_chunks=0.0))
    set_interpreting(True)


def _fake(monkeypatch, load_error: Exception | None = None) -> Recorder:
    rec = Recorder(load_error)
    monkeypatch.setattr(fused_path, "load_fused", rec.load_fused)
    return rec


def _args(lens=(9, 3), K=128, V=128, **kw):
    return make_inputs(list(lens), H, K, V, torch.bfloat16, "cpu", **kw)


def _hip_stages(program, state_in: int) -> tuple:
    """(the intra launch, the walk's one launch) of `program` for `state_in`, out of a HipPairLaunch (the
    hip_intra + hip_walk plans') or the two stages."""
    (walk,) = program.walks[state_in] if len(program.walks[state_in]) == 1 else (None,)
    if isinstance(walk, fused_path.HipPairLaunch):
        assert program.intra is None  # the pair launches kda_intra_kernel itself
        return walk.intra, walk.walk
    return program.intra, walk


def _last_plan(registry):
    """The plan the wrapper cached last for `registry` (on this thread and stream)."""
    return next(c.plan for key, c in dispatch._last.items() if key[0] == id(registry))


# ---- the registry --------------------------------------------------------------------------------



def test_registry_lists_the_hip_variants_with_their_targets():
    hip = {(e.head_dim_k, e.head_dim_v, e.dtype): e for e in kdagen_kernels.VARIANTS if e.backend == "hip"}
    assert set(hip) == {(128, 128, "bf16"), (64, 64, "bf16"), (128, 256, "bf16"), (128, 128, "fp16")}
    for e in hip.values():
        assert (e.chunk_size, e.targets) == (64, ("gfx942", "gfx950", "sm_90"))
        assert e.name == fused_path.variant_name(e.head_dim_k, e.head_dim_v, e.dtype)
        for t in e.targets:  # the source load_fused builds is there
            assert fused_path.source_path(PACKAGE_DIR, e.head_dim_k, e.head_dim_v, t, e.dtype).is_file()


def test_a_hip_entry_loads_through_load_fused(monkeypatch):
    rec = _fake(monkeypatch)
    assert KIMI.load("gfx950") is rec.lib
    assert rec.loads == [(PACKAGE_DIR, 128, 128, "gfx950", "bf16")]
    for bad in (None, "gfx90a"):
        with pytest.raises(ValueError, match=re.escape(f"load it with one of its targets gfx942, gfx950, sm_90, "
                                                       f"got target={bad!r}")):
            KIMI.load(bad)


# ---- the decision (pure) -------------------------------------------------------------------------

ALL_HOLD = {"use_fused_chunk": True, "use_qk_l2norm_in_kernel": True, "cu_seqlens_given": True,
            "lower_bound_given": True, "g_bias_given": True, "head_dim_k": 128, "head_dim_v": 128,
            "dtype": torch.bfloat16, "target": "sm_90"}


def test_fused_when_every_precondition_holds():
    d = dispatch.decide_fused(kdagen_kernels.VARIANTS, **ALL_HOLD)
    assert d.entry is KIMI and d.target == "sm_90" and d.why_not == ()
    for target in KIMI.targets:
        assert dispatch.decide_fused(kdagen_kernels.VARIANTS, **dict(ALL_HOLD, target=target)).entry is KIMI


@pytest.mark.parametrize("change,why", [
    ({"use_fused_chunk": False}, "use_fused_chunk is False"),
    ({"use_qk_l2norm_in_kernel": False}, "use_qk_l2norm_in_kernel is False"),
    ({"cu_seqlens_given": False}, "no cu_seqlens"),
    ({"lower_bound_given": False}, "no lower_bound"),
    ({"g_bias_given": False}, "no g_bias"),
    ({"target": None}, "no GPU target (CPU tensors or the Triton interpreter)"),
    ({"target": "gfx90a"}, "no generated hip variant for K=128, V=128, dtype=bf16, chunk 64 on gfx90a"),
    ({"dtype": torch.float32}, "no generated hip variant for K=128, V=128, dtype="),
    ({"head_dim_k": 96, "head_dim_v": 96}, "no generated hip variant for K=96, V=96, dtype=bf16"),
], ids=lambda x: None)
def test_triton_when_one_precondition_fails(change, why):
    d = dispatch.decide_fused(kdagen_kernels.VARIANTS, **dict(ALL_HOLD, **change))
    assert d.entry is None
    assert any(w.startswith(why) for w in d.why_not), d.why_not


def test_only_a_chunk_64_hip_variant_that_declares_the_target_serves():
    registry = (_hip_entry(chunk=32), _hip_entry(targets=("gfx942",)), SMALL_TRITON)
    assert dispatch.decide_fused(registry, **ALL_HOLD).entry is None
    assert dispatch.decide_fused(registry, **dict(ALL_HOLD, target="gfx942")).entry is registry[1]


def test_fused_target(monkeypatch, set_interpreting):
    monkeypatch.setattr(fused_choice, "target_of", lambda device: "gfx942")
    set_interpreting(False)
    assert dispatch.fused_target(torch.device("cpu")) is None
    assert dispatch.fused_target(torch.device("cuda", 0)) == "gfx942"
    set_interpreting(True)
    assert dispatch.fused_target(torch.device("cuda", 0)) is None


# ---- can_use_fused -------------------------------------------------------------------------------

@pytest.fixture
def fake_gpu(monkeypatch, set_interpreting):
    """torch sees a CUDA device whose target is sm_90 (KDAGEN_TARGET-style), outside the interpreter."""
    set_interpreting(False)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.setattr(fused_choice, "target_of", lambda device: "sm_90")
    monkeypatch.setattr(jit_hip, "find_compiler", lambda target: jit_hip.Compiler("nvcc", "/fake/nvcc"))


def test_can_use_fused_answers_from_registry_and_device(fake_gpu, monkeypatch):
    assert kdagen_kernels.can_use_fused_kda_chunk(128, 128, torch.bfloat16, 64)
    assert kdagen_kernels.can_use_fused_kda_chunk(128, 256, torch.bfloat16, 64)
    assert kdagen_kernels.can_use_fused_kda_chunk(128, 128, torch.float16, 64)
    assert kdagen_kernels.can_use_fused_kda_chunk(64, 64, torch.bfloat16, 64)
    assert not kdagen_kernels.can_use_fused_kda_chunk(64, 64, torch.float16, 64)  # no fp16 hip variant at 64
    assert not kdagen_kernels.can_use_fused_kda_chunk(96, 96, torch.bfloat16, 64)
    assert not kdagen_kernels.can_use_fused_kda_chunk(128, 128, torch.bfloat16, 32)
    monkeypatch.setattr(fused_choice, "target_of", lambda device: "gfx90a")  # a target no variant declares
    assert not kdagen_kernels.can_use_fused_kda_chunk(128, 128, torch.bfloat16, 64)


def test_can_use_fused_is_false_without_cuda_in_the_interpreter_or_without_the_compiler(fake_gpu, monkeypatch, set_interpreting):
    set_interpreting(True)
    assert not kdagen_kernels.can_use_fused_kda_chunk(128, 128, torch.bfloat16, 64)
    set_interpreting(False)

    def missing(target):
        raise jit_hip.CompilerNotFoundError(NO_NVCC)

    monkeypatch.setattr(jit_hip, "find_compiler", missing)
    assert not kdagen_kernels.can_use_fused_kda_chunk(128, 128, torch.bfloat16, 64)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert not kdagen_kernels.can_use_fused_kda_chunk(128, 128, torch.bfloat16, 64)


# ---- calls that take the fused path --------------------------------------------------------------

# Note [Pipelines]: kda_intra's gate (lower_bound -5, the L2 norm) takes the HIP kda_intra_kernel; a bound the
# HIP intra cannot take (-10) takes the Triton pipeline (triton_pair).
UNFIT_GATE = -10.0


def test_fused_call_runs_the_hip_intra_kernel_then_the_hip_walk(on_sm90, monkeypatch):
    rec = _fake(monkeypatch)
    runs = _fake_triton(monkeypatch, programs=(programs := []))
    args = _args()
    out = torch.full_like(args["v"], float("nan"))
    o, final = kdagen_kernels.chunk_kda_prefill(**args, out=out, use_fused_chunk=True)
    assert o is out and final.shape == (2, H, 128, 128) and final.dtype == torch.float32
    assert rec.loads == [(PACKAGE_DIR, 128, 128, "sm_90", "bf16")]
    (program,), (values,) = programs, runs
    launch, _ = _hip_stages(program, 1)
    assert isinstance(launch, fused_path.HipIntraLaunch) and launch.lib is rec.lib
    assert launch.lower_bound == -5.0 and launch.has_bias and launch.H == H
    assert launch.ci.dtype == torch.int32 and torch.equal(launch.ci.long(), torch.tensor([[0, 0], [1, 0]]))
    assert tuple(launch.ws["aqk"].shape) == (12, H, 16) and tuple(launch.ws["decay"].shape) == (2 * 4, H, 128)
    for name in ("q", "k", "v", "raw_g", "raw_beta", "A_log", "g_bias"):
        assert values[name] is args[name], name
    assert values["o"] is out and values["ht"] is final and values["h0"] is args["initial_state"]
    for state_in in (0, 1):  # zeros or the dense initial state; the dense final state
        intra, walk = _hip_stages(program, state_in)
        assert isinstance(walk, fused_path.HipWalkLaunch) and walk.lib is rec.lib and intra is launch
        assert (walk.state_in, walk.state_out) == (state_in, 1)
    kdagen_kernels.chunk_kda_prefill(**args, out=out, use_fused_chunk=True)
    assert len(rec.loads) == 1 and len(runs) == 2  # the library is loaded once per process


@pytest.mark.parametrize("env,walk_threads,hip", [("", 256, True), ("hip_intra+triton_walk", 256, False),
                                                 ("", 0, False)], ids=["hip", "env_triton_walk", "fma_library"])
def test_hip_walk_unless_asked_for_triton_or_missing(on_sm90, monkeypatch, env, walk_threads, hip):
    """The HIP walk follows the HIP kda_intra_kernel wherever the library has it; KDAGEN_PIPELINE naming the
    Triton walk or a library built on the FMA fallback (no walk) keep the Triton walk on the same workspace."""

    rec = _fake(monkeypatch)
    rec.lib.walk_threads = walk_threads
    monkeypatch.setenv("KDAGEN_PIPELINE", env)
    _fake_triton(monkeypatch, programs=(programs := []))
    kdagen_kernels.chunk_kda_prefill(**_args(), out=torch.empty(1, 12, H, 128, dtype=torch.bfloat16),
                                     use_fused_chunk=True)
    (program,) = programs
    intra, walk = _hip_stages(program, 1)
    assert isinstance(intra, fused_path.HipIntraLaunch)
    assert isinstance(walk, fused_path.HipWalkLaunch if hip else KernelLaunch)


@pytest.mark.parametrize("forced", [None, 2], ids=["plan", "KDAGEN_TRITON_GROUPS=2"])
def test_hip_walk_plans_walk_as_one_group(on_sm90, monkeypatch, forced):
    """kda_walk_kernel has no group split: a fused plan that launches it walks each sequence as one group where the
    Triton path's cost model would split (one long sequence on 132 SMs); a forced group count takes the Triton walk."""
    from kdagen.runtime import pipeline, planning

    _fake(monkeypatch)
    monkeypatch.setattr(planning, "device_sms", lambda device: 132)
    monkeypatch.setenv("KDAGEN_PIPELINE", "hip_intra+hip_walk" if forced is None else "hip_intra+triton_walk")
    if forced is not None:
        monkeypatch.setenv("KDAGEN_TRITON_GROUPS", str(forced))
    _fake_triton(monkeypatch, programs=(programs := []))
    args = _args((4000,))
    mod = next(e for e in kdagen_kernels.VARIANTS if e.backend == "triton" and e.dtype == "bf16"
               and (e.head_dim_k, e.head_dim_v) == (128, 128)).load()
    # The Triton path's own choice for this batch splits the walk: the case the rule is about.
    work = pipeline.Work(n_seq=1, H=H, n_chunks=63, lower_bound=-5.0, use_l2norm=True, checkpoints=False)
    triton_only = pipeline.Target("sm_90", 132, mod, mod.TUNING["sm_90"], None)
    assert pipeline.choose_pipeline(work, triton_only).groups > 1
    kdagen_kernels.chunk_kda_prefill(**args, out=torch.empty_like(args["v"]), use_fused_chunk=True)
    (program,) = programs
    assert isinstance(_hip_stages(program, 1)[0], fused_path.HipIntraLaunch)
    if forced is None:
        assert program.groups == 1
        assert isinstance(_hip_stages(program, 1)[1], fused_path.HipWalkLaunch)
    else:
        assert program.groups == forced
        assert all(isinstance(w, KernelLaunch) for w in program.walks[1]) and len(program.walks[1]) == 3


def test_the_pipeline_env_must_be_known(on_sm90, monkeypatch):
    _fake(monkeypatch)
    monkeypatch.setenv("KDAGEN_PIPELINE", "hip_intra+fast_walk")
    with pytest.raises(ValueError, match=re.escape("KDAGEN_PIPELINE='hip_intra+fast_walk': expected 'auto' or "
                                                   "'<chunk>+<walk>'")):
        kdagen_kernels.chunk_kda_prefill(**_args(), use_fused_chunk=True)


@pytest.mark.parametrize("name", ["KDAGEN_FUSED_WALK", "KDAGEN_FUSED_INTRA", "KDAGEN_TRITON_DESIGN",
                                  "KDAGEN_FUSED_GROUPS"])
def test_retired_switches_are_refused_with_their_replacement(on_sm90, monkeypatch, name):
    _fake(monkeypatch)
    monkeypatch.setenv(name, "triton")
    with pytest.raises(ValueError, match=f"{name} is no longer read; use .*(pipeline|groups)"):
        kdagen_kernels.chunk_kda_prefill(**_args(), use_fused_chunk=True)


@pytest.mark.parametrize("sms,env,hip", [(None, "", True), (132, "", False), (8, "", True),
                                         (132, "hip_intra+hip_walk", True), (8, "triton_intra+triton_walk", False)],
                         ids=lambda x: str(x))
def test_hip_intra_kernel_where_the_walks_fill_half_the_gpu(on_sm90, monkeypatch, sms, env, hip):
    """N x H = 4 walks: the HIP kernel on a GPU of at most 8 SMs (or without an SM count), the Triton program
    as the Triton path would run it on 132; KDAGEN_PIPELINE overrides."""
    from kdagen.runtime import planning

    _fake(monkeypatch)
    monkeypatch.setattr(planning, "device_sms", lambda device: sms)
    monkeypatch.setenv("KDAGEN_PIPELINE", env)
    _fake_triton(monkeypatch, programs=(programs := []))
    kdagen_kernels.chunk_kda_prefill(**_args(), out=torch.empty(1, 12, H, 128, dtype=torch.bfloat16),
                                     use_fused_chunk=True)
    (program,) = programs
    assert isinstance(_hip_stages(program, 1)[0], fused_path.HipIntraLaunch) == hip


def test_a_gate_the_hip_intra_cannot_take_runs_the_triton_pipeline(on_sm90, monkeypatch):
    rec = _fake(monkeypatch)
    runs = _fake_triton(monkeypatch, programs=(programs := []))
    args = _args(lower_bound=UNFIT_GATE)
    out = torch.full_like(args["v"], float("nan"))
    o, final = kdagen_kernels.chunk_kda_prefill(**args, out=out, use_fused_chunk=True)
    assert o is out and final.shape == (2, H, 128, 128)
    (program,), (values,) = programs, runs
    assert program.pipeline.name == "triton_pair+triton_walk" and program.intra is None
    assert values["o"] is out and values["ht"] is final
    plan = _last_plan(kdagen_kernels.VARIANTS)
    assert "the HIP intra cannot take this batch (the gate is not bounded by lower_bound >= -5.4152" in plan.describe()
    assert rec.loads == [(PACKAGE_DIR, 128, 128, "sm_90", "bf16")]  # the fused request built its library


@pytest.mark.parametrize("lower_bound", [-5.0, UNFIT_GATE], ids=["hip_intra", "unfit_gate"])
def test_fused_call_with_state_cache_and_checkpoints(on_sm90, monkeypatch, lower_bound):
    _fake(monkeypatch)
    runs = _fake_triton(monkeypatch, programs=(programs := []))
    args = _args((130, 3), h0=False, lower_bound=lower_bound)
    cache = torch.randn(4, H, 128, 128)
    ck = torch.full((3, H, 128, 128), float("nan"))
    extra = {"state_cache": cache, "state_indices": torch.tensor([2, -1], dtype=torch.int32),
             "has_initial_state": torch.tensor([True, False]), "checkpoint_state": ck,
             "checkpoint_offsets": torch.tensor([64, 0], dtype=torch.int32),
             "checkpoint_state_indices": torch.tensor([1, -1], dtype=torch.int32)}
    _, final = kdagen_kernels.chunk_kda_prefill(**args, out=torch.empty_like(args["v"]), use_fused_chunk=True,
                                                **extra)
    assert final is None
    (values,) = runs
    assert values["h0"] is cache and values["ht"] is cache and values["ckpt"] is ck
    (program,) = programs
    if lower_bound == UNFIT_GATE:  # the Triton walk
        assert all(isinstance(w, KernelLaunch) for w in program.walks[2])
    else:  # the HIP walk reads and writes the cache rows in place and writes the checkpoints
        _, walk = _hip_stages(program, 2)
        assert isinstance(walk, fused_path.HipWalkLaunch) and (walk.state_in, walk.state_out) == (2, 2)
        cu, co, idx, flags, ck_off, ck_idx, _ = walk._keep
        assert idx.dtype == torch.int32 and idx.tolist() == [2, -1] and flags.tolist() == [1, 0]
        assert ck_off.tolist() == [64, 0] and ck_idx.tolist() == [1, -1] and co.dtype == torch.int64


@pytest.mark.parametrize("lower_bound", [-5.0, UNFIT_GATE], ids=["hip_intra", "unfit_gate"])
def test_out_none_writes_into_a_contiguous_v(on_sm90, monkeypatch, lower_bound):
    _fake(monkeypatch)
    runs = _fake_triton(monkeypatch)
    args = _args(lower_bound=lower_bound)
    v = args["v"]
    o, _ = kdagen_kernels.chunk_kda_prefill(**args, use_fused_chunk=True)
    assert o.data_ptr() == v.data_ptr()  # as vLLM's op: v is dead by then (read by the first kernel)
    assert runs[0]["o"].data_ptr() == v.data_ptr()


def test_out_none_with_a_strided_v_allocates(on_sm90, monkeypatch):
    _fake(monkeypatch)
    runs = _fake_triton(monkeypatch)
    args = _args(lower_bound=UNFIT_GATE)
    wide = torch.randn(1, 12, H, 160).to(torch.bfloat16)
    args["v"] = wide[..., :128]
    before = wide.clone()
    o, _ = kdagen_kernels.chunk_kda_prefill(**args, use_fused_chunk=True)
    assert o.is_contiguous() and o.data_ptr() != wide.data_ptr() and runs[0]["o"] is o
    assert torch.equal(wide, before)


def test_misaligned_checkpoint_offsets_are_refused_before_building(on_sm90, monkeypatch):
    rec = _fake(monkeypatch)
    args = _args((130, 3))
    out = torch.full_like(args["v"], 7.0)
    ck = torch.full((2, H, 128, 128), 3.0)
    with pytest.raises(ValueError, match=re.escape("checkpoint_offsets[0] must be 0 (no checkpoint) or a positive "
                                                   "multiple of 64 below the sequence's length 130, got 100")):
        kdagen_kernels.chunk_kda_prefill(**args, out=out, use_fused_chunk=True, checkpoint_state=ck,
                                         checkpoint_offsets=torch.tensor([100, 0], dtype=torch.int32))
    assert rec.loads == []
    assert bool((out == 7.0).all()) and bool((ck == 3.0).all())


@pytest.mark.parametrize("change,why", [
    ({"use_qk_l2norm_in_kernel": False}, "use_qk_l2norm_in_kernel is False"),
    ({"cu_seqlens": None}, "no cu_seqlens"),
    ({"lower_bound": None}, "no lower_bound"),
    ({"g_bias": None}, "no g_bias"),
    ({"use_fused_chunk": False}, "use_fused_chunk is False"),
], ids=lambda x: None)
def test_a_missing_precondition_keeps_the_triton_path(on_sm90, monkeypatch, caplog, change, why):
    # A recorder in place of the Triton path's launches shows which path ran without running a kernel; the
    # checkpoints go to the Triton walk, and the debug log names the missing precondition.
    rec = _fake(monkeypatch)
    triton_runs = _fake_triton(monkeypatch)
    args = _args((6, 6))
    if "cu_seqlens" in change:  # B = 2 sequences of 6 tokens, unpacked
        args = {n: (t.reshape(2, 6, *t.shape[2:]) if n in ("q", "k", "v", "raw_g", "raw_beta") else t)
                for n, t in args.items()}
    args = {**args, "use_fused_chunk": True, **change}
    ck = torch.zeros(2, H, 128, 128)
    with caplog.at_level(logging.DEBUG, logger="kdagen"):
        kdagen_kernels.chunk_kda_prefill(**args, checkpoint_state=ck, checkpoint_offsets=torch.zeros(2, dtype=torch.int32))
    assert rec.loads == []
    assert len(triton_runs) == 1 and triton_runs[0]["ckpt"] is ck
    if args["use_fused_chunk"]:
        assert why in caplog.text


def test_cpu_tensors_never_take_the_fused_path(monkeypatch, caplog, set_interpreting):
    rec = _fake(monkeypatch)  # no fused_target patch: these are CPU tensors in the interpreter
    set_interpreting(True)
    triton_runs = _fake_triton(monkeypatch)
    with caplog.at_level(logging.DEBUG, logger="kdagen"):
        kdagen_kernels.chunk_kda_prefill(**_args(), use_fused_chunk=True, checkpoint_state=torch.zeros(2, H, 128, 128),
                                         checkpoint_offsets=torch.zeros(2, dtype=torch.int32))
    assert rec.loads == [] and len(triton_runs) == 1
    assert "no GPU target" in caplog.text


def _fake_triton(monkeypatch, programs: list | None = None) -> list[dict]:
    """Records each plan run's per-run values by name (run_values.RUN_ORDER), and the program into `programs`,
    instead of launching."""
    from kdagen.runtime import pipeline
    from kdagen.runtime.run_values import RUN_ORDER

    runs: list[dict] = []

    def run(self, values, state_in):
        runs.append(dict(zip(RUN_ORDER, values)))
        if programs is not None:
            programs.append(self)

    monkeypatch.setattr(pipeline.Program, "run", run)
    return runs


# ---- no compiler, compile errors ------------------------------------------------------------------

def _small(**kw):
    return _args((9, 3), 64, 64, seed=3, **kw)


@NEEDS_INTERPRETER
def test_no_compiler_warns_once_and_runs_triton(on_sm90, monkeypatch):
    rec = _fake(monkeypatch, jit_hip.CompilerNotFoundError(NO_NVCC))
    args = _small()
    expect, expect_state = dispatch.chunk_kda_prefill(SMALL_REGISTRY, **args)  # the Triton path
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        results = [dispatch.chunk_kda_prefill(SMALL_REGISTRY, **args, use_fused_chunk=True) for _ in range(2)]
    assert len(seen) == 1, [str(w.message) for w in seen]
    msg = str(seen[0].message)
    assert seen[0].category is RuntimeWarning
    assert "fake__hip__bf16__k64_v64_c64" in msg and "sm_90" in msg and NO_NVCC in msg
    assert "Running the Triton path instead" in msg
    assert len(rec.loads) == 1  # the missing compiler is remembered, not searched per call
    for o, s in results:
        assert torch.equal(o, expect) and torch.equal(s, expect_state)


def test_checkpoints_without_the_compiler_run_the_triton_path(on_sm90, monkeypatch):
    # The Triton path writes checkpoints too, so a missing compiler is a warning and a fallback, as without them.
    _fake(monkeypatch, jit_hip.CompilerNotFoundError(NO_NVCC))
    triton_runs = _fake_triton(monkeypatch)
    args = _small(h0=False)
    args["output_final_state"] = False
    ck = torch.full((2, H, 64, 64), float("nan"))
    cache = torch.randn(3, H, 64, 64)
    with pytest.warns(RuntimeWarning, match="Running the Triton path instead"):
        dispatch.chunk_kda_prefill(
            SMALL_REGISTRY, **args, use_fused_chunk=True, checkpoint_state=ck,
            checkpoint_offsets=torch.zeros(2, dtype=torch.int32), state_cache=cache,
            state_indices=torch.tensor([0, 2], dtype=torch.int32), has_initial_state=torch.tensor([True, False]))
    assert len(triton_runs) == 1 and triton_runs[0]["ckpt"] is ck


def test_a_compile_error_propagates(on_sm90, monkeypatch):
    err = jit_hip.HipCompileError("compiling kda_chunk_fwd__hip__bf16__k128_v128_c64 for sm_90 failed (exit 1).\n"
                                  "generated source: generated/kdagen_kernels/hip/x.hip\ncompiler stderr:\nerror: boom")
    rec = _fake(monkeypatch, err)
    args = _args()
    out = torch.full_like(args["v"], 7.0)
    for attempt in (1, 2):  # never cached as "no compiler": every call reports it
        with warnings.catch_warnings(record=True) as seen:
            warnings.simplefilter("always")
            with pytest.raises(jit_hip.HipCompileError, match="(?s)generated source: .*error: boom"):
                kdagen_kernels.chunk_kda_prefill(**args, out=out, use_fused_chunk=True)
        assert not [w for w in seen if "Triton path instead" in str(w.message)]  # no silent fallback
        assert len(rec.loads) == attempt
    assert bool((out == 7.0).all())


def test_the_fallback_warning_is_per_variant_and_target(monkeypatch):
    rec = _fake(monkeypatch, jit_hip.CompilerNotFoundError(NO_NVCC))
    a, b = _hip_entry(), _hip_entry(64, 64, targets=("sm_90", "gfx942"))
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        for entry, target in ((a, "sm_90"), (a, "sm_90"), (b, "sm_90"), (b, "sm_90"), (b, "gfx942")):
            assert fused_choice.fused_library(entry, target) is None
    assert [str(w.message).split(": ")[1].split(" cannot")[0] for w in seen] == [
        "use_fused_chunk=True, but the fused variant fake__hip__bf16__k128_v128_c64",
        "use_fused_chunk=True, but the fused variant fake__hip__bf16__k64_v64_c64",
        "use_fused_chunk=True, but the fused variant fake__hip__bf16__k64_v64_c64"]
    assert [(load[1], load[3]) for load in rec.loads] == [(128, "sm_90"), (64, "sm_90"), (64, "gfx942")]


def test_a_hip_variant_without_a_triton_variant_runs_both_hip_stages(on_sm90, monkeypatch):
    # No Triton variant of the dims: the fused request still gets a plan (Triton-free), never a crash.
    rec = _fake(monkeypatch)
    _fake_triton(monkeypatch, programs=(programs := []))
    registry = (_hip_entry(),)
    args = _args()
    dispatch.chunk_kda_prefill(registry, **args, out=torch.empty_like(args["v"]), use_fused_chunk=True)
    (program,) = programs
    plan = _last_plan(registry)
    assert plan.mod is None and program.pipeline.name == "hip_intra+hip_walk" and rec.loads
    assert "launches: HipPairLaunch (one C call)" in plan.describe(), plan.describe()
    intra, _ = _hip_stages(program, 1)
    assert isinstance(intra, fused_path.HipIntraLaunch)
    assert all(isinstance(_hip_stages(program, s)[1], fused_path.HipWalkLaunch) for s in program.walks)
    assert tuple(intra.ws["aqk"].shape) == (12, H, 16)
    rec.lib.walk_threads = 0  # a library on the FMA fallback has no walk, and there is no Triton walk
    dispatch.clear_plans()
    monkeypatch.setattr(fused_choice, "_fused_libs", {})
    with pytest.raises(ValueError, match="triton_walk cannot follow hip_intra here: triton_walk needs a Triton "
                                         "variant: no generated triton variant"):
        dispatch.chunk_kda_prefill(registry, **args, use_fused_chunk=True)


# ---- the HIP launchers' arguments -----------------------------------------------------------------

def _hip_plan(args, N=2):
    slots, has = torch.tensor([2, 0], dtype=torch.int32)[:N], torch.ones(N, dtype=torch.bool)
    return kdagen_kernels.plan_kda_prefill(
        args["cu_seqlens"], num_heads=H, head_dim_k=128, head_dim_v=128, lower_bound=-5.0, has_g_bias=True,
        use_qk_l2norm_in_kernel=True, state_indices=slots, has_initial_state=has, pipeline="hip_intra+hip_walk")


def test_hip_launchers_bind_the_plan_once_and_take_each_layer_s_tensors(on_sm90, monkeypatch):
    """The launchers hold the plan's workspace and metadata pointers; every run passes its own layer's tensors,
    strides and stream (a second layer with another out, state cache and gate projections is not served the
    first one's)."""
    rec = _fake(monkeypatch)
    args = _args(strided=True)
    plan = _hip_plan(args)
    intra_launch = _hip_stages(plan.program, 2)[0]
    intra_ws = intra_launch.ws
    T = args["q"].shape[1]
    for layer in range(2):
        cache = torch.zeros(3 + layer, H, 128, 128)
        out = torch.empty(1, T, H, 128 * (2 + layer), dtype=torch.bfloat16)[..., :128]  # strided, per layer
        g = args["raw_g"] if layer == 0 else args["raw_g"].contiguous()
        beta = args["raw_beta"].float() if layer == 1 else args["raw_beta"]  # fp32: converted to bf16
        del rec.launches[:]
        plan.run(args["q"], args["k"], args["v"], g, beta, args["A_log"], args["g_bias"], out=out, state_cache=cache)
        (iname, intra), (wname, walk) = rec.launches
        assert (iname, wname) == ("kda_intra_launch", "kda_walk_launch")
        for name, t in (("q", args["q"]), ("k", args["k"]), ("v", args["v"]), ("g", g)):
            assert intra[name] == t.data_ptr(), name
            assert (intra[f"s{name}_t"], intra[f"s{name}_h"]) == (t.stride(1), t.stride(2)), name
        if layer == 0:
            assert intra["beta"] == beta.data_ptr() and (intra["sb_t"], intra["sb_h"]) == beta.stride()[1:]
        else:  # a bf16 copy, its own strides
            assert intra["beta"] != beta.data_ptr() and (intra["sb_t"], intra["sb_h"]) == (H, 1)
        assert intra["A_log"] == args["A_log"].data_ptr() and intra["g_bias"] == args["g_bias"].data_ptr()
        assert intra["qg"] == intra_ws["qg"].data_ptr() and intra["cu_seqlens"] == intra_launch.cu.data_ptr()
        assert intra["scale"] == pytest.approx(128 ** -0.5, rel=1e-7) and intra["stream"] == walk["stream"] == 0  # CPU: the null stream
        assert walk["out"] == out.data_ptr() and (walk["so_t"], walk["so_h"]) == out.stride()[1:3]
        assert walk["h0"] == walk["ht"] == cache.data_ptr() and walk["n_slots"] == cache.shape[0]
        assert (walk["sh0_n"], walk["sht_n"]) == (cache.stride(0),) * 2 and walk["qg"] == intra_ws["qg"].data_ptr()
        assert (walk["state_in"], walk["state_out"]) == (2, 2) and walk["ckpt"] is None


def test_hip_plan_still_refuses_a_bad_layer_after_a_good_one(on_sm90, monkeypatch):
    """Nothing per layer is cached: an `out` on the state cache's memory after a good layer is refused,
    before any launch."""
    rec = _fake(monkeypatch)
    args = _args()
    plan = _hip_plan(args)
    T = args["q"].shape[1]
    cache = torch.zeros(3, H, 128, 128)
    inputs = [args[n] for n in ("q", "k", "v", "raw_g", "raw_beta", "A_log", "g_bias")]
    plan.run(*inputs, out=torch.empty(1, T, H, 128, dtype=torch.bfloat16), state_cache=cache)
    assert len(rec.launches) == 2
    del rec.launches[:]
    shared = torch.zeros(cache.numel() * 2, dtype=torch.bfloat16)  # a cache and an `out` on the same memory
    cache_b = shared.view(torch.float32).view(cache.shape)
    with pytest.raises(ValueError, match="out must be memory disjoint from state_cache"):
        plan.run(*inputs, out=shared[:T * H * 128].view(1, T, H, 128), state_cache=cache_b)
    assert rec.launches == [] and not shared.any()
