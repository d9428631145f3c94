# SPDX-License-Identifier: Apache-2.0
"""Data-dependent checks for chunk_kda_prefill: they read the values of the index arguments.

- cu_seqlens starts at 0, never decreases and ends at T (the packed token count);
- caller-built chunk_indices / chunk_offsets match cu_seqlens for the variant's chunk size;
- state_indices lie below the cache's slot count (negative = padding, skipped) and no two sequences
  share a row (their final states would race for it);
- checkpoint_offsets are 0 or positive multiples of the chunk size below the sequence length, and
  the checkpoint rows in use are in range and distinct.

Reading values means a device -> host copy, i.e. a sync. So the checks run when the tensors are on
the CPU already (the interpreter: free), and on a GPU only with KDAGEN_DEBUG=1 (device.debug_enabled).
They run before anything is written. Every failure is a ValueError naming the argument, what was
expected and what came. Shapes and dtypes are validate.py's job and are assumed checked.
"""

from __future__ import annotations

import torch

from .device import debug_enabled
from .validate import OP, Problem

__all__ = ["check_batch", "check_checkpoint_rows", "check_data", "check_state_indices", "should_check"]


def should_check(device: torch.device) -> bool:
    return device.type == "cpu" or debug_enabled()


def _fail(msg: str, fix: str = "") -> None:
    raise ValueError(f"{OP}: {msg}" + (f". {fix}" if fix else ""))


def _host(t: torch.Tensor) -> torch.Tensor:
    return t.detach().to("cpu", torch.int64)


def _short(xs: list[int], n: int = 8) -> str:
    return str(xs) if len(xs) <= n else str(xs[:n])[:-1] + f", ... ({len(xs)} entries)]"


def check_cu_seqlens(cu: torch.Tensor, T: int) -> torch.Tensor:
    """Host cu_seqlens (int64) -> sequence lengths; raises unless it runs monotonically from 0 to T."""
    if int(cu[0]) != 0:
        _fail(f"cu_seqlens[0] must be 0 (cumulative sequence lengths start at 0), got {int(cu[0])}",
              "Prepend a 0 or subtract cu_seqlens[0]")
    lens = cu[1:] - cu[:-1]
    if lens.numel() and bool((lens < 0).any()):
        n = int(torch.nonzero(lens < 0)[0, 0])
        _fail(f"cu_seqlens must be non-decreasing, got cu_seqlens[{n}] = {int(cu[n])} > "
              f"cu_seqlens[{n + 1}] = {int(cu[n + 1])}", "Sequence n owns tokens [cu[n], cu[n+1])")
    if int(cu[-1]) != T:
        _fail(f"cu_seqlens[-1] must be T = {T} (the packed token count of q), got {int(cu[-1])}",
              "The kernels would read and write tokens outside q and out" if int(cu[-1]) > T else
              f"Tokens {int(cu[-1])}..{T - 1} belong to no sequence and their output would never be written")
    return lens


def check_chunk_metadata(lens: torch.Tensor, chunk: int, chunk_indices: torch.Tensor | None,
                         chunk_offsets: torch.Tensor | None) -> None:
    counts = (lens + (chunk - 1)) // chunk
    fix = (f"Build both with prepare_chunk_metadata_device(cu_seqlens, cu_seqlens_cpu, {chunk}) from the same "
           "cu_seqlens, or pass neither")
    if chunk_offsets is not None:
        co = _host(chunk_offsets)
        want = torch.zeros(counts.numel() + 1, dtype=torch.int64)
        torch.cumsum(counts, 0, out=want[1:])
        if not torch.equal(co, want):
            i = int(torch.nonzero(co != want)[0, 0])
            _fail(f"chunk_offsets must be the exclusive prefix sum of ceil(len_n / {chunk}) over cu_seqlens, "
                  f"{_short(want.tolist())}, got {_short(co.tolist())} (first difference at index {i}: "
                  f"expected {int(want[i])}, got {int(co[i])})", fix)
    if chunk_indices is not None:
        total = int(counts.sum())
        ci = _host(chunk_indices)
        if ci.shape[0] != total:
            _fail(f"chunk_indices must have {total} rows (one per {chunk}-token chunk of the sequences in "
                  f"cu_seqlens), got {ci.shape[0]} rows", fix)
        seq = torch.repeat_interleave(torch.arange(counts.numel(), dtype=torch.int64), counts)
        first = torch.repeat_interleave(torch.cumsum(counts, 0) - counts, counts)
        want = torch.stack([seq, torch.arange(total, dtype=torch.int64) - first], 1)
        if not torch.equal(ci, want):
            r = int(torch.nonzero((ci != want).any(1))[0, 0])
            _fail(f"chunk_indices row {r} must be {tuple(want[r].tolist())} (sequence, chunk within it) for "
                  f"chunk size {chunk}, got {tuple(ci[r].tolist())}", fix)


