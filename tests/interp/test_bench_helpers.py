# SPDX-License-Identifier: Apache-2.0
"""The benchmark's input builder, its FlashKDA conversion and autotune's single-kernel launcher, run in
the Triton interpreter (on the GPU they time kernels; here they must build what they say and launch what
they say)."""

from __future__ import annotations

import types

import torch

import kdagen_kernels
from kdagen.autotune import kernel_call
from kdagen.bench import equal_lens, make_inputs
from kdagen.bench_peers import flashkda_call, flashkda_inputs
from kdagen.launch_knobs import dense_tuning
from kdagen.reference import chunk_kda_prefill_reference, l2norm_reference, naive_recurrent_kda, rel_l2
from kdagen.runtime import launch, planning, triton_path


def test_equal_lens_packs_t_tokens():
    assert equal_lens(10, 3) == [3, 3, 4] and equal_lens(64, 1) == [64]


def test_make_inputs_builds_the_declared_batch():
    args, ci, co = make_inputs(2, [0, 1, 70], K=64, V=32, dtype="fp16", seed=3, device="cpu")
    assert args["cu_seqlens"].tolist() == [0, 0, 1, 71] and args["cu_seqlens"].dtype == torch.int32
    assert args["q"].shape == (1, 71, 2, 64) and args["v"].shape == (1, 71, 2, 32) and args["q"].dtype == torch.float16
    assert args["initial_state"].shape == (3, 2, 32, 64) and args["g_bias"].shape == (2 * 64,)
    assert ci.tolist() == [[1, 0], [2, 0], [2, 1]] and co.tolist() == [0, 0, 1, 3]
    assert all(args[n].float().abs().sum() > 0 for n in ("q", "k", "v", "raw_g", "raw_beta", "initial_state"))


def test_kernel_call_runs_each_kernel_alone_with_the_given_tuning(monkeypatch):
    e = next(e for e in kdagen_kernels.VARIANTS if e.name == "kda_chunk_fwd__triton__bf16__k64_v64_c64")
    mod = e.load()
    args, ci, co = make_inputs(2, [5, 70], K=64, V=64, seed=4, device="cpu")
    tun = dict(triton_path.tuning_for(mod, "interpreter"), prologue_block_k=32, wu_block_k=32)
    ref_o, _ = chunk_kda_prefill_reference(**args)
    launched = []
    real = launch.KernelLaunch.__call__
    monkeypatch.setattr(launch.KernelLaunch, "__call__",
                        lambda self, values: (launched.append((self.abi.name, self.constexprs.get("BLOCK_K"),
                                                               self.options["num_warps"])), real(self, values)))
    for kernel in ("prologue", "wu"):
        call = kernel_call(mod, tun, kernel, args, ci, co)
        launched.clear()
        call()
        # The returned callable launches that kernel alone, with the given tuning.
        assert launched == [(f"kda_{kernel}", tun[f"{kernel}_block_k"], tun[f"{kernel}_warps"])]
    call = kernel_call(mod, tun, "intra", args, ci, co)
    launched.clear()
    call()
    assert launched == [("kda_intra", None, tun["intra_warps"])]
    for design in ("intra", "pair"):
        out = torch.full_like(args["v"], float("nan"))  # poisoned: an unwritten element fails the check
        kernel_call(mod, tun, "recurrence", args, ci, co, out=out, design=design)()
        assert rel_l2(out, ref_o) < 1e-2


def test_kernel_call_launches_the_knobs_it_is_given_not_the_dense_ones(monkeypatch):
    # One SM: a plan of this batch would take the dense_* knobs; kernel_call times exactly the knobs given.
    e = next(e for e in kdagen_kernels.VARIANTS if e.name == "kda_chunk_fwd__triton__bf16__k64_v64_c64")
    mod = e.load()
    monkeypatch.setattr(planning, "device_sms", lambda device: 1)
    args, ci, co = make_inputs(2, [5, 70], K=64, V=64, seed=4, device="cpu")
    tun = dict(triton_path.tuning_for(mod, "interpreter"), intra_rows=32, intra_warps=2, dense_intra_rows=16,
               dense_intra_warps=1)
    launched = []
    real = launch.KernelLaunch.__call__
    monkeypatch.setattr(launch.KernelLaunch, "__call__",
                        lambda self, values: (launched.append((self.abi.name, self.constexprs["SPLIT"],
                                                               self.options["num_warps"])), real(self, values)))
    kernel_call(mod, tun, "intra", args, ci, co, design="intra")()
    assert launched[-1] == ("kda_intra", 2, 2)
    kernel_call(mod, dense_tuning(tun), "intra", args, ci, co, design="intra")()
    assert launched[-1] == ("kda_intra", 4, 1)


