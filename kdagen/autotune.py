# SPDX-License-Identifier: Apache-2.0
"""`python -m kdagen autotune`: time the Triton path's launch configs on this GPU and write the best
into the spec, so tuning stays where users read and edit it (specs/*.yaml, tuning.triton.<target>).

Each candidate runs in its own process: a config can fault (an illegal address under triton 3.6 on
sm_90 for some recurrence configs), and a fault poisons the CUDA context
of the process that hit it. A candidate counts only if its full call first agrees with the float64
reference on a small ragged batch; then each kernel is timed alone (`triton.testing.do_bench` median)
on the tuning shapes. The three kernels' knobs are independent, so each is chosen on its own.
"""

from __future__ import annotations

import argparse
import json
import math
import re
import subprocess
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass, fields

from kdagen.cli import add_command
from kdagen.spec.model import TritonTuning
from kdagen.targets import TARGETS, estimate_triton_smem, next_pow2, refused_config

PROLOGUE_KNOBS = ("prologue_warps", "prologue_stages", "prologue_block_k")
WU_KNOBS = ("wu_warps", "wu_stages", "wu_block_k")
INTRA_KNOBS = ("intra_warps", "intra_stages", "intra_block_v")
RECURRENCE_KNOBS = ("recurrence_warps", "recurrence_stages", "recurrence_stages_sparse", "block_v")
KNOBS = {"prologue": PROLOGUE_KNOBS, "wu": WU_KNOBS, "intra": INTRA_KNOBS, "recurrence": RECURRENCE_KNOBS}
# The pair's kernels run only in the "pair" design (pipeline.choose_pipeline), so they are timed in it.
PAIR_KERNELS = ("prologue", "wu")
DEFAULT_SHAPES = ((12, 4096, 1), (96, 16384, 16))
CHECK_TOLERANCE = 1e-2  # relative L2 vs float64, the bench's bar (GPU runs measure ~3e-3)
TIE_TOLERANCE = 0.01  # configs within 1% of the fastest count as tied (do_bench medians vary about that much)


@dataclass(frozen=True)
class VariantDims:
    name: str
    head_dim_k: int
    head_dim_v: int
    chunk_size: int
    dtype: str


def prologue_candidates(v: VariantDims) -> list[dict[str, int]]:
    bound = next_pow2(v.head_dim_k)
    out = []
    for warps in (1, 2, 4, 8):
        for stages in (1, 2):
            for block_k in sorted({min(b, bound) for b in (16, 32, 64)}):
                out.append(dict(prologue_warps=warps, prologue_stages=stages, prologue_block_k=block_k))
    return out


def wu_candidates(v: VariantDims) -> list[dict[str, int]]:
    bound = min(next_pow2(v.head_dim_k), next_pow2(v.head_dim_v))
    out = []
    for warps in (2, 4, 8):
        for stages in (1, 2):
            for block_k in sorted({min(b, bound) for b in (32, 64, 128)}):
                out.append(dict(wu_warps=warps, wu_stages=stages, wu_block_k=block_k))
    return out


def intra_candidates(v: VariantDims) -> list[dict[str, int]]:
    bound = next_pow2(v.head_dim_v)
    return [dict(intra_warps=warps, intra_stages=stages, intra_block_v=block_v)
            for warps in (2, 4, 8) for stages in (1, 2) for block_v in sorted({min(b, bound) for b in (32, 64, 128)})]


def recurrence_candidates(v: VariantDims, target: str) -> list[dict[str, int]]:
    """Configs whose staged tiles fit the target's shared memory (the spec loader's own estimate). The
    sparse stage count only acts on shapes with few walks (the default shapes include one)."""
    out = []
    for block_v in sorted({min(b, next_pow2(v.head_dim_v)) for b in (16, 32, 64, 128)}):
        fits = [s for s in (1, 2) if estimate_triton_smem(v.head_dim_k, v.head_dim_v, v.chunk_size, v.dtype, block_v,
                                                           s, target) <= TARGETS[target].smem_per_block]
        for warps in (4, 8):
            for stages in fits:
                for sparse in fits:
                    out.append(dict(recurrence_warps=warps, recurrence_stages=stages,
                                    recurrence_stages_sparse=sparse, block_v=block_v))
    return out


