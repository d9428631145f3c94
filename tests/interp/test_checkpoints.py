# SPDX-License-Identifier: Apache-2.0
"""Prefix-cache checkpoints on the Triton path (kda_recurrence, CHECKPOINT), in the interpreter.

For sequence n with checkpoint_offsets[n] a positive multiple of the chunk below its length, the state
after that many tokens goes to checkpoint_state[checkpoint_state_indices[n]] (or row n); a negative row is
skipped. At one group the snapshot is bit-identical to the final state of a prefill of the same
sequences cut at their offsets; the grouped walk writes it from the scanned start state of the group that
holds the boundary chunk. Every checkpoint row starts NaN, so a missing or a stray write shows.
"""

from __future__ import annotations

import contextlib
import functools
import os
import re

import pytest
import torch

import kdagen_kernels
from kdagen.reference import chunk_kda_prefill_reference, rel_l2
from kdagen.runtime import debug_checks
from tests.kda_cases import cu_of, make_inputs, poisoned_out
from tests.tolerances import check, within

O_TOL, S_TOL = ("triton-interp", "bf16", "output"), ("triton-interp", "bf16", "final_state")

pytestmark = pytest.mark.skipif(os.environ.get("TRITON_INTERPRET") != "1",
                                reason="interpreter numerics: run with TRITON_INTERPRET=1")

# K != V: the checkpoint row is [H, V, K], V-first.
E = next(e for e in kdagen_kernels.VARIANTS
         if e.backend == "triton" and (e.dtype, e.head_dim_k, e.head_dim_v) == ("bf16", 128, 256))
C = E.chunk_size
H, K, V = 1, E.head_dim_k, E.head_dim_v
# Ragged: 4 chunks, empty, one token, 2 chunks with a ragged tail, 3 chunks.
LENS = [3 * C + 8, 0, 1, C + 6, 2 * C + 2]
# 192: chunk 2 of 4, at G = 2 and 3 the first of group 1; 64; 128: chunk 1 of 3, the last of group 0 at
# G = 2, group 1 at G = 3. None for the others.
OFFSETS = [3 * C, 0, 0, C, 2 * C]
ROWS = [5, 0, 0, -1, 3]  # offset-0 sequences name row 0 (vLLM's null block): never written; -1: skipped
N_ROWS = 7
SLOTS = [4, 0, 6, 2, 1]  # state_cache rows
FLAGS = [True, False, True, False, True]
# A mild gate (about -0.02 per token): the state after 64 tokens still holds the earlier ones', so a
# snapshot shows whether its group started from the right state.
LOWER_BOUND = -0.03


def _inputs(paged: bool) -> dict:
    args = make_inputs(LENS, H, K, V, torch.bfloat16, "cpu", seed=41, lower_bound=LOWER_BOUND)
    if not paged:
        return args
    h0 = args.pop("initial_state")
    args.pop("output_final_state")
    gen = torch.Generator().manual_seed(42)
    cache = torch.randn(8, H, V, K, generator=gen) * 0.1
    for n, (r, f) in enumerate(zip(SLOTS, FLAGS)):
        cache[r] = h0[n] if f else float("nan")  # a false flag: the row is never read
    return dict(args, state_cache=cache, state_indices=torch.tensor(SLOTS, dtype=torch.int32),
                has_initial_state=torch.tensor(FLAGS))


def _clone(args: dict) -> dict:
    return {n: (t.clone() if isinstance(t, torch.Tensor) else t) for n, t in args.items()}


def _checkpoint_args(indices: bool) -> dict:
    d = {"checkpoint_offsets": torch.tensor(OFFSETS, dtype=torch.int32)}
    if indices:
        d["checkpoint_state_indices"] = torch.tensor(ROWS, dtype=torch.int32)
        d["checkpoint_state"] = torch.full((N_ROWS, H, V, K), float("nan"))
    else:
        d["checkpoint_state"] = torch.full((len(LENS) + 1, H, V, K), float("nan"))  # one row no sequence names
    return d


