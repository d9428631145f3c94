# SPDX-License-Identifier: Apache-2.0
"""The op's front door in the interpreter: the custom op under torch.compile and opcheck, the plan cache under
inference mode and across threads, and inputs that used to give a silent wrong answer, refused before anything
is written. Small cases (the interpreter is slow); results compared bit for bit with an eager call."""

from __future__ import annotations

import threading
import time

import pytest
import torch

import kdagen_kernels as kk
from kdagen.runtime import dispatch
from tests.kda_cases import cu_of, make_inputs

H, K, V = 2, 64, 64
LENS = [9, 3]


def _args(seed: int = 0, lens=LENS, **kw) -> dict:
    return make_inputs(lens, H, K, V, torch.bfloat16, "cpu", seed=seed, **kw)


def _layer(a: dict) -> tuple:
    return tuple(a[n] for n in ("q", "k", "v", "raw_g", "raw_beta", "A_log", "g_bias"))


# ---------------------------------------------------------------------------------------------- custom op
class _Prefill(torch.nn.Module):
    def forward(self, q, k, v, raw_g, raw_beta, A_log, g_bias, initial_state, cu_seqlens):
        return kk.chunk_kda_prefill(q, k, v, raw_g, raw_beta, A_log, g_bias, initial_state=initial_state,
                                    output_final_state=True, lower_bound=-5.0, use_qk_l2norm_in_kernel=True,
                                    cu_seqlens=cu_seqlens)


def test_the_wrapper_compiles_to_one_graph_with_eagers_results():
    a = _args()
    o_ref, f_ref = kk.chunk_kda_prefill(**a)
    torch._dynamo.reset()
    m = torch.compile(_Prefill(), fullgraph=True, backend="aot_eager")  # fullgraph: a graph break raises
    o, f = m(*_layer(a), a["initial_state"], a["cu_seqlens"])
    assert torch.equal(o, o_ref) and torch.equal(f, f_ref)


def test_the_compiled_wrapper_writes_the_callers_buffers():
    a = _args(h0=False)
    cache = torch.randn(4, H, V, K) * 0.1
    slots, has_init = torch.tensor([2, 0], dtype=torch.int32), torch.tensor([True, False])
    kw = dict(lower_bound=-5.0, use_qk_l2norm_in_kernel=True, cu_seqlens=a["cu_seqlens"], state_indices=slots,
              has_initial_state=has_init)
    ref_cache, ref_out = cache.clone(), torch.empty_like(a["v"])
    kk.chunk_kda_prefill(*_layer(a), out=ref_out, state_cache=ref_cache, **kw)

    def f(q, k, v, raw_g, raw_beta, A_log, g_bias, out, state_cache):
        return kk.chunk_kda_prefill(q, k, v, raw_g, raw_beta, A_log, g_bias, out=out, state_cache=state_cache, **kw)

    torch._dynamo.reset()
    out = torch.full_like(a["v"], float("nan"))
    o, final = torch.compile(f, fullgraph=True, backend="aot_eager")(*_layer(a), out, cache)
    assert o is out and final is None
    assert torch.equal(out, ref_out) and torch.equal(cache, ref_cache)


@pytest.mark.parametrize("states", ["dense", "paged"])
def test_opcheck_passes(states):
    # opcheck: the schema's mutations are the only writes, the fake agrees with the real op, tracing works.
    a = _args(h0=states == "dense")
    out = torch.empty_like(a["v"])
    if states == "dense":
        dense = (a["initial_state"], True)
        paged = (None, None, torch.empty(len(LENS), H, V, K))
    else:
        dense = (None, False)
        paged = (torch.tensor([2, 0], dtype=torch.int32), torch.tensor([True, False]), None)
    cache = torch.randn(4, H, V, K) * 0.1 if states == "paged" else None
    args = (0, *_layer(a), None, *dense, -5.0, True, a["cu_seqlens"], None, None, False, out, None, None, None,
            cache, *paged)
    torch.library.opcheck(torch.ops.kdagen.chunk_kda_prefill.default, args)


# ------------------------------------------------------------------------------------ inference-mode cache
def _cached_call(a, **kw):
    return kk.chunk_kda_prefill(**a, **kw)


