# SPDX-License-Identifier: Apache-2.0
"""Cheap argument checks for chunk_kda_prefill: shapes, dtypes, devices, strides. No device syncs.

Every failure is a ValueError or TypeError that names the argument, what was expected, what came
and, where there is one, the fix. They all run before anything is written, so a rejected call leaves
`out`, `state_cache` and `checkpoint_state` untouched.
"""

from __future__ import annotations

import math
import numbers
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


def same_io_dtype(arg: str, t: object, q: torch.Tensor) -> None:
    """k and v share q's I/O dtype; the message names both tensors, not just the one checked second."""
    tensor(arg, t, dims=4)
    assert isinstance(t, torch.Tensor)
    if t.dtype != q.dtype:
        fail(arg, f"{q.dtype} like q (q, k and v share one I/O dtype, bfloat16 or float16)",
             f"{arg} {t.dtype} with q {q.dtype}", f"Cast q, k and v to one dtype, e.g. {arg}.to(q.dtype)",
             exc=TypeError)
    tensor(arg, t, device=q.device)


def shape(arg: str, t: torch.Tensor, expected: tuple[int, ...], what: str) -> None:
    if tuple(t.shape) != expected:
        fail(arg, f"of shape {list(expected)} ({what})", _desc(t))


def unit_last_stride(arg: str, t: torch.Tensor) -> None:
    if t.shape[-1] > 1 and t.stride(-1) != 1:
        fail(arg, "dense in its last dim (stride 1)", f"strides {t.stride()}", f"Pass {arg}.contiguous()")


def _what(x: object) -> str:
    if isinstance(x, torch.Tensor):
        return _desc(x)
    r = repr(x)
    return f"{type(x).__name__} {r if len(r) <= 60 else r[:57] + '...'}"


def dense_tail(arg: str, t: torch.Tensor, ndims: int, what: str, fix: str) -> None:
    """The last `ndims` dims of t are dense (row-major, stride 1 last); size-1 dims may have any stride."""
    expected = 1
    for d in range(t.dim() - 1, t.dim() - 1 - ndims, -1):
        if t.shape[d] != 1 and t.stride(d) != expected:
            fail(arg, f"dense in its {what} dims (strides {_dense_strides(t, ndims)})", f"strides {t.stride()}", fix)
        expected *= t.shape[d]


def _dense_strides(t: torch.Tensor, ndims: int) -> tuple[int, ...]:
    out, s = [], 1
    for d in range(t.dim() - 1, t.dim() - 1 - ndims, -1):
        out.append(s)
        s *= t.shape[d]
    return tuple(reversed(out))


def contiguous_1d(arg: str, t: torch.Tensor, fix: str = "") -> None:
    """The kernels index 1-D metadata tensors as `ptr + i`: they must have stride 1."""
    if t.numel() > 1 and t.stride(0) != 1:
        fail(arg, "contiguous (stride 1; the kernels read it as ptr + i)", f"stride {t.stride(0)}",
             fix or f"Pass {arg}.contiguous()")


def self_overlaps(t: torch.Tensor) -> bool:
    """Whether two elements of t share memory (an expand's stride 0, an as_strided view): taken by stride,
    each dim must step past everything the dims inside it span."""
    if t.numel() == 0:
        return False
    span = 0  # how far the inner dims reach, in elements
    for st, n in sorted((st, n) for n, st in zip(t.shape, t.stride()) if n > 1):
        if st <= span:
            return True
        span += (n - 1) * st
    return False


def flag(arg: str, x: object) -> None:
    # numpy bools are not ints; accept them, they come from host-side metadata builders.
    if isinstance(x, bool) or (type(x).__module__ == "numpy" and type(x).__name__ in ("bool", "bool_")):
        return
    fail(arg, "a bool", _what(x), "Pass True or False (a tensor would need a device sync to read)", exc=TypeError)


def check_flags(output_final_state, use_qk_l2norm_in_kernel, use_fused_chunk) -> None:
    """The bool arguments are bools: a truthy tensor or string would silently pick a code path."""
    flag("output_final_state", output_final_state)
    flag("use_qk_l2norm_in_kernel", use_qk_l2norm_in_kernel)
    flag("use_fused_chunk", use_fused_chunk)