def test_kernel_call_launches_the_kernels_of_the_module_it_is_given():
    # tools/ablate_*.py time edited copies of a variant's module: the copy's kernels must be the ones run.
    e = next(e for e in kdagen_kernels.VARIANTS if e.name == "kda_chunk_fwd__triton__bf16__k64_v64_c64")
    mod = e.load()
    grids = []

    class Spy:
        def __getitem__(self, grid):
            grids.append(grid)
            return mod.kda_intra[grid]

    edited = types.ModuleType(mod.__name__ + "_edited")
    edited.__dict__.update(mod.__dict__)
    edited.kda_intra = Spy()
    args, ci, co = make_inputs(2, [5, 70], K=64, V=64, seed=4, device="cpu")
    kernel_call(edited, triton_path.tuning_for(mod, "interpreter"), "intra", args, ci, co, design="intra")()
    assert grids == [(2 * len(ci), 2)]
    grids.clear()
    kernel_call(mod, triton_path.tuning_for(mod, "interpreter"), "intra", args, ci, co, design="intra")()
    assert grids == []


def _flashkda_fwd_float64(calls: list):
    """FlashKDA's fwd as its README and input checks state it, in float64 from our reference's pieces:
    gate lower_bound * sigmoid(exp(A_log) * (g + dt_bias)), beta sigmoid, q/k L2 norm (eps 1e-6 under the
    root), V-first state [N, H, V, K], cu_seqlens int64; out and final_state written in place."""
    def fwd(q, k, v, g, beta, scale, out, A_log, dt_bias, lower_bound, initial_state=None, final_state=None,
            cu_seqlens=None):
        B, T, H, D = q.shape
        N = cu_seqlens.numel() - 1
        tensors = dict(q=q, k=k, v=v, g=g, beta=beta, out=out, A_log=A_log, dt_bias=dt_bias,
                       initial_state=initial_state, final_state=final_state, cu_seqlens=cu_seqlens)
        assert all(t.is_contiguous() for t in tensors.values()), "FlashKDA takes contiguous tensors only"
        assert {t.dtype for t in (q, k, v, g, beta, out)} == {torch.bfloat16} and D == 128 and B == 1
        assert A_log.dtype == dt_bias.dtype == torch.float32 and A_log.shape == (H,) and dt_bias.shape == (H, D)
        assert cu_seqlens.dtype == torch.int64 and initial_state.dtype == final_state.dtype
        assert initial_state.shape == final_state.shape == (N, H, D, D)
        calls.append((out, final_state))
        out.fill_(float("nan"))  # poisoned: an element fwd leaves unwritten fails the check
        final_state.fill_(float("nan"))
        gate = lower_bound * torch.sigmoid(torch.exp(A_log.double()).view(H, 1) * (g.double() + dt_bias.double()))
        qn, kn, b = l2norm_reference(q), l2norm_reference(k), torch.sigmoid(beta.double())
        cu = cu_seqlens.tolist()
        for n, (bos, eos) in enumerate(zip(cu[:-1], cu[1:])):
            o, s = naive_recurrent_kda(qn[0, bos:eos], kn[0, bos:eos], v[0, bos:eos], gate[0, bos:eos],
                                       b[0, bos:eos], scale, initial_state[n])
            out[0, bos:eos] = o.to(out.dtype)
            final_state[n] = s.to(final_state.dtype)

    return fwd


def test_flashkda_conversion_computes_the_benchmark_workload():
    # The benchmark's own inputs (K = V = 128, bf16, safe gate, int32 cu_seqlens, flat g_bias).
    args, _, _ = make_inputs(3, [17, 40, 7], seed=5, device="cpu")
    calls: list = []
    o, s = flashkda_call(_flashkda_fwd_float64(calls), flashkda_inputs(args))()
    assert len(calls) == 1 and calls[0][0] is o and calls[0][1] is s  # returns the buffers it handed fwd
    assert o.shape == args["v"].shape and o.dtype == torch.bfloat16
    assert s.shape == args["initial_state"].shape and s.dtype == torch.float32
    ref_o, ref_s = chunk_kda_prefill_reference(**args)
    # Same float64 math on both sides, so only the stores round: measured 1.7e-3 (bf16 output) and 2.5e-8
    # (fp32 state), bounds about 2.4x and 4x that. A K-first state, dt_bias read [K, H] or scale 1 give
    # output errors of 0.94, 0.31 and 10.
    assert rel_l2(o, ref_o) < 4e-3
    assert rel_l2(s, ref_s) < 1e-7


