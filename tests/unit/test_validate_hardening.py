# SPDX-License-Identifier: Apache-2.0
"""Argument validation of chunk_kda_prefill beyond shapes and dtypes: flags, scale, strides the kernels
assume, arguments that would be ignored silently, the checkpoint tensors, `out` aliasing a state, and
mixed devices. All of these fire before any kernel runs (no GPU or interpreter needed), and a rejected
call writes nothing.
"""

from __future__ import annotations

import math
import re

import numpy as np
import pytest
import torch

import kdagen_kernels
from kdagen.runtime import fused_choice, validate
from tests.kda_cases import make_inputs

H, N = 2, 2


def _variant():
    return kdagen_kernels.VARIANTS[0]


def _args(**kw):
    e = _variant()
    return make_inputs([9, 3], H, e.head_dim_k, e.head_dim_v, torch.bfloat16, "cpu", **kw)


def _dims():
    e = _variant()
    return e.head_dim_k, e.head_dim_v


def _cache(slots=4):
    K, V = _dims()
    return torch.randn(slots, H, V, K)


def _paged(args, slots=4):
    """args with the dense state replaced by a state cache."""
    args = dict(args)
    args.pop("initial_state", None)
    args["output_final_state"] = False
    return dict(args, state_cache=_cache(slots), state_indices=torch.tensor([0, 1], dtype=torch.int32),
                has_initial_state=torch.tensor([True, False]))


def _raises(exc, needle, **kw):
    return pytest.raises(exc, match=re.escape(needle))


# ---- flags, scale, lower_bound -------------------------------------------------------------------

@pytest.mark.parametrize("name,value,needle", [
    ("output_final_state", "yes", "output_final_state must be a bool, got str 'yes'"),
    ("output_final_state", 1, "output_final_state must be a bool, got int 1"),
    ("use_qk_l2norm_in_kernel", None, "use_qk_l2norm_in_kernel must be a bool, got NoneType None"),
    ("use_fused_chunk", torch.tensor(True), "use_fused_chunk must be a bool, got a torch.bool tensor of shape ()"),
])
def test_non_bool_flags_are_refused(name, value, needle):
    args = _args()
    args[name] = value
    with _raises(TypeError, needle):
        kdagen_kernels.chunk_kda_prefill(**args)


def test_numpy_bools_count_as_bools():
    validate.check_flags(np.bool_(True), np.bool_(False), False)


@pytest.mark.parametrize("value,exc,needle", [
    (float("nan"), ValueError, "scale must be None or a finite float, got nan"),
    (float("inf"), ValueError, "scale must be None or a finite float, got inf"),
    (-math.inf, ValueError, "scale must be None or a finite float, got -inf"),
    (True, TypeError, "scale must be None or a finite float, got bool True"),
    (torch.tensor(0.1), TypeError, "scale must be None or a finite float, got a torch.float32 tensor"),
    ("0.1", TypeError, "scale must be None or a finite float, got str '0.1'"),
])
def test_bad_scale(value, exc, needle):
    with _raises(exc, needle):
        kdagen_kernels.chunk_kda_prefill(**_args(), scale=value)


@pytest.mark.parametrize("value,exc,needle", [
    (float("nan"), ValueError, "lower_bound must be None or a finite negative float (the gate lies in "
                               "(lower_bound, 0)), got nan"),
    (-math.inf, ValueError, "lower_bound must be None or a finite negative float"),
    (0.0, ValueError, "lower_bound must be None or a finite negative float"),
    (True, TypeError, "lower_bound must be None or a finite negative float (the gate lies in (lower_bound, 0)), "
                      "got bool True"),
    ("-5", TypeError, "lower_bound must be None or a finite negative float"),
])
def test_bad_lower_bound(value, exc, needle):
    with _raises(exc, needle):
        kdagen_kernels.chunk_kda_prefill(**dict(_args(), lower_bound=value))


# ---- strides the kernels assume ------------------------------------------------------------------

