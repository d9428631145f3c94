# SPDX-License-Identifier: Apache-2.0
"""A/B of kda_intra_kernel builds on the GPU: the kernel alone, interleaved rounds, workspaces compared.

Usage (repo root, CUDA machine with nvcc):
    git archive REV generated/kdagen_kernels/hip | tar -x -C /tmp/base      # the base, where git is
    PYTHONPATH=.:generated python3 tools/hip_intra_ab.py --base /tmp/base/generated/kdagen_kernels/hip \
        [--build NAME="-DKDA_INTRA_WAVE=0 -DINTRA_ITEMS=4 -DINTRA_BLOCKS_PER_SM=3" ...] [--rounds 4] [H:T:N ...]

Builds the K = V = 128 sm_90 fused library from the base tree (`--base`, optional) and from the working tree's
generated source once per `--build` (compile-time knobs as -D flags, kda_intra.h: KDA_INTRA_WAVE picks the design;
default: one build without flags), runs
each on the bench's inputs into its own workspace, prints every build's workspace against the first's (relative
L2 per tensor), then `do_bench` medians of the kernel alone over interleaved rounds (min / median of rounds).
Its tables: docs/performance-model.md, "HIP kernel knobs".
"""

from __future__ import annotations

import argparse
import subprocess
import tempfile
from pathlib import Path

import torch
import triton

import kdagen_kernels
from kdagen.bench import shape_inputs
from kdagen.runtime import fused_path
from kdagen.runtime.jit_hip import HipLibrary

PKG = Path(kdagen_kernels.__file__).resolve().parent
SOURCE = "kda_chunk_fwd__hip__bf16__k128_v128_c64__sm_90.hip"
SHAPES = [(96, 16384, 16), (12, 16384, 16), (32, 65536, 64)]
WS = ("qg", "w", "kg", "u", "aqk", "decay")


def _build(tree: Path, flags: list[str], out: Path) -> subprocess.Popen:
    return subprocess.Popen(["nvcc", "-O3", "-std=c++17", "-arch=sm_90", "-shared", "-Xcompiler", "-fPIC", "-x", "cu",
                             "-I", str(tree / "include"), *flags, "-o", str(out), str(tree / SOURCE)],
                            stderr=subprocess.PIPE, text=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    ap.add_argument("--base", type=Path, help="a generated kdagen_kernels/hip tree to compare against")
    ap.add_argument("--build", action="append", default=[], help='NAME="-DX=1 ..." (repeatable)')
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("shapes", nargs="*", help="H:T:N")
    a = ap.parse_args()
    shapes = [tuple(int(x) for x in s.split(":")) for s in a.shapes] or SHAPES
    builds = {"base": (a.base, [])} if a.base else {}
    for spec in a.build or ["new="]:
        name, _, flags = spec.partition("=")
        builds[name] = (PKG / "hip", flags.split())
    tmp = Path(tempfile.mkdtemp(prefix="intra_ab_"))
    procs = {n: _build(tree, flags, tmp / f"{n}.so") for n, (tree, flags) in builds.items()}
    for n, p in procs.items():
        err = p.communicate()[1]
        if p.returncode:
            raise SystemExit(f"{n}: nvcc failed\n{err[-2000:]}")
    libs = {n: HipLibrary(tmp / f"{n}.so", n, "sm_90") for n in builds}
    first = next(iter(libs))
    for H, T, N in shapes:
        args, ci, _ = shape_inputs(H, T, N)
        ci32 = ci.to(torch.int32).contiguous()
        inputs = dict(q=args["q"], k=args["k"], v=args["v"], raw_g=args["raw_g"], raw_beta=args["raw_beta"],
                      A_log=args["A_log"].float(), g_bias=args["g_bias"].float(), scale=128 ** -0.5,
                      lower_bound=args["lower_bound"], cu_seqlens=args["cu_seqlens"], chunk_indices=ci32)
        wss, calls = {}, {}
        for n, lib in libs.items():
            ws = fused_path.intra_workspace(T, H, 128, 128, ci32.shape[0], "cuda")
            calls[n] = lambda lib=lib, ws=ws: fused_path.run_intra(lib, ws, **inputs)
            calls[n]()
            wss[n] = ws
        torch.cuda.synchronize()
        for n in list(libs)[1:]:
            d = {t: ((wss[n][t].float() - wss[first][t].float()).norm() / wss[first][t].float().norm()).item()
                 for t in WS}
            print(f"{H}/{T}/{N} {n} vs {first}:", " ".join(f"{t}={e:.1e}" for t, e in d.items()), flush=True)
        times = {n: [] for n in calls}
        for r in range(a.rounds):
            for n in (list(calls) if r % 2 == 0 else reversed(list(calls))):
                times[n].append(triton.testing.do_bench(calls[n], return_mode="median"))
        print(f"{H}/{T}/{N} kda_intra_kernel ms (min / median of rounds):",
              " ".join(f"{n}={min(t):.3f}/{sorted(t)[len(t) // 2]:.3f}" for n, t in times.items()), flush=True)


if __name__ == "__main__":
    main()
