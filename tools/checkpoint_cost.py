# SPDX-License-Identifier: Apache-2.0
"""GPU time of the Triton path with a prefix-cache checkpoint per sequence against none (H200).

Usage: PYTHONPATH=.:generated python3 tools/checkpoint_cost.py [H:T:N ...]

vLLM's signature takes one checkpoint offset per sequence per call; each sequence here snapshots at the
last chunk boundary before its midpoint, into its own row. Times are CUDA-graph replay medians of the
whole call (triton.testing.do_bench_cudagraph), both configurations on the same inputs in one process.
"""

from __future__ import annotations

import sys

import torch
import triton

import kdagen_kernels as kk
from kdagen.bench import shape_inputs


def main() -> None:
    shapes = sys.argv[1:] or ["12:16384:16", "32:16384:16", "96:16384:16"]
    for shape in shapes:
        H, T, N = (int(x) for x in shape.split(":"))
        args, ci, co = shape_inputs(H, T, N)
        out = torch.empty_like(args["v"])
        lens = (args["cu_seqlens"][1:] - args["cu_seqlens"][:-1]).cpu()
        offsets = ((lens // 2) // 64 * 64).to(torch.int32).cuda()
        ck = torch.empty(N, H, 128, 128, dtype=torch.float32, device="cuda")

        def plain():
            return kk.chunk_kda_prefill(**args, chunk_indices=ci, chunk_offsets=co, out=out)

        def with_ckpt():
            return kk.chunk_kda_prefill(**args, chunk_indices=ci, chunk_offsets=co, out=out, checkpoint_state=ck,
                                        checkpoint_offsets=offsets)

        plain()
        with_ckpt()
        torch.cuda.synchronize()
        t0 = triton.testing.do_bench_cudagraph(plain, rep=200, return_mode="median")
        t1 = triton.testing.do_bench_cudagraph(with_ckpt, rep=200, return_mode="median")
        print(f"H={H} T={T} N={N}: none {t0:.3f} ms, one checkpoint per sequence {t1:.3f} ms ({100 * (t1 / t0 - 1):+.1f}%)")


if __name__ == "__main__":
    main()
