# SPDX-License-Identifier: Apache-2.0
"""`python -m kdagen bench`: time chunk_kda_prefill's Triton path, its fused path (when a hip variant serves
the device) and FLA's chunk_kda (when importable) on the GPU.

GPU time is the median of CUDA-graph replays (triton.testing.do_bench_cudagraph); eager time is the
median of plain calls, Python included (do_bench, which flushes the L2 cache before each call, so its
difference to the GPU time mixes host time with cold-cache effects); host time is the median host-side
cost of one call on an idle device (validation, metadata, allocations, launches: what an eager caller
pays before the GPU work is queued). The floor is max(bytes / copy bandwidth, FLOPs / bf16 matmul rate),
both measured in the same run. Writes a table to stdout, a CSV and a PNG plot.
Every implementation is checked against the float64 reference on a small shape before timing.
"""

from __future__ import annotations

import argparse
import csv
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

from kdagen.cli import add_command

# performance.md: (H, T, N) with N equal sequences packed into T tokens.
SHAPES = [(h, t, n) for h in (12, 32, 96) for (t, n) in ((4096, 1), (16384, 1), (65536, 1), (16384, 16), (65536, 64))]
QUICK = [(12, 4096, 1), (12, 16384, 16), (96, 16384, 16)]
BYTES_PER_TOKEN_HEAD = 1282  # read q, k, v, raw_g, raw_beta; write o (bf16, K = V = 128)
STATE_BYTES_PER_SEQ_HEAD = 2 * 128 * 128 * 4  # fp32 state in and out
FLOPS_PER_TOKEN_HEAD = 181_589  # 6d^2 + 10Cd + C^2/3 at C = 64, d = 128
IMPL_NAMES = {"triton": "kdagen-triton", "fused": "kdagen-fused", "fla": "fla-safe-gate"}


def pick_shapes(explicit: list[str], quick: bool, heads: str) -> list[tuple[int, int, int]]:
    """--shape H:T:N entries as given, else the performance.md (or quick) shapes, kept to --heads if set."""
    def parse(text: str, what: str) -> tuple[int, ...]:
        try:
            return tuple(int(x) for x in text.split(":" if what == "--shape" else ","))
        except ValueError:
            raise SystemExit(f"kdagen bench: {what} {text!r}: expected integers "
                             f"({'H:T:N' if what == '--shape' else 'H1,H2'})") from None

    shapes = [parse(s, "--shape") for s in explicit]
    if any(len(s) != 3 or min(s) < 1 or s[2] > s[1] for s in shapes):
        raise SystemExit(f"kdagen bench: --shape wants H:T:N with 1 <= N <= T, got {explicit}")
    if not shapes:
        shapes = list(QUICK if quick else SHAPES)
        if heads:
            wanted = set(parse(heads, "--heads"))
            shapes = [s for s in shapes if s[0] in wanted]
            if not shapes:
                raise SystemExit(f"kdagen bench: no {'quick ' if quick else ''}shape has H in {sorted(wanted)}; "
                                 f"the heads there are {sorted({s[0] for s in (QUICK if quick else SHAPES)})}, "
                                 "or give --shape H:T:N")
    return shapes


def pick_impls(available: dict, wanted: list[str]) -> dict:
    """The implementations named by --impl (short or full names), all available ones if none is named."""
    if not wanted:
        return available
    out = {}
    for w in wanted:
        name = IMPL_NAMES.get(w, w)
        if name not in IMPL_NAMES.values():
            raise SystemExit(f"kdagen bench: --impl {w!r}: choose from {', '.join(IMPL_NAMES)}")
        if name not in available:
            raise SystemExit(f"kdagen bench: {name} is not available here (see the message above)")
        out[name] = available[name]
    return out


