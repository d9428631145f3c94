# SPDX-License-Identifier: Apache-2.0
"""One fused call and one Triton call of a shape, for `ncu` (see docs/perf-notes.md); a second argument
`triton` leaves the fused call (and its nvcc build) out.

    ncu -k regex:prologue --section SpeedOfLight ... python3 tools/ncu_one_call.py 96:16384:16 [triton]
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch

import kdagen_kernels
from kdagen.bench import shape_inputs
from kdagen.runtime import fused_path

H, T, N = (int(x) for x in (sys.argv[1] if len(sys.argv) > 1 else "96:16384:16").split(":"))
args, ci, co = shape_inputs(H, T, N)
out = torch.empty_like(args["v"])
if sys.argv[2:] != ["triton"]:
    lib = fused_path.load_fused(Path(kdagen_kernels.__file__).resolve().parent, 128, 128, "sm_90")
    fused_path.run_fused(lib, q=args["q"], k=args["k"], v=args["v"], raw_g=args["raw_g"], raw_beta=args["raw_beta"],
                         A_log=args["A_log"], g_bias=args["g_bias"], scale=128 ** -0.5, lower_bound=-5.0,
                         cu_seqlens=args["cu_seqlens"], chunk_indices=ci, chunk_offsets=co, out=out)
kdagen_kernels.chunk_kda_prefill(**args, chunk_indices=ci, chunk_offsets=co, out=out)
torch.cuda.synchronize()