def test_inference_mode_metadata_is_cached_and_an_edit_is_seen():
    with torch.inference_mode():
        a = _args()
        cu = a["cu_seqlens"]
        ci, co = kk.prepare_chunk_indices(cu, 64), kk.prepare_chunk_offsets(cu, 64)
        o1, _ = _cached_call(a, chunk_indices=ci, chunk_offsets=co)
        plan = next(iter(dispatch._last.values())).plan
        o2, _ = _cached_call(a, chunk_indices=ci, chunk_offsets=co)
        assert next(iter(dispatch._last.values())).plan is plan  # a hit: no re-plan per layer
        assert torch.equal(o1, o2)
        # Same objects, edited in place: [9, 3] -> [3, 9].
        cu[1] = 3
        ci.copy_(kk.prepare_chunk_indices(cu, 64))
        co.copy_(kk.prepare_chunk_offsets(cu, 64))
        o3, f3 = _cached_call(a, chunk_indices=ci, chunk_offsets=co)
        # A new plan: the old one's checks (and, once plans own their metadata copies, its values) are stale.
        assert next(iter(dispatch._last.values())).plan is not plan
        dispatch.clear_plans()
        fresh = dict(a, cu_seqlens=cu_of([3, 9], "cpu"))
        o4, f4 = _cached_call(fresh)
    assert torch.equal(o3, o4) and torch.equal(f3, f4)


def test_inference_mode_device_metadata_refreshes_the_plan(monkeypatch):
    # On a device the plan copies un-versioned metadata into its own buffers on every hit (no GPU here: the
    # CPU tensors are made to look like device ones to the cache).
    calls = []
    monkeypatch.setattr(dispatch, "_stamp", lambda t: -1 if t is None else dispatch._REFRESH)
    monkeypatch.setattr(kk.KdaPrefillPlan, "refresh_metadata", lambda self, *m: calls.append(m), raising=False)
    with torch.inference_mode():
        a = _args()  # with chunk metadata: a plan that built its own from cu_seqlens re-plans instead
        a.update(chunk_indices=kk.prepare_chunk_indices(a["cu_seqlens"], 64),
                 chunk_offsets=kk.prepare_chunk_offsets(a["cu_seqlens"], 64))
        _cached_call(a)
        plan = next(iter(dispatch._last.values())).plan
        _cached_call(a)
        _cached_call(a)
    assert next(iter(dispatch._last.values())).plan is plan
    assert len(calls) == 2 and all(m[0] is a["cu_seqlens"] for m in calls)


def test_plan_refuses_a_cpu_cu_seqlens_unlike_its_cpu_copy():
    with torch.inference_mode():
        cu = cu_of(LENS, "cpu")
        with pytest.raises(ValueError, match="cu_seqlens_cpu must be equal to cu_seqlens"):
            kk.plan_kda_prefill(cu, cu_of([3, 9], "cpu"), num_heads=H, head_dim_k=K, head_dim_v=V)
        kk.plan_kda_prefill(cu, cu.clone(), num_heads=H, head_dim_k=K, head_dim_v=V)  # equal: fine