def candidates(kernel: str, v: VariantDims, target: str) -> list[dict[str, int]]:
    """The configs to time; those a Triton release is known to miscompile for `target` are skipped."""
    if kernel == "prologue":
        found = prologue_candidates(v)
    elif kernel == "wu":
        found = wu_candidates(v)
    elif kernel == "intra":
        found = intra_candidates(v)
    else:
        found = recurrence_candidates(v, target)
    return [c for c in found if refused_config(target, c) is None]


@dataclass
class Trial:
    knobs: dict[str, int]
    ms: list[float] | None = None  # per tuning shape
    error: str | None = None

    def score(self, base: list[float]) -> float:
        """Geometric mean of the time ratios to the spec's current config: every shape weighs the same."""
        assert self.ms is not None
        return math.exp(sum(math.log(t / b) for t, b in zip(self.ms, base)) / len(base))


Measure = Callable[[str, str, str, dict[str, int], Sequence[tuple[int, int, int]]], Trial]


def measure_in_subprocess(variant: str, target: str, kernel: str, knobs: dict[str, int],
                          shapes: Sequence[tuple[int, int, int]], timeout_s: float = 300.0) -> Trial:
    job = json.dumps(dict(variant=variant, target=target, kernel=kernel, knobs=knobs, shapes=list(shapes)))
    try:
        res = subprocess.run([sys.executable, "-m", "kdagen.autotune", "--worker", job], capture_output=True,
                             text=True, timeout=timeout_s)
    except subprocess.TimeoutExpired:
        return Trial(knobs, error=f"timed out after {timeout_s:.0f} s")
    lines = [ln for ln in res.stdout.splitlines() if ln.startswith("{")]
    if res.returncode != 0 or not lines:
        tail = (res.stderr.strip().splitlines() or ["no output"])[-1]
        return Trial(knobs, error=f"exit {res.returncode}: {tail[:120]}")
    got = json.loads(lines[-1])
    return Trial(knobs, ms=got.get("ms"), error=got.get("error"))


def parse_knob_filters(items: Sequence[str]) -> dict[str, set[int]]:
    names = PROLOGUE_KNOBS + WU_KNOBS + INTRA_KNOBS + RECURRENCE_KNOBS
    out: dict[str, set[int]] = {}
    for item in items:
        name, _, values = item.partition("=")
        if name not in names or not values:
            raise ValueError(f"--knob {item!r}: expected NAME=V1,V2 with NAME one of {', '.join(names)}")
        try:
            out[name] = {int(x) for x in values.split(",")}
        except ValueError:
            raise ValueError(f"--knob {item!r}: values must be integers") from None
    return out


