# SPDX-License-Identifier: Apache-2.0
"""Per-kernel GPU time of the fused path and of the Triton path (torch.profiler / CUPTI), per shape.

Usage (repo root, GPU machine): PYTHONPATH=.:generated python3 tools/profile_fused.py [H:T:N ...]
Prints, per shape and path, each kernel's mean time per call, so a change can be aimed at the kernel
that costs (docs/perf-archive.md keeps the results).
"""

from __future__ import annotations

import sys
from collections import defaultdict

import torch
from torch.profiler import ProfilerActivity, profile

import kdagen_kernels
from kdagen.bench import shape_inputs

SHAPES = [(12, 4096, 1), (12, 65536, 1), (96, 16384, 16)]
ITERS = 5


def kernel_times(fn) -> dict[str, float]:
    fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(ITERS):
            fn()
        torch.cuda.synchronize()
    out: dict[str, float] = defaultdict(float)
    for ev in prof.key_averages():
        t = getattr(ev, "device_time_total", None) or getattr(ev, "cuda_time_total", 0.0)
        if t > 0 and ev.key not in ("", "cudaDeviceSynchronize"):
            out[ev.key[:60]] += t / 1e3 / ITERS  # ms per call
    return dict(out)


def main() -> None:
    shapes = [tuple(int(x) for x in a.split(":")) for a in sys.argv[1:]] or SHAPES
    for H, T, N in shapes:
        args, ci, co = shape_inputs(H, T, N)
        out = torch.empty_like(args["v"])

        def fused() -> None:  # the plan's fused pipeline (describe() of a plan says which stages)
            kdagen_kernels.chunk_kda_prefill(**args, chunk_indices=ci, chunk_offsets=co, out=out,
                                             use_fused_chunk=True)

        def triton() -> None:
            kdagen_kernels.chunk_kda_prefill(**args, chunk_indices=ci, chunk_offsets=co, out=out)

        for name, fn in (("fused", fused), ("triton", triton)):
            times = kernel_times(fn)
            total = sum(times.values())
            print(f"H={H} T={T} N={N} {name}: {total:.3f} ms of kernels per call")
            for k, ms in sorted(times.items(), key=lambda kv: -kv[1]):
                print(f"    {ms:8.3f} ms  {k}")
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