def is_real(x: object) -> bool:
    return isinstance(x, numbers.Real) and not isinstance(x, bool)


def _byte_range(t: torch.Tensor) -> tuple[int, int] | None:
    if t.numel() == 0:
        return None
    span = sum((n - 1) * st for n, st in zip(t.shape, t.stride()) if n > 1)
    return t.data_ptr(), t.data_ptr() + (span + 1) * t.element_size()


def may_overlap(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Whether the memory a and b span intersects (conservative for interleaved strided views)."""
    if a.device != b.device:
        return False
    ra, rb = _byte_range(a), _byte_range(b)
    return ra is not None and rb is not None and ra[0] < rb[1] and rb[0] < ra[1]


def no_overlap(arg: str, t: torch.Tensor, other: str, o: torch.Tensor | None, why: str) -> None:
    if o is not None and may_overlap(t, o):
        fail(arg, f"memory disjoint from {other} ({why})",
             f"{arg} spanning bytes [{_byte_range(t)[0]:#x}, {_byte_range(t)[1]:#x}) and {other} "
             f"[{_byte_range(o)[0]:#x}, {_byte_range(o)[1]:#x})",
             f"Pass a separate buffer as {arg}")


def check_gate_form(lower_bound) -> None:
    if lower_bound is not None and not is_real(lower_bound):
        fail("lower_bound", "None or a finite negative float (the gate lies in (lower_bound, 0))",
             _what(lower_bound), exc=TypeError)
    if lower_bound is not None and (not math.isfinite(lower_bound) or lower_bound >= 0):
        fail("lower_bound", "None or a finite negative float (the gate lies in (lower_bound, 0))",
             repr(lower_bound))


def check_batch_metadata(B: int, dev, cu_seqlens, chunk_indices, chunk_offsets) -> int:
    """cu_seqlens / chunk_indices / chunk_offsets (dtypes, ranks, device, contiguity); returns N."""
    if cu_seqlens is not None:
        tensor("cu_seqlens", cu_seqlens, dims=1, dtypes=INDEX_DTYPES, device=dev)
        if cu_seqlens.numel() < 1:
            fail("cu_seqlens", "[N + 1] with N >= 0", _desc(cu_seqlens))
        if B != 1:
            fail("q", "of batch size 1 when cu_seqlens is given (packed varlen)", f"batch size {B}",
                 "Pack the sequences into [1, T_total, H, K] or drop cu_seqlens")
        contiguous_1d("cu_seqlens", cu_seqlens)
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
    return N


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
    same_io_dtype("k", k, q)
    shape("k", k, (B, T, H, K), "like q")
    same_io_dtype("v", v, q)
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
    if A_log.dim() == 1:  # read as ptr + h (other ranks are flattened into a copy)
        contiguous_1d("A_log", A_log)
    if g_bias is not None:
        tensor("g_bias", g_bias, dtypes=FLOAT_DTYPES, device=dev)
        if g_bias.numel() != H * K:
            fail("g_bias", f"{H * K} values (H * K, viewed [H, K])", _desc(g_bias))
        if g_bias.dim() == 1:
            contiguous_1d("g_bias", g_bias)
    if not is_real(scale):
        fail("scale", "None or a finite float", _what(scale), exc=TypeError)
    if not math.isfinite(scale):
        fail("scale", "None or a finite float", repr(scale), "The default is K ** -0.5")
    check_gate_form(lower_bound)

    N = check_batch_metadata(B, dev, cu_seqlens, chunk_indices, chunk_offsets)
    if initial_state is not None:
        tensor("initial_state", initial_state, dims=4, dtypes=(torch.float32,), device=dev)
        shape("initial_state", initial_state, (N, H, V, K), "[N, H, V, K] V-first fp32")
        # The walk reads row (n, h) at h0 + n * stride0 + h * stride1 + v * K + k.
        dense_tail("initial_state", initial_state, 2, "[V, K]",
                   "Pass initial_state.contiguous() (a transposed K-first [N, H, K, V] state is a V-first "
                   "state only once it is made contiguous)")
    if out is not None:
        tensor("out", out, dims=4, dtypes=(v.dtype,), device=dev)
        shape("out", out, tuple(v.shape), "like v")
        unit_last_stride("out", out)
        if self_overlaps(out):
            fail("out", "a buffer whose elements do not overlap (every token and head written once)",
                 f"strides {out.stride()} for shape {tuple(out.shape)}",
                 "Pass a dense buffer, e.g. torch.empty_like(v)")
        # The recurrence reads initial_state in the same launch that writes out. (q, k, v, raw_g and
        # raw_beta are read only by the prologue, which completes before out is written.)
        no_overlap("out", out, "initial_state", initial_state, "the walk reads it while writing out")
    return Problem(B, T, H, K, V, N)


def check_state_cache(p: Problem, state_cache, state_indices, has_initial_state, device) -> None:
    tensor("state_cache", state_cache, dims=4, dtypes=(torch.float32,), device=device)
    if tuple(state_cache.shape[1:]) != (p.H, p.V, p.K):
        fail("state_cache", f"[slots, {p.H}, {p.V}, {p.K}] ([slots, H, V, K] V-first fp32)", _desc(state_cache))
    if state_cache.stride()[1:] != (p.V * p.K, p.K, 1):
        fail("state_cache", "dense within each row ([H, V, K] contiguous; the row stride may be padded)",
             f"strides {state_cache.stride()}")
    check_state_routing(p, device, state_indices, has_initial_state)


def check_state_routing(p: Problem, device, state_indices, has_initial_state) -> None:
    """state_indices / has_initial_state: one int / bool per sequence, contiguous, on the device."""
    tensor("state_indices", state_indices, dims=1, dtypes=INDEX_DTYPES, device=device)
    shape("state_indices", state_indices, (p.N,), "one cache row per sequence")
    contiguous_1d("state_indices", state_indices)
    tensor("has_initial_state", has_initial_state, dims=1, dtypes=(torch.bool,), device=device)
    shape("has_initial_state", has_initial_state, (p.N,), "one flag per sequence")
    contiguous_1d("has_initial_state", has_initial_state)


def check_optional_args(p: Problem, device, *, out, state_cache, state_indices, has_initial_state,
                        checkpoint_state, checkpoint_offsets, checkpoint_state_indices) -> None:
    """Arguments that would otherwise be ignored silently, the checkpoint tensors, and `out` aliasing a state.

    Runs after check_inputs / check_state_cache; no device syncs (data-dependent checks live in
    debug_checks).
    """
    if state_cache is None and (state_indices is not None or has_initial_state is not None):
        given = " and ".join(n for n, t in (("state_indices", state_indices), ("has_initial_state", has_initial_state))
                             if t is not None)
        fail(given, "given only together with state_cache", f"{given} without state_cache",
             "They route the paged state; pass state_cache too, or initial_state for a dense state")
    if checkpoint_offsets is None:
        if checkpoint_state_indices is not None:
            fail("checkpoint_state_indices", "given only together with checkpoint_offsets and checkpoint_state",
                 "it without checkpoint_offsets", "No snapshot would be written")
    else:
        check_checkpoint(p, device, checkpoint_state, checkpoint_offsets, checkpoint_state_indices)
    if out is not None:
        no_overlap("out", out, "state_cache", state_cache, "the walk reads and writes it while writing out")
        no_overlap("out", out, "checkpoint_state", checkpoint_state, "the walk writes it while writing out")


def check_checkpoint_rows_free(p: Problem, checkpoint_state: torch.Tensor, checkpoint_offsets: torch.Tensor,
                               checkpoint_state_indices: torch.Tensor | None, initial_state: torch.Tensor | None,
                               state_cache: torch.Tensor | None, state_indices: torch.Tensor | None,
                               read_values: bool) -> None:
    """No snapshot lands on a state the walk still reads or writes: checkpoint_state must not overlap
    initial_state, and where it shares memory with state_cache, no written snapshot row may be a row of
    state_indices (a sequence's live state). The rows are compared only when `read_values` (the index
    tensors are on the CPU, or KDAGEN_DEBUG=1): on a device that would sync."""
    no_overlap("checkpoint_state", checkpoint_state, "initial_state", initial_state,
               "the walk reads the initial states while it writes snapshots")
    if state_cache is None or state_indices is None or not read_values or not may_overlap(checkpoint_state,
                                                                                          state_cache):
        return
    off = checkpoint_offsets.detach().to("cpu", torch.int64)
    rows = (checkpoint_state_indices.detach().to("cpu", torch.int64) if checkpoint_state_indices is not None
            else torch.arange(p.N))
    slots = state_indices.detach().to("cpu", torch.int64)
    row_bytes = p.H * p.V * p.K * 4
    written = torch.nonzero((off > 0) & (rows >= 0)).flatten()
    live = torch.nonzero(slots >= 0).flatten()
    if written.numel() == 0 or live.numel() == 0:
        return
    c0 = checkpoint_state.data_ptr() + rows[written] * checkpoint_state.stride(0) * 4
    s0 = state_cache.data_ptr() + slots[live] * state_cache.stride(0) * 4
    clash = torch.nonzero((c0[:, None] - s0[None, :]).abs() < row_bytes)
    if clash.numel():
        n, m = int(written[clash[0, 0]]), int(live[clash[0, 1]])
        fail("checkpoint_state", "rows apart from every sequence's state_cache row",
             f"sequence {n}'s snapshot row {int(rows[n])} on state_cache row {int(slots[m])}, the live state of "
             f"sequence {m}", "Route snapshots to spare rows with checkpoint_state_indices")


def check_checkpoint(p: Problem, device, checkpoint_state, checkpoint_offsets, checkpoint_state_indices) -> None:
    """checkpoint_offsets int [N]; checkpoint_state fp32 [rows, H, V, K] dense rows; indices int [N]."""
    tensor("checkpoint_offsets", checkpoint_offsets, dims=1, dtypes=INDEX_DTYPES, device=device)
    shape("checkpoint_offsets", checkpoint_offsets, (p.N,), "one token offset per sequence, 0 for none")
    contiguous_1d("checkpoint_offsets", checkpoint_offsets)
    if checkpoint_state is None:
        fail("checkpoint_state", "given with checkpoint_offsets (the snapshots' destination)", "None",
             "Pass both or neither")
    tensor("checkpoint_state", checkpoint_state, dims=4, dtypes=(torch.float32,), device=device)
    if tuple(checkpoint_state.shape[1:]) != (p.H, p.V, p.K):
        fail("checkpoint_state", f"[rows, {p.H}, {p.V}, {p.K}] ([rows, H, V, K] V-first fp32)",
             _desc(checkpoint_state))
    if checkpoint_state.stride()[1:] != (p.V * p.K, p.K, 1):
        fail("checkpoint_state", "dense within each row ([H, V, K] contiguous; the row stride may be padded)",
             f"strides {checkpoint_state.stride()}")
    if checkpoint_state_indices is None:
        if checkpoint_state.shape[0] < p.N:
            fail("checkpoint_state", f"at least {p.N} rows (row n is sequence n's snapshot without "
                 "checkpoint_state_indices)", _desc(checkpoint_state), "Pass checkpoint_state_indices to route rows")
    else:
        tensor("checkpoint_state_indices", checkpoint_state_indices, dims=1, dtypes=INDEX_DTYPES, device=device)
        shape("checkpoint_state_indices", checkpoint_state_indices, (p.N,), "one destination row per sequence")
        contiguous_1d("checkpoint_state_indices", checkpoint_state_indices)


def check_checkpoint_routing(p: Problem, device, checkpoint_offsets, checkpoint_state_indices) -> None:
    """The plan-level half of check_checkpoint: offsets int [N] and the optional destination rows int [N]."""
    tensor("checkpoint_offsets", checkpoint_offsets, dims=1, dtypes=INDEX_DTYPES, device=device)
    shape("checkpoint_offsets", checkpoint_offsets, (p.N,), "one token offset per sequence, 0 for none")
    contiguous_1d("checkpoint_offsets", checkpoint_offsets)
    if checkpoint_state_indices is not None:
        tensor("checkpoint_state_indices", checkpoint_state_indices, dims=1, dtypes=INDEX_DTYPES, device=device)
        shape("checkpoint_state_indices", checkpoint_state_indices, (p.N,), "one destination row per sequence")
        contiguous_1d("checkpoint_state_indices", checkpoint_state_indices)
