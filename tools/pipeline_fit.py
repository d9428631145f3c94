# SPDX-License-Identifier: Apache-2.0
"""Fit the pipeline choice's parameters (kdagen.runtime.pipeline.Rules) to timings of every pipeline on random
shapes, and check them on shapes the fit did not see (docs/performance-model.md, "Fitted constants").

Usage:
  (GPU)  PYTHONPATH=.:generated python3 tools/pipeline_fit.py sweep --shapes 40 --seed 1 --out sweep.jsonl
  (CPU)  python3 tools/pipeline_fit.py fit sweep.jsonl[.gz] [--holdout 0.3] [--seed 0] [--free NAME,...]

The H200 sweeps RULES was fitted on are docs/data/pipeline-sweep-h200-2026-12-03.jsonl.gz (60 batches, seed 1)
and docs/data/pipeline-sweep-h200-walks-2026-12-03.jsonl.gz (60 batches with 16 <= N x H <= 132, seed 2).

`sweep` draws shapes (H 1-128, N 1-256, T 256-131072, ragged lengths: log-uniform draws), builds each batch's
plan once per candidate the chooser could return (the Triton pipeline at every group count the cost model
considers, hip_intra + triton_walk at the same counts, hip_intra + hip_walk, and "auto"), times each whole call
by CUDA-graph replay, and writes one JSON line per (shape, candidate) with what the chooser sees of the batch
and the target. It stops drawing at --budget-s, so a device call's limit keeps what was measured.

`fit` replays `choose_pipeline` over the measured shapes with each point of a grid of Rules, scores a point by
the geometric mean of (chosen candidate's time / fastest candidate's time) on the fit shapes, and prints the best
point as a Rules literal with its score on the held-out shapes beside today's RULES. A shape whose choice was
not measured (a candidate that failed) counts as 2x, so a grid point cannot win by choosing what was not timed.
"""

from __future__ import annotations

import argparse
import dataclasses
import gzip
import itertools
import json
import math
import random
import sys
import time
from pathlib import Path
from types import SimpleNamespace

from kdagen.runtime.group_scan import MAX_GROUPS
from kdagen.runtime.pipeline import RULES, Rules, Target, Work, choose_pipeline, rules_for

GROUP_CANDIDATES = (1, 2, 3, 4, 6, 8, 12, 16, 24, MAX_GROUPS)  # group_scan.choose_groups' candidates
CHUNK = 64  # the swept variant's metadata chunk (K = V = 128, bf16)
UNMEASURED = 2.0  # the ratio a choice that was not timed counts as


def draw_shape(rng: random.Random, max_token_heads: int = 1 << 23,
               walks: tuple[int, int] | None = None) -> tuple[int, list[int]]:
    """(H, lens): log-uniform H, N and total tokens, the tokens split at random cut points (ragged); with
    `walks` = (lo, hi), only batches whose N x H lies in it (a sweep aimed at one band of the choice)."""
    while True:
        H = min(128, max(1, round(2 ** rng.uniform(0, 7))))
        N = min(256, max(1, round(2 ** rng.uniform(0, 8))))
        T = max(N, round(2 ** rng.uniform(8, 17)))
        if T * H > max_token_heads or (walks is not None and not walks[0] <= N * H <= walks[1]):
            continue
        cuts = sorted(rng.sample(range(1, T), N - 1)) if N > 1 else []
        lens = [b - a for a, b in zip([0] + cuts, cuts + [T])]
        return H, lens


def candidates(per_seq_chunks: int, hip: bool) -> list[tuple[str, int | None]]:
    """(pipeline, groups) pairs the chooser can return for a batch, "auto" first."""
    gs = [g for g in GROUP_CANDIDATES if g == 1 or 2 * g <= per_seq_chunks]
    out: list[tuple[str, int | None]] = [("auto", None)]
    out += [("triton_intra+triton_walk", g) for g in gs]
    if hip:
        out += [("hip_intra+hip_walk", 1)] + [("hip_intra+triton_walk", g) for g in gs]
    return out


