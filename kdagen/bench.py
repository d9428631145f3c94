# SPDX-License-Identifier: Apache-2.0
"""`python -m kdagen bench`: time chunk_kda_prefill's Triton path, its fused path (when a hip variant serves
the device) and the peers on the same inputs: FLA (`chunk_kda`, with FLA_FLASH_KDA=0) and FlashKDA (`fwd`).
Two FlashKDA builds (vLLM's fork and upstream) both import as `flash_kda`, so each one named by
`--flashkda NAME=DIR` runs in its own worker process (bench_worker.py) that regenerates the same inputs from
the same seed; a `flash_kda` importable here is timed in-process as "flashkda" when no --flashkda is given.

GPU time is the median of CUDA-graph replays (triton.testing.do_bench_cudagraph); a call that cannot be
captured (it syncs inside) is timed eagerly instead and marked 'e' in the table. Eager time is the median of
plain calls, Python included (do_bench, which flushes the L2 before each call); host time is the median
host-side cost of one call on an idle device. The floor is max(bytes / copy bandwidth, FLOPs / bf16 matmul
rate), both measured in the same run. Per shape: the best peer (least GPU time of the peers that ran), every
row's ratio best peer / it, and fork / it (vLLM's FlashKDA, when it ran). Every implementation is checked
against the float64 reference on a small shape before timing, and again at each shape the reference can
afford (ref_fits). Writes a table to stdout, a CSV and a PNG plot.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

from kdagen.bench_peers import FLA, FLASHKDA, FORK, is_peer, peer_impls
from kdagen.bench_report import add_peer_ratios, format_table, plot, summary, write_csv
from kdagen.bench_shapes import DEFAULT_SETS, SETS, STANDARD, Shape, equal_lens, pick_shapes
from kdagen.cli import add_command

SHAPES = STANDARD  # performance.md's fifteen
BYTES_PER_TOKEN_HEAD = 1282  # read q, k, v, raw_g, raw_beta; write o (bf16, K = V = 128)
STATE_BYTES_PER_SEQ_HEAD = 2 * 128 * 128 * 4  # fp32 state in and out
FLOPS_PER_TOKEN_HEAD = 181_589  # 6d^2 + 10Cd + C^2/3 at C = 64, d = 128
IMPL_NAMES = {"triton": "kdagen-triton", "triton-pair": "kdagen-triton-pair", "fused": "kdagen-fused", "fla": FLA,
              "flashkda": FLASHKDA, "flashkda-vllm": FORK}
DEFAULT_OFF = ("kdagen-triton-pair",)  # an A/B of the plan's design choice: timed only when --impl names it
CHECK_SHAPE = (4, 1000, 3)  # (H, T, N) every implementation is checked on before any timing
# A peer keeps its own numerics (FlashKDA rounds its state to bf16 between 16-token chunks); a wrong
# input conversion gives errors of order 1, far above this.
PEER_TOL = 5e-2
REF_MAX_TOKEN_HEADS = 2**21  # larger shapes report the check shape's errors (see ref_fits)
REF_MAX_STEPS = 16384
REP_MS = 100


def pick_impls(available: dict, wanted: list[str]) -> dict:
    """The implementations named by --impl (short or full names); none named: all available ones but the
    DEFAULT_OFF A/Bs."""
    if not wanted:
        return {k: v for k, v in available.items() if k not in DEFAULT_OFF}
    out = {}
    for w in wanted:
        name = IMPL_NAMES.get(w, w)
        if name not in IMPL_NAMES.values():
            raise SystemExit(f"kdagen bench: --impl {w!r}: choose from {', '.join(IMPL_NAMES)}")
        if name not in available:
            raise SystemExit(f"kdagen bench: {name} is not available here (see the message above)")
        out[name] = available[name]
    return out


def parse_workers(specs: list[str]) -> dict[str, Path]:
    """--flashkda NAME=DIR entries: DIR holds a `flash_kda` package (a build of FlashKDA); NAME is flashkda
    (upstream) or flashkda-vllm (vLLM's fork)."""
    out = {}
    for s in specs:
        name, sep, d = s.partition("=")
        if not sep or name not in (FLASHKDA, FORK) or not d:
            raise SystemExit(f"kdagen bench: --flashkda {s!r}: expected NAME=DIR with NAME {FLASHKDA} (upstream) "
                             f"or {FORK} (vLLM's fork) and DIR the folder holding its flash_kda package")
        if not (Path(d) / "flash_kda" / "__init__.py").is_file():
            raise SystemExit(f"kdagen bench: --flashkda {s!r}: no flash_kda/__init__.py under {d}; point DIR at "
                             "the folder that holds the built package")
        out[name] = Path(d).resolve()
    return out


def shape_inputs(H: int, T: int, N: int, seed: int = 0):
    return make_inputs(H, equal_lens(T, N), seed=seed)


def make_inputs(H: int, lens: list[int], K: int = 128, V: int = 128, dtype: str = "bf16", chunk_size: int = 64,
                seed: int = 0, device: str = "cuda"):
    """Random chunk_kda_prefill arguments (safe gate, L2 norm, bias, initial state) and the chunk
    metadata for sequences of the given lengths. Deterministic in (lens, seed): a worker process builds
    the same tensors."""
    import torch

    import kdagen_kernels
    from kdagen.runtime.registry import TORCH_DTYPES

    g = torch.Generator(device=device).manual_seed(seed)
    dev, io, T, N = device, TORCH_DTYPES[dtype], sum(lens), len(lens)

    def rn(*s):
        return torch.randn(*s, device=dev, generator=g)

    cu = torch.tensor([0] + list(lens), device=dev).cumsum(0).to(torch.int32)
    args = dict(q=rn(1, T, H, K).to(io), k=rn(1, T, H, K).to(io), v=rn(1, T, H, V).to(io),
                raw_g=rn(1, T, H, K).to(io), raw_beta=rn(1, T, H).to(io),
                A_log=torch.rand(H, device=dev, generator=g), g_bias=torch.rand(H * K, device=dev, generator=g),
                initial_state=rn(N, H, V, K), output_final_state=True, lower_bound=-5.0,
                use_qk_l2norm_in_kernel=True, cu_seqlens=cu)
    ci, co = kdagen_kernels.prepare_chunk_metadata_device(cu, cu.cpu(), chunk_size)
    return args, ci, co


def _plan(args: dict, ci, co, **extra):
    """plan_kda_prefill for the benchmark's batch, with a row's plan options (`_plan_extra`)."""
    import kdagen_kernels

    cu, q, v = args["cu_seqlens"], args["q"], args["v"]
    return kdagen_kernels.plan_kda_prefill(
        cu, cu.cpu(), num_heads=q.shape[2], head_dim_k=q.shape[3], head_dim_v=v.shape[3], dtype=q.dtype,
        lower_bound=args["lower_bound"], has_g_bias=args["g_bias"] is not None,
        use_qk_l2norm_in_kernel=args["use_qk_l2norm_in_kernel"], chunk_indices=ci, chunk_offsets=co,
        output_final_state=args["output_final_state"], **extra)


def _plan_extra(name: str) -> dict:
    """The plan options a kdagen row's name stands for: the fused path, the pair design, or a named pipeline
    ("kdagen-<chunk>+<walk>", from --pipeline)."""
    if name == "kdagen-fused":
        return {"use_fused_chunk": True}
    if name == "kdagen-triton-pair":
        return {"design": "pair"}
    if "+" in name:
        return {"pipeline": name.removeprefix("kdagen-")}
    return {}


def pipeline_of(name: str, args: dict, ci, co) -> str:
    """What a kdagen row ran: the "pipeline:" line of plan.describe() (its stages and group count); a peer: ""."""
    if not name.startswith("kdagen"):
        return ""
    text = _plan(args, ci, co, **_plan_extra(name)).describe()
    line = next((ln.strip() for ln in text.splitlines() if ln.strip().startswith("pipeline:")), None)
    return line.removeprefix("pipeline:").strip() if line else " ".join(text.split())


def pipeline_maker(pipeline: str):
    """A kdagen row running the named pipeline ("<chunk>+<walk>") through plan_kda_prefill(pipeline=...)."""
    def make(args, ci, co, out):
        plan = _plan(args, ci, co, pipeline=pipeline)
        return lambda: plan.run(args["q"], args["k"], args["v"], args["raw_g"], args["raw_beta"], args["A_log"],
                                args["g_bias"], initial_state=args["initial_state"], out=out)

    return make


def implementations(include_peers: bool = True) -> dict:
    import torch

    import kdagen_kernels

    impls = {}

    def ours(args, ci, co, out):
        return lambda: kdagen_kernels.chunk_kda_prefill(**args, chunk_indices=ci, chunk_offsets=co, out=out)

    impls["kdagen-triton"] = ours

    def ours_pair(args, ci, co, out):
        # The Triton path with the chunk-parallel design forced to the kernel pair (an A/B of the plan's choice).
        plan = _plan(args, ci, co, **_plan_extra("kdagen-triton-pair"))
        return lambda: plan.run(args["q"], args["k"], args["v"], args["raw_g"], args["raw_beta"], args["A_log"],
                                args["g_bias"], initial_state=args["initial_state"], out=out)

    impls["kdagen-triton-pair"] = ours_pair
    if kdagen_kernels.can_use_fused_kda_chunk(128, 128, torch.bfloat16, 64):
        def fused(args, ci, co, out):
            return lambda: kdagen_kernels.chunk_kda_prefill(**args, chunk_indices=ci, chunk_offsets=co, out=out,
                                                            use_fused_chunk=True)

        impls["kdagen-fused"] = fused
    else:
        print("no fused (hip) variant for K=V=128 bf16 on this device; timing the Triton path only",
              file=sys.stderr)
    if include_peers:
        impls.update(peer_impls())
    return impls


def _ceilings() -> tuple[float, float]:
    import torch
    import triton

    x = torch.empty(2**28, dtype=torch.float32, device="cuda").uniform_()
    y = torch.empty_like(x)
    ms = triton.testing.do_bench(lambda: y.copy_(x), return_mode="median")
    bw = 2 * x.numel() * 4 / (ms * 1e-3)
    a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    b = torch.randn_like(a)
    ms = triton.testing.do_bench(lambda: a @ b, return_mode="median")
    return bw, 2 * 8192**3 / (ms * 1e-3)


def floor_ms(shape: Shape, bw: float, flops: float) -> float:
    """performance.md's floor: every byte moved once at the copy bandwidth, or every FLOP at the bf16 rate."""
    TH = shape.T * shape.H
    return 1e3 * max((BYTES_PER_TOKEN_HEAD * TH + STATE_BYTES_PER_SEQ_HEAD * shape.N * shape.H) / bw,
                     FLOPS_PER_TOKEN_HEAD * TH / flops)


def ref_fits(H: int, lens) -> bool:
    """Whether the float64 reference runs at this shape: it holds about 10 KB per token-head on the GPU
    and walks the longest sequence token by token from Python (about 0.15 ms a step)."""
    return sum(lens) * H <= REF_MAX_TOKEN_HEADS and max(lens) <= REF_MAX_STEPS


def check_errors(make, ref, args, ci, co) -> tuple[float, float]:
    """One poisoned call of `make`'s callable against the float64 reference (o, s): rel L2 of each."""
    import torch

    from kdagen.reference import rel_l2

    # An explicit, poisoned out: with out=None the fused path writes into v (vLLM's op's contract).
    o, s = make(args, ci, co, torch.full_like(args["v"], float("nan")))()
    return rel_l2(o, ref[0]), rel_l2(s, ref[1])


def _validate(impls: dict) -> tuple[dict, dict[str, tuple[float, float]]]:
    """Each implementation against the float64 reference at CHECK_SHAPE: ours must agree within 1e-2, a
    peer within PEER_TOL (else it is not timed); returns the kept ones and their errors there."""
    from kdagen.reference import chunk_kda_prefill_reference

    args, ci, co = shape_inputs(*CHECK_SHAPE, seed=1)
    ref = chunk_kda_prefill_reference(**args)
    kept, errors = {}, {}
    for name, make in impls.items():
        eo, es = check_errors(make, ref, args, ci, co)
        print(f"check {name}: rel L2 output {eo:.2e}, final state {es:.2e}", file=sys.stderr)
        tol = PEER_TOL if is_peer(name) else 1e-2
        if not (eo < tol and es < tol):
            if not is_peer(name):
                raise SystemExit(f"{name} disagrees with the float64 reference; not timing it")
            print(f"{name} disagrees with the float64 reference (over {tol:g}); not timing it", file=sys.stderr)
            continue
        kept[name], errors[name] = make, (eo, es)
    return kept, errors


def host_us(fn: Callable[[], object], sync: Callable[[], None], n: int = 30) -> float:
    """Median host time of one call of `fn`, microseconds. The device is drained (`sync`) before each
    sample so the launch queue never makes the call wait; a call that syncs inside is charged its wait."""
    times = []
    for _ in range(n):
        sync()
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    sync()
    return 1e6 * statistics.median(times)


def time_call(fn: Callable[[], object], rep_ms: int = REP_MS, name: str = "") -> dict:
    """GPU time by graph replay ('graph'), or eagerly ('eager') where the call cannot be captured; eager and
    host time beside it. `fn` has run once already (compile, autotune)."""
    import torch
    import triton

    timing = "graph"
    try:
        gpu = triton.testing.do_bench_cudagraph(fn, rep=rep_ms, return_mode="median")
    except Exception as exc:  # a peer that syncs inside its call cannot be captured
        print(f"{name}: graph capture failed ({type(exc).__name__}: {str(exc)[:120]}); timing it eagerly",
              file=sys.stderr)
        torch.cuda.synchronize()
        gpu, timing = triton.testing.do_bench(fn, rep=rep_ms, return_mode="median"), "eager"
    eager = triton.testing.do_bench(fn, rep=rep_ms, return_mode="median")
    return dict(gpu_ms=gpu, eager_ms=eager, host_us=host_us(fn, torch.cuda.synchronize), timing=timing)


def _row(name: str, shape: Shape, timed: dict, floor: float, errs: tuple[float, float], err_at: str,
         pipeline: str) -> dict:
    gpu = timed["gpu_ms"]
    return dict(impl=name, set=shape.set, H=shape.H, T=shape.T, N=shape.N, max_len=max(shape.lens), **timed,
                floor_ms=floor, mtok_s=shape.T / gpu / 1e3, pct_floor=100 * floor / gpu, err_o=errs[0],
                err_s=errs[1], err_at=err_at, pipeline=pipeline)


def run_bench(shapes: list[Shape], out_dir: Path, wanted: list[str] | None = None,
              workers: dict[str, Path] | None = None, rep_ms: int = REP_MS,
              pipelines: tuple[str, ...] = ()) -> list[dict]:
    import torch

    from kdagen.bench_worker import Worker
    from kdagen.reference import chunk_kda_prefill_reference, rel_l2
    from kdagen.runtime.dispatch import clear_plans

    workers = workers or {}
    # With workers, this process imports no flash_kda: the workers time the FlashKDA builds.
    avail = {**implementations(include_peers=False), **peer_impls(flashkda=not workers)}
    pool = {}
    for name, d in workers.items():  # started before the names are checked: their import is the check
        w = Worker.start(name, d)
        if w is not None:
            pool[name] = w
            avail[name] = w
    chosen = pick_impls(avail, wanted or [])
    chosen.update({f"kdagen-{p}": pipeline_maker(p) for p in pipelines})
    local = {k: v for k, v in chosen.items() if k not in pool}
    remote = {k: v for k, v in chosen.items() if k in pool}
    impls, check_errs = _validate(local)
    for name, w in remote.items():
        errs = w.check()
        if errs is not None:
            impls[name], check_errs[name] = w, errs
    bw, flops = _ceilings()
    print(f"ceilings: copy {bw / 1e9:.0f} GB/s, bf16 matmul {flops / 1e12:.0f} TFLOP/s", file=sys.stderr)
    chk = ":".join(map(str, CHECK_SHAPE))
    rows = []
    try:
        for i, shape in enumerate(shapes):
            t_shape = time.perf_counter()
            args, ci, co = make_inputs(shape.H, list(shape.lens))
            out = torch.empty_like(args["v"])
            ref = chunk_kda_prefill_reference(**args) if ref_fits(shape.H, shape.lens) else None
            floor = floor_ms(shape, bw, flops)
            # seconds of the reference, of each implementation's first call here (compile, autotune), and all of
            # a worker's request: where a long run's time goes
            setup = {"reference": time.perf_counter() - t_shape}
            shape_rows = []
            for name, make in impls.items():
                t_impl = time.perf_counter()
                if name in pool:
                    timed, got = make.time(shape, rep_ms, dump=ref is not None)
                    setup[name] = time.perf_counter() - t_impl
                    if timed is None:
                        continue
                    errs, at = ((rel_l2(got[0], ref[0]), rel_l2(got[1], ref[1])), "own") if got else \
                        (check_errs[name], chk)
                    shape_rows.append(_row(name, shape, timed, floor, errs, at, ""))
                    continue
                fn = make(args, ci, co, out)  # a peer's input conversion happens here, outside the timing
                out.fill_(float("nan"))
                o, s = fn()  # compile / autotune outside the graph; this call's results are checked
                torch.cuda.synchronize()
                setup[name] = time.perf_counter() - t_impl
                errs, at = ((rel_l2(o, ref[0]), rel_l2(s, ref[1])), "own") if ref is not None else \
                    (check_errs[name], chk)
                del o, s
                timed = time_call(fn, rep_ms, name)
                # The wrapper keeps a plan, workspace included, per (thread, stream) it has run on, and every graph
                # capture runs on a stream of its own: forget them, and this row's plan, before describe() plans
                # again (96/65536/64 with three kdagen rows ran out of an 80 GB GPU's memory without this).
                del fn
                clear_plans()
                shape_rows.append(_row(name, shape, timed, floor, errs, at, pipeline_of(name, args, ci, co)))
            del ref, args, out  # the next shape's inputs and reference need the memory
            torch.cuda.empty_cache()
            add_peer_ratios(shape_rows)
            rows += shape_rows
            # Progress, with this shape's rows, and the CSV so far: a long run that is cut short keeps them.
            spent = ", ".join(f"{k} {v:.1f}" for k, v in setup.items())
            print(f"[{i + 1}/{len(shapes)}] {shape.set} H:T:N {shape.label()} in {time.perf_counter() - t_shape:.1f} s "
                  f"(first call s: {spent})\n"
                  + format_table(shape_rows).split("\n", 1)[1], file=sys.stderr, flush=True)
            out_dir.mkdir(parents=True, exist_ok=True)
            write_csv(rows, out_dir / "bench.csv")
    finally:
        for w in pool.values():
            w.close()
    plot(rows, out_dir / "bench.png")
    return rows


def _configure(p: argparse.ArgumentParser) -> None:
    p.add_argument("--set", action="append", default=[], metavar="NAME", dest="sets",
                   help=f"a shape set, repeatable: {', '.join(SETS)} (default: {' + '.join(DEFAULT_SETS)})")
    p.add_argument("--quick", action="store_true", help="the three quick shapes (same as --set quick)")
    p.add_argument("--shape", action="append", default=[], metavar="H:T:N",
                   help="add a shape (repeatable): H:T:N for N equal sequences, H:L1,L2,... for those lengths")
    p.add_argument("--heads", default="", metavar="H1,H2", help="only the chosen sets' shapes with these head counts")
    p.add_argument("--impl", action="append", default=[], metavar="NAME",
                   help=f"time only this implementation, repeatable: {', '.join(IMPL_NAMES)} (default: all "
                        f"available but {', '.join(DEFAULT_OFF)})")
    p.add_argument("--flashkda", action="append", default=[], metavar="NAME=DIR",
                   help=f"a FlashKDA build to time in its own process: {FLASHKDA}=DIR (upstream) or {FORK}=DIR "
                        "(vLLM's fork), DIR holding its flash_kda package (repeatable)")
    p.add_argument("--pipeline", action="append", default=[], metavar="CHUNK+WALK",
                   help="also time kdagen on this pipeline (plan_kda_prefill(pipeline=...)), e.g. "
                        "triton_pair+triton_walk; repeatable")
    p.add_argument("--rep-ms", type=int, default=REP_MS, help="milliseconds of repeats per timing (default 100)")
    p.add_argument("--out-dir", type=Path, default=Path("bench-results"), help="where the CSV and PNG go")


def _run(args: argparse.Namespace) -> int:
    import torch

    shapes = pick_shapes(args.shape, args.sets + (["quick"] if args.quick else []), args.heads)
    workers = parse_workers(args.flashkda)
    pick_impls(dict.fromkeys(IMPL_NAMES.values()), args.impl)  # names checked before looking for a GPU
    if not torch.cuda.is_available():
        print("kdagen bench needs a GPU", file=sys.stderr)
        return 2
    rows = run_bench(shapes, args.out_dir, args.impl, workers, args.rep_ms, tuple(args.pipeline))
    print(format_table(rows))
    print(summary(rows))
    print(f"CSV and plot: {args.out_dir}/bench.csv, {args.out_dir}/bench.png")
    return 0


add_command("bench", "time chunk_kda_prefill beside FLA and FlashKDA (when importable) on the GPU", _configure, _run)


def _configure_metadata(p: argparse.ArgumentParser) -> None:
    p.add_argument("--chunk-size", type=int, default=64)


def _run_metadata(args: argparse.Namespace) -> int:
    import torch

    if not torch.cuda.is_available():
        print("kdagen bench-metadata needs a GPU", file=sys.stderr)
        return 2
    from kdagen.bench_metadata import bench_metadata
    from kdagen.bench_metadata import format_table as metadata_table
    from kdagen_kernels.triton import chunk_metadata

    print(metadata_table(bench_metadata(chunk_size=args.chunk_size, kernels=chunk_metadata)))
    return 0


add_command("bench-metadata", "time prepare_chunk_metadata_device on the GPU for N = 1 .. 65,536",
            _configure_metadata, _run_metadata)