def test_transposed_initial_state_is_refused():
    # A K-first [N, H, K, V] state viewed as [N, H, V, K] has the right shape when K == V, and the walk
    # (which reads v * K + k) would silently use the wrong layout.
    args = _args()
    h0 = args["initial_state"]
    args["initial_state"] = h0.transpose(2, 3).contiguous().transpose(2, 3)
    K, V = _dims()
    with _raises(ValueError, f"initial_state must be dense in its [V, K] dims (strides ({K}, 1)), got strides "
                             f"({H * V * K}, {V * K}, 1, {V})"):
        kdagen_kernels.chunk_kda_prefill(**args)


def test_initial_state_rows_and_heads_may_be_strided():
    K, V = _dims()
    big = torch.randn(N, H + 1, V, K)
    validate.check_inputs(*[_args()[n] for n in ("q", "k", "v", "raw_g", "raw_beta", "A_log", "g_bias")],
                          0.1, -5.0, _args()["cu_seqlens"], None, None, big[:, 1:], None)


def test_non_contiguous_cu_seqlens_is_refused():
    args = _args()
    args["cu_seqlens"] = torch.tensor([0, 0, 9, 0, 12, 0], dtype=torch.int32)[::2]
    with _raises(ValueError, "cu_seqlens must be contiguous (stride 1; the kernels read it as ptr + i), got "
                             "stride 2. Pass cu_seqlens.contiguous()"):
        kdagen_kernels.chunk_kda_prefill(**args)


@pytest.mark.parametrize("name", ["state_indices", "has_initial_state"])
def test_non_contiguous_paged_state_metadata_is_refused(name):
    args = _paged(_args())
    args[name] = torch.stack([args[name], args[name]], 1)[:, 0]
    with _raises(ValueError, f"{name} must be contiguous (stride 1; the kernels read it as ptr + i), got stride 2"):
        kdagen_kernels.chunk_kda_prefill(**args)


# ---- arguments that would be ignored -------------------------------------------------------------

@pytest.mark.parametrize("given", [["state_indices"], ["has_initial_state"], ["state_indices", "has_initial_state"]])
def test_paged_metadata_without_a_state_cache_is_refused(given):
    paged = _paged(_args())
    extra = {n: paged[n] for n in given}
    what = " and ".join(given)
    with _raises(ValueError, f"{what} must be given only together with state_cache, got {what} without state_cache"):
        kdagen_kernels.chunk_kda_prefill(**_args(), **extra)


def test_checkpoint_state_indices_without_offsets_is_refused():
    with _raises(ValueError, "checkpoint_state_indices must be given only together with checkpoint_offsets and "
                             "checkpoint_state, got it without checkpoint_offsets"):
        kdagen_kernels.chunk_kda_prefill(**_args(), checkpoint_state_indices=torch.tensor([0, 1], dtype=torch.int32))


# ---- checkpoint tensors (checked when the fused path would take them) ----------------------------

@pytest.fixture
def fused(monkeypatch):
    """Pretend the tensors sit on an sm_90 GPU, so the registered fused variant serves this call and the
    checkpoint arguments reach their checks (every case here is refused before anything is built)."""
    monkeypatch.setattr(fused_choice, "fused_target", lambda device: "sm_90")


def _ck_state(rows=N, dtype=torch.float32):
    K, V = _dims()
    return torch.full((rows, H, V, K), float("nan"), dtype=dtype)


def _ck(**kw):
    d = dict(checkpoint_state=_ck_state(), checkpoint_offsets=torch.zeros(N, dtype=torch.int32))
    d.update(kw)
    return d


