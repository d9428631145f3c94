# SPDX-License-Identifier: Apache-2.0
"""The batches `python -m kdagen bench` times: performance.md's fifteen standard shapes (N equal sequences), a
few fixed ragged batches, the tensor-parallel head counts with many sequences, and a serving set drawn with a
fixed generator. Pure Python (no torch): the CPU tests check every set."""

from __future__ import annotations

import math
import random
from typing import NamedTuple

SERVING_HEADS = (4, 8, 12, 16, 32, 64, 96, 128)  # Kimi's 96 heads over TP 1..24, and the neighbours
SERVING_SEED = 20261203
SERVING_COUNT = 30
SERVING_TOKENS = (256, 131072)
SERVING_MAX_SEQS = 256


class Shape(NamedTuple):
    """One batch: H heads over sequences of these lengths, packed (B = 1, cu_seqlens), K = V = 128."""

    H: int
    lens: tuple[int, ...]
    set: str

    @property
    def T(self) -> int:
        return sum(self.lens)

    @property
    def N(self) -> int:
        return len(self.lens)

    @property
    def ragged(self) -> bool:
        return list(self.lens) != equal_lens(self.T, self.N)

    def label(self) -> str:
        """H:T:N, with the longest sequence where lengths differ (it bounds the walk)."""
        return f"{self.H}:{self.T}:{self.N}" + (f" max {max(self.lens)}" if self.ragged else "")


def equal_lens(T: int, N: int) -> list[int]:
    """performance.md's batches: N equal sequences (the last takes the remainder) packed into T tokens."""
    return [T // N] * (N - 1) + [T - (T // N) * (N - 1)]


def equal(H: int, T: int, N: int, set_name: str = "custom") -> Shape:
    return Shape(H, tuple(equal_lens(T, N)), set_name)


def ragged_lens(T: int, N: int, rng: random.Random) -> list[int]:
    """N lengths (each >= 1) summing to T, spread like a serving batch: log-normal weights give a few long
    prefills among many short ones; the longest goes last, as vLLM packs prefills after decodes."""
    if not 1 <= N <= T:
        raise ValueError(f"ragged_lens: need 1 <= N <= T, got N={N}, T={T}")
    w = [rng.lognormvariate(0.0, 1.5) for _ in range(N)]
    spare = T - N
    lens = [1 + int(spare * x / sum(w)) for x in w]
    lens[lens.index(max(lens))] += T - sum(lens)  # rounding remainder to the longest
    lens.sort()
    return lens


STANDARD = [equal(h, t, n, "standard") for h in (12, 32, 96)
            for (t, n) in ((4096, 1), (16384, 1), (65536, 1), (16384, 16), (65536, 64))]
QUICK = [equal(12, 4096, 1, "quick"), equal(12, 16384, 16, "quick"), equal(96, 16384, 16, "quick")]
# Mixed prefill batches at Kimi's full and TP-split head counts: one long prompt among short ones, a few
# medium prompts with a decode-sized tail, and an even spread.
RAGGED = [
    Shape(96, (1,) * 7 + (17, 100, 1024, 4096, 16384), "ragged"),
    Shape(32, (3, 40, 250, 700, 1500, 3000, 6000, 12000), "ragged"),
    Shape(12, tuple(range(64, 64 * 33, 64)), "ragged"),
    Shape(96, (8192, 8192, 4096, 2048, 1024, 512, 256, 128), "ragged"),
]


def _tp_shapes() -> list[Shape]:
    rng = random.Random(SERVING_SEED + 1)
    return [Shape(h, tuple(ragged_lens(t, n, rng)), "tp") for h in (4, 8, 16) for (t, n) in ((65536, 64), (16384, 256))]


def serving_shapes(count: int = SERVING_COUNT, seed: int = SERVING_SEED) -> list[Shape]:
    """`count` batches from random.Random(seed): H from SERVING_HEADS, T log-uniform over SERVING_TOKENS,
    N log-uniform over 1 .. min(SERVING_MAX_SEQS, T), ragged lengths. The same list on every machine
    (Python's Mersenne Twister and the float math here are platform-independent)."""
    rng = random.Random(seed)
    lo, hi = SERVING_TOKENS
    out = []
    for _ in range(count):
        H = rng.choice(SERVING_HEADS)
        T = int(round(math.exp(rng.uniform(math.log(lo), math.log(hi)))))
        N = max(1, min(SERVING_MAX_SEQS, T, int(math.exp(rng.uniform(0.0, math.log(SERVING_MAX_SEQS + 1))))))
        out.append(Shape(H, tuple(ragged_lens(T, N, rng)), "serving"))
    return out


TP = _tp_shapes()
SERVING = serving_shapes()
SETS = {"standard": STANDARD, "ragged": RAGGED, "tp": TP, "serving": SERVING, "quick": QUICK}
DEFAULT_SETS = ("standard", "serving")  # the pair that fits one 10-minute H200 call with every peer


def parse_shape(text: str) -> Shape:
    """--shape H:T:N (N equal sequences) or H:L1,L2,... (those lengths)."""
    parts = text.split(":")
    try:
        if len(parts) == 3:
            H, T, N = (int(x) for x in parts)
            if min(H, T, N) < 1 or N > T:
                raise SystemExit(f"kdagen bench: --shape {text!r}: H:T:N wants 1 <= N <= T and H >= 1")
            return equal(H, T, N)
        if len(parts) == 2:
            H, lens = int(parts[0]), tuple(int(x) for x in parts[1].split(","))
            if H < 1 or min(lens) < 1:
                raise SystemExit(f"kdagen bench: --shape {text!r}: every length and H must be >= 1")
            return Shape(H, lens, "custom")
    except ValueError:
        pass
    raise SystemExit(f"kdagen bench: --shape {text!r}: expected integers as H:T:N (N equal sequences) or "
                     "H:L1,L2,... (the sequence lengths), e.g. 32:16384:16 or 8:100,3000,17")


def pick_shapes(explicit: list[str], sets: list[str], heads: str) -> list[Shape]:
    """--shape entries as given; else the named sets (default DEFAULT_SETS), kept to --heads if set."""
    if explicit:
        return [parse_shape(s) for s in explicit]
    unknown = [s for s in sets if s not in SETS]
    if unknown:
        raise SystemExit(f"kdagen bench: --set {unknown[0]!r}: choose from {', '.join(SETS)}")
    shapes = [s for name in (sets or DEFAULT_SETS) for s in SETS[name]]
    if heads:
        try:
            wanted = {int(x) for x in heads.split(",")}
        except ValueError:
            raise SystemExit(f"kdagen bench: --heads {heads!r}: expected integers (H1,H2)") from None
        kept = [s for s in shapes if s.H in wanted]
        if not kept:
            raise SystemExit(f"kdagen bench: no shape of the sets {', '.join(sets or DEFAULT_SETS)} has H in "
                             f"{sorted(wanted)}; the heads there are {sorted({s.H for s in shapes})}, "
                             "or give --shape H:T:N")
        shapes = kept
    return shapes