class _Timed:
    """A timed callable that carries the GPU time the fake do_bench reports for it."""

    def __init__(self, fn, ms: float):
        self.fn, self.ms = fn, ms

    def __call__(self):
        return self.fn()


def test_run_bench_times_flashkda_beside_ours_with_errors_ratios_and_pipeline(monkeypatch, tmp_path):
    import triton.testing

    from kdagen import bench
    from kdagen.bench_peers import flashkda_maker
    from kdagen.bench_shapes import Shape, equal

    def ours(args, ci, co, out):
        return _Timed(lambda: kdagen_kernels.chunk_kda_prefill(**args, chunk_indices=ci, chunk_offsets=co, out=out),
                      1.0)

    def fork(args, ci, co, out):
        return _Timed(flashkda_maker(_flashkda_fwd_float64([]))(args, ci, co, out), 2.5)

    monkeypatch.setattr(bench, "implementations", lambda include_peers=True: {"kdagen-triton": ours})
    monkeypatch.setattr(bench, "peer_impls", lambda flashkda=True: {"flashkda-vllm": fork})
    real_make = bench.make_inputs
    monkeypatch.setattr(bench, "make_inputs", lambda H, lens, seed=0: real_make(H, lens, seed=seed, device="cpu"))
    monkeypatch.setattr(bench, "CHECK_SHAPE", (2, 40, 2))
    monkeypatch.setattr(bench, "REF_MAX_TOKEN_HEADS", 100)  # the second shape takes the check shape's errors
    monkeypatch.setattr(bench, "_ceilings", lambda: (4e12, 6e14))
    monkeypatch.setattr(torch.cuda, "synchronize", lambda: None)
    monkeypatch.setattr(bench, "host_us", lambda fn, sync: 5.0)  # 30 interpreted calls per row otherwise
    monkeypatch.setattr(triton.testing, "do_bench_cudagraph", lambda fn, **kw: fn.ms)
    monkeypatch.setattr(triton.testing, "do_bench", lambda fn, **kw: fn.ms + 0.1)
    rows = bench.run_bench([Shape(2, (5, 43), "ragged"), equal(2, 64, 1, "standard")], tmp_path)
    assert [(r["impl"], r["T"], r["set"], r["max_len"]) for r in rows] == [
        ("kdagen-triton", 48, "ragged", 43), ("flashkda-vllm", 48, "ragged", 43),
        ("kdagen-triton", 64, "standard", 64), ("flashkda-vllm", 64, "standard", 64)]
    assert [r["err_at"] for r in rows] == ["own", "own", "2:40:2", "2:40:2"]
    # Each implementation's own errors: ours in bf16 on chunks of 64, the fake FlashKDA in float64.
    assert all(r["err_o"] < 1e-2 and r["err_s"] < 1e-2 for r in rows)
    assert rows[1]["err_s"] < 1e-7 < rows[0]["err_s"]
    assert {r["best_peer"] for r in rows} == {"flashkda-vllm"} and rows[0]["vs_best_peer"] == 2.5
    assert rows[0]["vs_fork"] == 2.5 and rows[1]["vs_fork"] == 1.0
    assert rows[0]["gpu_ms"] == 1.0 and rows[0]["eager_ms"] == 1.1 and rows[0]["host_us"] == 5.0
    assert rows[0]["timing"] == "graph" and rows[1]["pipeline"] == ""
    assert "+" in rows[0]["pipeline"]  # "<chunk>+<walk>, N groups" from plan.describe()
    head = (tmp_path / "bench.csv").read_text().splitlines()[0].split(",")
    assert head[-4:] == ["best_peer", "best_peer_ms", "vs_best_peer", "vs_fork"] and "pipeline" in head
    # Each row's plans (the wrapper keeps one per thread and stream, workspace included) are gone after its
    # timing, so a long run's memory does not grow with the shapes it has timed.
    from kdagen.runtime import dispatch

    assert not dispatch._last