# ----------------------------------------------------------------------------------------------- threads
def test_two_threads_calling_at_once_each_get_their_own_result(monkeypatch):
    # Triton's interpreter is not thread-safe: one launch at a time, the threads switching between launches
    # (each call is several), which is where two calls on one workspace would overwrite each other.
    from triton.runtime.interpreter import InterpretedFunction

    launch, lock = InterpretedFunction.run, threading.Lock()

    def one_at_a_time(self, *args, **kwargs):
        with lock:
            r = launch(self, *args, **kwargs)
        time.sleep(0.001)  # let the other thread launch next
        return r

    monkeypatch.setattr(InterpretedFunction, "run", one_at_a_time)
    inputs = [_args(seed=s) for s in (1, 2)]
    # Same metadata objects in both threads, as vLLM's dual-batch overlap shares them.
    for a in inputs[1:]:
        a["cu_seqlens"] = inputs[0]["cu_seqlens"]
    refs = [kk.chunk_kda_prefill(**a) for a in inputs]
    dispatch.clear_plans()
    results: dict[int, list] = {0: [], 1: []}
    start = threading.Barrier(2)
    errors: list[BaseException] = []

    def worker(i: int) -> None:
        try:
            start.wait()
            for _ in range(3):
                results[i].append(kk.chunk_kda_prefill(**inputs[i]))
        except BaseException as exc:  # noqa: BLE001 (re-raised below)
            errors.append(exc)

    threads = [threading.Thread(target=worker, args=(i,)) for i in (0, 1)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    for i in (0, 1):
        for o, f in results[i]:
            assert torch.equal(o, refs[i][0]) and torch.equal(f, refs[i][1])
    assert len({id(c.plan) for c in dispatch._last.values()}) == 2  # one plan (and workspace) per thread


# ------------------------------------------------------------------------------------ silent-wrong inputs
def _refused(a: dict, match: str, watch: dict[str, torch.Tensor], **kw) -> None:
    before = {n: t.clone() for n, t in watch.items()}
    with pytest.raises(ValueError, match=match):
        kk.chunk_kda_prefill(**a, **kw)
    for n, t in watch.items():
        assert torch.allclose(t, before[n], rtol=0, atol=0, equal_nan=True), f"{n} was written before the refusal"


@pytest.mark.parametrize("name", ["A_log", "g_bias"])
def test_a_strided_1d_gate_parameter_is_refused(name):
    a = _args()
    a[name] = torch.stack([a[name], a[name]], 1).flatten()[::2]  # same values, stride 2
    out = torch.full_like(a["v"], float("nan"))
    _refused(a, f"{name} must be contiguous", {"out": out}, out=out)


def test_an_expanded_out_is_refused():
    a = _args()
    out = torch.zeros(1, 1, H, V, dtype=a["v"].dtype).expand(1, sum(LENS), H, V)
    _refused(a, "out must be a buffer whose elements do not overlap", {"out": out}, out=out)


def test_a_checkpoint_on_a_live_state_cache_row_is_refused():
    a = _args(lens=[70, 3], h0=False)  # a snapshot at token 64 of sequence 0
    cache = torch.randn(4, H, V, K) * 0.1
    kw = dict(state_cache=cache, state_indices=torch.tensor([0, 1], dtype=torch.int32),
              has_initial_state=torch.tensor([True, True]), checkpoint_state=cache,
              checkpoint_offsets=torch.tensor([0, 0], dtype=torch.int32))
    # Sequence 0's snapshot goes to row 1, sequence 1's live state: refused.
    kw["checkpoint_offsets"] = torch.tensor([64, 0], dtype=torch.int32)
    kw["checkpoint_state_indices"] = torch.tensor([1, 3], dtype=torch.int32)
    _refused(a, "snapshot row 1 on state_cache row 1", {"cache": cache}, **kw)
    kw["checkpoint_state_indices"] = torch.tensor([3, 2], dtype=torch.int32)  # spare rows: runs
    kk.chunk_kda_prefill(**a, **kw)


def test_a_checkpoint_on_the_initial_state_is_refused():
    a = _args(lens=[70, 3])
    ckpt = a["initial_state"]
    _refused(a, "checkpoint_state must be memory disjoint from initial_state", {"initial_state": ckpt},
             checkpoint_state=ckpt, checkpoint_offsets=torch.tensor([64, 0], dtype=torch.int32))


# ------------------------------------------------------------------------------- plan.run's per-layer checks
def _plan(**kw):
    cu = cu_of(LENS, "cpu")
    return kk.plan_kda_prefill(cu, cu, num_heads=H, head_dim_k=K, head_dim_v=V, lower_bound=-5.0, has_g_bias=True,
                               use_qk_l2norm_in_kernel=True, **kw)


def test_run_refuses_an_out_inside_the_state_cache():
    a = _args(h0=False)
    plan = _plan(state_indices=torch.tensor([0, 1], dtype=torch.int32), has_initial_state=torch.tensor([True, True]))
    cache = torch.randn(8, H, V, K)
    # `out` as a bf16 view of the cache's spare rows 4..7: the walk would read and write the states under it.
    out = cache[4:].view(torch.bfloat16).flatten()[:sum(LENS) * H * V].view(1, sum(LENS), H, V)
    before = cache.clone()
    with pytest.raises(ValueError, match="out must be memory disjoint from state_cache"):
        plan.run(*_layer(a), out=out, state_cache=cache)
    assert torch.equal(cache, before)


@pytest.mark.parametrize("layout", ["k_first", "padded_rows"])
def test_run_refuses_a_non_dense_initial_state(layout):
    a = _args()
    plan = _plan()
    h0 = a["initial_state"]
    if layout == "k_first":
        h0 = h0.transpose(-1, -2).contiguous().transpose(-1, -2)  # [N, H, V, K] values, K-first in memory
    else:
        h0 = torch.zeros(len(LENS), H, V, K + 4)[..., :K].copy_(h0)  # each row's [V, K] not dense
    out = torch.full_like(a["v"], float("nan"))
    with pytest.raises(ValueError, match="initial_state must be dense in its"):
        plan.run(*_layer(a), initial_state=h0, out=out)
    assert out.isnan().all()