def _written(indices: bool) -> dict[int, int]:
    """checkpoint row -> the sequence whose snapshot it must hold; every other row stays NaN."""
    return {(ROWS[n] if indices else n): n for n, off in enumerate(OFFSETS)
            if off > 0 and (not indices or ROWS[n] >= 0)}


@contextlib.contextmanager
def _groups(groups: str):
    old = os.environ.get("KDAGEN_TRITON_GROUPS")
    os.environ["KDAGEN_TRITON_GROUPS"] = groups
    try:
        yield
    finally:
        if old is None:
            os.environ.pop("KDAGEN_TRITON_GROUPS")
        else:
            os.environ["KDAGEN_TRITON_GROUPS"] = old


@functools.lru_cache(maxsize=None)
def _cut_states(paged: bool) -> dict[int, torch.Tensor]:
    """Final states of a G = 1 prefill of each checkpointed sequence cut at its offset, from the same initial
    state: sequence -> [H, V, K]."""
    args = _inputs(paged)
    seqs = [n for n, off in enumerate(OFFSETS) if off > 0]
    cu = args["cu_seqlens"].tolist()
    toks = torch.cat([torch.arange(cu[n], cu[n] + OFFSETS[n]) for n in seqs])
    cut = {name: args[name][:, toks] for name in ("q", "k", "v", "raw_g", "raw_beta")}
    if paged:  # the cache row when its flag is set, else zeros, as a dense initial state
        h0 = torch.stack([args["state_cache"][SLOTS[n]] if FLAGS[n] else torch.zeros(H, V, K) for n in seqs])
    else:
        h0 = args["initial_state"][seqs]
    with _groups("1"):
        _, s = kdagen_kernels.chunk_kda_prefill(
                **cut, A_log=args["A_log"], g_bias=args["g_bias"], lower_bound=args["lower_bound"],
            use_qk_l2norm_in_kernel=True, cu_seqlens=cu_of([OFFSETS[n] for n in seqs], "cpu"), initial_state=h0,
            output_final_state=True)
    return dict(zip(seqs, s))


@functools.lru_cache(maxsize=None)
def _plain(paged: bool, groups: str) -> tuple[torch.Tensor, torch.Tensor]:
    """Output and final states (or the cache after the call) of the same call without checkpoints."""
    args = _clone(_inputs(paged))
    with _groups(groups):
        o, s = kdagen_kernels.chunk_kda_prefill(**args)
    return o, (args["state_cache"] if paged else s)


def _run(monkeypatch, paged: bool, indices: bool, groups: str):
    monkeypatch.setenv("KDAGEN_TRITON_GROUPS", groups)
    args = _clone(_inputs(paged))
    ck = _checkpoint_args(indices)
    o, s = kdagen_kernels.chunk_kda_prefill(**args, **ck, out=poisoned_out(args["v"]))
    # The checkpoint export changes nothing else the call writes.
    plain_o, plain_s = _plain(paged, groups)
    assert torch.equal(o, plain_o)
    assert torch.equal(args["state_cache"] if paged else s, plain_s)
    return args, ck["checkpoint_state"]


def _assert_only_written_rows(ckpt: torch.Tensor, written: dict[int, int]) -> None:
    for r in range(ckpt.shape[0]):
        if r in written:
            assert torch.isfinite(ckpt[r]).all(), f"checkpoint row {r} (sequence {written[r]}) not fully written"
        else:
            assert torch.isnan(ckpt[r]).all(), f"checkpoint row {r} written, but no sequence snapshots into it"


