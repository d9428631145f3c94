# SPDX-License-Identifier: Apache-2.0
"""Data-dependent argument checks (kdagen.runtime.debug_checks) on CPU tensors, and their gating:
always on CPU tensors, on device tensors only with KDAGEN_DEBUG=1.

The dispatcher-level wiring (a bad value is refused by chunk_kda_prefill and nothing is written) is
in tests/interp/test_debug_checks_dispatch.py, since on CPU tensors the call needs the interpreter.
"""

from __future__ import annotations

import re

import pytest
import torch

from kdagen.runtime import debug_checks
from kdagen.runtime.device import debug_enabled
from kdagen.runtime.metadata import prepare_chunk_indices, prepare_chunk_offsets
from kdagen.runtime.validate import Problem

CPU = torch.device("cpu")
C = 64


def _p(lens, H=2, K=64, V=64, T=None):
    return Problem(B=1, T=sum(lens) if T is None else T, H=H, K=K, V=V, N=len(lens))


def _cu(lens, dtype=torch.int32):
    cu = [0]
    for n in lens:
        cu.append(cu[-1] + n)
    return torch.tensor(cu, dtype=dtype)


def _raises(needle):
    return pytest.raises(ValueError, match=re.escape(needle))


def _check(lens, T=None, **kw):
    debug_checks.check_data(_p(lens, T=T), C, CPU, **kw)


# ---- cu_seqlens ----------------------------------------------------------------------------------

def test_valid_ragged_batch_passes():
    lens = [100, 0, 1, 64, 129]
    cu = _cu(lens)
    _check(lens, cu_seqlens=cu, chunk_indices=prepare_chunk_indices(cu, C), chunk_offsets=prepare_chunk_offsets(cu, C))
    _check(lens, cu_seqlens=cu.long(), chunk_indices=prepare_chunk_indices(cu.long(), C))
    _check([], T=0, cu_seqlens=torch.zeros(1, dtype=torch.int32))


def test_cu_seqlens_must_start_at_zero():
    with _raises("cu_seqlens[0] must be 0 (cumulative sequence lengths start at 0), got 3. Prepend a 0 or "
                 "subtract cu_seqlens[0]"):
        _check([5], T=8, cu_seqlens=torch.tensor([3, 8], dtype=torch.int32))


def test_cu_seqlens_must_not_decrease():
    with _raises("cu_seqlens must be non-decreasing, got cu_seqlens[1] = 10 > cu_seqlens[2] = 7"):
        _check([10, -3, 5], T=12, cu_seqlens=torch.tensor([0, 10, 7, 12], dtype=torch.int32))


def test_cu_seqlens_must_end_at_T_not_beyond():
    with _raises("cu_seqlens[-1] must be T = 20 (the packed token count of q), got 25. The kernels would read "
                 "and write tokens outside q and out"):
        _check([10, 15], T=20, cu_seqlens=_cu([10, 15]))


def test_cu_seqlens_must_end_at_T_not_before():
    with _raises("cu_seqlens[-1] must be T = 30 (the packed token count of q), got 25. Tokens 25..29 belong to "
                 "no sequence and their output would never be written"):
        _check([10, 15], T=30, cu_seqlens=_cu([10, 15]))


# ---- chunk_indices / chunk_offsets ---------------------------------------------------------------

def test_chunk_offsets_for_another_chunk_size_are_refused():
    lens = [100, 1]
    cu = _cu(lens)
    with _raises("chunk_offsets must be the exclusive prefix sum of ceil(len_n / 64) over cu_seqlens, [0, 2, 3], "
                 "got [0, 4, 5] (first difference at index 1: expected 2, got 4). Build both with "
                 "prepare_chunk_metadata_device(cu_seqlens, cu_seqlens_cpu, 64)"):
        _check(lens, cu_seqlens=cu, chunk_offsets=prepare_chunk_offsets(cu, 32))


def test_chunk_offsets_of_another_batch_are_refused():
    cu = _cu([10, 70])
    with _raises("first difference at index 2: expected 3, got 2"):
        _check([10, 70], cu_seqlens=cu, chunk_offsets=prepare_chunk_offsets(_cu([10, 10]), C))


def test_chunk_indices_row_count():
    lens = [100, 1]
    cu = _cu(lens)
    with _raises("chunk_indices must have 3 rows (one per 64-token chunk of the sequences in cu_seqlens), got 5 rows"):
        _check(lens, cu_seqlens=cu, chunk_indices=prepare_chunk_indices(cu, 32))


def test_chunk_indices_rows_must_match():
    lens = [100, 1, 70]
    cu = _cu(lens)
    ci = prepare_chunk_indices(cu, C)
    ci[[2, 3]] = ci[[3, 2]].clone()
    with _raises("chunk_indices row 2 must be (1, 0) (sequence, chunk within it) for chunk size 64, got (2, 0)"):
        _check(lens, cu_seqlens=cu, chunk_indices=ci)


def test_metadata_is_not_checked_against_a_bad_cu_seqlens_first():
    # cu_seqlens is checked before the metadata built from it.
    with _raises("cu_seqlens[-1] must be T"):
        _check([5], T=4, cu_seqlens=_cu([5]), chunk_offsets=torch.tensor([0, 2]))


# ---- state_indices -------------------------------------------------------------------------------

def _state(lens, rows, slots=6):
    return dict(cu_seqlens=_cu(lens), state_cache=torch.empty(slots, 1, 1, 1),
                state_indices=torch.tensor(rows, dtype=torch.int32))


def test_state_indices_in_range_and_padding_pass():
    _check([3, 4, 5, 0], **_state([3, 4, 5, 0], [5, -1, 0, -1]))


