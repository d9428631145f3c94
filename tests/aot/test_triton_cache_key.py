# SPDX-License-Identifier: Apache-2.0
"""Triton's own cache key of a generated wrapper follows its body in kdagen/triton_kernels/: an edit there
recompiles every variant. Needs the compiler's JITFunction (tests/aot runs without TRITON_INTERPRET)."""

from __future__ import annotations

import triton

import kdagen_kernels
from kdagen.triton_kernels import walk

TRITON = [e for e in kdagen_kernels.VARIANTS if e.backend == "triton"]


def test_the_triton_cache_key_follows_the_body(monkeypatch):
    mod = TRITON[0].load()
    wrapper = mod.kda_group_scan
    monkeypatch.setattr(wrapper, "hash", None)
    key = wrapper.cache_key

    def group_scan(group_op, group_in, h0, state_indices, has_initial_state, cu_seqlens, sh0_n, sh0_h,
                   H, n_slots, n_seq, G, BLOCK_V, STATE_IN, FP32_DOT, SPLIT, K, V, BK, BV, BT):
        pass

    monkeypatch.setattr(walk, "group_scan", triton.jit(group_scan))
    monkeypatch.setattr(wrapper, "hash", None)
    assert wrapper.cache_key != key
    monkeypatch.undo()
    monkeypatch.setattr(wrapper, "hash", None)
    assert wrapper.cache_key == key
