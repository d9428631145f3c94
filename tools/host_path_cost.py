# SPDX-License-Identifier: Apache-2.0
"""Host-side cost of a chunk_kda_prefill call and of a plan's run, as multiples of one `a.add_(b)`.

Usage: TRITON_INTERPRET=1 PYTHONPATH=.:generated python tools/host_path_cost.py [H:T:N] [--profile]
       PYTHONPATH=.:generated python tools/host_path_cost.py --cuda [H:T:N]    (on a GPU)

vLLM's common case on CPU tensors: bf16, K = V = 128, cu_seqlens with caller-built chunk metadata, the
safe gate with g_bias, L2 norm in kernel, a paged state cache, `out` given. Triton's interpreter launch
entry (InterpretedFunction.run) is replaced by a no-op and torch runs on one thread, so what is timed is
kdagen's Python path plus Triton's own launch closure: the per-layer checks, the argument binding and the
plan cache's lookup. The figure is the median of interleaved rounds of each, reported as a ratio to one
`add_` of two 16-float tensors timed in the same rounds, so that a slower or busier machine moves both.

With --cuda the tensors are on the GPU and the launches are real: each sample drains the device first, so
the figure is the host time of one call on an idle device (the bench's host column), and `add_` is one
launch of torch's add kernel.
"""

from __future__ import annotations

import statistics
import sys
import time

import torch


def _median_us(fn, n: int, sync=None) -> float:
    samples = []
    for _ in range(n):
        if sync is not None:
            sync()
        t = time.perf_counter()
        fn()
        samples.append(time.perf_counter() - t)
    return statistics.median(samples) * 1e6


def main() -> None:
    torch.set_num_threads(1)
    import kdagen_kernels as kk
    from kdagen.bench import make_inputs

    argv = sys.argv[1:]
    cuda = "--cuda" in argv
    dev = "cuda" if cuda else "cpu"
    sync = torch.cuda.synchronize if cuda else None
    shape = [a for a in argv if not a.startswith("--")]
    H, T, N = (int(x) for x in (shape[0] if shape else ("12:4096:1" if cuda else "12:1024:4")).split(":"))
    args, ci, co = make_inputs(H, [T // N] * N, K=128, V=128, seed=1, device=dev)
    cache = torch.randn(N + 4, H, 128, 128, device=dev)
    slots = torch.arange(N, dtype=torch.int32, device=dev)
    has_init = torch.ones(N, dtype=torch.bool, device=dev)
    out = torch.empty_like(args["v"])
    q, k, v, g, beta, A_log, g_bias = (args[n] for n in ("q", "k", "v", "raw_g", "raw_beta", "A_log", "g_bias"))
    cu = args["cu_seqlens"]
    plan = kk.plan_kda_prefill(cu, cu.cpu(), num_heads=H, head_dim_k=128, head_dim_v=128, lower_bound=args["lower_bound"],
                               has_g_bias=True, use_qk_l2norm_in_kernel=True, chunk_indices=ci, chunk_offsets=co,
                               state_indices=slots, has_initial_state=has_init)
    if not cuda:
        from triton.runtime.interpreter import InterpretedFunction

        InterpretedFunction.run = lambda self, *a, **kw: None  # the launches themselves: no-ops from here on

    def call():
        kk.chunk_kda_prefill(q, k, v, g, beta, A_log, g_bias, lower_bound=args["lower_bound"],
                             use_qk_l2norm_in_kernel=True, cu_seqlens=cu, chunk_indices=ci, chunk_offsets=co,
                             out=out, state_cache=cache, state_indices=slots, has_initial_state=has_init)

    def run():
        plan.run(q, k, v, g, beta, A_log, g_bias, out=out, state_cache=cache)

    a, b = torch.randn(16, device=dev), torch.randn(16, device=dev)

    def add():
        a.add_(b)

    n = 40 if cuda else 400
    for f in (add, call, run):
        _median_us(f, n, sync)
    rounds = {"add": [], "call": [], "run": []}
    for _ in range(15):
        for name, f in (("add", add), ("call", call), ("run", run)):
            rounds[name].append(_median_us(f, n, sync))
    add_us, call_us, run_us = (statistics.median(rounds[n]) for n in ("add", "call", "run"))
    how = "on the GPU, idle device per sample" if cuda else "launches no-ops, one torch thread"
    print(f"H={H} T={T} N={N}, {how} (median of 15 rounds x {n}):")
    print(f"  a.add_(b), 16 floats      {add_us:7.2f} us")
    print(f"  chunk_kda_prefill (cached) {call_us:7.1f} us = {call_us / add_us:5.1f}x add_")
    print(f"  plan.run                   {run_us:7.1f} us = {run_us / add_us:5.1f}x add_")
    if "--profile" in argv:
        import cProfile
        import pstats

        pr = cProfile.Profile()
        pr.enable()
        for _ in range(2000):
            call()
        pr.disable()
        pstats.Stats(pr).sort_stats("tottime").print_stats(20)


if __name__ == "__main__":
    main()
