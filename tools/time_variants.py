# SPDX-License-Identifier: Apache-2.0
"""Every variant the registry declares, timed once on the GPU beside the Triton path of the same head dims.

Usage (repo root, GPU machine): PYTHONPATH=.:generated python3 tools/time_variants.py [H:T:N ...]

The variants come from kdagen_kernels.VARIANTS, so a variant is timed the moment the spec declares it. A Triton
variant runs each Triton pipeline (triton_intra+triton_walk, triton_pair+triton_walk), a hip variant
hip_intra+hip_walk (where its library builds here), each through a plan made with the variant's chunk size and
that pipeline; beside it, the Triton path as vLLM calls it (chunk_kda_prefill, no pipeline asked) on the same
inputs. Shapes default to 32/16384/16 and 96/16384/16; inputs are the bench's (bounded gate, L2 norm in kernel,
bias, an initial state, the final state out). Times are medians of CUDA-graph replays. Each row ends with the
plan's own description. Correctness of the same variants and pipelines is tests/gpu's (test_variants_gpu.py).
"""

from __future__ import annotations

import sys

import torch
import triton

import kdagen_kernels
from kdagen.bench import equal_lens, make_inputs
from kdagen.runtime.registry import TORCH_DTYPES

SHAPES = [(32, 16384, 16), (96, 16384, 16)]
PIPELINES = {"triton": ("triton_intra+triton_walk", "triton_pair+triton_walk"), "hip": ("hip_intra+hip_walk",)}


def _ms(call) -> float:
    call()
    torch.cuda.synchronize()
    return triton.testing.do_bench_cudagraph(call, rep=100, return_mode="median")


def _runnable(e) -> bool:
    return e.backend != "hip" or kdagen_kernels.can_use_fused_kda_chunk(
        e.head_dim_k, e.head_dim_v, TORCH_DTYPES[e.dtype], e.chunk_size)


def main() -> None:
    shapes = [tuple(int(x) for x in a.split(":")) for a in sys.argv[1:]] or SHAPES
    print(f"{'variant':44s} {'pipeline':26s} {'H/T/N':>12s} {'ms':>8s} {'Triton ms':>9s} {'ratio':>6s}  plan")
    for e in kdagen_kernels.VARIANTS:
        if not _runnable(e):
            print(f"{e.name:44s} {'-':26s} (its library does not build here: no compiler for this target)")
            continue
        for H, T, N in shapes:
            args, ci, co = make_inputs(H, equal_lens(T, N), K=e.head_dim_k, V=e.head_dim_v, dtype=e.dtype,
                                       chunk_size=e.chunk_size)
            out = torch.empty_like(args["v"])
            triton_ms = _ms(lambda: kdagen_kernels.chunk_kda_prefill(**args, chunk_indices=ci, chunk_offsets=co,
                                                                     out=out))
            for pipeline in PIPELINES[e.backend]:
                plan = kdagen_kernels.plan_kda_prefill(
                    args["cu_seqlens"], args["cu_seqlens"].cpu(), num_heads=H, head_dim_k=e.head_dim_k,
                    head_dim_v=e.head_dim_v, dtype=args["q"].dtype, lower_bound=args["lower_bound"], has_g_bias=True,
                    use_qk_l2norm_in_kernel=True, chunk_indices=ci, chunk_offsets=co, output_final_state=True,
                    use_fused_chunk=e.backend == "hip", chunk_size=e.chunk_size, pipeline=pipeline)
                run = (args["q"], args["k"], args["v"], args["raw_g"], args["raw_beta"], args["A_log"], args["g_bias"])
                ms = _ms(lambda plan=plan: plan.run(*run, initial_state=args["initial_state"], out=out))
                print(f"{e.name:44s} {pipeline:26s} {f'{H}/{T}/{N}':>12s} {ms:8.3f} {triton_ms:9.3f} "
                      f"{ms / triton_ms:6.2f}  {' '.join(plan.describe().split())}", flush=True)


if __name__ == "__main__":
    main()
