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

from kdagen.bench import QUICK, SHAPES, pick_impls, pick_shapes, ref_fits
from kdagen.bench_peers import flashkda_inputs, peer_impls
from kdagen.bench_report import add_peer_ratios, format_table
from kdagen.cli import main


def test_shapes_default_quick_heads_and_explicit():
    assert pick_shapes([], False, "") == SHAPES and len(SHAPES) == 15
    assert pick_shapes([], True, "") == QUICK
    assert pick_shapes([], False, "12,96") == [s for s in SHAPES if s[0] in (12, 96)]
    assert pick_shapes(["8:1024:2"], False, "12") == [(8, 1024, 2)]  # an explicit shape states its heads


@pytest.mark.parametrize("shape,heads,msg", [
    (["12:4096"], "", "H:T:N with 1 <= N <= T"),
    (["12:16:32"], "", "H:T:N with 1 <= N <= T"),
    (["a:b:c"], "", "expected integers"),
    ([], "7", r"no shape has H in \[7\]; the heads there are \[12, 32, 96\]"),
    ([], "x", "expected integers"),
])
def test_bad_shapes_say_what_is_wrong(shape, heads, msg):
    with pytest.raises(SystemExit, match=msg):
        pick_shapes(shape, False, heads)


def test_impls_by_short_or_full_name():
    avail = {"kdagen-triton": 1, "kdagen-fused": 2}
    assert pick_impls(avail, []) == avail
    assert pick_impls(avail, ["triton"]) == {"kdagen-triton": 1}
    assert pick_impls(avail, ["kdagen-fused", "triton"]) == {"kdagen-fused": 2, "kdagen-triton": 1}
    with pytest.raises(SystemExit, match="fla-safe-gate is not available here"):
        pick_impls(avail, ["fla"])
    with pytest.raises(SystemExit, match="flashkda is not available here"):
        pick_impls(avail, ["flashkda"])
    with pytest.raises(SystemExit, match="choose from triton, triton-pair, fused, fla, flashkda"):
        pick_impls(avail, ["flash"])
    peers = {"fla-safe-gate": 3, "flashkda": 4}
    assert pick_impls(peers, ["flashkda", "fla"]) == {"flashkda": 4, "fla-safe-gate": 3}


def test_cli_checks_options_before_looking_for_a_gpu(capsys):
    with pytest.raises(SystemExit, match="choose from"):
        main(["bench", "--impl", "nope"])
    assert main(["bench", "--impl", "triton", "--heads", "12"]) == 2
    assert "needs a GPU" in capsys.readouterr().err
    assert main(["bench", "--impl", "triton", "--impl", "fla", "--impl", "flashkda", "--quick"]) == 2
    assert "needs a GPU" in capsys.readouterr().err


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


def _row(impl, gpu_ms, err_at="own"):
    return dict(impl=impl, H=12, T=4096, N=1, gpu_ms=gpu_ms, eager_ms=0.355, host_us=98.4, floor_ms=0.015,
                mtok_s=15.1, pct_floor=5.6, err_o=3.1e-3, err_s=2.0e-6, err_at=err_at)


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


def test_table_shows_host_time_errors_and_the_ratio_to_the_best_peer():
    rows = [_row("kdagen-triton", 0.5), _row("flashkda", 0.8, err_at="4:1000:3")]
    add_peer_ratios(rows)
    head, ours, peer, note = format_table(rows).splitlines()
    assert "host us" in head and "err o" in head and "err s" in head and "best peer" in head and "peer/x" in head
    assert "98.4" in ours and "3.1e-03 " in ours and "flashkda" in ours and ours.endswith("1.60")
    assert "3.1e-03*" in peer and "2.0e-06*" in peer  # measured on the check shape, as the note says
    assert note.startswith("* error on the check shape H:T:N = 4:1000:3")


def test_reference_is_run_only_where_it_fits():
    assert ref_fits(12, 65536, 64) and ref_fits(32, 65536, 64) and ref_fits(96, 16384, 1)
    assert not ref_fits(12, 65536, 1)  # one 65,536-token walk
    assert not ref_fits(96, 65536, 64)  # 6.3 M token-heads
    assert sum(ref_fits(*s) for s in SHAPES) == 11


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


def test_both_peers_importable_sets_fla_flash_kda_before_fla_is_imported(fake_peers, monkeypatch):
    _package(fake_peers, "flash_kda", "def fwd(*a, **kw):\n    pass\n")
    _package(fake_peers, "fla", "")
    _package(fake_peers, "fla.ops", "")
    _package(fake_peers, "fla.ops.kda", "import os\nSEEN = os.environ.get('FLA_FLASH_KDA')\n"
                                        "def chunk_kda(**kw):\n    pass\n")
    said = []
    impls = peer_impls(said.append)
    assert set(impls) == {"fla-safe-gate", "flashkda"}
    assert sys.modules["fla.ops.kda"].SEEN == "0" and os.environ["FLA_FLASH_KDA"] == "0"
    assert said == ["FLA_FLASH_KDA=0 set: flash_kda is importable, and fla-core would hand chunk_kda to it"]


def test_fla_alone_leaves_fla_flash_kda_unset(fake_peers):
    _package(fake_peers, "fla.ops.kda", "def chunk_kda(**kw):\n    pass\n")
    _package(fake_peers, "fla", "")
    _package(fake_peers, "fla.ops", "")
    said = []
    assert set(peer_impls(said.append)) == {"fla-safe-gate"}
    assert "FLA_FLASH_KDA" not in os.environ
    assert said == ["FlashKDA: not importable (ModuleNotFoundError: No module named 'flash_kda')"]


def test_a_broken_peer_is_reported_once_with_its_reason(fake_peers, monkeypatch):
    _package(fake_peers, "flash_kda", "raise ImportError('flash_kda_C.so: undefined symbol: _ZN3c10\\nmore')\n")
    monkeypatch.setitem(sys.modules, "fla", None)  # not installed
    said = []
    assert peer_impls(said.append) == {}
    assert said[0] == "FlashKDA: not importable (ImportError: flash_kda_C.so: undefined symbol: _ZN3c10)"
    assert len(said) == 2 and said[1].startswith("FLA: not importable (ModuleNotFoundError: ")
    assert "FLA_FLASH_KDA" not in os.environ


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