@pytest.mark.parametrize("indices", [True, False], ids=["checkpoint_state_indices", "row_n"])
@pytest.mark.parametrize("paged", [False, True], ids=["dense_initial_state", "state_cache"])
def test_one_group_is_bit_identical_to_a_cut_prefill(monkeypatch, paged, indices):
    args, ckpt = _run(monkeypatch, paged, indices, "1")
    written = _written(indices)
    _assert_only_written_rows(ckpt, written)
    cut = _cut_states(paged)
    for r, n in written.items():
        assert torch.equal(ckpt[r], cut[n]), f"row {r}: sequence {n} after {OFFSETS[n]} tokens differs from the " \
            f"cut prefill's final state (max |diff| {(ckpt[r] - cut[n]).abs().max():.3e})"
    if not paged and indices:  # and both agree with the float64 reference's snapshots
        ref_ck = torch.full_like(ckpt, float("nan"), dtype=torch.float64)
        chunk_kda_prefill_reference(**_inputs(False), checkpoint_state=ref_ck,
                                    checkpoint_offsets=torch.tensor(OFFSETS, dtype=torch.int32),
                                    checkpoint_state_indices=torch.tensor(ROWS, dtype=torch.int32))
        for r in written:
            check(f"checkpoint row {r}", ckpt[r], ref_ck[r], S_TOL)


# Grouped snapshots against the one-group cut prefill (tests/tolerances.py); a snapshot from a wrong start
# state or chunk is off by O(1).
GROUPED = ("triton-interp", "bf16", "checkpoint_vs_cut_grouped")


@pytest.mark.parametrize("groups", ["2", "3"])
def test_grouped_walk_snapshots_from_the_scanned_start_state(monkeypatch, groups):
    _, ckpt = _run(monkeypatch, True, True, groups)
    written = _written(True)
    _assert_only_written_rows(ckpt, written)
    cut = _cut_states(True)
    errs = {r: rel_l2(ckpt[r], cut[n]) for r, n in written.items()}
    print(f"\n  G={groups}: rel L2 vs the cut prefill per checkpoint row: "
          + ", ".join(f"row {r} {e:.2e}" for r, e in errs.items()), end="")
    for r, e in errs.items():
        within(f"G={groups} row {r} vs the cut prefill", e, GROUPED)


@pytest.mark.parametrize("offset", [C + 36, 2 * C + 8, 4 * C, -C],
                         ids=["unaligned", "unaligned_past_end", "aligned_past_end", "negative"])
def test_offsets_off_a_boundary_inside_the_sequence_are_refused_on_cpu(offset):
    args = _inputs(True)
    cache = args["state_cache"].clone()
    ck = _checkpoint_args(True)
    ck["checkpoint_offsets"][3] = offset
    out = torch.full_like(args["v"], 5.0)
    with pytest.raises(ValueError, match=re.escape(
            f"checkpoint_offsets[3] must be 0 (no checkpoint) or a positive multiple of {C} below the "
            f"sequence's length {LENS[3]}, got {offset}")):
        kdagen_kernels.chunk_kda_prefill(**args, **ck, out=out)
    assert bool((out == 5.0).all()), "a refused call wrote into out"
    assert torch.equal(args["state_cache"].nan_to_num(7.0), cache.nan_to_num(7.0)), "a refused call wrote the cache"
    assert torch.isnan(ck["checkpoint_state"]).all(), "a refused call wrote a checkpoint"


def test_the_kernel_itself_skips_what_the_host_check_refuses(monkeypatch):
    # GPU tensors skip the host checks unless KDAGEN_DEBUG=1: the kernel must still write nothing for an
    # unaligned, past-the-end or negative offset, or a row past checkpoint_state.
    monkeypatch.setattr(debug_checks, "should_check", lambda device: False)
    args = _inputs(False)
    # Sequence 0 is checkpointed as usual, so the export ran; 1 (T = 0) negative, 2 (T = 1) aligned but not
    # below its length (its one chunk is walked), 3 unaligned, 4 a row past checkpoint_state.
    ck = _checkpoint_args(True)
    ck["checkpoint_offsets"] = torch.tensor([3 * C, -C, C, C + 1, 2 * C], dtype=torch.int32)
    ck["checkpoint_state_indices"] = torch.tensor([5, 0, 2, 1, N_ROWS], dtype=torch.int32)
    with _groups("1"):
        kdagen_kernels.chunk_kda_prefill(**args, **ck)
    _assert_only_written_rows(ck["checkpoint_state"], {5: 0})
    assert torch.equal(ck["checkpoint_state"][5], _cut_states(False)[0])
