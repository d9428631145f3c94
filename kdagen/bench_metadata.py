# SPDX-License-Identifier: Apache-2.0
"""Benchmark of `prepare_chunk_metadata_device` on the GPU (the lead wires it into the CLI).

Each row: N sequences of random lengths in [0, 4 * chunk_size] (a fifth of them empty), timed with
`triton.testing.do_bench` (median, microseconds; events around each call, so host launch cost shows
when it exceeds the GPU time), the GPU time alone (median of CUDA-graph replays of the two launches),
and the host wall time per call (perf_counter over a loop).
Every row is checked against the host-built metadata once before timing.
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from types import ModuleType

import torch

from kdagen.runtime.metadata import (
    prepare_chunk_indices,
    prepare_chunk_metadata_device,
    prepare_chunk_offsets,
)

__all__ = ["bench_metadata", "format_table"]


def _random_cu(n: int, chunk_size: int, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    lens = torch.randint(0, 4 * chunk_size + 1, (n,), generator=g)
    lens[torch.rand(n, generator=g) < 0.2] = 0
    return torch.cat([torch.zeros(1, dtype=torch.int64), lens.cumsum(0)]).to(torch.int32)


def bench_metadata(
    ns: Iterable[int] = (1, 16, 256, 4096, 65536),
    chunk_size: int = 64,
    *,
    kernels: ModuleType,
    device: str | torch.device = "cuda",
    host_iters: int = 200,
) -> list[dict]:
    """Time prepare_chunk_metadata_device for each N; returns one dict per N."""
    import triton.testing

    device = torch.device(device)
    if device.type != "cuda" or not torch.cuda.is_available():
        raise RuntimeError(f"bench_metadata needs a GPU (torch.cuda.is_available() is False or device={device}).")
    rows = []
    for n in ns:
        cu_cpu = _random_cu(int(n), chunk_size, seed=int(n))
        cu = cu_cpu.to(device)

        def run() -> tuple[torch.Tensor, torch.Tensor]:
            return prepare_chunk_metadata_device(
                cu, cu_cpu, chunk_size, kernels=kernels, chunk_sizes=(chunk_size,)
            )

        ci, co = run()
        ok = torch.equal(ci.cpu(), prepare_chunk_indices(cu_cpu, chunk_size)) and torch.equal(
            co.cpu(), prepare_chunk_offsets(cu_cpu, chunk_size)
        )
        if not ok:
            raise AssertionError(f"bench_metadata: device metadata differs from the host build at N={n}")
        median_ms = triton.testing.do_bench(run, warmup=25, rep=100, return_mode="median")
        # GPU time alone: a CUDA graph holds only the two kernel launches (the host work is not replayed).
        try:
            gpu_ms = triton.testing.do_bench_cudagraph(run, rep=100, return_mode="median")
        except Exception:  # pragma: no cover - capture unsupported on this device/driver
            gpu_ms = float("nan")
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for _ in range(host_iters):
            run()
        host_us = (time.perf_counter() - t0) / host_iters * 1e6
        torch.cuda.synchronize()
        rows.append(
            {
                "n": int(n),
                "num_chunks": int(ci.shape[0]),
                "chunk_size": chunk_size,
                "median_us": median_ms * 1e3,
                "gpu_us": gpu_ms * 1e3,
                "host_us": host_us,
                "device": torch.cuda.get_device_name(device),
            }
        )
    return rows


def format_table(rows: list[dict]) -> str:
    """Fixed-width text table of bench_metadata rows."""
    header = ("N", "chunks", "chunk", "GPU us (graph)", "eager us", "host us/call")
    body = [
        (
            str(r["n"]),
            str(r["num_chunks"]),
            str(r["chunk_size"]),
            f"{r['gpu_us']:.1f}",
            f"{r['median_us']:.1f}",
            f"{r['host_us']:.1f}",
        )
        for r in rows
    ]
    widths = [max(len(h), *(len(b[i]) for b in body)) if body else len(h) for i, h in enumerate(header)]
    lines = ["  ".join(h.rjust(w) for h, w in zip(header, widths))]
    lines.append("  ".join("-" * w for w in widths))
    lines += ["  ".join(c.rjust(w) for c, w in zip(b, widths)) for b in body]
    title = f"prepare_chunk_metadata_device ({rows[0]['device']})\n" if rows else ""
    return title + "\n".join(lines)

