# SPDX-License-Identifier: Apache-2.0
"""Per-kernel GPU time (torch.profiler) of named pipelines, optionally with knobs in place of the target's.

Usage (repo root, GPU machine):
    PYTHONPATH=.:generated python3 tools/profile_pipelines.py --shape 96:16384:16 --shape 32:65536:1 \
        --pipeline triton_intra+triton_walk --pipeline triton_intra_tb+triton_walk_tb \
        [--knobs intra_rows=16,intra_warps=1] [--knobs intra_tb_block_k=32]
Every pipeline runs with the target's own knobs, then with each --knobs set in their place
(plan_kda_prefill(tuning=...); the dense_* rule still applies); the plan's describe() lines say what ran.
"""

from __future__ import annotations

import argparse

import torch

import kdagen_kernels
from kdagen.bench import shape_inputs
from profile_fused import kernel_times  # tools/ is the script's directory

VARIANT = "kda_chunk_fwd__triton__bf16__k128_v128_c64"
TARGET = "sm_90"


def parse_knobs(text: str) -> dict[str, int]:
    pairs = [kv.split("=") for kv in text.split(",") if kv]
    if any(len(p) != 2 for p in pairs):
        raise SystemExit(f"--knobs {text!r}: expected name=int[,name=int...]")
    return {k: int(v) for k, v in pairs}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shape", action="append", required=True, metavar="H:T:N")
    ap.add_argument("--pipeline", action="append", required=True, metavar="CHUNK+WALK")
    ap.add_argument("--knobs", action="append", default=[], metavar="NAME=INT,...")
    a = ap.parse_args()
    base = next(e for e in kdagen_kernels.VARIANTS if e.name == VARIANT).load().TUNING[TARGET]
    knob_sets = [{}] + [parse_knobs(k) for k in a.knobs]  # the target's own knobs first
    for shape in a.shape:
        H, T, N = (int(x) for x in shape.split(":"))
        args, ci, co = shape_inputs(H, T, N)
        out = torch.empty_like(args["v"])
        layer = {n: args[n] for n in ("q", "k", "v", "raw_g", "raw_beta", "A_log", "g_bias")}
        for knobs in knob_sets:
            for pipeline in a.pipeline:
                plan = kdagen_kernels.plan_kda_prefill(
                    args["cu_seqlens"], num_heads=H, head_dim_k=128, head_dim_v=128, dtype=args["q"].dtype,
                    lower_bound=args["lower_bound"], has_g_bias=True, use_qk_l2norm_in_kernel=True,
                    chunk_indices=ci, chunk_offsets=co, output_final_state=True, pipeline=pipeline,
                    tuning={**base, **knobs} if knobs else None)

                def call() -> None:
                    plan.run(**layer, initial_state=args["initial_state"], out=out)

                times = kernel_times(call)
                knob_text = ",".join(f"{k}={v}" for k, v in knobs.items()) or "target knobs"
                print(f"H={H} T={T} N={N} {pipeline} ({knob_text}): {sum(times.values()):.3f} ms of kernels")
                print("    " + plan.describe().splitlines()[2].strip() + "; " + plan.describe().splitlines()[5].strip())
                for name, ms in sorted(times.items(), key=lambda kv: -kv[1]):
                    print(f"    {ms:8.3f} ms  {name}")
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
