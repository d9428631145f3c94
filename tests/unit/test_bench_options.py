# SPDX-License-Identifier: Apache-2.0
"""`python -m kdagen bench` options, checked without a GPU: shapes, heads and implementations."""

from __future__ import annotations

import time

import pytest

from kdagen.bench import QUICK, SHAPES, pick_impls, pick_shapes
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
    with pytest.raises(SystemExit, match="choose from triton, fused, fla"):
        pick_impls(avail, ["flash"])


def test_cli_checks_options_before_looking_for_a_gpu(capsys):
    with pytest.raises(SystemExit, match="choose from"):
        main(["bench", "--impl", "nope"])
    assert main(["bench", "--impl", "triton", "--heads", "12"]) == 2
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


def test_table_shows_the_host_time():
    from kdagen.bench import format_table

    row = dict(impl="kdagen-triton", H=12, T=4096, N=1, gpu_ms=0.271, eager_ms=0.355, host_us=98.4,
               floor_ms=0.015, mtok_s=15.1, pct_floor=5.6, speedup_vs_fla=0.985)
    head, line = format_table([row]).splitlines()
    assert "host us" in head and "98.4" in line