def test_state_indices_beyond_the_cache_are_refused():
    with _raises("state_indices must lie in [0, 6) (the rows of state_cache; negative = padding, skipped), got "
                 "state_indices[1] = 6. The kernel would silently neither read nor write that sequence's state"):
        _check([3, 4], **_state([3, 4], [0, 6]))


def test_duplicate_state_indices_are_refused():
    with _raises("state_indices must not repeat a row, got state_indices[0] = state_indices[2] = 4 (two sequences "
                 "would write their final states to one cache row)"):
        _check([3, 4, 1], **_state([3, 4, 1], [4, 2, 4]))


def test_duplicate_state_indices_of_empty_sequences_are_refused_too():
    # An empty sequence still writes its (passed-through) initial state to its row.
    with _raises("state_indices[0] = state_indices[1] = 2"):
        _check([0, 0], **_state([0, 0], [2, 2]))


# ---- checkpoints ---------------------------------------------------------------------------------

def _ckpt(lens, offsets, rows=None, n_rows=4):
    d = dict(cu_seqlens=_cu(lens), checkpoint_state=torch.empty(n_rows, 1, 1, 1),
             checkpoint_offsets=torch.tensor(offsets, dtype=torch.int32))
    if rows is not None:
        d["checkpoint_state_indices"] = torch.tensor(rows, dtype=torch.int32)
    return d


def test_aligned_checkpoints_pass():
    _check([200, 65, 64, 0], **_ckpt([200, 65, 64, 0], [192, 64, 0, 0]))
    _check([200, 65], **_ckpt([200, 65], [128, 64], rows=[3, -1]))


@pytest.mark.parametrize("offset,length", [(65, 200), (63, 200), (200, 200), (256, 200), (-64, 200), (64, 64)])
def test_checkpoints_off_a_chunk_boundary_inside_the_sequence_are_refused(offset, length):
    with _raises(f"checkpoint_offsets[1] must be 0 (no checkpoint) or a positive multiple of 64 below the "
                 f"sequence's length {length}, got {offset}. The kernel snapshots only at chunk boundaries"):
        _check([100, length], **_ckpt([100, length], [0, offset]))


def test_checkpoint_rows_beyond_checkpoint_state_are_refused():
    with _raises("checkpoint_state_indices must lie in [0, 4) (the rows of checkpoint_state; negative = none) where "
                 "checkpoint_offsets is non-zero, got checkpoint_state_indices[1] = 4"):
        _check([100, 100], **_ckpt([100, 100], [64, 64], rows=[0, 4]))


def test_duplicate_checkpoint_rows_are_refused():
    with _raises("checkpoint_state_indices must not repeat a row, got checkpoint_state_indices[0] = "
                 "checkpoint_state_indices[2] = 1 (two sequences would write their snapshots to one row)"):
        _check([100, 100, 100], **_ckpt([100, 100, 100], [64, 64, 64], rows=[1, 2, 1]))


def test_rows_of_sequences_without_a_checkpoint_are_not_checked():
    # vLLM points "no checkpoint" sequences at the null block (row 0), repeatedly.
    _check([100, 100, 100], **_ckpt([100, 100, 100], [0, 64, 0], rows=[0, 1, 0]))
    _check([100, 100], **_ckpt([100, 100], [0, 0], rows=[9, 9]))


def test_batched_problem_without_cu_seqlens_uses_T_per_sequence():
    p = Problem(B=3, T=100, H=1, K=64, V=64, N=3)
    debug_checks.check_data(p, C, CPU, checkpoint_state=torch.empty(3, 1, 1, 1),
                            checkpoint_offsets=torch.tensor([64, 0, 0]))
    with _raises("below the sequence's length 100, got 128"):
        debug_checks.check_data(p, C, CPU, checkpoint_state=torch.empty(3, 1, 1, 1),
                                checkpoint_offsets=torch.tensor([128, 0, 0]))


# ---- gating --------------------------------------------------------------------------------------

def test_debug_flag_is_read_from_the_environment(monkeypatch):
    monkeypatch.delenv("KDAGEN_DEBUG", raising=False)
    assert not debug_enabled()
    monkeypatch.setenv("KDAGEN_DEBUG", "0")
    assert not debug_enabled()
    monkeypatch.setenv("KDAGEN_DEBUG", "1")
    assert debug_enabled()


def test_device_tensors_are_checked_only_with_kdagen_debug(monkeypatch):
    bad = dict(cu_seqlens=torch.tensor([0, 10, 7], dtype=torch.int32))
    gpu = torch.device("cuda", 0)  # only the decision uses the device; the tensors stay on the CPU here
    monkeypatch.delenv("KDAGEN_DEBUG", raising=False)
    debug_checks.check_data(_p([10, 0], T=7), C, gpu, **bad)  # no sync, no check
    monkeypatch.setenv("KDAGEN_DEBUG", "1")
    with _raises("cu_seqlens must be non-decreasing"):
        debug_checks.check_data(_p([10, 0], T=7), C, gpu, **bad)


def test_device_tensors_are_not_read_without_kdagen_debug(monkeypatch):
    # meta tensors have no values: reading one would raise, so passing proves nothing is read.
    monkeypatch.delenv("KDAGEN_DEBUG", raising=False)
    meta = torch.device("meta")
    debug_checks.check_data(_p([3]), C, meta, cu_seqlens=torch.empty(2, dtype=torch.int32, device=meta),
                            state_cache=torch.empty(2, 1, 1, 1, device=meta),
                            state_indices=torch.empty(1, dtype=torch.int32, device=meta))