def tune(v: VariantDims, target: str, current: dict[str, int], shapes: Sequence[tuple[int, int, int]],
         measure: Measure = measure_in_subprocess, kernels: Sequence[str] = ("prologue", "wu", "recurrence"),
         log: Callable[[str], None] = print, only: dict[str, set[int]] | None = None) -> dict[str, int]:
    """The best knobs per kernel (the current ones where nothing beats them), merged over `current`."""
    best = dict(current)
    for kernel in kernels:
        now = {n: current[n] for n in KNOBS[kernel]}
        cands = candidates(kernel, v, target)
        cands = [c for c in cands if all(c[k] in vals for k, vals in (only or {}).items() if k in c)]
        cands = [now] + [c for c in cands if c != now]
        trials = []
        for i, knobs in enumerate(cands, 1):
            t = measure(v.name, target, kernel, knobs, shapes)
            shown = "  ".join(f"{x:.3f}" for x in t.ms) if t.ms else f"skipped: {t.error}"
            log(f"[{kernel} {i}/{len(cands)}] {_short(knobs)}  {shown}")
            trials.append(t)
        base = trials[0]
        if base.ms is None:
            raise RuntimeError(f"the spec's current {kernel} config {_short(now)} failed ({base.error}); "
                               "fix the spec's tuning by hand before autotuning")
        ok = [t for t in trials if t.ms is not None and len(t.ms) == len(base.ms)]
        fastest = min(t.score(base.ms) for t in ok)
        # Within timing noise of the fastest, keep the most knobs as they are: a knob the shapes do not
        # exercise (recurrence_stages_sparse on shapes with many walks) times the same either way.
        near = [t for t in ok if t.score(base.ms) <= fastest * (1 + TIE_TOLERANCE)]
        winner = min(near, key=lambda t: (-sum(t.knobs[n] == now[n] for n in now), t.score(base.ms)))
        log(f"{kernel}: {_short(winner.knobs)} at {winner.score(base.ms):.3f}x the current config's time")
        best.update(winner.knobs)
    return best


def _short(knobs: dict[str, int]) -> str:
    return ", ".join(f"{k}={v}" for k, v in knobs.items())


# ------------------------------------------------------------------------------------- spec rewrite

def flow_mapping(knobs: dict[str, int]) -> str:
    """`{prologue_warps: 1, ...}` in TritonTuning's field order, every field written out."""
    return "{" + ", ".join(f"{f.name}: {knobs[f.name]}" for f in fields(TritonTuning)) + "}"


class RewriteError(ValueError):
    """The spec's layout is one autotune does not edit; the message says what to write by hand."""


def rewrite_target_tuning(text: str, target: str, knobs: dict[str, int]) -> str:
    """`text` with the file-level `tuning.triton.<target>` set to `knobs`, comments and layout kept.

    Edits a one-line flow mapping in place, or adds the target (and `tuning:` / `triton:` if missing).
    """
    from kdagen.spec.yaml_nodes import YMap, parse_yaml

    def report(line: int, where: str, msg: str) -> None:
        raise RewriteError(f"line {line}: {where}: {msg}")

    root = parse_yaml(text, report)
    if not isinstance(root, YMap):
        raise RewriteError("the spec is not a mapping")
    lines = text.splitlines(keepends=True)
    value = flow_mapping(knobs)
    by_hand = f"set tuning.triton.{target} to {value} by hand"
    tuning = root.get("tuning")
    if tuning is None:
        at = root.key_lines["variants"] - 1 if "variants" in root else len(lines)
        lines[at:at] = ["tuning:\n", "  triton:\n", f"    {target}: {value}\n", "\n"]
        return "".join(lines)
    triton = tuning.get("triton") if isinstance(tuning, YMap) else None
    if not isinstance(triton, YMap):
        raise RewriteError(f"tuning has no block-style `triton:` mapping; {by_hand}")
    triton_line = lines[tuning.key_lines["triton"] - 1]
    if target not in triton:
        if "{" in triton_line:
            raise RewriteError(f"tuning.triton is a one-line flow mapping; {by_hand}")
        indent = len(triton_line) - len(triton_line.lstrip()) + 2
        lines.insert(tuning.key_lines["triton"], " " * indent + f"{target}: {value}\n")
        return "".join(lines)
    i = triton.key_lines[target] - 1
    m = re.match(rf"^(\s*{re.escape(target)}:\s*)\{{[^{{}}]*\}}(\s*(#.*)?)$", lines[i].rstrip("\n"))
    if m is None:
        raise RewriteError(f"tuning.triton.{target} (line {i + 1}) is not a one-line {{...}} mapping; {by_hand}")
    lines[i] = m.group(1) + value + m.group(2) + "\n"
    return "".join(lines)


# ------------------------------------------------------------------------------------------- worker

