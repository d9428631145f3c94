# SPDX-License-Identifier: Apache-2.0
"""Compile the Triton kernels of the generated variants for an AMD target under tuning overrides and print
what each code object holds against the occupancy budget (kdagen.targets.AMD_MIN_WAVES_PER_SIMD waves per
SIMD, no scratch). Compile only: no AMD GPU runs anything here.

Usage (no GPU; unset TRITON_INTERPRET):
    PYTHONPATH=.:generated python tools/amd_triton_sweep.py [--variant SUBSTR] [--target gfx942,gfx950]
        [--kernels kda_recurrence,kda_wu,...] [--all-modes] [KNOB=V1,V2 ...]
Each KNOB=V1,V2 is a spec tuning knob (recurrence_warps, block_v, wu_block_k, ...); the sweep compiles the
product of the values given, on top of the variant's own tuning for the target. Without --all-modes only
the bounded-gate, paged-state builds are compiled (kdagen.aot.compile_variant); with it, every build the
AOT test checks (kdagen.aot.compile_checked). Kernel names are compile_variant's (kda_recurrence_p1, ...).
"""

from __future__ import annotations

import argparse
import itertools
import os
import tempfile
import time

import kdagen_kernels
from kdagen import aot


def _grid(specs: list[str]) -> list[dict[str, int]]:
    axes = []
    for spec in specs:
        knob, _, values = spec.partition("=")
        axes.append([(knob, int(v)) for v in values.split(",")])
    return [dict(combo) for combo in itertools.product(*axes)] if axes else [{}]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--variant", default="", help="substring of the variant name (default: every Triton variant)")
    ap.add_argument("--target", default="gfx942,gfx950", help="comma-separated AMD targets")
    ap.add_argument("--kernels", default="", help="comma-separated compile_variant names (default: all)")
    ap.add_argument("--all-modes", action="store_true", help="every gate / state mode the AOT test compiles")
    ap.add_argument("knobs", nargs="*", help="KNOB=V1,V2,... tuning overrides to sweep")
    args = ap.parse_args()
    os.environ.setdefault("TRITON_CACHE_DIR", tempfile.mkdtemp(prefix="kdagen-amd-sweep-"))
    kernels = tuple(args.kernels.split(",")) if args.kernels else None
    misses = 0
    for e in kdagen_kernels.VARIANTS:
        if e.backend != "triton" or args.variant not in e.name:
            continue
        mod = e.load()
        for target in args.target.split(","):
            if target not in e.targets:
                continue
            for over in _grid(args.knobs):
                t0 = time.time()
                if args.all_modes:
                    reports = aot.compile_checked(mod, target, tuning=over, kernels=kernels)
                else:
                    reports = aot.compile_variant(mod, target, state_mode=2, kernels=kernels, tuning=over)
                knobs = " ".join(f"{k}={v}" for k, v in over.items()) or "(spec tuning)"
                print(f"# {e.name} {target} {knobs} ({time.time() - t0:.0f} s)", flush=True)
                for r in reports:
                    why = aot.amd_budget_misses(r)
                    misses += bool(why)
                    print(f"  {r.row()}  {'MISS: ' + '; '.join(why) if why else 'ok'}", flush=True)
    print(f"# {misses} build(s) miss the budget")


if __name__ == "__main__":
    main()
