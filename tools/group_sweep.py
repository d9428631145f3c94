# SPDX-License-Identifier: Apache-2.0
"""Whole-call GPU time of the Triton path at forced recurrence group counts (docs/performance-model.md, "The group
count of the Triton walk").

Usage (repo root, GPU machine): PYTHONPATH=.:generated python3 tools/group_sweep.py [H:T:N ...] [--groups 1,2,4]
Each call is captured in a CUDA graph and timed by replay (triton.testing.do_bench_cudagraph), so the
launch overhead of the extra passes is in the figure but the host's Python is not; "auto" is the count
the dispatcher picks (kdagen.runtime.pipeline.choose_pipeline).
"""

from __future__ import annotations

import argparse
import os

import torch
import triton

import kdagen_kernels
from kdagen.bench import shape_inputs
from kdagen.runtime.triton_path import GROUPS_ENV


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("shapes", nargs="*", default=["12:4096:1", "12:16384:1", "12:65536:1"], metavar="H:T:N")
    p.add_argument("--groups", default="1,2,3,4,6,8,16,auto")
    args = p.parse_args()
    for shape in args.shapes:
        H, T, N = (int(x) for x in shape.split(":"))
        kw, ci, co = shape_inputs(H, T, N)
        out = torch.empty_like(kw["v"])
        row = []
        for g in args.groups.split(","):
            os.environ[GROUPS_ENV] = g
            call = lambda: kdagen_kernels.chunk_kda_prefill(**kw, chunk_indices=ci, chunk_offsets=co, out=out)  # noqa: E731
            call()
            torch.cuda.synchronize()
            with torch.cuda.stream(torch.cuda.Stream()):
                ms = triton.testing.do_bench_cudagraph(call, return_mode="median")
            row.append(f"G={g}: {ms:.3f}")
        os.environ.pop(GROUPS_ENV, None)
        print(f"H={H} T={T} N={N} graph ms: " + " | ".join(row), flush=True)


if __name__ == "__main__":
    main()