def _worker(job: dict) -> dict:
    """In a fresh process: check the candidate's full call against the reference, then time one kernel."""
    import torch
    import triton

    import kdagen_kernels
    from kdagen.bench import equal_lens, make_inputs
    from kdagen.reference import chunk_kda_prefill_reference, rel_l2

    entry = next(e for e in kdagen_kernels.VARIANTS if e.name == job["variant"])
    mod = entry.load()
    mod.TUNING[job["target"]].update(job["knobs"])  # this process only
    tun = mod.TUNING[job["target"]]
    C = entry.chunk_size
    dims = dict(K=entry.head_dim_k, V=entry.head_dim_v, dtype=entry.dtype, chunk_size=C)

    args, ci, co = make_inputs(4, [0, 1, C - 1, C, 3 * C + 8, 2 * C + 2], **dims, seed=1)
    ref_o, ref_s = chunk_kda_prefill_reference(**args)
    o, s = kdagen_kernels.chunk_kda_prefill(**args, chunk_indices=ci, chunk_offsets=co,
                                            out=torch.full_like(args["v"], float("nan")))
    eo, es = rel_l2(o, ref_o), rel_l2(s, ref_s)
    if not (eo < CHECK_TOLERANCE and es < CHECK_TOLERANCE):
        return dict(error=f"disagrees with the float64 reference (output {eo:.1e}, state {es:.1e})")
    ms = []
    for H, T, N in job["shapes"]:
        args, ci, co = make_inputs(H, equal_lens(T, N), **dims)
        ms.append(float(triton.testing.do_bench(kernel_call(mod, tun, job["kernel"], args, ci, co),
                                                return_mode="median")))
        torch.cuda.synchronize()
    return dict(ms=ms)


def kernel_call(mod, tun: dict[str, int], kernel: str, args: dict, ci, co, out=None,
                design: str | None = None) -> Callable[[], None]:
    """One Triton kernel ("prologue", "wu", "intra" or "recurrence") of a chunk_kda_prefill call, launched
    alone with `tun`, on a workspace the kernels before it have filled (so each one reads real values); the
    recurrence writes `out` (a new tensor if None). design: the plan's (pipeline.choose_pipeline); the pair's
    kernels always run in "pair". The launches take `tun` as given: its dense_* knobs are not applied (a batch
    whose walks fill the GPU takes them in a plan; pass `launch_knobs.dense_tuning(tun)` to time those)."""
    import kdagen_kernels
    from kdagen.launch_knobs import DENSE_KNOBS
    from kdagen.runtime import planning
    from kdagen.runtime.device import target_of

    tun = {**tun, **dict.fromkeys(DENSE_KNOBS.values(), 0)}
    q, v = args["q"], args["v"]
    cu = args["cu_seqlens"]
    entry = next(e for e in kdagen_kernels.VARIANTS if e.backend == "triton" and e.name == mod.NAME)
    # The plan launches the kernels of `mod` itself, which may be an edited copy of the variant's module
    # (tools/ablate_*.py), not the one the planner would load.
    key = planning.module_key(entry, target_of(q.device))
    loaded = planning._loaded.get(key)
    planning._loaded[key] = mod
    try:
        plan = planning.plan_kda_prefill(
            (entry,), cu, cu.cpu(), num_heads=q.shape[2], head_dim_k=q.shape[3], head_dim_v=v.shape[3],
            dtype=q.dtype, lower_bound=args["lower_bound"], has_g_bias=args["g_bias"] is not None,
            use_qk_l2norm_in_kernel=True, chunk_indices=ci, chunk_offsets=co, output_final_state=True, tuning=tun,
            design="pair" if kernel in PAIR_KERNELS else design)
    finally:
        if loaded is None:
            del planning._loaded[key]
        else:
            planning._loaded[key] = loaded
    values, state_in, *_ = plan.bind(q, args["k"], v, args["raw_g"], args["raw_beta"], args["A_log"],
                                     args["g_bias"], q.shape[3] ** -0.5, args["initial_state"], out, None)
    program = plan.program
    assert program is not None
    steps = {"prologue": program.prologue, "wu": program.wu, "intra": program.intra}
    for step in steps.values():
        if step is not None:
            step(values)
    if kernel in steps:
        step = steps[kernel]
        return (lambda: step(values)) if step is not None else (lambda: None)
    walks = program.walks.get(state_in, ())

    def walk() -> None:
        for launch in walks:
            launch(values)

    return walk


