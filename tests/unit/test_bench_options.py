# SPDX-License-Identifier: Apache-2.0
"""`python -m kdagen bench` options, checked without a GPU: shapes, heads, implementations, the peers'
optional imports (fake packages), the best-peer ratios and FlashKDA's argument conversion."""

from __future__ import annotations

import math
import os
import sys
import time
from pathlib import Path

import pytest
import torch

from kdagen.bench import floor_ms, parse_workers, pick_impls, ref_fits
from kdagen.bench_peers import flashkda_inputs, peer_impls
from kdagen.bench_report import add_peer_ratios, format_table, kdagen_vs_fork, summary
from kdagen.bench_shapes import (QUICK, RAGGED, SERVING, SERVING_HEADS, STANDARD, TP, Shape, equal, pick_shapes,
                                 ragged_lens, serving_shapes)
from kdagen.bench_worker import Worker
from kdagen.cli import main


def test_shapes_default_sets_heads_and_explicit():
    assert pick_shapes([], [], "") == STANDARD + SERVING and len(STANDARD) == 15 and len(SERVING) >= 30
    assert pick_shapes([], ["quick"], "") == QUICK
    assert pick_shapes([], ["standard"], "12,96") == [s for s in STANDARD if s.H in (12, 96)]
    assert pick_shapes([], ["ragged", "tp"], "") == RAGGED + TP
    assert pick_shapes(["8:1024:2"], ["standard"], "12") == [equal(8, 1024, 2)]  # an explicit shape states its heads
    assert pick_shapes(["8:100,3000,17"], [], "") == [Shape(8, (100, 3000, 17), "custom")]


