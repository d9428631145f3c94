# SPDX-License-Identifier: Apache-2.0
"""Run the Triton recurrence with one launch config against the spec's config (GPU debugging aid).

Usage: PYTHONPATH=.:generated python3 tools/repro_recurrence.py WARPS STAGES BLOCK_V [H:T:N]
"""

from __future__ import annotations

import sys

import torch

import kdagen_kernels
from kdagen.autotune import kernel_call
from kdagen.bench import shape_inputs


def main() -> None:
    warps, stages, bv = (int(x) for x in sys.argv[1:4])
    H, T, N = (int(x) for x in (sys.argv[4] if len(sys.argv) > 4 else "2:200:2").split(":"))
    entry = next(e for e in kdagen_kernels.VARIANTS if e.name.endswith("bf16__k128_v128_c64"))
    mod = entry.load()
    args, ci, co = shape_inputs(H, T, N)
    ref_o, _ = kdagen_kernels.chunk_kda_prefill(**args, chunk_indices=ci, chunk_offsets=co)
    tun = {**mod.TUNING["sm_90"], "recurrence_warps": warps, "recurrence_stages": stages, "block_v": bv}
    out = torch.full_like(args["v"], float("nan"))
    kernel_call(mod, tun, "recurrence", args, ci, co, out=out)()
    torch.cuda.synchronize()
    print(f"warps={warps} stages={stages} block_v={bv}: max |o - spec config| "
          f"{(out.float() - ref_o.float()).abs().max().item():.3e}")


if __name__ == "__main__":
    main()