# -------------------------------------------------------------------------------------------- command

def _configure(p: argparse.ArgumentParser) -> None:
    p.add_argument("--variant", default="kda_chunk_fwd__triton__bf16__k128_v128_c64",
                   help="Triton variant to time (its spec file's tuning for this GPU's target is written)")
    p.add_argument("--shape", action="append", default=[], metavar="H:T:N",
                   help="tuning shape, repeatable (default: 12:4096:1 and 96:16384:16)")
    p.add_argument("--kernel", choices=(*KNOBS, "all"), default="all")
    p.add_argument("--knob", action="append", default=[], metavar="NAME=V1,V2",
                   help="only try these values of a knob, repeatable (e.g. prologue_warps=1,2)")
    p.add_argument("--write", action="store_true",
                   help="write the best knobs into the spec and regenerate generated/")


def _run(args: argparse.Namespace) -> int:
    import torch

    if not torch.cuda.is_available():
        print("kdagen autotune needs a GPU (it times kernels)", file=sys.stderr)
        return 2
    import kdagen_kernels
    from kdagen.render.emit import emit
    from kdagen.runtime.device import target_of

    target = target_of(torch.device("cuda"))
    entry = next((e for e in kdagen_kernels.VARIANTS if e.name == args.variant and e.backend == "triton"), None)
    if entry is None or target not in entry.targets:
        names = [e.name for e in kdagen_kernels.VARIANTS if e.backend == "triton" and target in e.targets]
        print(f"kdagen autotune: no Triton variant {args.variant!r} for {target}; choose one of: "
              f"{', '.join(names)}", file=sys.stderr)
        return 2
    v = VariantDims(entry.name, entry.head_dim_k, entry.head_dim_v, entry.chunk_size, entry.dtype)
    shapes = [tuple(int(x) for x in s.split(":")) for s in args.shape] or list(DEFAULT_SHAPES)
    current = dict(entry.load().TUNING[target])
    kernels = tuple(KNOBS) if args.kernel == "all" else (args.kernel,)
    try:
        best = tune(v, target, current, shapes, kernels=kernels, only=parse_knob_filters(args.knob))
    except (RuntimeError, ValueError) as exc:
        print(f"kdagen autotune: {exc}", file=sys.stderr)
        return 1
    spec_file = args.root / entry.spec.rsplit(":", 1)[0]
    print(f"best for {target}: {flow_mapping(best)}")
    if not args.write:
        print(f"not written; rerun with --write, or set tuning.triton.{target} in {spec_file.name} by hand")
        return 0
    old = spec_file.read_text()
    spec_file.write_text(rewrite_target_tuning(old, target, best))
    try:
        report = emit(args.root)
    except Exception:
        spec_file.write_text(old)
        raise
    print(f"wrote tuning.triton.{target} in {spec_file} and regenerated {len(report.written)} file(s); "
          "note: a variant-level tuning override for this target still takes precedence")
    return 0


add_command("autotune", "time Triton launch configs on this GPU and write the best into the spec",
            _configure, _run)


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "--worker":
        try:
            print(json.dumps(_worker(json.loads(sys.argv[2]))))
        except Exception as exc:  # reported to the parent as a skipped candidate
            print(json.dumps(dict(error=f"{type(exc).__name__}: {str(exc)[:200]}")))
        sys.exit(0)
    sys.exit("kdagen.autotune is run as `python -m kdagen autotune`")
