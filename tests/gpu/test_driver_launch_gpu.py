# SPDX-License-Identifier: Apache-2.0
"""The driver launcher on the GPU (Note [Driver launch]): a plan's runs through cuda_launch.DriverLaunch give the
same bits as runs of a plan made with KDAGEN_TRITON_JIT_LAUNCH=1 (every launch through JITFunction.run), and
the driver launcher is the one each Triton launch used."""

from __future__ import annotations

import os
import threading

import pytest
import torch

pytestmark = pytest.mark.skipif(not torch.cuda.is_available() or os.environ.get("TRITON_INTERPRET") == "1",
                                reason="needs a GPU (and not the interpreter)")

import kdagen_kernels as kk  # noqa: E402
from tests.kda_cases import make_inputs  # noqa: E402

DEV, H, K, V = "cuda", 4, 128, 128
LENS = [300, 17, 130, 1]
CASES = [("triton_intra+triton_walk", None), ("triton_pair+triton_walk", None),
         ("triton_intra_tb+triton_walk_tb", None), ("triton_intra+triton_walk", 4)]


def _plan(a: dict, pipeline: str, groups: int | None, monkeypatch, jit: bool):
    monkeypatch.setenv("KDAGEN_TRITON_JIT_LAUNCH", "1" if jit else "0")  # read when the plan is made
    cu = a["cu_seqlens"]
    return kk.plan_kda_prefill(cu, cu.cpu(), num_heads=H, head_dim_k=K, head_dim_v=V, dtype=a["q"].dtype,
                               device=DEV, lower_bound=a["lower_bound"], has_g_bias=True,
                               use_qk_l2norm_in_kernel=True, output_final_state=True, pipeline=pipeline,
                               groups=groups)


def _runs(plan, a: dict, n: int = 4) -> list[tuple[torch.Tensor, torch.Tensor]]:
    out = []
    # Runs alternate no initial state and a dense one: each walk's first run goes through JITFunction.run, the
    # later ones through the launch kept for its key.
    for i in range(n):
        o, s = plan.run(a["q"], a["k"], a["v"], a["raw_g"], a["raw_beta"], a["A_log"], a["g_bias"],
                        initial_state=a["initial_state"] if i % 2 else None, out=torch.full_like(a["v"], float("nan")))
        out.append((o.clone(), s.clone()))
    torch.cuda.synchronize()
    return out


def _launchers(plan) -> set[str]:
    return {launch.launcher for state_in in (0, 1, 2) for launch in plan.program.launches(state_in)
            if launch.launchers}


@pytest.mark.parametrize("pipeline,groups", CASES, ids=[f"{p}-g{g}" for p, g in CASES])
def test_driver_launches_give_the_jit_s_bits(pipeline, groups, monkeypatch):
    a = make_inputs(LENS, H, K, V, torch.bfloat16, DEV, seed=3)
    jit = _plan(a, pipeline, groups, monkeypatch, jit=True)
    driver = _plan(a, pipeline, groups, monkeypatch, jit=False)
    want, got = _runs(jit, a), _runs(driver, a)
    assert {launch.launcher for s in (0, 1, 2) for launch in jit.program.launches(s)} == {"jit"}
    assert _launchers(driver) == {"driver"}, driver.describe()
    for (o1, s1), (o2, s2) in zip(want, got):
        assert torch.equal(o1, o2) and torch.equal(s1, s2)


def test_two_plans_from_two_threads_on_two_streams(monkeypatch):
    # Each thread runs its own plan (a plan's workspace is its own) on its own inputs, concurrently: every
    # result is that plan's single-threaded one.
    inputs = [make_inputs(LENS, H, K, V, torch.bfloat16, DEV, seed=s) for s in (4, 5)]
    plans = [_plan(a, "triton_intra+triton_walk", None, monkeypatch, jit=False) for a in inputs]
    want = [_runs(p, a, n=2)[1] for p, a in zip(plans, inputs)]  # warm: the second run is a kept launch
    streams = [torch.cuda.Stream() for _ in plans]
    results: list[list] = [[], []]
    torch.cuda.synchronize()

    def worker(t: int) -> None:
        a = inputs[t]
        with torch.cuda.stream(streams[t]):
            for _ in range(20):
                results[t].append(plans[t].run(a["q"], a["k"], a["v"], a["raw_g"], a["raw_beta"], a["A_log"],
                                               a["g_bias"], initial_state=a["initial_state"]))

    threads = [threading.Thread(target=worker, args=(t,)) for t in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    torch.cuda.synchronize()
    for t, plan in enumerate(plans):
        assert _launchers(plan) == {"driver"}, plan.describe()
        for o, s in results[t]:
            assert torch.equal(o, want[t][0]) and torch.equal(s, want[t][1])