def _distinct(arg: str, rows: torch.Tensor, active: torch.Tensor, what: str) -> None:
    """No two active entries of rows (host int64 [N]) hold the same value."""
    idx = torch.nonzero(active).flatten()
    if idx.numel() < 2:
        return
    vals, order = torch.sort(rows[idx], stable=True)
    same = torch.nonzero(vals[1:] == vals[:-1]).flatten()
    if same.numel():
        j = int(same[0])
        a, b = int(idx[order[j]]), int(idx[order[j + 1]])
        _fail(f"{arg} must not repeat a row, got {arg}[{a}] = {arg}[{b}] = {int(vals[j])} ({what})",
              "Give every sequence its own row (negative = padding, skipped)")


def check_state_indices(state_indices: torch.Tensor, slots: int) -> None:
    si = _host(state_indices)
    bad = torch.nonzero(si >= slots).flatten()
    if bad.numel():
        n = int(bad[0])
        _fail(f"state_indices must lie in [0, {slots}) (the rows of state_cache; negative = padding, skipped), "
              f"got state_indices[{n}] = {int(si[n])}",
              "The kernel would silently neither read nor write that sequence's state")
    _distinct("state_indices", si, si >= 0, "two sequences would write their final states to one cache row")


def check_checkpoint_offsets(lens: torch.Tensor, chunk: int, checkpoint_offsets: torch.Tensor) -> None:
    off = _host(checkpoint_offsets)
    ok = (off == 0) | ((off > 0) & (off % chunk == 0) & (off < lens))
    if not bool(ok.all()):
        n = int(torch.nonzero(~ok)[0, 0])
        _fail(f"checkpoint_offsets[{n}] must be 0 (no checkpoint) or a positive multiple of {chunk} below the "
              f"sequence's length {int(lens[n])}, got {int(off[n])}",
              "The kernel snapshots only at chunk boundaries inside the sequence and would store nothing; "
              "filter offsets when building the metadata")


def check_checkpoint_rows(checkpoint_offsets: torch.Tensor, checkpoint_state_indices: torch.Tensor | None,
                          rows: int) -> None:
    if checkpoint_state_indices is None:
        return  # row n for sequence n: in range (validate.check_checkpoint) and distinct
    off = _host(checkpoint_offsets)
    ri = _host(checkpoint_state_indices)
    active = (off > 0) & (ri >= 0)
    bad = torch.nonzero(active & (ri >= rows)).flatten()
    if bad.numel():
        n = int(bad[0])
        _fail(f"checkpoint_state_indices must lie in [0, {rows}) (the rows of checkpoint_state; negative = "
              f"none) where checkpoint_offsets is non-zero, got checkpoint_state_indices[{n}] = {int(ri[n])}")
    _distinct("checkpoint_state_indices", ri, active, "two sequences would write their snapshots to one row")


def check_checkpoints(lens: torch.Tensor, chunk: int, checkpoint_offsets: torch.Tensor,
                      checkpoint_state_indices: torch.Tensor | None, rows: int) -> None:
    check_checkpoint_offsets(lens, chunk, checkpoint_offsets)
    check_checkpoint_rows(checkpoint_offsets, checkpoint_state_indices, rows)


def check_batch(p: Problem, chunk_size: int, device: torch.device, *, cu_seqlens=None, cu_seqlens_cpu=None,
                chunk_indices=None, chunk_offsets=None, checkpoint_offsets=None) -> None:
    """The plan-level checks: everything that depends on the batch alone. On a GPU without KDAGEN_DEBUG=1
    only cu_seqlens_cpu (a host copy, free to read) is checked."""
    full = should_check(device)
    if cu_seqlens is not None:
        if not full and cu_seqlens_cpu is None:
            return
        lens = check_cu_seqlens(_host(cu_seqlens_cpu if cu_seqlens_cpu is not None else cu_seqlens), p.B * p.T)
        if not full:
            return
        if chunk_indices is not None or chunk_offsets is not None:
            check_chunk_metadata(lens, chunk_size, chunk_indices, chunk_offsets)
    else:
        if not full:
            return
        lens = torch.full((p.B,), p.T, dtype=torch.int64)
    if checkpoint_offsets is not None:
        check_checkpoint_offsets(lens, chunk_size, checkpoint_offsets)


def check_data(p: Problem, chunk_size: int, device: torch.device, *, cu_seqlens=None, chunk_indices=None,
               chunk_offsets=None, state_cache=None, state_indices=None, checkpoint_state=None,
               checkpoint_offsets=None, checkpoint_state_indices=None) -> None:
    """All the checks above that apply to this call; a no-op on a GPU unless KDAGEN_DEBUG=1."""
    if not should_check(device):
        return
    if cu_seqlens is not None:
        lens = check_cu_seqlens(_host(cu_seqlens), p.B * p.T)
        if chunk_indices is not None or chunk_offsets is not None:
            check_chunk_metadata(lens, chunk_size, chunk_indices, chunk_offsets)
    else:
        lens = torch.full((p.B,), p.T, dtype=torch.int64)
    if state_cache is not None and state_indices is not None:
        check_state_indices(state_indices, state_cache.shape[0])
    if checkpoint_offsets is not None and checkpoint_state is not None:
        check_checkpoints(lens, chunk_size, checkpoint_offsets, checkpoint_state_indices, checkpoint_state.shape[0])
