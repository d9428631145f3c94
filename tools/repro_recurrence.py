# SPDX-License-Identifier: Apache-2.0
"""Run the Triton recurrence with one launch config against the spec's config (GPU debugging aid).

Usage: PYTHONPATH=.:generated python3 tools/repro_recurrence.py WARPS STAGES BLOCK_V [H:T:N]
"""

from __future__ import annotations

import sys

import torch

import kdagen_kernels
from kdagen.bench import _inputs
from kdagen.runtime import triton_path


def main() -> None:
    warps, stages, bv = (int(x) for x in sys.argv[1:4])
    H, T, N = (int(x) for x in (sys.argv[4] if len(sys.argv) > 4 else "2:200:2").split(":"))
    entry = next(e for e in kdagen_kernels.VARIANTS if e.name.endswith("bf16__k128_v128_c64"))
    mod = entry.load()
    args, ci, co = _inputs(H, T, N)
    ref_o, ref_s = kdagen_kernels.chunk_kda_prefill(**args, chunk_indices=ci, chunk_offsets=co)
    tun = {**mod.TUNING["sm_90"], "recurrence_warps": warps, "recurrence_stages": stages, "block_v": bv}
    ws = triton_path.new_workspace(mod, T, H, ci.shape[0], torch.bfloat16, "cuda")
    triton_path.launch_prologue(mod, tun, ws, q=args["q"], k=args["k"], v=args["v"], raw_g=args["raw_g"],
                                raw_beta=args["raw_beta"], A_log=args["A_log"], g_bias=args["g_bias"],
                                scale=128 ** -0.5, lower_bound=-5.0, use_qk_l2norm=True,
                                cu_seqlens=args["cu_seqlens"], chunk_indices=ci)
    out = torch.full_like(args["v"], float("nan"))
    final = torch.full((N, H, 128, 128), float("nan"), device="cuda")
    triton_path.launch_recurrence(mod, tun, ws, scale=128 ** -0.5, cu_seqlens=args["cu_seqlens"], chunk_offsets=co,
                                  out=out, state=triton_path.StateArgs(1, 1, args["initial_state"], final))
    torch.cuda.synchronize()
    print(f"warps={warps} stages={stages} block_v={bv}: max |o - spec config| "
          f"{(out.float() - ref_o.float()).abs().max().item():.3e}, state {(final - ref_s).abs().max().item():.3e}")


if __name__ == "__main__":
    main()
