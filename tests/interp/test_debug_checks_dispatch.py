# SPDX-License-Identifier: Apache-2.0
"""chunk_kda_prefill runs the data-dependent checks on CPU tensors (interpreter) before writing anything,
and accepts what the contract allows: padding state rows, numpy flags and scales, `out` aliasing an input.
"""

from __future__ import annotations

import os
import re

import numpy as np
import pytest
import torch

import kdagen_kernels
from kdagen.reference import chunk_kda_prefill_reference
from tests.kda_cases import make_inputs, poisoned_out
from tests.tolerances import check

pytestmark = pytest.mark.skipif(os.environ.get("TRITON_INTERPRET") != "1",
                                reason="interpreter numerics: run with TRITON_INTERPRET=1")

E = min((e for e in kdagen_kernels.VARIANTS if e.backend == "triton"),
        key=lambda e: (e.dtype != "bf16", e.head_dim_k * e.head_dim_v))
H, K, V = 2, E.head_dim_k, E.head_dim_v
OUT, STATE = ("triton-interp", "bf16", "output"), ("triton-interp", "bf16", "final_state")


def _args(lens=(20, 0, 1, 9), **kw):
    return make_inputs(list(lens), H, K, V, torch.bfloat16, "cpu", seed=21, **kw)


def _paged(args, rows, flags, slots=6):
    args = dict(args)
    h0 = args.pop("initial_state")
    args.pop("output_final_state")
    cache = torch.randn(slots, H, V, K)
    for n, r in enumerate(rows):
        if r >= 0:
            cache[r] = h0[n]
    return dict(args, state_cache=cache, state_indices=torch.tensor(rows, dtype=torch.int32),
                has_initial_state=torch.tensor(flags))


def _assert_refused(args, needle, out):
    cache = args.get("state_cache")
    before = cache.clone() if cache is not None else None
    with pytest.raises(ValueError, match=re.escape(needle)):
        kdagen_kernels.chunk_kda_prefill(**args, out=out)
    assert bool((out == 5.0).all()), "a refused call wrote into out"
    if cache is not None:
        assert torch.equal(cache, before), "a refused call wrote into state_cache"


def test_cu_seqlens_past_T_is_refused_before_any_write():
    args = _args()
    out = torch.full_like(args["v"], 5.0)
    args["cu_seqlens"] = args["cu_seqlens"].clone()
    args["cu_seqlens"][-1] += 64
    _assert_refused(args, "cu_seqlens[-1] must be T = 30 (the packed token count of q), got 94", out)


def test_duplicate_state_rows_are_refused_before_any_write():
    args = _paged(_args(), rows=[5, 0, 5, 3], flags=[True, False, True, False])
    _assert_refused(args, "state_indices must not repeat a row, got state_indices[0] = state_indices[2] = 5",
                    torch.full_like(args["v"], 5.0))


def test_state_rows_beyond_the_cache_are_refused_before_any_write():
    args = _paged(_args(), rows=[5, 0, 2, 3], flags=[True, False, True, False])
    args["state_indices"] = torch.tensor([5, 0, 6, 3], dtype=torch.int32)
    _assert_refused(args, "state_indices must lie in [0, 6)", torch.full_like(args["v"], 5.0))


def test_chunk_metadata_of_another_batch_is_refused_before_any_write():
    args = _args(lens=(70, 0, 5))
    other = kdagen_kernels.prepare_chunk_indices(torch.tensor([0, 5, 5, 75], dtype=torch.int32), E.chunk_size)
    args["chunk_indices"] = other
    _assert_refused(args, "chunk_indices row 1 must be (0, 1) (sequence, chunk within it) for chunk size 64, "
                          "got (2, 0)", torch.full_like(args["v"], 5.0))


def test_padding_state_rows_are_neither_read_nor_written():
    # Sequence 2 is padding (row -1): it starts from zero whatever its flag says and writes no row.
    args = _paged(_args(), rows=[5, 0, -1, 3], flags=[True, False, True, True])
    cache = args["state_cache"]
    before = cache.clone()
    o, s = kdagen_kernels.chunk_kda_prefill(**args, out=poisoned_out(args["v"]))
    assert s is None
    # The reference knows no padding rows: give sequence 2 a scratch row and a false flag instead.
    ref_args = dict(args, state_cache=cache.new_zeros(7, H, V, K), state_indices=torch.tensor([5, 0, 6, 3]),
                    has_initial_state=torch.tensor([True, False, False, True]))
    ref_args["state_cache"][:6] = before
    ref_o, _ = chunk_kda_prefill_reference(**ref_args)
    check("padded-batch output", o, ref_o, OUT)
    for r in (5, 0, 3):
        check(f"cache row {r}", cache[r], ref_args["state_cache"][r], STATE)
    for r in (1, 2, 4):
        assert torch.equal(cache[r], before[r])


def test_numpy_flags_and_scale_are_accepted():
    args = _args()
    ref_o, ref_s = chunk_kda_prefill_reference(**dict(args, scale=0.1))
    args.update(output_final_state=np.bool_(True), use_qk_l2norm_in_kernel=np.bool_(True))
    o, s = kdagen_kernels.chunk_kda_prefill(**args, scale=np.float32(0.1), use_fused_chunk=np.bool_(False),
                                            out=poisoned_out(args["v"]))
    check("output", o, ref_o, OUT)
    check("state", s, ref_s, STATE)


@pytest.mark.parametrize("alias", ["v", "q", "k"])
def test_out_may_alias_an_input(alias):
    # The prologue reads q, k, v, raw_g and raw_beta and finishes before the recurrence writes out, so
    # an in-place call is correct; only the states the recurrence reads must be disjoint from out.
    args = _args()
    ref_o, ref_s = chunk_kda_prefill_reference(**args)
    args = {n: (t.clone() if isinstance(t, torch.Tensor) else t) for n, t in args.items()}
    o, s = kdagen_kernels.chunk_kda_prefill(**args, out=args[alias])
    assert o.data_ptr() == args[alias].data_ptr()
    check("in-place output", o, ref_o, OUT)
    check("state", s, ref_s, STATE)