def sweep(args: argparse.Namespace) -> int:
    import torch
    import triton

    import kdagen_kernels
    from kdagen.bench import make_inputs

    rng = random.Random(args.seed)
    t0 = time.perf_counter()
    hip = kdagen_kernels.can_use_fused_kda_chunk(128, 128, torch.bfloat16, CHUNK)
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    with open(args.out, "a") as f:
        for i in range(args.shapes):
            if time.perf_counter() - t0 > args.budget_s:
                print(f"budget of {args.budget_s} s spent after {i} shapes", file=sys.stderr)
                break
            H, lens = draw_shape(rng, walks=args.walks)
            kw, ci, co = make_inputs(H, lens)
            out = torch.empty_like(kw["v"])
            cu = kw["cu_seqlens"]
            per_seq = max(-(-n // CHUNK) for n in lens)
            for pipeline, groups in candidates(per_seq, hip):
                err = ""
                extra = {"use_fused_chunk": True} if pipeline == "auto" else {"pipeline": pipeline, "groups": groups}
                try:
                    plan = kdagen_kernels.plan_kda_prefill(
                        cu, cu.cpu(), num_heads=H, head_dim_k=128, head_dim_v=128, dtype=kw["q"].dtype,
                        lower_bound=kw["lower_bound"], has_g_bias=True, use_qk_l2norm_in_kernel=True,
                        chunk_indices=ci, chunk_offsets=co, output_final_state=True, **extra)

                    def call(plan=plan):
                        return plan.run(kw["q"], kw["k"], kw["v"], kw["raw_g"], kw["raw_beta"], kw["A_log"],
                                        kw["g_bias"], initial_state=kw["initial_state"], out=out)

                    call()
                    torch.cuda.synchronize()
                    with torch.cuda.stream(torch.cuda.Stream()):
                        ms = triton.testing.do_bench_cudagraph(call, rep=args.rep_ms, return_mode="median")
                except Exception as exc:  # noqa: BLE001  a candidate this batch cannot run is recorded as such
                    ms, plan = None, None
                    err = f"{type(exc).__name__}: {str(exc)[:200]}"
                row = dict(shape=i, H=H, N=len(lens), T=sum(lens), max_len=max(lens), pipeline=pipeline,
                           groups=groups, ms=ms)
                if plan is not None:
                    p = plan.pipeline
                    row.update(chosen=p.name, chosen_groups=p.groups, knobs=p.knobs,
                               work=dict(n_seq=len(lens), H=H, n_chunks=int(ci.shape[0]), lower_bound=kw["lower_bound"],
                                         use_l2norm=True, checkpoints=False,
                                         max_seq_chunks=-(-max(lens) // CHUNK)),
                               target=dict(name=plan.target, sms=sms,
                                           hip_walk_threads=plan.lib.walk_threads if plan.lib is not None else None,
                                           tuning=dict(plan.tuning) if plan.tuning is not None else None,
                                           **({k: getattr(plan.mod, k) for k in ("HEAD_DIM_K", "HEAD_DIM_V", "BK", "BV")}
                                              if plan.mod is not None else {})))
                else:
                    row["error"] = err
                f.write(json.dumps(row) + "\n")
                f.flush()
            print(f"[{i + 1}] H={H} N={len(lens)} T={sum(lens)} at {time.perf_counter() - t0:.0f} s", file=sys.stderr)
    return 0


def load(path: Path) -> dict[int, list[dict]]:
    shapes: dict[int, list[dict]] = {}
    text = gzip.decompress(path.read_bytes()).decode() if path.suffix == ".gz" else path.read_text()
    for line in text.splitlines():
        if line.strip():
            r = json.loads(line)
            shapes.setdefault(r["shape"], []).append(r)
    return shapes


def _facts(rows: list[dict]) -> tuple[Work, dict, dict[tuple[str, int], float]] | None:
    """The batch and target the chooser saw (from the fused "auto" plan), and the measured (pipeline, groups)."""
    auto = next((r for r in rows if r["pipeline"] == "auto" and r.get("ms")), None)
    if auto is None:
        return None
    timed = {(r["chosen"], r["chosen_groups"]): r["ms"] for r in rows if r.get("ms") and r["pipeline"] != "auto"}
    work = dict(auto["work"])
    work.setdefault("max_seq_chunks", -(-auto["max_len"] // CHUNK))  # sweeps written before Work had it
    return Work(**work), auto["target"], timed


def _target(t: dict) -> Target:
    mod = SimpleNamespace(**{k: t[k] for k in ("HEAD_DIM_K", "HEAD_DIM_V", "BK", "BV")}) if "BK" in t else None
    return Target(name=t["name"], sms=t["sms"], triton=mod, tuning=t["tuning"], hip_walk_threads=t["hip_walk_threads"],
                  fused=t["hip_walk_threads"] is not None)


def ratios(shapes: list[tuple[Work, dict, dict]], rules: Rules) -> list[tuple[float, str]]:
    """(chosen / fastest measured, shape) per shape under `rules`."""
    out = []
    for work, t, timed in shapes:
        p = choose_pipeline(work, _target(t), rules=rules)
        got = timed.get((p.name, p.groups))
        out.append((got / min(timed.values()) if got else UNMEASURED,
                    f"H={work.H} N={work.n_seq} chunks={work.n_chunks}: {p.name} G={p.groups}"))
    return out


def score(shapes: list[tuple[Work, dict, dict]], rules: Rules) -> float:
    """Geomean over the shapes of chosen / fastest measured time under `rules`."""
    logs = [math.log(r) for r, _ in ratios(shapes, rules)]
    return math.exp(sum(logs) / len(logs)) if logs else float("nan")


GRID = dict(hip_intra_walks_per_sm=(0.0, 0.125, 0.25, 0.5, 1.0, 1e9),
            hip_intra_long_walks_per_sm=(0.0, 0.125, 0.2, 0.25, 0.33, 0.5),
            hip_intra_long_seq_chunks=(4.0, 8.0, 10.0, 16.0, 32.0, 1e9),
            hip_walk_min_seq_chunks=(0.0, 1.0, 1.25, 1.5, 2.0, 3.0),
            walk_programs_per_sm=(1, 2, 3, 4),
            pass1_step=(0.25, 0.5, 1.0),
            scan_step=(0.5, 1.0, 2.5, 5.0),
            split_max_fill=(0.25, 0.5, 1.0, 2.0),
            split_step=(0.0, 2.0, 4.0, 8.0),
            hip_walk_step=(0.6, 0.7, 0.8, 0.9, 1.0))


def fit(args: argparse.Namespace) -> int:
    data = [f for f in (_facts(rows) for rows in load(args.sweep).values()) if f is not None and f[2]]
    if len(data) < 4:
        print(f"{args.sweep}: {len(data)} usable shapes; the fit needs at least 4", file=sys.stderr)
        return 2
    random.Random(args.seed).shuffle(data)
    n_hold = max(1, round(args.holdout * len(data)))
    held, train = data[:n_hold], data[n_hold:]
    names = [f.name for f in dataclasses.fields(Rules)]  # a field without a GRID axis keeps today's value
    target = data[0][1]["name"]
    today = rules_for(target)
    # Ties (to 4 digits) go to the point that changes fewest of today's parameters.
    free = args.free.split(",") if args.free else list(GRID)
    unknown = [n for n in free if n not in GRID]
    if unknown:
        print(f"--free {unknown[0]!r}: choose from {', '.join(GRID)}", file=sys.stderr)
        return 2
    axes = [GRID[n] if n in free and n in GRID else (getattr(today, n),) for n in names]
    best = min((Rules(**dict(zip(names, point))) for point in itertools.product(*axes)),
               key=lambda r: (round(score(train, r), 4), sum(getattr(r, n) != getattr(today, n) for n in names)))
    print(f"{len(train)} fit shapes, {len(held)} held out; target {target} ({data[0][1]['sms']} SMs)")
    print("geomean of chosen / fastest measured (1.000 = always the fastest):")
    for label, r in (("today's RULES", today), ("fitted", best)):
        print(f"  {label:14s} fit {score(train, r):.4f}  held out {score(held, r):.4f}")
    for label, r in (("today's RULES", today), ("fitted", best)):
        worst = max(ratios(held + train, r), key=lambda x: x[0])
        print(f"  {label:14s} worst {worst[0]:.3f} at {worst[1]}")
    print(f"fitted: Rules({', '.join(f'{n}={getattr(best, n)!r}' for n in names)})")
    print(f"known targets: {', '.join(RULES)}")
    return 0


def _band(text: str) -> tuple[int, int]:
    try:
        lo, hi = (int(x) for x in text.split(":"))
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: expected LO:HI, two integers") from None
    if not 1 <= lo <= hi:
        raise argparse.ArgumentTypeError(f"{text!r}: expected 1 <= LO <= HI")
    return lo, hi


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    s = sub.add_parser("sweep", help="time every candidate pipeline on random shapes (GPU)")
    s.add_argument("--shapes", type=int, default=40)
    s.add_argument("--seed", type=int, default=1)
    s.add_argument("--rep-ms", type=int, default=20)
    s.add_argument("--budget-s", type=float, default=420.0)
    s.add_argument("--out", type=Path, default=Path("sweep.jsonl"))
    s.add_argument("--walks", type=_band, default=None, metavar="LO:HI",
                   help="only batches with LO <= N x H <= HI, e.g. 16:132 for the band of the hip_intra threshold")
    f = sub.add_parser("fit", help="fit Rules to a sweep's timings (CPU)")
    f.add_argument("sweep", type=Path)
    f.add_argument("--holdout", type=float, default=0.3)
    f.add_argument("--seed", type=int, default=0)
    f.add_argument("--free", default="", metavar="NAME,...",
                   help="fit only these Rules fields, the others at today's values (default: all)")
    args = p.parse_args()
    return sweep(args) if args.cmd == "sweep" else fit(args)


if __name__ == "__main__":
    sys.exit(main())
