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
from kdagen.bench import make_inputs
args, ci, co = make_inputs(4, [100, 200])
out = torch.empty_like(args["v"])
torch.cuda.synchronize()
t2 = time.perf_counter()
kdagen_kernels.chunk_kda_prefill(**args, chunk_indices=ci, chunk_offsets=co, out=out,
                                 use_fused_chunk=sys.argv[1] == "fused")
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
