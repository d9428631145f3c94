# SPDX-License-Identifier: Apache-2.0
"""Host-side cost of one chunk_kda_prefill call with the kernel launches faked (no GPU needed).

Usage: TRITON_INTERPRET=1 PYTHONPATH=.:generated python tools/host_path_cost.py [H:T:N] [--profile]

Times the Python path of the Triton dispatch (argument checks, variant choice, chunk metadata given,
workspace allocations, launch arguments) on CPU tensors, with kda_prologue / kda_wu / kda_recurrence
launches replaced by no-ops and the data-value checks (which run on CPU tensors but not on GPU ones
unless KDAGEN_DEBUG=1) switched off. What it leaves out: Triton's own launch cost per kernel (3 to 5
launches) and CUDA allocations, which `python -m kdagen bench` measures on the GPU in its host column.
Keep T small (the default 12:1024:16): on the CPU, large workspace buffers cost the allocator tens of
microseconds that CUDA's caching allocator does not, and the Python cost does not depend on T.
"""

from __future__ import annotations

import cProfile
import pstats
import sys
import time

import kdagen_kernels
from kdagen.bench import make_inputs
from kdagen.runtime import dispatch, triton_path


def main() -> None:
    argv = sys.argv[1:]
    profile = "--profile" in argv
    shape = [a for a in argv if a != "--profile"]
    H, T, N = (int(x) for x in (shape[0] if shape else "12:1024:16").split(":"))
    for name in ("launch_prologue", "launch_wu", "launch_recurrence"):
        setattr(triton_path, name, lambda *a, **kw: None)
    dispatch.debug_checks.check_data = lambda *a, **kw: None
    args, ci, co = make_inputs(H, [T // N] * N, K=128, V=128, seed=1, device="cpu")

    def call():
        return kdagen_kernels.chunk_kda_prefill(**args, chunk_indices=ci, chunk_offsets=co)

    for _ in range(100):
        call()
    samples = []
    for _ in range(2000):
        t = time.perf_counter()
        call()
        samples.append(time.perf_counter() - t)
    samples.sort()
    print(f"H={H} T={T} N={N}: host path without launches {1e6 * samples[len(samples) // 2]:.1f} us per call "
          f"(median of 2000; p10 {1e6 * samples[len(samples) // 10]:.1f})")
    if profile:
        pr = cProfile.Profile()
        pr.enable()
        for _ in range(500):
            call()
        pr.disable()
        pstats.Stats(pr).sort_stats("tottime").print_stats(20)


if __name__ == "__main__":
    main()
