# SPDX-License-Identifier: Apache-2.0
"""Time the Triton path's kernels separately under several launch configs (GPU).

Usage (repo root, GPU machine): PYTHONPATH=.:generated python3 tools/profile_triton.py [H:T:N ...]
Prints, per shape, the whole call and each kernel's median time for every tuning candidate, so a
spec's tuning block can be chosen from measurements (docs/perf-archive.md keeps the results).
"""

from __future__ import annotations

import os
import sys

import torch
import triton

import kdagen_kernels
from kdagen.autotune import kernel_call
from kdagen.bench import shape_inputs
from kdagen.runtime.device import target_of

SHAPES = [(12, 4096, 1), (12, 16384, 16), (96, 16384, 16), (12, 65536, 1)]
PRO = [dict(prologue_warps=w, prologue_stages=s, prologue_block_k=bk)
       for w, s, bk in ((1, 1, 16), (1, 1, 32), (1, 1, 64), (1, 2, 32), (2, 1, 32), (4, 1, 32))]
WU = [dict(wu_warps=w, wu_stages=s, wu_block_k=bk)
      for w, s, bk in ((4, 1, 64), (4, 1, 32), (4, 1, 128), (4, 2, 64), (2, 1, 64), (8, 1, 64), (8, 1, 128))]
INTRA = [dict(intra_warps=w, intra_stages=s, intra_block_v=b)
         for w, s, b in ((8, 1, 32), (8, 1, 64), (4, 1, 32), (4, 1, 64), (8, 2, 32), (16, 1, 32), (16, 1, 64))]
REC = [dict(recurrence_warps=w, recurrence_stages=s, block_v=b)
       # (4, 2, 32) is left out: it faults (illegal address) under triton 3.6 on sm_90.
       for w, s, b in ((8, 2, 64), (4, 2, 64), (8, 1, 64), (8, 2, 32), (4, 1, 32), (8, 2, 128), (4, 1, 16))]


def main() -> None:
    # KDAGEN_PROFILE=prologue, wu, intra, recurrence (the walk on kda_intra's half chunks) or
    # recurrence-pair (on whole chunks) times only those kernels' candidates.
    only = set(filter(None, os.environ.get("KDAGEN_PROFILE", "").split(",")))
    shapes = [tuple(int(x) for x in a.split(":")) for a in sys.argv[1:]] or SHAPES
    entry = next(e for e in kdagen_kernels.VARIANTS if e.name.endswith("bf16__k128_v128_c64"))
    mod = entry.load()
    target = target_of(torch.device("cuda"))
    base = dict(mod.TUNING[target])
    for H, T, N in shapes:
        args, ci, co = shape_inputs(H, T, N)
        out = torch.empty_like(args["v"])
        full = triton.testing.do_bench(
            lambda: kdagen_kernels.chunk_kda_prefill(**args, chunk_indices=ci, chunk_offsets=co, out=out),
            return_mode="median")
        print(f"H={H} T={T} N={N}: whole call {full:.3f} ms (spec tuning {base})")
        for name, kernel, design, cands in (("prologue", "prologue", "pair", PRO), ("wu", "wu", "pair", WU),
                                            ("intra", "intra", "intra", INTRA), ("recurrence", "recurrence", None, REC),
                                            ("recurrence-pair", "recurrence", "pair", REC)):
            for c in cands if not only or name in only else []:
                try:
                    ms = triton.testing.do_bench(kernel_call(mod, {**base, **c}, kernel, args, ci, co, design=design),
                                                 return_mode="median")
                    print(f"   {name:15s} {c}: {ms:.3f} ms")
                except Exception as exc:  # e.g. out of shared memory, or a config that faults
                    print(f"   {name:15s} {c}: failed ({type(exc).__name__}: {str(exc)[:80]})")


if __name__ == "__main__":
    main()
