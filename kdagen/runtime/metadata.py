# SPDX-License-Identifier: Apache-2.0
"""Chunk metadata for packed varlen batches (docs/semantics.md, "The chunk metadata helpers").

- `prepare_chunk_metadata_device`: chunk_indices / chunk_offsets built on the device by the
  generated Triton module (passed in as `kernels`); only the allocation size comes from the host
  copy of cu_seqlens, so there is no host<->device transfer and no sync (CUDA-graph friendly).
- `prepare_chunk_indices` / `prepare_chunk_offsets`: host-built equivalents for callers without a
  CPU copy (they copy cu_seqlens to the host: a sync).
- `build_conv1d_chunk_schedule`: the causal-conv1d program schedule, built on the host.

This module must not import kdagen_kernels, kdagen.spec or kdagen.render.
"""

from __future__ import annotations

from collections.abc import Collection
from types import ModuleType

import torch

from .device import TRITON_COMPILE_OPTIONS

try:  # numpy makes the one O(N) host pass several times cheaper; torch ops are the fallback.
    import numpy as _np
except ImportError:  # pragma: no cover - numpy ships with every torch install we support
    _np = None

__all__ = [
    "build_conv1d_chunk_schedule",
    "prepare_chunk_indices",
    "prepare_chunk_metadata_device",
    "prepare_chunk_offsets",
]

_INT_DTYPES = (torch.int32, torch.int64)

# Launch shape of the metadata kernels (see templates/triton/chunk_metadata.py.j2).
_MAX_BLOCK_N = 128  # sequences per program
_MIN_BLOCK_N = 16
_MAX_BLOCK_B = 1024  # block sums summed per step when a program computes its base
_BLOCK_J = 16  # chunks per sequence per 2-D tile step
_CAP = 128  # chunks per sequence written by 2-D tiles; the rest, sequence by sequence
_BLOCK_C = 1024  # chunks per 1-D tile step of a long sequence
_NUM_WARPS = 4


def _next_pow2(x: int) -> int:
    return 1 << max(0, int(x) - 1).bit_length()


def _describe(x: object) -> str:
    if isinstance(x, torch.Tensor):
        return f"a {x.dtype} tensor of shape {tuple(x.shape)} on {x.device}"
    return f"{type(x).__name__} {x!r}"


def _check_index_tensor(fn: str, name: str, t: object, fix: str) -> torch.Tensor:
    """A 1-D int32/int64 tensor with at least one entry."""
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{fn}: {name} must be a torch.Tensor (1-D int32/int64); got {_describe(t)}. {fix}")
    if t.dtype not in _INT_DTYPES:
        raise TypeError(
            f"{fn}: {name} must have dtype torch.int32 or torch.int64; got {t.dtype}. "
            f"Pass cumulative sequence lengths as integers, e.g. {name}.to(torch.int32)."
        )
    if t.dim() != 1 or t.numel() < 1:
        raise ValueError(
            f"{fn}: {name} must be 1-D with N+1 >= 1 entries (cumulative sequence lengths); "
            f"got shape {tuple(t.shape)}. {fix}"
        )
    return t


def _host_lengths(fn: str, name: str, cu_cpu: torch.Tensor) -> torch.Tensor:
    """Sequence lengths (int64, CPU) from a validated host copy; checks cu[0] == 0 and monotonicity."""
    first = int(cu_cpu[0])
    if first != 0:
        raise ValueError(
            f"{fn}: {name}[0] must be 0 (cumulative sequence lengths start at 0); got {first}. "
            f"Prepend a 0 or subtract {name}[0]."
        )
    lens = cu_cpu[1:].to(torch.int64) - cu_cpu[:-1].to(torch.int64)
    if lens.numel() and bool((lens < 0).any()):
        n = int(torch.nonzero(lens < 0)[0, 0])
        raise ValueError(
            f"{fn}: {name} must be non-decreasing; got {name}[{n}] = {int(cu_cpu[n])} > "
            f"{name}[{n + 1}] = {int(cu_cpu[n + 1])}. Sequence n owns tokens [cu[n], cu[n+1])."
        )
    return lens


