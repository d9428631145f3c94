# SPDX-License-Identifier: Apache-2.0
"""`python -m kdagen bench`'s results: the best peer of each shape and our ratio to it, the table, the CSV
and the plot."""

from __future__ import annotations

import csv
import math
import sys
from pathlib import Path

from kdagen.bench_peers import PEERS


def add_peer_ratios(rows: list[dict]) -> None:
    """For one shape's rows: the best peer that ran (least GPU time over FLA and FlashKDA) and, in every
    row, best peer ms / this row's ms (> 1: this row is faster than the best peer). No peer: NaN."""
    peers = [r for r in rows if r["impl"] in PEERS and math.isfinite(r["gpu_ms"])]
    best = min(peers, key=lambda r: r["gpu_ms"]) if peers else None
    for r in rows:
        r["best_peer"] = best["impl"] if best else ""
        r["best_peer_ms"] = best["gpu_ms"] if best else float("nan")
        r["vs_best_peer"] = r["best_peer_ms"] / r["gpu_ms"]


def _err(r: dict, key: str) -> str:
    # '*': measured on the check shape, this shape being too large for the float64 reference.
    return f"{r[key]:.1e}{'*' if r['err_at'] != 'own' else ' '}"


def format_table(rows: list[dict]) -> str:
    head = f"{'impl':14s} {'H':>3s} {'T':>6s} {'N':>3s} {'gpu ms':>8s} {'eager ms':>9s} {'host us':>8s} " \
           f"{'floor ms':>8s} {'Mtok/s':>7s} {'%floor':>6s} {'err o':>8s} {'err s':>8s} " \
           f"{'best peer':>14s} {'peer/x':>6s}"
    lines = [head]
    for r in rows:
        lines.append(f"{r['impl']:14s} {r['H']:3d} {r['T']:6d} {r['N']:3d} {r['gpu_ms']:8.3f} {r['eager_ms']:9.3f} "
                     f"{r['host_us']:8.1f} {r['floor_ms']:8.3f} {r['mtok_s']:7.1f} {r['pct_floor']:6.1f} "
                     f"{_err(r, 'err_o'):>8s} {_err(r, 'err_s'):>8s} {r['best_peer'] or '-':>14s} "
                     f"{r['vs_best_peer']:6.2f}")
    notes = sorted({r["err_at"] for r in rows} - {"own"})
    if notes:
        lines.append(f"* error on the check shape H:T:N = {', '.join(notes)} (too large for the float64 reference); "
                     "peer/x = best peer ms / this row's ms, > 1: faster than the best peer")
    return "\n".join(lines)


def write_csv(rows: list[dict], path: Path) -> None:
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)


def plot(rows: list[dict], path: Path) -> None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except Exception:
        print("matplotlib not importable; no plot", file=sys.stderr)
        return
    shapes = sorted({(r["H"], r["T"], r["N"]) for r in rows})
    impls = sorted({r["impl"] for r in rows})
    fig, axes = plt.subplots(2, 1, figsize=(max(8, len(shapes)), 7))
    width = 0.8 / len(impls)
    for j, impl in enumerate(impls):
        by = {(r["H"], r["T"], r["N"]): r for r in rows if r["impl"] == impl}
        xs = [i + width * j for i in range(len(shapes))]
        axes[0].bar(xs, [by[s]["gpu_ms"] for s in shapes], width=width, label=impl)
        axes[1].bar(xs, [by[s]["pct_floor"] for s in shapes], width=width, label=impl)
    for ax, lab in zip(axes, ("GPU time (ms, log)", "% of floor")):
        ax.set_xticks(range(len(shapes)), [f"H{h}\nT{t}\nN{n}" for h, t, n in shapes], fontsize=7)
        ax.set_ylabel(lab)
        ax.legend()
    axes[0].set_yscale("log")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
