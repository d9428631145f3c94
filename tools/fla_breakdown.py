# SPDX-License-Identifier: Apache-2.0
"""FLA's chunk_kda (safe gate) per kernel, from the torch profiler (GPU, fla-core importable).

Usage: PYTHONPATH=.:generated python3 tools/fla_breakdown.py [H:T:N ...]
Gives the peer's time per stage, which is what each of our stages has to beat (docs/performance-model.md,
"Per-kernel times as last measured").
"""

from __future__ import annotations

import sys
from collections import defaultdict

import torch

from kdagen.bench import implementations, shape_inputs


def main() -> None:
    shapes = [tuple(int(x) for x in a.split(":")) for a in sys.argv[1:]] or [(96, 16384, 16)]
    fla = implementations().get("fla-safe-gate")
    if fla is None:
        raise SystemExit("fla-core is not importable")
    for H, T, N in shapes:
        args, ci, co = shape_inputs(H, T, N)
        call = fla(args, ci, co, None)
        for _ in range(3):
            call()
        torch.cuda.synchronize()
        reps = 10
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
            for _ in range(reps):
                call()
            torch.cuda.synchronize()
        per = defaultdict(float)
        for ev in prof.events():
            if ev.device_type == torch.autograd.DeviceType.CUDA:
                per[ev.name] += ev.device_time / 1e3 / reps
        print(f"FLA chunk_kda H={H} T={T} N={N}: {sum(per.values()):.3f} ms of kernels per call")
        for name, ms in sorted(per.items(), key=lambda x: -x[1]):
            print(f"  {ms:8.3f} ms  {name[:90]}")


if __name__ == "__main__":
    main()