def equal_lens(T: int, N: int) -> list[int]:
    """performance.md's batches: N equal sequences (the last takes the remainder) packed into T tokens."""
    return [T // N] * (N - 1) + [T - (T // N) * (N - 1)]


def _inputs(H: int, T: int, N: int, seed: int = 0):
    return make_inputs(H, equal_lens(T, N), seed=seed)


def make_inputs(H: int, lens: list[int], K: int = 128, V: int = 128, dtype: str = "bf16", chunk_size: int = 64,
                seed: int = 0, device: str = "cuda"):
    """Random chunk_kda_prefill arguments (safe gate, L2 norm, bias, initial state) and the chunk
    metadata for sequences of the given lengths."""
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


def _impls():
    import torch

    import kdagen_kernels

    impls = {}

    def ours(args, ci, co, out):
        return lambda: kdagen_kernels.chunk_kda_prefill(**args, chunk_indices=ci, chunk_offsets=co, out=out)

    impls["kdagen-triton"] = ours
    if kdagen_kernels.can_use_fused_kda_chunk(128, 128, torch.bfloat16, 64):
        def fused(args, ci, co, out):
            return lambda: kdagen_kernels.chunk_kda_prefill(**args, chunk_indices=ci, chunk_offsets=co, out=out,
                                                            use_fused_chunk=True)

        impls["kdagen-fused"] = fused
    else:
        print("no fused (hip) variant for K=V=128 bf16 on this device; timing the Triton path only",
              file=sys.stderr)
    try:
        from fla.ops.kda import chunk_kda

        def fla(args, ci, co, out):
            cu = args["cu_seqlens"].long()
            cu_cpu = cu.cpu()
            return lambda: chunk_kda(
                q=args["q"], k=args["k"], v=args["v"], g=args["raw_g"], beta=args["raw_beta"],
                initial_state=args["initial_state"], output_final_state=True, use_qk_l2norm_in_kernel=True,
                use_gate_in_kernel=True, use_beta_sigmoid_in_kernel=True, safe_gate=True, lower_bound=-5.0,
                state_v_first=True, cu_seqlens=cu, cu_seqlens_cpu=cu_cpu, A_log=args["A_log"],
                dt_bias=args["g_bias"])

        impls["fla-safe-gate"] = fla
    except Exception as exc:  # fla-core is optional
        print(f"fla-core not importable ({type(exc).__name__}); timing kdagen only", file=sys.stderr)
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


def _validate(impls) -> None:
    import torch

    from kdagen.reference import chunk_kda_prefill_reference, rel_l2

    args, ci, co = _inputs(4, 1000, 3, seed=1)
    ref_o, ref_s = chunk_kda_prefill_reference(**args)
    for name, make in impls.items():
        # An explicit out: with out=None the fused path writes into v (the seed's contract), which the
        # next implementation reads.
        o, s = make(args, ci, co, torch.empty_like(args["v"]))()
        eo, es = rel_l2(o, ref_o), rel_l2(s, ref_s)
        print(f"check {name}: rel L2 output {eo:.2e}, final state {es:.2e}", file=sys.stderr)
        if not (eo < 1e-2 and es < 1e-2):
            raise SystemExit(f"{name} disagrees with the float64 reference; not timing it")


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


def run_bench(shapes, out_dir: Path, wanted: list[str] | None = None) -> list[dict]:
    import torch
    import triton

    impls = pick_impls(_impls(), wanted or [])
    _validate(impls)
    bw, flops = _ceilings()
    print(f"ceilings: copy {bw / 1e9:.0f} GB/s, bf16 matmul {flops / 1e12:.0f} TFLOP/s", file=sys.stderr)
    rows = []
    for i, (H, T, N) in enumerate(shapes):
        args, ci, co = _inputs(H, T, N)
        out = torch.empty_like(args["v"])
        floor_ms = 1e3 * max((BYTES_PER_TOKEN_HEAD * T * H + STATE_BYTES_PER_SEQ_HEAD * N * H) / bw,
                             FLOPS_PER_TOKEN_HEAD * T * H / flops)
        base = None
        for name, make in impls.items():
            fn = make(args, ci, co, out)
            fn()  # compile / autotune outside the graph
            torch.cuda.synchronize()
            try:
                gpu = triton.testing.do_bench_cudagraph(fn, rep=100, return_mode="median")
            except Exception as exc:  # a peer that syncs inside its call cannot be captured
                print(f"{name}: graph capture failed ({exc}); timing it eagerly", file=sys.stderr)
                torch.cuda.synchronize()
                gpu = triton.testing.do_bench(fn, rep=100, return_mode="median")
            eager = triton.testing.do_bench(fn, rep=100, return_mode="median")
            host = host_us(fn, torch.cuda.synchronize)
            if name.startswith("fla"):
                base = gpu
            rows.append(dict(impl=name, H=H, T=T, N=N, gpu_ms=gpu, eager_ms=eager, host_us=host, floor_ms=floor_ms,
                             mtok_s=T / gpu / 1e3, pct_floor=100 * floor_ms / gpu))
        for r in rows[-len(impls):]:
            r["speedup_vs_fla"] = (base / r["gpu_ms"]) if base else float("nan")
        # Progress, with this shape's rows, and the CSV so far: a long run that is cut short keeps them.
        print(f"[{i + 1}/{len(shapes)}] H={H} T={T} N={N}\n" + format_table(rows[-len(impls):]).split("\n", 1)[1],
              file=sys.stderr, flush=True)
        out_dir.mkdir(parents=True, exist_ok=True)
        _write_csv(rows, out_dir / "bench.csv")
    _plot(rows, out_dir / "bench.png")
    return rows


def format_table(rows: list[dict]) -> str:
    head = f"{'impl':14s} {'H':>3s} {'T':>6s} {'N':>3s} {'gpu ms':>8s} {'eager ms':>9s} {'host us':>8s} " \
           f"{'floor ms':>8s} {'Mtok/s':>7s} {'%floor':>6s} {'vs FLA':>6s}"
    lines = [head]
    for r in rows:
        lines.append(f"{r['impl']:14s} {r['H']:3d} {r['T']:6d} {r['N']:3d} {r['gpu_ms']:8.3f} {r['eager_ms']:9.3f} "
                     f"{r['host_us']:8.1f} {r['floor_ms']:8.3f} {r['mtok_s']:7.1f} {r['pct_floor']:6.1f} "
                     f"{r['speedup_vs_fla']:6.2f}")
    return "\n".join(lines)


def _write_csv(rows, path: Path) -> None:
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)


