# SPDX-License-Identifier: Apache-2.0
"""`python -m kdagen bench`'s results: the best peer of each shape and our ratio to it, the table, the CSV
and the plot."""

from __future__ import annotations

import csv
import math
import sys
from pathlib import Path

from kdagen.bench_peers import FORK, is_peer


def add_peer_ratios(rows: list[dict]) -> None:
    """For one shape's rows: the best peer that ran (least GPU time over FLA and the FlashKDA builds) and,
    in every row, best peer ms / this row's ms and vLLM's fork ms / this row's ms (> 1: this row is faster).
    No such peer: NaN."""
    peers = [r for r in rows if is_peer(r["impl"]) and math.isfinite(r["gpu_ms"])]
    best = min(peers, key=lambda r: r["gpu_ms"]) if peers else None
    fork = next((r["gpu_ms"] for r in peers if r["impl"] == FORK), float("nan"))
    for r in rows:
        r["best_peer"] = best["impl"] if best else ""
        r["best_peer_ms"] = best["gpu_ms"] if best else float("nan")
        r["vs_best_peer"] = r["best_peer_ms"] / r["gpu_ms"]
        r["vs_fork"] = fork / r["gpu_ms"]


def kdagen_vs_fork(rows: list[dict]) -> float:
    """For one shape's rows: the fork's time over the fastest kdagen path's (> 1: kdagen is faster)."""
    ours = [r["gpu_ms"] for r in rows if r["impl"].startswith("kdagen") and math.isfinite(r["gpu_ms"])]
    fork = [r["gpu_ms"] for r in rows if r["impl"] == FORK]
    return fork[0] / min(ours) if ours and fork else float("nan")


def _err(r: dict, key: str) -> str:
    # '*': measured on the check shape, this shape being too large for the float64 reference.
    return f"{r[key]:.1e}{'*' if r['err_at'] != 'own' else ' '}"


def format_table(rows: list[dict]) -> str:
    """One line per row; the shape's fastest-kdagen-over-fork ratio sits in fork/x of its kdagen rows, and
    a GPU time measured eagerly (the call could not be graph-captured) is marked 'e'."""
    head = f"{'impl':18s} {'set':8s} {'H':>3s} {'T':>6s} {'N':>3s} {'maxlen':>6s} {'gpu ms':>9s} " \
           f"{'eager ms':>9s} {'host us':>8s} {'floor ms':>8s} {'%floor':>6s} {'err o':>8s} {'err s':>8s} " \
           f"{'best peer':>13s} {'peer/x':>6s} {'fork/x':>6s}  pipeline"
    lines = [head]
    for r in rows:
        mark = "e" if r.get("timing") == "eager" else " "
        lines.append(f"{r['impl']:18s} {r.get('set', ''):8s} {r['H']:3d} {r['T']:6d} {r['N']:3d} "
                     f"{r.get('max_len', r['T']):6d} {r['gpu_ms']:8.3f}{mark} {r['eager_ms']:9.3f} "
                     f"{r['host_us']:8.1f} {r['floor_ms']:8.3f} {r['pct_floor']:6.1f} "
                     f"{_err(r, 'err_o'):>8s} {_err(r, 'err_s'):>8s} {r['best_peer'] or '-':>13s} "
                     f"{r['vs_best_peer']:6.2f} {r.get('vs_fork', float('nan')):6.2f}  {r.get('pipeline', '')[:60]}")
    notes = sorted({r["err_at"] for r in rows} - {"own"})
    if notes:
        lines.append(f"* error on the check shape H:T:N = {', '.join(notes)} (too large for the float64 reference); "
                     "peer/x = best peer ms / this row's ms, fork/x = vLLM's FlashKDA ms / this row's ms, "
                     "> 1: faster")
    return "\n".join(lines)


def summary(rows: list[dict]) -> str:
    """Per shape: fastest kdagen over the fork, and over the best peer; then the range over the shapes."""
    shapes: dict[tuple, list[dict]] = {}
    for r in rows:
        shapes.setdefault((r.get("set", ""), r["H"], r["T"], r["N"], r.get("max_len", r["T"])), []).append(r)
    lines, ratios = [f"{'set':8s} {'H':>3s} {'T':>6s} {'N':>3s} {'maxlen':>6s} {'fastest kdagen':>18s} "
                     f"{'ms':>8s} {'fork/x':>6s} {'peer/x':>6s}"], []
    for (st, H, T, N, L), rs in shapes.items():
        ours = [r for r in rs if r["impl"].startswith("kdagen")]
        if not ours:
            continue
        best = min(ours, key=lambda r: r["gpu_ms"])
        vf = kdagen_vs_fork(rs)
        ratios.append(vf)
        lines.append(f"{st:8s} {H:3d} {T:6d} {N:3d} {L:6d} {best['impl']:>18s} {best['gpu_ms']:8.3f} {vf:6.2f} "
                     f"{best['vs_best_peer']:6.2f}")
    finite = [x for x in ratios if math.isfinite(x)]
    if finite:
        lines.append(f"fastest kdagen / fork over {len(finite)} shapes: {min(finite):.3f}x .. {max(finite):.3f}x "
                     f"(fork ms / kdagen ms; > 1: kdagen faster)")
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
    def key(r: dict) -> tuple:
        return r.get("set", ""), r["H"], r["T"], r["N"], r.get("max_len", r["T"])

    shapes = list(dict.fromkeys(key(r) for r in rows))
    impls = sorted({r["impl"] for r in rows})
    fig, axes = plt.subplots(2, 1, figsize=(max(8, len(shapes)), 7))
    width = 0.8 / len(impls)
    for j, impl in enumerate(impls):
        by = {key(r): r for r in rows if r["impl"] == impl}
        nan = dict(gpu_ms=float("nan"), pct_floor=float("nan"))  # an implementation that failed at a shape
        xs = [i + width * j for i in range(len(shapes))]
        axes[0].bar(xs, [by.get(s, nan)["gpu_ms"] for s in shapes], width=width, label=impl)
        axes[1].bar(xs, [by.get(s, nan)["pct_floor"] for s in shapes], width=width, label=impl)
    for ax, lab in zip(axes, ("GPU time (ms, log)", "% of floor")):
        ax.set_xticks(range(len(shapes)), [f"H{h}\nT{t}\nN{n}" for _, h, t, n, _ in shapes], fontsize=7)
        ax.set_ylabel(lab)
        ax.legend()
    axes[0].set_yscale("log")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
