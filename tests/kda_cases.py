# SPDX-License-Identifier: Apache-2.0
"""Shared test inputs (random, never zeros) and NaN-poisoned outputs; tolerances: tests/tolerances.py."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch


def cu_of(lens: list[int], device) -> torch.Tensor:
    cu = [0]
    for n in lens:
        cu.append(cu[-1] + n)
    return torch.tensor(cu, dtype=torch.int32, device=device)


def make_inputs(lens: list[int], H: int, K: int, V: int, dtype: torch.dtype, device, *, seed: int = 0,
                lower_bound: float | None = -5.0, g_bias: bool = True, h0: bool = True,
                strided: bool = False, adversarial: bool = False) -> dict:
    """kwargs for chunk_kda_prefill on a packed ragged batch."""
    gen = torch.Generator(device="cpu").manual_seed(seed)
    T = sum(lens)

    def rnd(*shape, s=1.0):
        return (torch.randn(*shape, generator=gen) * s)

    q = rnd(1, T, H, K)
    k = rnd(1, T, H, K)
    if adversarial:
        # Near-duplicate keys within each chunk, real K3 gate biases, beta near 0.95.
        base = rnd(1, 1, H, K)
        k = base + 0.05 * k
    args = dict(q=q.to(dtype), k=k.to(dtype), v=rnd(1, T, H, V).to(dtype))
    if strided:
        width = H * K + H + 5
        # Built on the target device and sliced there: `.to(device)` of a gapped view would make it dense.
        proj = rnd(1, T, width).to(dtype).to(device)
        args["raw_g"] = proj[..., :H * K].unflatten(-1, (H, K))
        args["raw_beta"] = proj[..., H * K:H * K + H]
    else:
        args["raw_g"] = rnd(1, T, H, K).to(dtype)
        args["raw_beta"] = rnd(1, T, H).to(dtype)
    if adversarial:
        args["raw_beta"] = torch.full((1, T, H), 2.95, dtype=dtype) + 0.01 * rnd(1, T, H).to(dtype)
    args["A_log"] = torch.rand(H, generator=gen)
    if g_bias:
        gb = torch.rand(H * K, generator=gen)
        args["g_bias"] = (-7.8 + 6.4 * gb) if adversarial else gb
    args["lower_bound"] = lower_bound
    args["use_qk_l2norm_in_kernel"] = True
    args["cu_seqlens"] = cu_of(lens, "cpu")
    if h0:
        args["initial_state"] = rnd(len(lens), H, V, K, s=0.1)
        args["output_final_state"] = True
    return {k_: (v_.to(device) if isinstance(v_, torch.Tensor) else v_) for k_, v_ in args.items()}


def poisoned_out(v: torch.Tensor) -> torch.Tensor:
    return torch.full_like(v, float("nan"))


def graph_replay(call: Callable[[], Any], out: torch.Tensor) -> tuple[Any, torch.cuda.CUDAGraph]:
    """`call` warmed up on a side stream, captured into a CUDA graph, then replayed once with `out` poisoned
    first: what the captured call returned, and the graph (keep it while using that: its memory pool)."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # warm up outside the capture
        call()
    torch.cuda.current_stream().wait_stream(side)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        got = call()
    out.fill_(float("nan"))
    graph.replay()
    torch.cuda.synchronize()
    return got, graph
