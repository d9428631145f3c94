# SPDX-License-Identifier: Apache-2.0
"""The op's front door on a GPU: one plan per stream, device metadata made under inference mode, and the
compiled wrapper on the path a call takes there (the fused one where it builds). Results compared bit for bit
with eager calls on the same inputs."""

from __future__ import annotations

import pytest
import torch

if not torch.cuda.is_available():
    pytest.skip("no GPU", allow_module_level=True)

import kdagen_kernels as kk
from kdagen.runtime import dispatch
from tests.kda_cases import cu_of, make_inputs

DEV, H, K, V = "cuda", 4, 128, 128
LENS = [300, 17, 130]


def _args(seed: int = 0, **kw) -> dict:
    a = make_inputs(LENS, H, K, V, torch.bfloat16, DEV, seed=seed, **kw)
    cu = a["cu_seqlens"]
    a["chunk_indices"], a["chunk_offsets"] = kk.prepare_chunk_metadata_device(cu, cu.cpu(), 64)
    return a


def test_two_streams_get_two_plans_and_their_own_results():
    inputs = [_args(seed=s) for s in (1, 2)]
    for a in inputs[1:]:
        for n in ("cu_seqlens", "chunk_indices", "chunk_offsets"):
            a[n] = inputs[0][n]  # shared metadata objects, as in a dual-batch overlap
    refs = [kk.chunk_kda_prefill(**a) for a in inputs]
    dispatch.clear_plans()
    streams = [torch.cuda.Stream() for _ in inputs]
    torch.cuda.synchronize()
    results = []
    for _ in range(3):
        for a, s in zip(inputs, streams):
            with torch.cuda.stream(s):
                results.append(kk.chunk_kda_prefill(**a))
    torch.cuda.synchronize()
    assert len({id(c.plan) for c in dispatch._last.values()}) == 2
    for i, (o, f) in enumerate(results):
        assert torch.equal(o, refs[i % 2][0]) and torch.equal(f, refs[i % 2][1])


def test_inference_mode_device_metadata_is_never_stale():
    with torch.inference_mode():
        a = _args()
        o1, f1 = kk.chunk_kda_prefill(**a)
        o2, f2 = kk.chunk_kda_prefill(**a)
        assert torch.equal(o1, o2) and torch.equal(f1, f2)
        # Same objects edited in place (same shapes): lens [300, 17, 130] -> [130, 17, 300].
        new = cu_of([130, 17, 300], DEV)
        a["cu_seqlens"].copy_(new)
        ci, co = kk.prepare_chunk_metadata_device(new, new.cpu(), 64)
        a["chunk_indices"].copy_(ci)
        a["chunk_offsets"].copy_(co)
        o3, f3 = kk.chunk_kda_prefill(**a)
        dispatch.clear_plans()
        o4, f4 = kk.chunk_kda_prefill(**dict(a, cu_seqlens=new, chunk_indices=ci, chunk_offsets=co))
    assert torch.equal(o3, o4) and torch.equal(f3, f4)


@pytest.mark.parametrize("fused", [False, True])
def test_the_compiled_wrapper_matches_eager(fused):
    a = _args(h0=False)
    kw = {n: a.pop(n) for n in ("lower_bound", "use_qk_l2norm_in_kernel", "cu_seqlens", "chunk_indices",
                                "chunk_offsets")}
    v_eager = a["v"].clone()
    o_ref, _ = kk.chunk_kda_prefill(**dict(a, v=v_eager), **kw, use_fused_chunk=fused)

    def f(q, k, v, raw_g, raw_beta, A_log, g_bias):
        return kk.chunk_kda_prefill(q, k, v, raw_g, raw_beta, A_log, g_bias, **kw, use_fused_chunk=fused)

    torch._dynamo.reset()
    o, _ = torch.compile(f, fullgraph=True)(*(a[n] for n in ("q", "k", "v", "raw_g", "raw_beta", "A_log", "g_bias")))
    assert torch.equal(o, o_ref)
    # Where eager wrote the output into v (the fused path's contract), so did the compiled call.
    assert torch.equal(a["v"], v_eager)
