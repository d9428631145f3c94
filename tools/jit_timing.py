# SPDX-License-Identifier: Apache-2.0
"""First-call latency of each path in fresh processes: once on empty caches (cold JIT), then again
on the caches the first run filled (a warm hit), which is what a restarted server pays.

Usage (repo root, GPU machine): PYTHONPATH=.:generated python3 tools/jit_timing.py
Each process reports the time of its first chunk_kda_prefill call (imports excluded, synchronized) and
of its import of torch + kdagen_kernels, so interpreter start-up is not counted against the kernels.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile

CHILD = r"""
import json, sys, time
t0 = time.perf_counter()
import torch, kdagen_kernels
t1 = time.perf_counter()
fused = sys.argv[1] == "fused"
g = torch.Generator(device="cuda").manual_seed(0)
T, H = 300, 4
rn = lambda *s: torch.randn(*s, device="cuda", generator=g)
cu = torch.tensor([0, 100, 300], dtype=torch.int32, device="cuda")
ci, co = kdagen_kernels.prepare_chunk_metadata_device(cu, cu.cpu(), 64)
args = dict(q=rn(1, T, H, 128).bfloat16(), k=rn(1, T, H, 128).bfloat16(), v=rn(1, T, H, 128).bfloat16(),
            raw_g=rn(1, T, H, 128).bfloat16(), raw_beta=rn(1, T, H).bfloat16(), A_log=torch.rand(H, device="cuda"),
            g_bias=torch.rand(H * 128, device="cuda"), initial_state=rn(2, H, 128, 128), output_final_state=True,
            lower_bound=-5.0, use_qk_l2norm_in_kernel=True, cu_seqlens=cu, chunk_indices=ci, chunk_offsets=co,
            out=torch.empty(1, T, H, 128, device="cuda", dtype=torch.bfloat16), use_fused_chunk=fused)
torch.cuda.synchronize()
t2 = time.perf_counter()
kdagen_kernels.chunk_kda_prefill(**args)
torch.cuda.synchronize()
t3 = time.perf_counter()
print(json.dumps(dict(import_s=t1 - t0, first_call_s=t3 - t2)))
"""


def main() -> None:
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        env = dict(os.environ, TRITON_CACHE_DIR=os.path.join(tmp, "triton"), KDAGEN_CACHE_DIR=os.path.join(tmp, "kd"))
        for path in ("triton", "fused"):
            for state in ("cold", "warm"):
                res = subprocess.run([sys.executable, "-c", CHILD, path], env=env, capture_output=True, text=True)
                if res.returncode != 0:
                    rows.append((path, state, "failed: " + (res.stderr.strip().splitlines() or ["?"])[-1][:100]))
                    continue
                got = json.loads(res.stdout.strip().splitlines()[-1])
                rows.append((path, state, f"first call {got['first_call_s']:.3f} s (import {got['import_s']:.2f} s)"))
    for row in rows:
        print(f"{row[0]:7s} {row[1]:5s} {row[2]}")


if __name__ == "__main__":
    main()
