# SPDX-License-Identifier: Apache-2.0
"""Every shipped variant timed once on the GPU: the Triton path, and the fused path where the variant has one.

Usage (repo root, GPU machine): PYTHONPATH=.:generated python3 tools/time_variants.py [H:T:N ...]

Per variant (K = V = 128 bf16, K = 128 / V = 256 bf16, K = V = 64 bf16, K = V = 128 fp16) and shape (default
32/16384/16 and 96/16384/16): the median GPU time of CUDA-graph replays of `chunk_kda_prefill` through the
generated package, the bench's inputs (bounded gate, L2 norm in kernel, bias, an initial state, the final
state out). Correctness of the same variants is `tests/gpu`'s; `python -m kdagen bench` compares K = V = 128
with the peers.
"""

from __future__ import annotations

import sys

import torch
import triton

import kdagen_kernels
from kdagen.bench import equal_lens, make_inputs

VARIANTS = [(128, 128, "bf16"), (128, 256, "bf16"), (64, 64, "bf16"), (128, 128, "fp16")]
SHAPES = [(32, 16384, 16), (96, 16384, 16)]


def main() -> None:
    shapes = [tuple(int(x) for x in a.split(":")) for a in sys.argv[1:]] or SHAPES
    print(f"{'K':>4s} {'V':>4s} {'dtype':>5s} {'H/T/N':>12s} {'Triton ms':>10s} {'fused ms':>9s}")
    for K, V, dt in VARIANTS:
        for H, T, N in shapes:
            args, ci, co = make_inputs(H, equal_lens(T, N), K=K, V=V, dtype=dt)
            out = torch.empty_like(args["v"])
            paths = [False] + ([True] if kdagen_kernels.can_use_fused_kda_chunk(K, V, args["q"].dtype, 64) else [])
            ms = {}
            for fused in paths:
                def call(fused=fused):
                    return kdagen_kernels.chunk_kda_prefill(**args, chunk_indices=ci, chunk_offsets=co, out=out,
                                                            use_fused_chunk=fused)
                call()
                torch.cuda.synchronize()
                ms[fused] = triton.testing.do_bench_cudagraph(call, rep=100, return_mode="median")
            fused_ms = f"{ms[True]:9.3f}" if True in ms else f"{'-':>9s}"
            print(f"{K:4d} {V:4d} {dt:>5s} {f'{H}/{T}/{N}':>12s} {ms[False]:10.3f} {fused_ms}", flush=True)


if __name__ == "__main__":
    main()
