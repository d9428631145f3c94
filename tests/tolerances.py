# SPDX-License-Identifier: Apache-2.0
"""The one tolerance table of the numerics tests, and the checks that read it.

A key is (path, dtype, quantity); a bound is the worst error measured on that key times a stated margin,
so a bound never comes from nowhere. Errors are relative L2 against the float64 reference unless the
quantity says otherwise. Paths:

- triton-interp: the Triton kernels under TRITON_INTERPRET=1 on the CPU (fp32 workspace, numpy products).
- triton-gpu, fused-gpu: the Triton and the fused HIP (sm_90 build) paths on the H200.
- hip-emulated: the generated HIP sources built by g++ against tests/build/hip_emulation (CPU).

Re-measuring: KDAGEN_TOLERANCE_LOG=/tmp/errs.jsonl pytest ... appends every checked error there, and
`python -m tests.tolerances /tmp/errs.jsonl` prints the worst one per key next to the table's entry.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Iterable
from dataclasses import dataclass

import torch

from kdagen.reference import rel_l2

Key = tuple[str, str, str]
INTERP = "triton 3.7.1 interpreter, torch 2.13 CPU (2026-12-01, commit 1f94667)"
H200 = "H200, torch 2.11 + triton 3.6"
EMULATED = "g++ emulation (2026-12-01, commit 1f94667)"


@dataclass(frozen=True)
class Tolerance:
    measured: float  # the worst error seen on this key
    margin: float  # bound = measured * margin
    source: str  # where and when `measured` was measured

    @property
    def bound(self) -> float:
        return self.measured * self.margin


TOLERANCES: dict[Key, Tolerance] = {
    # ---- Triton path in the interpreter: all of tests/interp and tests/e2e's added variant ------------
    ("triton-interp", "bf16", "output"): Tolerance(1.0e-2, 1.0, INTERP),
    ("triton-interp", "fp16", "output"): Tolerance(1.0e-2, 1.0, INTERP),
    ("triton-interp", "bf16", "final_state"): Tolerance(1.0e-4, 1.0, INTERP),
    ("triton-interp", "fp16", "final_state"): Tolerance(1.0e-4, 1.0, INTERP),
    # ---- the H200 (tests/gpu) -----------------------------------------------------------------------
    ("triton-gpu", "bf16", "output"): Tolerance(4.0e-3, 2.5, H200),
    ("triton-gpu", "fp16", "output"): Tolerance(4.0e-3, 2.5, H200),
    ("triton-gpu", "bf16", "final_state"): Tolerance(4.0e-3, 2.5, H200),
    ("triton-gpu", "fp16", "final_state"): Tolerance(4.0e-3, 2.5, H200),
    ("triton-gpu", "bf16", "adversarial"): Tolerance(4.0e-3, 12.5, H200),
    ("fused-gpu", "bf16", "output"): Tolerance(4.0e-3, 2.5, H200),
    ("fused-gpu", "bf16", "final_state"): Tolerance(4.0e-3, 2.5, H200),
    ("fused-gpu", "bf16", "adversarial"): Tolerance(4.0e-3, 12.5, H200),
    ("fused-gpu", "bf16", "vs_triton"): Tolerance(8.0e-3, 2.5, H200),
    ("fused-gpu", "bf16", "vs_one_group"): Tolerance(1.1e-3, 4.5, H200),
    # ---- the HIP sources in the CPU emulation (tests/build) -----------------------------------------
    ("hip-emulated", "bf16", "output"): Tolerance(1.0e-2, 1.0, EMULATED),
    ("hip-emulated", "bf16", "final_state"): Tolerance(1.0e-2, 1.0, EMULATED),
    ("hip-emulated", "bf16", "vs_one_group"): Tolerance(5.0e-3, 1.0, EMULATED),
    ("hip-emulated", "bf16", "vs_fma_layer"): Tolerance(1.0e-2, 1.0, EMULATED),
    ("hip-emulated", "bf16", "mma_tile_abs"): Tolerance(1.0e-4, 1.0, EMULATED),
}


def bound(key: Key) -> float:
    if key not in TOLERANCES:
        raise KeyError(f"no tolerance for {key}: measure it and add it to tests/tolerances.py")
    return TOLERANCES[key].bound


def _record(key: Key, what: str, err: float) -> None:
    path = os.environ.get("KDAGEN_TOLERANCE_LOG")
    if path:
        row = {"key": list(key), "what": what, "err": err, "test": os.environ.get("PYTEST_CURRENT_TEST", "")}
        with open(path, "a") as f:
            f.write(json.dumps(row) + "\n")


def within(what: str, err: float, key: Key) -> float:
    """Assert a measured error meets the key's bound; return it."""
    _record(key, what, err)
    tol = bound(key)
    assert err <= tol, f"{what}: error {err:.3e} > {tol:.2e} ({key})"
    return err


def check(name: str, got: torch.Tensor, ref: torch.Tensor, key: Key) -> float:
    """Shape, finiteness (an unwritten poisoned element is NaN) and relative L2 error within the bound."""
    assert got.shape == ref.shape, f"{name}: shape {tuple(got.shape)} vs reference {tuple(ref.shape)}"
    assert torch.isfinite(got).all(), f"{name}: {int((~torch.isfinite(got)).sum())} non-finite values (unwritten?)"
    return within(name, rel_l2(got, ref), key)


def summarize(lines: Iterable[str]) -> str:
    worst: dict[Key, tuple[float, str]] = {}
    for line in lines:
        row = json.loads(line)
        key = tuple(row["key"])
        if key not in worst or row["err"] > worst[key][0]:
            worst[key] = (row["err"], row["test"])
    out = []
    for key, (err, test) in sorted(worst.items()):
        t = TOLERANCES.get(key)
        table = f"table {t.measured:.1e} x {t.margin:g} = {t.bound:.1e}" if t else "not in the table"
        out.append(f"{'/'.join(key):40s} worst {err:.2e}  {table}  ({test})")
    return "\n".join(out)


if __name__ == "__main__":
    with open(sys.argv[1]) as f:
        print(summarize(f))