def test_standard_shapes_are_performance_md_fifteen():
    assert [(s.H, s.T, s.N) for s in STANDARD] == [
        (h, t, n) for h in (12, 32, 96) for (t, n) in ((4096, 1), (16384, 1), (65536, 1), (16384, 16), (65536, 64))]
    assert all(not s.ragged and s.lens == tuple([s.T // s.N] * s.N) for s in STANDARD)


def test_serving_set_is_fixed_ragged_and_within_its_ranges():
    assert serving_shapes() == SERVING  # the fixed generator: the same list on every call
    # Pinned: a change to the generator or the draw order changes every serving-set figure ever reported.
    assert SERVING[0] == Shape(12, (56, 282), "serving") and SERVING[1].H == 128 and SERVING[1].T == 18947
    for s in SERVING:
        assert s.H in SERVING_HEADS and 256 <= s.T <= 131072 and 1 <= s.N <= 256, s
        assert min(s.lens) >= 1 and sum(s.lens) == s.T and list(s.lens) == sorted(s.lens)
    assert len({s.H for s in SERVING}) >= 6 and sum(s.ragged for s in SERVING) >= 25
    assert serving_shapes(seed=1) != SERVING


def test_tp_and_ragged_sets():
    assert sorted({s.H for s in TP}) == [4, 8, 16] and all(s.N >= 64 and s.ragged for s in TP)
    assert all(s.ragged for s in RAGGED) and {s.H for s in RAGGED} <= {12, 32, 96}


def test_ragged_lens_sum_to_t_with_the_longest_last():
    import random

    for T, N in ((256, 1), (300, 299), (131072, 256), (1000, 1000)):
        lens = ragged_lens(T, N, random.Random(T + N))
        assert len(lens) == N and sum(lens) == T and min(lens) >= 1 and lens[-1] == max(lens)
    with pytest.raises(ValueError, match="need 1 <= N <= T"):
        ragged_lens(4, 5, random.Random(0))


@pytest.mark.parametrize("shape,sets,heads,msg", [
    (["12"], [], "", "expected integers as H:T:N"),
    (["12:4096:1:1"], [], "", "expected integers as H:T:N"),
    (["12:16:32"], [], "", "H:T:N wants 1 <= N <= T"),
    (["12:5,0"], [], "", "every length and H must be >= 1"),
    (["a:b:c"], [], "", "expected integers"),
    ([], ["standard"], "7", r"no shape of the sets standard has H in \[7\]; the heads there are \[12, 32, 96\]"),
    ([], [], "x", "expected integers"),
    ([], ["nope"], "", "--set 'nope': choose from standard, ragged, tp, serving, quick"),
])
def test_bad_shapes_say_what_is_wrong(shape, sets, heads, msg):
    with pytest.raises(SystemExit, match=msg):
        pick_shapes(shape, sets, heads)


def test_impls_by_short_or_full_name():
    avail = {"kdagen-triton": 1, "kdagen-fused": 2, "kdagen-triton-pair": 5}
    assert pick_impls(avail, []) == {"kdagen-triton": 1, "kdagen-fused": 2}  # the pair A/B only when named
    assert pick_impls(avail, ["triton-pair"]) == {"kdagen-triton-pair": 5}
    assert pick_impls(avail, ["triton"]) == {"kdagen-triton": 1}
    assert pick_impls(avail, ["kdagen-fused", "triton"]) == {"kdagen-fused": 2, "kdagen-triton": 1}
    with pytest.raises(SystemExit, match="fla-safe-gate is not available here"):
        pick_impls(avail, ["fla"])
    with pytest.raises(SystemExit, match="flashkda is not available here"):
        pick_impls(avail, ["flashkda"])
    with pytest.raises(SystemExit, match="choose from triton, triton-pair, fused, fla, flashkda, flashkda-vllm"):
        pick_impls(avail, ["flash"])
    peers = {"fla-safe-gate": 3, "flashkda": 4, "flashkda-vllm": 6}
    assert pick_impls(peers, ["flashkda", "fla"]) == {"flashkda": 4, "fla-safe-gate": 3}
    assert pick_impls(peers, ["flashkda-vllm"]) == {"flashkda-vllm": 6}


def test_flashkda_workers_name_a_build_folder(tmp_path):
    (tmp_path / "flash_kda").mkdir()
    (tmp_path / "flash_kda" / "__init__.py").write_text("")
    assert parse_workers([f"flashkda-vllm={tmp_path}", f"flashkda={tmp_path}"]) == {
        "flashkda-vllm": tmp_path.resolve(), "flashkda": tmp_path.resolve()}
    with pytest.raises(SystemExit, match="expected NAME=DIR with NAME flashkda"):
        parse_workers([f"fork={tmp_path}"])
    with pytest.raises(SystemExit, match="no flash_kda/__init__.py under"):
        parse_workers(["flashkda=/nonexistent"])


def test_a_worker_that_cannot_import_its_build_is_skipped_with_the_reason(tmp_path, capsys):
    (tmp_path / "flash_kda").mkdir()
    (tmp_path / "flash_kda" / "__init__.py").write_text("raise ImportError('_C.abi3.so: undefined symbol: x')\n")
    assert Worker.start("flashkda-vllm", tmp_path) is None
    assert "flashkda-vllm: flash_kda not importable: ImportError: _C.abi3.so: undefined symbol: x; not timing it" \
        in capsys.readouterr().err


def test_cli_checks_options_before_looking_for_a_gpu(capsys):
    with pytest.raises(SystemExit, match="choose from"):
        main(["bench", "--impl", "nope"])
    assert main(["bench", "--impl", "triton", "--heads", "12"]) == 2
    assert "needs a GPU" in capsys.readouterr().err
    assert main(["bench", "--impl", "triton", "--impl", "fla", "--impl", "flashkda", "--quick"]) == 2
    assert "needs a GPU" in capsys.readouterr().err
    with pytest.raises(SystemExit, match="--set 'x': choose from"):
        main(["bench", "--set", "x"])
    with pytest.raises(SystemExit, match="expected NAME=DIR"):
        main(["bench", "--flashkda", "nope"])


def test_host_time_drains_the_device_before_each_sample_and_takes_the_median():
    from kdagen.bench import host_us

    events = []
    costs = iter([5e-3] + [1e-3] * 8)  # one slow first call (a cache miss, say) does not move the median

    def fn():
        events.append("call")
        t = time.perf_counter() + next(costs)
        while time.perf_counter() < t:
            pass

    us = host_us(fn, lambda: events.append("sync"), n=9)
    assert events == ["sync", "call"] * 9 + ["sync"]
    assert 1000 <= us < 2500


def _row(impl, gpu_ms, err_at="own", timing="graph", pipeline=""):
    return dict(impl=impl, set="standard", H=12, T=4096, N=1, max_len=4096, gpu_ms=gpu_ms, eager_ms=0.355,
                host_us=98.4, timing=timing, floor_ms=0.015, mtok_s=15.1, pct_floor=5.6, err_o=3.1e-3, err_s=2.0e-6,
                err_at=err_at, pipeline=pipeline)


def test_best_peer_is_the_fastest_peer_that_ran_and_ratios_are_peer_over_ours():
    rows = [_row("kdagen-triton", 0.5), _row("kdagen-fused", 2.0), _row("fla-safe-gate", 1.2), _row("flashkda", 0.8)]
    add_peer_ratios(rows)
    assert {r["best_peer"] for r in rows} == {"flashkda"} and {r["best_peer_ms"] for r in rows} == {0.8}
    assert [r["vs_best_peer"] for r in rows] == pytest.approx([1.6, 0.4, 0.8 / 1.2, 1.0])
    only_fla = [_row("kdagen-triton", 0.5), _row("fla-safe-gate", 1.2)]
    add_peer_ratios(only_fla)
    assert only_fla[0]["best_peer"] == "fla-safe-gate" and only_fla[0]["vs_best_peer"] == pytest.approx(2.4)
    no_peer = [_row("kdagen-triton", 0.5)]
    add_peer_ratios(no_peer)
    assert no_peer[0]["best_peer"] == "" and math.isnan(no_peer[0]["vs_best_peer"])
    assert math.isnan(no_peer[0]["vs_fork"]) and math.isnan(kdagen_vs_fork(no_peer))


def test_fork_ratio_is_fork_over_each_row_and_over_the_fastest_kdagen():
    rows = [_row("kdagen-triton", 0.5), _row("kdagen-fused", 0.4), _row("flashkda-vllm", 0.6), _row("flashkda", 0.9)]
    add_peer_ratios(rows)
    assert {r["best_peer"] for r in rows} == {"flashkda-vllm"}  # the fork is a peer like the others
    assert [r["vs_fork"] for r in rows] == pytest.approx([1.2, 1.5, 1.0, 0.6 / 0.9])
    assert kdagen_vs_fork(rows) == pytest.approx(1.5)  # the fused path is the fastest kdagen here
    text = summary(rows)
    assert "kdagen-fused" in text.splitlines()[1] and "1.50" in text.splitlines()[1]
    assert text.splitlines()[-1] == "fastest kdagen / fork over 1 shapes: 1.500x .. 1.500x (fork ms / kdagen ms; " \
                                    "> 1: kdagen faster)"


def test_table_shows_host_time_errors_pipeline_and_the_ratios():
    rows = [_row("kdagen-triton", 0.5, pipeline="intra+walk groups=2"), _row("flashkda-vllm", 0.8, err_at="4:1000:3",
                                                                        timing="eager")]
    add_peer_ratios(rows)
    head, ours, peer, note = format_table(rows).splitlines()
    for col in ("set", "maxlen", "host us", "err o", "err s", "best peer", "peer/x", "fork/x", "pipeline"):
        assert col in head, col
    assert "98.4" in ours and "3.1e-03 " in ours and "flashkda-vllm" in ours
    assert ours.endswith("1.60   1.60  intra+walk groups=2") and "   0.500  " in ours
    assert "3.1e-03*" in peer and "2.0e-06*" in peer  # measured on the check shape, as the note says
    assert "   0.800e " in peer  # timed eagerly: marked
    assert note.startswith("* error on the check shape H:T:N = 4:1000:3")


def test_reference_is_run_only_where_it_fits():
    assert ref_fits(12, [1024] * 64) and ref_fits(32, [1024] * 64) and ref_fits(96, [16384])
    assert not ref_fits(12, [65536])  # one 65,536-token walk
    assert not ref_fits(96, [1024] * 64)  # 6.3 M token-heads
    assert not ref_fits(4, [100, 20000])  # the longest sequence bounds the walk
    assert sum(ref_fits(s.H, s.lens) for s in STANDARD) == 11


def test_floor_counts_token_bytes_state_bytes_and_flops():
    s = Shape(4, (1000, 24), "custom")
    # bytes: 1282 per token-head + 128 KiB per (sequence, head); FLOPs: 181,589 per token-head.
    assert floor_ms(s, 1e12, 1e30) == pytest.approx(1e3 * (1282 * 1024 * 4 + 131072 * 2 * 4) / 1e12)
    assert floor_ms(s, 1e30, 1e12) == pytest.approx(1e3 * 181589 * 1024 * 4 / 1e12)


@pytest.fixture
def fake_peers(tmp_path, monkeypatch):
    """A folder on sys.path for fake peer packages; the real (or earlier fake) ones are hidden."""
    for name in [m for m in sys.modules if m.split(".")[0] in ("fla", "flash_kda")]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setenv("FLA_FLASH_KDA", "unset by the fixture")  # recorded, so the test's own value is undone
    monkeypatch.delenv("FLA_FLASH_KDA")
    yield tmp_path
    for name in [m for m in sys.modules if m.split(".")[0] in ("fla", "flash_kda")]:
        del sys.modules[name]


def _package(root: Path, dotted: str, body: str) -> None:
    d = root.joinpath(*dotted.split("."))
    d.mkdir(parents=True, exist_ok=True)
    (d / "__init__.py").write_text(body)


def _fake_fla(root: Path) -> None:
    _package(root, "fla", "")
    _package(root, "fla.ops", "")
    _package(root, "fla.ops.kda", "import os\nSEEN = os.environ.get('FLA_FLASH_KDA')\ndef chunk_kda(**kw):\n    pass\n")


def test_both_peers_importable_sets_fla_flash_kda_before_fla_is_imported(fake_peers, monkeypatch):
    _package(fake_peers, "flash_kda", "def fwd(*a, **kw):\n    pass\n")
    _fake_fla(fake_peers)
    said = []
    impls = peer_impls(said.append)
    assert set(impls) == {"fla-safe-gate", "flashkda"}
    assert sys.modules["fla.ops.kda"].SEEN == "0" and os.environ["FLA_FLASH_KDA"] == "0" and said == []


def test_fla_is_imported_with_fla_flash_kda_0_also_without_flash_kda_here(fake_peers):
    # With worker processes timing the FlashKDA builds this process imports none, and fla must still not
    # reach for one that some other path could provide.
    _fake_fla(fake_peers)
    said = []
    assert set(peer_impls(said.append)) == {"fla-safe-gate"}
    assert sys.modules["fla.ops.kda"].SEEN == "0"
    assert said == ["FlashKDA: not importable (ModuleNotFoundError: No module named 'flash_kda')"]
    del sys.modules["fla.ops.kda"]
    said.clear()
    assert set(peer_impls(said.append, flashkda=False)) == {"fla-safe-gate"} and said == []


def test_a_broken_peer_is_reported_once_with_its_reason(fake_peers, monkeypatch):
    _package(fake_peers, "flash_kda", "raise ImportError('flash_kda_C.so: undefined symbol: _ZN3c10\\nmore')\n")
    monkeypatch.setitem(sys.modules, "fla", None)  # not installed
    said = []
    assert peer_impls(said.append) == {}
    assert said[0] == "FlashKDA: not importable (ImportError: flash_kda_C.so: undefined symbol: _ZN3c10)"
    assert len(said) == 2 and said[1].startswith("FLA: not importable (ModuleNotFoundError: ")


def _args(H=2, lens=(5, 11), K=128, V=128, dtype=torch.bfloat16, **over):
    g = torch.Generator().manual_seed(0)
    T, N = sum(lens), len(lens)
    args = dict(q=torch.randn(1, T, H, K, generator=g).to(dtype), k=torch.randn(1, T, H, K, generator=g).to(dtype),
                v=torch.randn(1, T, H, V, generator=g).to(dtype), raw_g=torch.randn(1, T, H, K, generator=g).to(dtype),
                raw_beta=torch.randn(1, T, H, generator=g).to(dtype), A_log=torch.rand(H, generator=g),
                g_bias=torch.rand(H * K, generator=g), initial_state=torch.randn(N, H, V, K, generator=g),
                output_final_state=True, lower_bound=-5.0, use_qk_l2norm_in_kernel=True,
                cu_seqlens=torch.tensor([0, *lens]).cumsum(0).to(torch.int32))
    args.update(over)
    return args


def test_flashkda_inputs_have_its_layouts_and_dtypes():
    args = _args()
    # A transposed view: FlashKDA wants every tensor contiguous, so the conversion must copy it.
    args["q"] = args["q"].transpose(1, 2).contiguous().transpose(1, 2)
    fk = flashkda_inputs(args)
    for name in ("q", "k", "v", "g", "beta", "A_log", "dt_bias", "initial_state", "cu_seqlens"):
        assert fk[name].is_contiguous(), name
    assert torch.equal(fk["q"], args["q"]) and fk["g"] is args["raw_g"] and fk["beta"] is args["raw_beta"]
    assert fk["dt_bias"].shape == (2, 128) and fk["dt_bias"].dtype == torch.float32
    assert torch.equal(fk["dt_bias"][1], args["g_bias"][128:])  # row h is head h's K biases
    assert fk["A_log"].shape == (2,) and fk["A_log"].dtype == torch.float32
    assert fk["initial_state"].shape == (2, 2, 128, 128) and fk["initial_state"].dtype == torch.float32
    assert torch.equal(fk["initial_state"], args["initial_state"])  # V-first on both sides: no transpose
    assert fk["cu_seqlens"].dtype == torch.int64 and fk["cu_seqlens"].tolist() == [0, 5, 16]
    assert fk["scale"] == 128**-0.5 and fk["lower_bound"] == -5.0
    assert flashkda_inputs(_args(scale=0.25))["scale"] == 0.25


@pytest.mark.parametrize("over,msg", [
    (dict(lower_bound=None), "lower_bound None"),
    (dict(use_qk_l2norm_in_kernel=False), "use_qk_l2norm_in_kernel=False"),
    (dict(K=64), "K=64, V=128"),
    (dict(dtype=torch.float16), "dtype torch.float16"),
    (dict(cu_seqlens=None), "no cu_seqlens"),
    (dict(initial_state=None), "no initial_state"),
])
def test_flashkda_inputs_reject_what_flashkda_cannot_compute(over, msg):
    with pytest.raises(ValueError, match=f"no FlashKDA form: {msg}"):
        flashkda_inputs(_args(**over))


def test_pipeline_column_is_the_plans_pipeline_line(monkeypatch):
    from types import SimpleNamespace

    from kdagen import bench

    asked = []
    text = "kdagen plan on cuda: v\n  batch: B=1\n  pipeline: hip_intra+hip_walk, 1 group\n  why: fits"
    monkeypatch.setattr(bench, "_plan", lambda a, ci, co, **kw: asked.append(kw) or SimpleNamespace(
        describe=lambda: text))
    assert bench.pipeline_of("kdagen-fused", {}, None, None) == "hip_intra+hip_walk, 1 group"
    assert bench.pipeline_of("kdagen-triton_pair+triton_walk", {}, None, None) == "hip_intra+hip_walk, 1 group"
    assert asked == [{"use_fused_chunk": True}, {"pipeline": "triton_pair+triton_walk"}]
    assert bench.pipeline_of("flashkda-vllm", {}, None, None) == ""