def _plot(rows, path: Path) -> None:
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


def _configure(p: argparse.ArgumentParser) -> None:
    p.add_argument("--quick", action="store_true", help="three shapes instead of the fifteen of performance.md")
    p.add_argument("--shape", action="append", default=[], metavar="H:T:N", help="add a shape (repeatable)")
    p.add_argument("--heads", default="", metavar="H1,H2",
                   help="only the performance.md (or --quick) shapes with these head counts")
    p.add_argument("--impl", action="append", default=[], metavar="NAME",
                   help=f"time only this implementation, repeatable: {', '.join(IMPL_NAMES)} (default: all available)")
    p.add_argument("--out-dir", type=Path, default=Path("bench-results"), help="where the CSV and PNG go")


def _run(args: argparse.Namespace) -> int:
    import torch

    shapes = pick_shapes(args.shape, args.quick, args.heads)
    pick_impls(dict.fromkeys(IMPL_NAMES.values()), args.impl)  # names checked before looking for a GPU
    if not torch.cuda.is_available():
        print("kdagen bench needs a GPU", file=sys.stderr)
        return 2
    rows = run_bench(shapes, args.out_dir, args.impl)
    print(format_table(rows))
    print(f"CSV and plot: {args.out_dir}/bench.csv, {args.out_dir}/bench.png")
    return 0


add_command("bench", "time chunk_kda_prefill (and FLA when importable) on the GPU", _configure, _run)


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