def _bad_checkpoints():
    K, V = _dims()
    i32 = torch.int32
    return [
        (_ck(checkpoint_offsets=torch.zeros(N)), TypeError,
         "checkpoint_offsets must be one of torch.int32, torch.int64, got a torch.float32 tensor of shape (2,)"),
        (_ck(checkpoint_offsets=torch.zeros(N + 1, dtype=i32)), ValueError,
         "checkpoint_offsets must be of shape [2] (one token offset per sequence, 0 for none)"),
        (_ck(checkpoint_offsets=torch.zeros(N, 2, dtype=i32)[:, 0]), ValueError,
         "checkpoint_offsets must be contiguous (stride 1"),
        (_ck(checkpoint_state=None), ValueError,
         "checkpoint_state must be given with checkpoint_offsets (the snapshots' destination), got None"),
        (_ck(checkpoint_state=_ck_state(dtype=torch.bfloat16)), TypeError,
         "checkpoint_state must be one of torch.float32, got a torch.bfloat16 tensor"),
        (_ck(checkpoint_state=_ck_state()[..., :K // 2]), ValueError,
         f"checkpoint_state must be [rows, {H}, {V}, {K}] ([rows, H, V, K] V-first fp32)"),
        (_ck(checkpoint_state=_ck_state().transpose(2, 3).contiguous().transpose(2, 3)), ValueError,
         "checkpoint_state must be dense within each row ([H, V, K] contiguous; the row stride may be padded)"),
        (_ck(checkpoint_state=_ck_state(rows=1)), ValueError,
         "checkpoint_state must be at least 2 rows (row n is sequence n's snapshot without checkpoint_state_indices)"),
        (_ck(checkpoint_state=_ck_state(rows=1), checkpoint_state_indices=torch.tensor([0, 1])[None]), ValueError,
         "checkpoint_state_indices must be 1-D"),
        (_ck(checkpoint_state_indices=torch.tensor([0.0, 1.0])), TypeError,
         "checkpoint_state_indices must be one of torch.int32, torch.int64"),
        (_ck(checkpoint_state_indices=torch.tensor([0], dtype=i32)), ValueError,
         "checkpoint_state_indices must be of shape [2] (one destination row per sequence)"),
        (_ck(checkpoint_offsets=torch.zeros(N, dtype=i32, device="meta")), ValueError,
         "checkpoint_offsets must be on cpu like q, got a torch.int32 tensor of shape (2,) on meta"),
        (_ck(checkpoint_state=_ck_state().to("meta")), ValueError, "checkpoint_state must be on cpu like q"),
    ]


@pytest.mark.parametrize("ck,exc,needle", _bad_checkpoints(), ids=lambda x: None)
def test_bad_checkpoint_arguments(fused, ck, exc, needle):
    with _raises(exc, needle):
        kdagen_kernels.chunk_kda_prefill(**_args(), use_fused_chunk=True, **ck)


def test_checkpoint_rows_may_be_padded_and_routed():
    K, V = _dims()
    prob = validate.Problem(B=1, T=12, H=H, K=K, V=V, N=N)
    padded = torch.zeros(5, H * V * K + 7)[:, :H * V * K].view(5, H, V, K)
    validate.check_checkpoint(prob, torch.device("cpu"), padded, torch.zeros(N, dtype=torch.int64),
                              torch.tensor([4, -1], dtype=torch.int32))
    # fewer rows than sequences is fine once indices route them
    validate.check_checkpoint(prob, torch.device("cpu"), padded[:1], torch.zeros(N, dtype=torch.int64),
                              torch.tensor([0, -1], dtype=torch.int32))


# ---- aliasing ------------------------------------------------------------------------------------

def _shared(args, fp32_elems):
    """One fp32 buffer big enough for a state of fp32_elems and for out; returns (buffer, out view)."""
    v = args["v"]
    buf = torch.zeros(max(fp32_elems, v.numel()), dtype=torch.float32)
    out = buf.view(torch.bfloat16)[:v.numel()].view(v.shape)
    return buf, out


def test_out_overlapping_initial_state_is_refused():
    args = _args()
    h0 = args["initial_state"]
    buf, out = _shared(args, h0.numel())
    buf[:h0.numel()] = h0.flatten()
    args["initial_state"] = buf[:h0.numel()].view(h0.shape)
    with _raises(ValueError, "out must be memory disjoint from initial_state (the walk reads it while writing out)"):
        kdagen_kernels.chunk_kda_prefill(**args, out=out)


def test_out_overlapping_the_state_cache_is_refused():
    args = _paged(_args())
    cache = args["state_cache"]
    buf, out = _shared(args, cache.numel())
    args["state_cache"] = buf[:cache.numel()].view(cache.shape)
    with _raises(ValueError, "out must be memory disjoint from state_cache (the walk reads and writes it while "
                             "writing out)"):
        kdagen_kernels.chunk_kda_prefill(**args, out=out)


def test_out_overlapping_checkpoint_state_is_refused(fused):
    args = _args()
    ck = _ck_state()
    buf, out = _shared(args, ck.numel())
    with _raises(ValueError, "out must be memory disjoint from checkpoint_state"):
        kdagen_kernels.chunk_kda_prefill(**args, out=out, use_fused_chunk=True,
                                         **_ck(checkpoint_state=buf[:ck.numel()].view(ck.shape)))


def test_disjoint_views_of_one_buffer_do_not_overlap():
    buf = torch.zeros(100)
    assert not validate.may_overlap(buf[:50], buf[50:])
    assert validate.may_overlap(buf[:51], buf[50:])
    assert validate.may_overlap(buf[::2], buf[1::2])  # conservative for interleaved views
    assert not validate.may_overlap(buf[:0], buf)


# ---- mixed devices -------------------------------------------------------------------------------

@pytest.mark.parametrize("name", ["raw_beta", "A_log", "g_bias", "cu_seqlens", "initial_state"])
def test_mixed_devices_name_the_argument(name):
    args = _args()
    args[name] = args[name].to("meta")
    with _raises(ValueError, f"{name} must be on cpu like q, got"):
        kdagen_kernels.chunk_kda_prefill(**args)


@pytest.mark.parametrize("name", ["state_cache", "state_indices", "has_initial_state"])
def test_mixed_devices_of_the_paged_state(name):
    args = _paged(_args())
    args[name] = args[name].to("meta")
    with _raises(ValueError, f"{name} must be on cpu like q, got"):
        kdagen_kernels.chunk_kda_prefill(**args)


def test_out_on_another_device():
    args = _args()
    with _raises(ValueError, "out must be on cpu like q"):
        kdagen_kernels.chunk_kda_prefill(**args, out=torch.empty_like(args["v"], device="meta"))


# ---- a rejected call writes nothing --------------------------------------------------------------

def _rejections():
    return [
        ("non-bool flag", lambda a: a.update(use_qk_l2norm_in_kernel="yes"), TypeError),
        ("nan scale", lambda a: a.update(scale=float("nan")), ValueError),
        ("strided cu_seqlens", lambda a: a.update(cu_seqlens=torch.stack([a["cu_seqlens"]] * 2, 1)[:, 0]), ValueError),
        ("strided state_indices", lambda a: a.update(state_indices=torch.stack([a["state_indices"]] * 2, 1)[:, 0]),
         ValueError),
        ("bad checkpoint_offsets dtype", lambda a: a.update(checkpoint_offsets=torch.zeros(N)), TypeError),
        ("short checkpoint_state_indices",
         lambda a: a.update(checkpoint_state_indices=torch.zeros(1, dtype=torch.int32)), ValueError),
    ]


@pytest.mark.parametrize("what,mutate,exc", _rejections(), ids=[r[0] for r in _rejections()])
def test_a_rejected_call_leaves_out_cache_and_checkpoints_untouched(fused, what, mutate, exc):
    args = _paged(_args())
    args.update(use_fused_chunk=True, **_ck())
    out = torch.full_like(args["v"], 7.0)
    cache_before = args["state_cache"].clone()
    ck = args["checkpoint_state"]
    ck.fill_(3.0)
    mutate(args)
    with pytest.raises(exc):
        kdagen_kernels.chunk_kda_prefill(**args, out=out)
    assert torch.equal(args["state_cache"], cache_before)
    assert bool((out == 7.0).all()) and bool((ck == 3.0).all())
