# SPDX-License-Identifier: Apache-2.0
"""`python -m kdagen bench`: time chunk_kda_prefill's Triton path, its fused path (when a hip variant serves
the device) and the peers FLA (`chunk_kda`) and FlashKDA (`fwd`), each when importable, in one run on the
same inputs (bench_peers.py converts them to what each peer takes).

GPU time is the median of CUDA-graph replays (triton.testing.do_bench_cudagraph); eager time is the
median of plain calls, Python included (do_bench, which flushes the L2 cache before each call, so its
difference to the GPU time mixes host time with cold-cache effects); host time is the median host-side
cost of one call on an idle device (validation, metadata, allocations, launches: what an eager caller
pays before the GPU work is queued). The floor is max(bytes / copy bandwidth, FLOPs / bf16 matmul rate),
both measured in the same run. Per shape: the best peer (least GPU time of the peers that ran) and every
row's ratio best peer / it. Writes a table to stdout, a CSV and a PNG plot.
Every implementation is checked against the float64 reference on a small shape before timing, and its
output and final state again at each shape the reference can afford (ref_fits).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

from kdagen.bench_peers import FLA, FLASHKDA, PEERS, peer_impls
from kdagen.bench_report import add_peer_ratios, format_table, plot, write_csv
from kdagen.cli import add_command

# performance.md: (H, T, N) with N equal sequences packed into T tokens.
SHAPES = [(h, t, n) for h in (12, 32, 96) for (t, n) in ((4096, 1), (16384, 1), (65536, 1), (16384, 16), (65536, 64))]
QUICK = [(12, 4096, 1), (12, 16384, 16), (96, 16384, 16)]
BYTES_PER_TOKEN_HEAD = 1282  # read q, k, v, raw_g, raw_beta; write o (bf16, K = V = 128)
STATE_BYTES_PER_SEQ_HEAD = 2 * 128 * 128 * 4  # fp32 state in and out
FLOPS_PER_TOKEN_HEAD = 181_589  # 6d^2 + 10Cd + C^2/3 at C = 64, d = 128
IMPL_NAMES = {"triton": "kdagen-triton", "triton-pair": "kdagen-triton-pair", "fused": "kdagen-fused", "fla": FLA,
              "flashkda": FLASHKDA}
CHECK_SHAPE = (4, 1000, 3)  # (H, T, N) every implementation is checked on before any timing
# A peer keeps its own numerics (FlashKDA rounds its state to bf16 between 16-token chunks); a wrong
# input conversion gives errors of order 1, far above this.
PEER_TOL = 5e-2
REF_MAX_TOKEN_HEADS = 2**21  # larger shapes report the check shape's errors (see ref_fits)
REF_MAX_STEPS = 16384


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


def shape_inputs(H: int, T: int, N: int, seed: int = 0):
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


def implementations() -> dict:
    import torch

    import kdagen_kernels

    impls = {}

    def ours(args, ci, co, out):
        return lambda: kdagen_kernels.chunk_kda_prefill(**args, chunk_indices=ci, chunk_offsets=co, out=out)

    impls["kdagen-triton"] = ours

    def ours_pair(args, ci, co, out):
        # The Triton path with the chunk-parallel design forced to the kernel pair (an A/B of the plan's choice).
        cu, q, v = args["cu_seqlens"], args["q"], args["v"]
        plan = kdagen_kernels.plan_kda_prefill(
            cu, cu.cpu(), num_heads=q.shape[2], head_dim_k=q.shape[3], head_dim_v=v.shape[3], dtype=q.dtype,
            lower_bound=args["lower_bound"], has_g_bias=args["g_bias"] is not None,
            use_qk_l2norm_in_kernel=args["use_qk_l2norm_in_kernel"], chunk_indices=ci, chunk_offsets=co,
            output_final_state=args["output_final_state"], design="pair")
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


def ref_fits(H: int, T: int, N: int) -> bool:
    """Whether the float64 reference runs at this shape: it holds about 10 KB per token-head on the GPU
    and walks the longest sequence token by token from Python (about 0.15 ms a step)."""
    return T * H <= REF_MAX_TOKEN_HEADS and max(equal_lens(T, N)) <= REF_MAX_STEPS


def _validate(impls: dict) -> tuple[dict, dict[str, tuple[float, float]]]:
    """Each implementation against the float64 reference at CHECK_SHAPE: ours must agree within 1e-2, a
    peer within PEER_TOL (else it is not timed); returns the kept ones and their errors there."""
    import torch

    from kdagen.reference import chunk_kda_prefill_reference, rel_l2

    args, ci, co = shape_inputs(*CHECK_SHAPE, seed=1)
    ref_o, ref_s = chunk_kda_prefill_reference(**args)
    kept, errors = {}, {}
    for name, make in impls.items():
        # An explicit, poisoned out: with out=None the fused path writes into v (vLLM's op's contract),
        # which the next implementation reads.
        o, s = make(args, ci, co, torch.full_like(args["v"], float("nan")))()
        eo, es = rel_l2(o, ref_o), rel_l2(s, ref_s)
        print(f"check {name}: rel L2 output {eo:.2e}, final state {es:.2e}", file=sys.stderr)
        tol = PEER_TOL if name in PEERS else 1e-2
        if not (eo < tol and es < tol):
            if name not in PEERS:
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


def run_bench(shapes, out_dir: Path, wanted: list[str] | None = None) -> list[dict]:
    import torch
    import triton

    from kdagen.reference import chunk_kda_prefill_reference, rel_l2

    impls, check_errors = _validate(pick_impls(implementations(), wanted or []))
    bw, flops = _ceilings()
    print(f"ceilings: copy {bw / 1e9:.0f} GB/s, bf16 matmul {flops / 1e12:.0f} TFLOP/s", file=sys.stderr)
    rows = []
    for i, (H, T, N) in enumerate(shapes):
        args, ci, co = shape_inputs(H, T, N)
        out = torch.empty_like(args["v"])
        ref = chunk_kda_prefill_reference(**args) if ref_fits(H, T, N) else None
        floor_ms = 1e3 * max((BYTES_PER_TOKEN_HEAD * T * H + STATE_BYTES_PER_SEQ_HEAD * N * H) / bw,
                             FLOPS_PER_TOKEN_HEAD * T * H / flops)
        for name, make in impls.items():
            fn = make(args, ci, co, out)  # a peer's input conversion happens here, outside the timing
            out.fill_(float("nan"))
            o, s = fn()  # compile / autotune outside the graph; this call's results are checked
            torch.cuda.synchronize()
            if ref is not None:
                (eo, es), err_at = (rel_l2(o, ref[0]), rel_l2(s, ref[1])), "own"
            else:
                (eo, es), err_at = check_errors[name], ":".join(map(str, CHECK_SHAPE))
            del o, s
            try:
                gpu = triton.testing.do_bench_cudagraph(fn, rep=100, return_mode="median")
            except Exception as exc:  # a peer that syncs inside its call cannot be captured
                print(f"{name}: graph capture failed ({exc}); timing it eagerly", file=sys.stderr)
                torch.cuda.synchronize()
                gpu = triton.testing.do_bench(fn, rep=100, return_mode="median")
            eager = triton.testing.do_bench(fn, rep=100, return_mode="median")
            host = host_us(fn, torch.cuda.synchronize)
            rows.append(dict(impl=name, H=H, T=T, N=N, gpu_ms=gpu, eager_ms=eager, host_us=host, floor_ms=floor_ms,
                             mtok_s=T / gpu / 1e3, pct_floor=100 * floor_ms / gpu, err_o=eo, err_s=es, err_at=err_at))
        ref = None  # the next shape's reference needs the memory
        add_peer_ratios(rows[-len(impls):])
        # Progress, with this shape's rows, and the CSV so far: a long run that is cut short keeps them.
        print(f"[{i + 1}/{len(shapes)}] H={H} T={T} N={N}\n" + format_table(rows[-len(impls):]).split("\n", 1)[1],
              file=sys.stderr, flush=True)
        out_dir.mkdir(parents=True, exist_ok=True)
        write_csv(rows, out_dir / "bench.csv")
    plot(rows, out_dir / "bench.png")
    return rows


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
