# SPDX-License-Identifier: Apache-2.0
"""One fused call and one Triton call of a shape, for `ncu`; a second argument
`triton` leaves the fused call (and its nvcc build) out.

    ncu -k regex:prologue --section SpeedOfLight ... python3 tools/ncu_one_call.py 96:16384:16 [triton]
"""

from __future__ import annotations

import sys

import torch

import kdagen_kernels
from kdagen.bench import shape_inputs

H, T, N = (int(x) for x in (sys.argv[1] if len(sys.argv) > 1 else "96:16384:16").split(":"))
args, ci, co = shape_inputs(H, T, N)
out = torch.empty_like(args["v"])
if sys.argv[2:] != ["triton"]:
    kdagen_kernels.chunk_kda_prefill(**args, chunk_indices=ci, chunk_offsets=co, out=out, use_fused_chunk=True)
kdagen_kernels.chunk_kda_prefill(**args, chunk_indices=ci, chunk_offsets=co, out=out)
torch.cuda.synchronize()
