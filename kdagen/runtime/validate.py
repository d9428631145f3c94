# SPDX-License-Identifier: Apache-2.0
"""Cheap argument checks for chunk_kda_prefill: shapes, dtypes, devices, strides. No device syncs.

Every failure is a ValueError or TypeError that names the argument, what was expected, what came
and, where there is one, the fix. They all run before anything is written, so a rejected call leaves
`out`, `state_cache` and `checkpoint_state` untouched.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

OP = "chunk_kda_prefill"
IO_DTYPES = (torch.bfloat16, torch.float16)
FLOAT_DTYPES = (torch.bfloat16, torch.float16, torch.float32)
INDEX_DTYPES = (torch.int32, torch.int64)


def fail(arg: str, expected: str, got: object, fix: str = "", exc: type[Exception] = ValueError) -> None:
    msg = f"{OP}: {arg} must be {expected}, got {got}"
    raise exc(msg + (f". {fix}" if fix else ""))


def _desc(t: torch.Tensor) -> str:
    return f"a {t.dtype} tensor of shape {tuple(t.shape)} on {t.device}"


def tensor(arg: str, t: object, *, dims: int | None = None, dtypes: tuple[torch.dtype, ...] | None = None,
           device: torch.device | None = None) -> torch.Tensor:
    if not isinstance(t, torch.Tensor):
        fail(arg, "a torch.Tensor", type(t).__name__, exc=TypeError)
    assert isinstance(t, torch.Tensor)
    if dims is not None and t.dim() != dims:
        fail(arg, f"{dims}-D", _desc(t))
    if dtypes is not None and t.dtype not in dtypes:
        fail(arg, "one of " + ", ".join(str(d) for d in dtypes), _desc(t), exc=TypeError)
    if device is not None and t.device != device:
        fail(arg, f"on {device} like q", _desc(t), "Move it with .to(q.device)")
    return t


def shape(arg: str, t: torch.Tensor, expected: tuple[int, ...], what: str) -> None:
    if tuple(t.shape) != expected:
        fail(arg, f"of shape {list(expected)} ({what})", _desc(t))


def unit_last_stride(arg: str, t: torch.Tensor) -> None:
    if t.shape[-1] > 1 and t.stride(-1) != 1:
        fail(arg, "dense in its last dim (stride 1)", f"strides {t.stride()}", f"Pass {arg}.contiguous()")


@dataclass(frozen=True)
class Problem:
    B: int
    T: int
    H: int
    K: int
    V: int
    N: int  # sequences


def check_inputs(q, k, v, raw_g, raw_beta, A_log, g_bias, scale, lower_bound, cu_seqlens,
                 chunk_indices, chunk_offsets, initial_state, out) -> Problem:
    q = tensor("q", q, dims=4, dtypes=IO_DTYPES)
    dev = q.device
    B, T, H, K = q.shape
    tensor("k", k, dims=4, dtypes=(q.dtype,), device=dev)
    shape("k", k, (B, T, H, K), "like q")
    tensor("v", v, dims=4, dtypes=(q.dtype,), device=dev)
    if tuple(v.shape[:3]) != (B, T, H):
        fail("v", f"of shape [{B}, {T}, {H}, V] (q's batch, tokens and heads)", _desc(v))
    V = v.shape[3]
    tensor("raw_g", raw_g, dims=4, dtypes=FLOAT_DTYPES, device=dev)
    shape("raw_g", raw_g, (B, T, H, K), "the gate projection, one value per key channel")
    tensor("raw_beta", raw_beta, dims=3, dtypes=FLOAT_DTYPES, device=dev)
    shape("raw_beta", raw_beta, (B, T, H), "one beta logit per token and head")
    for name, t in (("q", q), ("k", k), ("v", v), ("raw_g", raw_g)):
        unit_last_stride(name, t)
    tensor("A_log", A_log, dtypes=FLOAT_DTYPES, device=dev)
    if A_log.numel() != H:
        fail("A_log", f"{H} values (one per head)", _desc(A_log))
    if g_bias is not None:
        tensor("g_bias", g_bias, dtypes=FLOAT_DTYPES, device=dev)
        if g_bias.numel() != H * K:
            fail("g_bias", f"{H * K} values (H * K, viewed [H, K])", _desc(g_bias))
    if not isinstance(scale, (int, float)) or not math.isfinite(scale):
        fail("scale", "a finite float", repr(scale), exc=TypeError)
    if lower_bound is not None and (not isinstance(lower_bound, (int, float)) or not math.isfinite(lower_bound)
                                    or lower_bound >= 0):
        fail("lower_bound", "None or a finite negative float (the gate lies in (lower_bound, 0))",
             repr(lower_bound))

    if cu_seqlens is not None:
        tensor("cu_seqlens", cu_seqlens, dims=1, dtypes=INDEX_DTYPES, device=dev)
        if cu_seqlens.numel() < 1:
            fail("cu_seqlens", "[N + 1] with N >= 0", _desc(cu_seqlens))
        if B != 1:
            fail("q", "of batch size 1 when cu_seqlens is given (packed varlen)", f"batch size {B}",
                 "Pack the sequences into [1, T_total, H, K] or drop cu_seqlens")
        N = cu_seqlens.numel() - 1
    else:
        N = B
        if chunk_indices is not None or chunk_offsets is not None:
            fail("chunk_indices/chunk_offsets", "given only together with cu_seqlens", "them without it")
    if chunk_indices is not None:
        tensor("chunk_indices", chunk_indices, dims=2, dtypes=INDEX_DTYPES, device=dev)
        if chunk_indices.shape[1] != 2 or not chunk_indices.is_contiguous():
            fail("chunk_indices", "a contiguous [num_chunks, 2] tensor of (sequence, chunk) rows",
                 _desc(chunk_indices), "Build it with prepare_chunk_metadata_device")
    if chunk_offsets is not None:
        tensor("chunk_offsets", chunk_offsets, dims=1, dtypes=INDEX_DTYPES, device=dev)
        if chunk_offsets.numel() != N + 1 or not chunk_offsets.is_contiguous():
            fail("chunk_offsets", f"a contiguous [{N + 1}] tensor (N + 1 for {N} sequences)",
                 _desc(chunk_offsets))
    if initial_state is not None:
        tensor("initial_state", initial_state, dims=4, dtypes=(torch.float32,), device=dev)
        shape("initial_state", initial_state, (N, H, V, K), "[N, H, V, K] V-first fp32")
    if out is not None:
        tensor("out", out, dims=4, dtypes=(v.dtype,), device=dev)
        shape("out", out, tuple(v.shape), "like v")
        unit_last_stride("out", out)
    return Problem(B, T, H, K, V, N)


def check_state_cache(p: Problem, state_cache, state_indices, has_initial_state, device) -> None:
    tensor("state_cache", state_cache, dims=4, dtypes=(torch.float32,), device=device)
    if tuple(state_cache.shape[1:]) != (p.H, p.V, p.K):
        fail("state_cache", f"[slots, {p.H}, {p.V}, {p.K}] ([slots, H, V, K] V-first fp32)", _desc(state_cache))
    if state_cache.stride()[1:] != (p.V * p.K, p.K, 1):
        fail("state_cache", "dense within each row ([H, V, K] contiguous; the row stride may be padded)",
             f"strides {state_cache.stride()}")
    tensor("state_indices", state_indices, dims=1, dtypes=INDEX_DTYPES, device=device)
    shape("state_indices", state_indices, (p.N,), "one cache row per sequence")
    tensor("has_initial_state", has_initial_state, dims=1, dtypes=(torch.bool,), device=device)
    shape("has_initial_state", has_initial_state, (p.N,), "one flag per sequence")