def _host_num_chunks(fn: str, cu_cpu: torch.Tensor, chunk_size: int) -> int:
    """sum(ceil(len_n / chunk_size)) from the host copy, with the cu[0] == 0 and monotonicity checks.

    NOTE: this O(N) pass is the only per-call host work that grows with N; numpy does it several
    times faster than torch's CPU ops on small tensors (about 50 us at N = 65536 on a slow core).
    """
    if _np is None:
        lens = _host_lengths(fn, "cu_seqlens_cpu", cu_cpu)
        return int(((lens + (chunk_size - 1)) // chunk_size).sum())
    c = cu_cpu.numpy()
    d = _np.diff(c)
    if c[0] != 0 or (d.size and d.min() < 0):
        _host_lengths(fn, "cu_seqlens_cpu", cu_cpu)  # raises with the full message
    if chunk_size & (chunk_size - 1) == 0:
        counts = (d + (chunk_size - 1)) >> (chunk_size.bit_length() - 1)
    else:
        counts = (d + (chunk_size - 1)) // chunk_size
    return int(counts.sum(dtype=_np.int64))


def _check_chunk_size(fn: str, chunk_size: object) -> int:
    if isinstance(chunk_size, bool) or not isinstance(chunk_size, int):
        raise TypeError(f"{fn}: chunk_size must be a positive int; got {_describe(chunk_size)}.")
    if chunk_size <= 0:
        raise ValueError(f"{fn}: chunk_size must be a positive int; got {chunk_size}.")
    return chunk_size


def prepare_chunk_metadata_device(
    cu_seqlens: torch.Tensor,
    cu_seqlens_cpu: torch.Tensor,
    chunk_size: int,
    *,
    kernels: ModuleType,
    chunk_sizes: Collection[int],
) -> tuple[torch.Tensor, torch.Tensor]:
    """Build (chunk_indices [num_chunks, 2], chunk_offsets [N+1] int64) on cu_seqlens' device.

    `cu_seqlens_cpu` is the host copy of `cu_seqlens` (same values); only it is read on the host, to
    size chunk_indices. `kernels` is the generated module `kdagen_kernels.triton.chunk_metadata`;
    `chunk_sizes` are the chunk sizes the specs declare. chunk_indices has cu_seqlens' dtype.
    """
    fn = "prepare_chunk_metadata_device"
    _check_index_tensor(fn, "cu_seqlens", cu_seqlens, "Pass the device cu_seqlens (query_start_loc).")
    _check_index_tensor(
        fn, "cu_seqlens_cpu", cu_seqlens_cpu, "Pass the host copy of cu_seqlens (e.g. query_start_loc_cpu)."
    )
    if cu_seqlens_cpu.device.type != "cpu":
        raise ValueError(
            f"{fn}: cu_seqlens_cpu must be on the CPU (it sizes the outputs without a device sync); "
            f"got a tensor on {cu_seqlens_cpu.device}. Pass the host copy the scheduler already has "
            f"(e.g. query_start_loc_cpu), not cu_seqlens itself."
        )
    if cu_seqlens.numel() != cu_seqlens_cpu.numel():
        raise ValueError(
            f"{fn}: cu_seqlens and cu_seqlens_cpu must hold the same N+1 values; got "
            f"{cu_seqlens.numel()} and {cu_seqlens_cpu.numel()} entries. Pass the host copy of this "
            f"same cu_seqlens."
        )
    chunk_size = _check_chunk_size(fn, chunk_size)
    if chunk_size not in chunk_sizes:
        declared = sorted({int(c) for c in chunk_sizes})
        raise ValueError(
            f"{fn}: chunk_size={chunk_size} is not declared by any spec (declared: {declared}). "
            f"Add a variant with chunk_size: {chunk_size} to a spec under specs/, then run `nox -s generate`."
        )
    num_seqs = cu_seqlens_cpu.numel() - 1
    num_chunks = _host_num_chunks(fn, cu_seqlens_cpu, chunk_size)
    device = cu_seqlens.device
    chunk_indices = torch.empty(num_chunks, 2, dtype=cu_seqlens.dtype, device=device)
    if num_seqs == 0:
        return chunk_indices, torch.zeros(1, dtype=torch.int64, device=device)

    block_n = min(_MAX_BLOCK_N, max(_MIN_BLOCK_N, _next_pow2(num_seqs)))
    num_blocks = -(-num_seqs // block_n)
    block_b = min(_MAX_BLOCK_B, max(16, _next_pow2(num_blocks)))
    # One allocation: chunk_offsets is a view of the first N+1 entries (contiguous, offset 0), the
    # per-block chunk counts the two kernels pass to each other follow it.
    buf = torch.empty(num_seqs + 1 + num_blocks, dtype=torch.int64, device=device)
    chunk_offsets = buf[: num_seqs + 1]
    block_sums = buf[num_seqs + 1 :]
    # An empty chunk_indices may have no storage; it is never written, any valid pointer will do.
    indices_arg = chunk_indices if num_chunks > 0 else torch.empty(1, 2, dtype=cu_seqlens.dtype, device=device)
    stride = cu_seqlens.stride(0)
    kernels.chunk_block_sums_kernel[(num_blocks,)](
        cu_seqlens, stride, block_sums, num_seqs, BT=chunk_size, BLOCK_N=block_n, num_warps=_NUM_WARPS,
        **TRITON_COMPILE_OPTIONS,
    )
    kernels.chunk_metadata_fill_kernel[(num_blocks,)](
        cu_seqlens,
        stride,
        block_sums,
        indices_arg,
        chunk_offsets,
        num_seqs,
        num_chunks,
        BT=chunk_size,
        BLOCK_N=block_n,
        BLOCK_B=block_b,
        BLOCK_J=_BLOCK_J,
        CAP=_CAP,
        BLOCK_C=_BLOCK_C,
        num_warps=_NUM_WARPS,
        **TRITON_COMPILE_OPTIONS,
    )
    return chunk_indices, chunk_offsets


def _host_copy(fn: str, cu_seqlens: object) -> torch.Tensor:
    t = _check_index_tensor(fn, "cu_seqlens", cu_seqlens, "Pass cumulative sequence lengths [N+1].")
    return t.detach().to("cpu")


def _host_counts(fn: str, cu_seqlens: torch.Tensor, chunk_size: object) -> torch.Tensor:
    chunk_size = _check_chunk_size(fn, chunk_size)
    lens = _host_lengths(fn, "cu_seqlens", _host_copy(fn, cu_seqlens))
    return (lens + (chunk_size - 1)) // chunk_size


def prepare_chunk_offsets(cu_seqlens: torch.Tensor, chunk_size: int) -> torch.Tensor:
    """[N+1] int64 exclusive prefix sum of ceil(len_n / chunk_size), on cu_seqlens' device (host-built)."""
    counts = _host_counts("prepare_chunk_offsets", cu_seqlens, chunk_size)
    offsets = torch.zeros(counts.numel() + 1, dtype=torch.int64)
    torch.cumsum(counts, 0, out=offsets[1:])
    return offsets.to(cu_seqlens.device)


def prepare_chunk_indices(cu_seqlens: torch.Tensor, chunk_size: int) -> torch.Tensor:
    """[num_chunks, 2] rows (sequence n, chunk i within n), dtype of cu_seqlens, on its device (host-built)."""
    counts = _host_counts("prepare_chunk_indices", cu_seqlens, chunk_size)
    total = int(counts.sum())
    seq = torch.repeat_interleave(torch.arange(counts.numel(), dtype=torch.int64), counts)
    starts = torch.cumsum(counts, 0) - counts
    within = torch.arange(total, dtype=torch.int64) - torch.repeat_interleave(starts, counts)
    return torch.stack([seq, within], dim=1).to(dtype=cu_seqlens.dtype, device=cu_seqlens.device)


def _to_device(t: torch.Tensor, device: torch.device) -> torch.Tensor:
    """Host -> device copy that does not block on the device (pinned staging, async copy)."""
    if device.type == "cpu":
        return t
    if device.type == "cuda" and torch.cuda.is_available():
        # The pinned block is held by the caching host allocator until the copy has run.
        return t.pin_memory().to(device, non_blocking=True)
    return t.to(device)


def build_conv1d_chunk_schedule(
    query_start_loc_cpu: torch.Tensor, block_m: int, device: torch.device | str
) -> dict[str, int | torch.Tensor]:
    """Causal-conv1d program schedule, built on the host with no device sync.

    nums[n] = ceil(len_n / block_m); tot = sum(nums); program i handles block
    token_chunk_offset_ptr[i] of sequence batch_ptr[i] (both int32, on `device`).
    """
    fn = "build_conv1d_chunk_schedule"
    t = _check_index_tensor(
        fn, "query_start_loc_cpu", query_start_loc_cpu, "Pass the host copy of query_start_loc [N+1]."
    )
    if t.device.type != "cpu":
        raise ValueError(
            f"{fn}: query_start_loc_cpu must be on the CPU (the schedule is built on the host with no "
            f"device sync); got a tensor on {t.device}. Pass the scheduler's query_start_loc_cpu."
        )
    if isinstance(block_m, bool) or not isinstance(block_m, int):
        raise TypeError(f"{fn}: block_m must be a positive int; got {_describe(block_m)}.")
    if block_m <= 0:
        raise ValueError(f"{fn}: block_m must be a positive int; got {block_m}.")
    device = torch.device(device)
    lens = _host_lengths(fn, "query_start_loc_cpu", t)
    nums = (lens + (block_m - 1)) // block_m
    tot = int(nums.sum())
    batch_ptr = torch.repeat_interleave(torch.arange(nums.numel(), dtype=torch.int32), nums)
    starts = torch.repeat_interleave(torch.cumsum(nums, 0) - nums, nums)
    token_chunk_offset_ptr = (torch.arange(tot, dtype=torch.int64) - starts).to(torch.int32)
    return {
        "tot": tot,
        "batch_ptr": _to_device(batch_ptr, device),
        "token_chunk_offset_ptr": _to_device(token_chunk_offset_ptr, device),
    }
