# SPDX-License-Identifier: Apache-2.0
"""Launches of the fused HIP path (templates/hip/): workspace, the launchers' arguments by name
(kdagen/kernels/hip.py), stream.

A plan on the fused path (runtime/plan.py) calls `run_fused` once per run, after validate.py has checked
vLLM's op's contract; `run_fused` re-checks only what the kernels themselves rely on, so that a mistake is
an exception here and never an out-of-bounds access on the device. It still allocates its workspace per
call (the fused path's redesign will move it into the plan).
"""

from __future__ import annotations

from pathlib import Path

import torch

from .device import target_of
from .group_scan import check_groups, choose_groups, device_sms, env_groups
from .jit_hip import HipLibrary, TargetMismatchError, load_library

CHUNK = 64
OP = "run_fused"
GROUPS_ENV = "KDAGEN_FUSED_GROUPS"


def variant_name(head_dim_k: int, head_dim_v: int, dtype: str = "bf16", chunk: int = CHUNK) -> str:
    # Mirrors VariantSpec.name for backend "hip" (never parsed back).
    return f"kda_chunk_fwd__hip__{dtype}__k{head_dim_k}_v{head_dim_v}_c{chunk}"


def source_path(package_dir: Path, head_dim_k: int, head_dim_v: int, target: str, dtype: str = "bf16") -> Path:
    """generated/kdagen_kernels/hip/<variant>__<target>.hip (see render/context.py HIP_TEMPLATE)."""
    return Path(package_dir) / "hip" / f"{variant_name(head_dim_k, head_dim_v, dtype)}__{target}.hip"


def load_fused(package_dir: Path, head_dim_k: int, head_dim_v: int, target: str, dtype: str = "bf16") -> HipLibrary:
    """Build (first use; cached afterwards) and load the fused variant for (K, V) on `target`."""
    src = source_path(package_dir, head_dim_k, head_dim_v, target, dtype)
    return load_library(src, target, variant=f"{variant_name(head_dim_k, head_dim_v, dtype)}")


def _env_groups() -> int | None:
    return env_groups(GROUPS_ENV)


def group_workspace_numel(groups: int, num_seqs: int, H: int, K: int, V: int) -> int:
    """fp32 elements of the launcher's group workspace: operator rows, then start states."""
    if groups <= 1:
        return 0
    return (groups - 1) * num_seqs * H * (V + K) * K + groups * num_seqs * H * V * K


def _req(cond: bool, msg: str) -> None:
    if not cond:
        raise ValueError(f"{OP}: {msg}")


def _i32(t: torch.Tensor) -> torch.Tensor:
    return t if t.dtype == torch.int32 and t.is_contiguous() else t.to(torch.int32).contiguous()


def _i64(t: torch.Tensor) -> torch.Tensor:
    return t if t.dtype == torch.int64 and t.is_contiguous() else t.to(torch.int64).contiguous()


def _flags(t: torch.Tensor) -> torch.Tensor:
    # has_initial_state as the kernels read it: one byte per sequence, nonzero = true.
    return t.reshape(-1).to(torch.bool).contiguous().view(torch.uint8)


def _state_rows(name: str, t: torch.Tensor, H: int, V: int, K: int, device) -> None:
    _req(t.dtype == torch.float32 and t.device == device and t.dim() == 4 and tuple(t.shape[1:]) == (H, V, K),
         f"{name} must be fp32 [rows, {H}, {V}, {K}] on {device} (V-first), got {t.dtype} {tuple(t.shape)}")
    _req(t.stride()[1:] == (V * K, K, 1), f"{name} must be dense within each row, got strides {t.stride()}")


def _ptr(t: torch.Tensor | None) -> int | None:
    return t.data_ptr() if t is not None else None


# kda_intra_kernel's walk chunk (templates/hip/include/kda_intra.h IR): fused plans step their walk over it.
INTRA_ROWS = 16


def intra_workspace(T: int, H: int, K: int, V: int, n_chunks: int, device) -> dict[str, torch.Tensor]:
    """kda_intra_kernel's outputs: qg, w, kg [T, H, K], u [T, H, V], aqk [T, H, 16] (bf16) and decay
    [n_chunks * chunk / 16, H, K] (fp32), the Triton kda_intra's layout at intra_rows 16."""
    ws = {n: torch.empty(T, H, d, dtype=torch.bfloat16, device=device)
          for n, d in (("qg", K), ("w", K), ("kg", K), ("u", V), ("aqk", INTRA_ROWS))}
    ws["decay"] = torch.empty(max(n_chunks * (CHUNK // INTRA_ROWS), 1), H, K, dtype=torch.float32, device=device)
    return ws


def run_intra(lib: HipLibrary, ws: dict[str, torch.Tensor], *, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
              raw_g: torch.Tensor, raw_beta: torch.Tensor, A_log: torch.Tensor, g_bias: torch.Tensor | None,
              scale: float, lower_bound: float, cu_seqlens: torch.Tensor, chunk_indices: torch.Tensor) -> None:
    """kda_intra_kernel on torch's current stream: the workspace of 16-row walk chunks into `ws` (views shaped
    as intra_workspace's, rows dense), for the bounded gate with q and k L2-normed in the kernel.

    Packed [1, T, H, *] bf16 inputs, dense in the last dim (any token / head strides), raw_g bf16; A_log and
    g_bias fp32 contiguous; cu_seqlens and chunk_indices int32 (chunk-64 metadata)."""
    _, T, H, K = q.shape
    V = v.shape[-1]
    _req((K, V, CHUNK) == (lib.head_dim_k, lib.head_dim_v, lib.chunk_size),
         f"{lib.name} is built for K={lib.head_dim_k}, V={lib.head_dim_v}; got K={K}, V={V}")
    for name, t in (("q", q), ("k", k), ("v", v), ("raw_g", raw_g)):
        _req(t.dtype == torch.bfloat16 and t.stride(-1) == 1, f"{name} must be bf16, dense in its last dim")
    _req(raw_beta.dtype == torch.bfloat16, "raw_beta must be bf16")
    _req(A_log.dtype == torch.float32 and A_log.is_contiguous() and A_log.numel() == H, f"A_log: fp32 [{H}]")
    _req(g_bias is None or (g_bias.dtype == torch.float32 and g_bias.is_contiguous() and g_bias.numel() == H * K),
         f"g_bias: fp32 [{H * K}] or None")
    _req(cu_seqlens.dtype == torch.int32 and chunk_indices.dtype == torch.int32, "metadata must be int32")
    n_chunks = chunk_indices.shape[0] if chunk_indices.numel() else 0
    for name, d in (("qg", K), ("w", K), ("kg", K), ("u", V), ("aqk", INTRA_ROWS)):
        t = ws[name]
        _req(t.dtype == torch.bfloat16 and tuple(t.shape) == (T, H, d) and t.is_contiguous(),
             f"workspace {name} must be contiguous bf16 [{T}, {H}, {d}]")
    _req(ws["decay"].dtype == torch.float32 and ws["decay"].is_contiguous()
         and ws["decay"].shape[0] >= n_chunks * (CHUNK // INTRA_ROWS) and tuple(ws["decay"].shape[1:]) == (H, K),
         "workspace decay must be contiguous fp32 [n_chunks * 4, H, K]")
    if n_chunks == 0 or H == 0:
        return
    launch = HipIntraLaunch(lib, ws, cu_seqlens=cu_seqlens, chunk_indices=chunk_indices, lower_bound=lower_bound,
                            has_bias=g_bias is not None, H=H)
    with torch.cuda.device(q.device):
        launch([q, k, v, raw_g, raw_beta, A_log, g_bias if g_bias is not None else A_log, scale])


class HipIntraLaunch:
    """kda_intra_kernel as the first launch of a Triton program (triton_path.TritonProgram's `intra`): called
    with the program's run values (triton_path.RUN_ORDER), it writes the program's workspace views `ws`, which
    the walk then reads. The metadata (int32) and the workspace are fixed when the plan is made, so a
    call only converts what the kernel takes in another dtype (raw_g and raw_beta to bf16, A_log and g_bias to
    fp32) and launches; nothing syncs, so graphs capture it."""

    __slots__ = ("lib", "ws", "cu", "ci", "lower_bound", "has_bias", "H", "_static")

    def __init__(self, lib: HipLibrary, ws: dict[str, torch.Tensor], *, cu_seqlens: torch.Tensor,
                 chunk_indices: torch.Tensor, lower_bound: float, has_bias: bool, H: int):
        self.lib, self.ws, self.lower_bound, self.has_bias, self.H = lib, ws, float(lower_bound), has_bias, H
        self.cu = _i32(cu_seqlens)
        self.ci = _i32(chunk_indices)
        n_chunks = self.ci.shape[0] if self.ci.numel() else 0
        self._static = dict(cu_seqlens=self.cu.data_ptr(), chunk_indices=self.ci.data_ptr(),
                            **{n: ws[n].data_ptr() for n in ("qg", "w", "kg", "u", "aqk", "decay")},
                            num_chunks=n_chunks, H=H, lower_bound=self.lower_bound)

    def __call__(self, values: list, key: tuple | None = None) -> None:
        q, k, v, raw_g, raw_beta, A_log, g_bias, scale = values[:8]
        if raw_g.dtype != torch.bfloat16:
            raw_g = raw_g.to(torch.bfloat16)  # NOTE: the kernel reads bf16 gates, as the fused path always has
        if raw_beta.dtype != torch.bfloat16:
            raw_beta = raw_beta.to(torch.bfloat16)
        A_log = A_log.to(torch.float32).contiguous()
        g_bias = g_bias.to(torch.float32).contiguous() if self.has_bias else None
        self.lib.intra(dict(
            self._static, q=q.data_ptr(), k=k.data_ptr(), v=v.data_ptr(), g=raw_g.data_ptr(),
            beta=raw_beta.data_ptr(), A_log=A_log.data_ptr(), g_bias=_ptr(g_bias),
            sq_t=q.stride(1), sq_h=q.stride(2), sk_t=k.stride(1), sk_h=k.stride(2), sv_t=v.stride(1),
            sv_h=v.stride(2), sg_t=raw_g.stride(1), sg_h=raw_g.stride(2), sb_t=raw_beta.stride(1),
            sb_h=raw_beta.stride(2), scale=float(scale), stream=torch.cuda.current_stream(q.device).cuda_stream))


# The run values HipWalkLaunch reads, a slice of triton_path.RUN_ORDER (which checks it): the output, the states
# and the checkpoint rows, then `scale` at index 7.
WALK_VALUES = slice(18, 31)
WALK_VALUE_NAMES = ("o", "so_t", "so_h", "h0", "ht", "sh0_n", "sh0_h", "sht_n", "sht_h", "n_slots", "ckpt", "sck_n",
                    "n_ckpt_rows")


class HipWalkLaunch:
    """kda_walk_kernel as the walk of a Triton program (triton_path.TritonProgram's `walks`, one group): called with
    the program's run values (triton_path.RUN_ORDER), it walks the workspace views `ws` that kda_intra_kernel
    wrote and writes the output, the final state or the cache rows, and the checkpoints, as the Triton walk at
    PASS 0 would. The metadata, the state routing and the checkpoint request are converted to the kernel's dtypes
    when the plan is made; a call only reads the per-layer tensors' pointers and strides, so graphs capture it."""

    __slots__ = ("lib", "_keep", "_static", "state_in", "state_out")

    def __init__(self, lib: HipLibrary, ws: dict[str, torch.Tensor], *, state_in: int, state_out: int,
                 cu_seqlens: torch.Tensor, chunk_offsets: torch.Tensor, H: int, N: int,
                 state_indices: torch.Tensor | None, has_initial_state: torch.Tensor | None,
                 checkpoint_offsets: torch.Tensor | None, checkpoint_state_indices: torch.Tensor | None):
        cu = _i32(cu_seqlens)
        co = _i64(chunk_offsets)
        idx = _i32(state_indices.reshape(-1)) if state_indices is not None else None
        flags = _flags(has_initial_state) if has_initial_state is not None else None
        ck_off = _i32(checkpoint_offsets.reshape(-1)) if checkpoint_offsets is not None else None
        ck_idx = _i32(checkpoint_state_indices.reshape(-1)) if checkpoint_state_indices is not None else None
        _req((state_in != 2 and state_out != 2) or (idx is not None and flags is not None),
             "a paged state needs state_indices and has_initial_state")
        self.lib, self.state_in, self.state_out = lib, state_in, state_out
        self._keep = (cu, co, idx, flags, ck_off, ck_idx, ws)
        self._static = dict(**{n: ws[n].data_ptr() for n in ("qg", "w", "kg", "u", "aqk", "decay")},
                            cu_seqlens=cu.data_ptr(), chunk_offsets=co.data_ptr(), state_in=state_in,
                            state_out=state_out, state_idx=_ptr(idx), has_init=_ptr(flags), ckpt_off=_ptr(ck_off),
                            ckpt_idx=_ptr(ck_idx), num_seqs=N, H=H)

    def __call__(self, values: list, key: tuple | None = None) -> None:
        o, so_t, so_h, h0, ht, sh0_n, sh0_h, sht_n, sht_h, n_slots, ckpt, sck_n, n_ckpt_rows = values[WALK_VALUES]
        self.lib.walk(dict(
            self._static, out=o.data_ptr(), so_t=so_t, so_h=so_h,
            h0=h0.data_ptr() if self.state_in else None, sh0_n=sh0_n, sh0_h=sh0_h,
            ht=ht.data_ptr() if self.state_out else None, sht_n=sht_n, sht_h=sht_h, n_slots=n_slots,
            ckpt=_ptr(ckpt), sck_n=sck_n or 0, n_ckpt_rows=n_ckpt_rows or 0, scale=float(values[7]),
            stream=torch.cuda.current_stream(o.device).cuda_stream))


def run_fused(lib: HipLibrary, *, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, raw_g: torch.Tensor,
              raw_beta: torch.Tensor, A_log: torch.Tensor, g_bias: torch.Tensor | None, scale: float,
              lower_bound: float | None, cu_seqlens: torch.Tensor, chunk_indices: torch.Tensor,
              chunk_offsets: torch.Tensor, out: torch.Tensor, initial_state: torch.Tensor | None = None,
              final_state: torch.Tensor | None = None, state_cache: torch.Tensor | None = None,
              state_indices: torch.Tensor | None = None, has_initial_state: torch.Tensor | None = None,
              checkpoint_state: torch.Tensor | None = None, checkpoint_offsets: torch.Tensor | None = None,
              checkpoint_state_indices: torch.Tensor | None = None,
              use_qk_l2norm: bool = True, groups: int | None = None) -> None:
    """Prologue + recurrence on torch's current stream for packed [1, T, H, *] inputs.

    Writes `out` ([1, T, H, V], any token/head strides, dense last dim), `final_state` ([N, H, V, K]) when
    given, the `state_cache` rows named by `state_indices` (read when `has_initial_state`, always
    written; negative / out-of-range index: neither), and checkpoint snapshots. Every sequence's final
    state is written, T = 0 ones too (initial state passthrough or zeros). No host sync: graph-capturable
    when the index tensors already have the kernels' dtypes (cu_seqlens/chunk_indices int32,
    chunk_offsets int64, state/checkpoint indices and offsets int32).

    `groups`: the recurrence's group count (Note [Group count] in group_scan.py); None = KDAGEN_FUSED_GROUPS or the
    cost model's choice.
    """
    dev = q.device
    _req(dev.type == "cuda", f"tensors must be on a GPU, got {dev}")
    dev_target = target_of(dev)
    if dev_target != lib.target:
        raise TargetMismatchError(f"{OP}: {lib.name} is built for {lib.target} but {dev} is {dev_target}; "
                                  f"load the variant for {dev_target}")
    _req(q.dim() == 4 and q.shape[0] == 1, f"q must be packed [1, T, H, K], got {tuple(q.shape)}")
    _, T, H, K = q.shape
    V = v.shape[-1]
    _req((K, V, CHUNK) == (lib.head_dim_k, lib.head_dim_v, lib.chunk_size),
         f"{lib.name} is built for K={lib.head_dim_k}, V={lib.head_dim_v}, chunk {lib.chunk_size}; "
         f"got K={K}, V={V}")
    for name, t, last in (("q", q, K), ("k", k, K), ("v", v, V), ("out", out, V)):
        _req(t.dtype == torch.bfloat16 and t.device == dev and tuple(t.shape) == (1, T, H, last),
             f"{name} must be bf16 [1, {T}, {H}, {last}] on {dev}, got {t.dtype} {tuple(t.shape)}")
        _req(t.stride(-1) == 1, f"{name} must be dense in its last dim, got strides {t.stride()}")
    if raw_g.dtype != torch.bfloat16 or raw_g.stride(-1) != 1:
        raw_g = raw_g.to(torch.bfloat16).contiguous()  # NOTE: the kernels read bf16 gates
    if raw_beta.dtype != torch.bfloat16:
        raw_beta = raw_beta.to(torch.bfloat16)
    _req(tuple(raw_g.shape) == (1, T, H, K) and tuple(raw_beta.shape) == (1, T, H),
         f"raw_g must be [1, T, H, K] and raw_beta [1, T, H], got {tuple(raw_g.shape)} and {tuple(raw_beta.shape)}")
    A_log = A_log.to(device=dev, dtype=torch.float32).reshape(-1).contiguous()
    _req(A_log.numel() == H, f"A_log must have {H} entries")
    if g_bias is not None:
        g_bias = g_bias.to(device=dev, dtype=torch.float32).reshape(-1).contiguous()
        _req(g_bias.numel() == H * K, f"g_bias must have {H * K} entries")
    cu = _i32(cu_seqlens)
    ci = _i32(chunk_indices)
    co = _i64(chunk_offsets)
    N = cu.numel() - 1
    n_chunks = ci.shape[0] if ci.numel() else 0
    _req(ci.numel() == 0 or (ci.dim() == 2 and ci.shape[1] == 2), "chunk_indices must be [num_chunks, 2]")
    _req(co.numel() == N + 1, f"chunk_offsets must have N + 1 = {N + 1} entries")

    if initial_state is not None:
        _state_rows("initial_state", initial_state, H, V, K, dev)
        _req(initial_state.shape[0] == N, f"initial_state must have N = {N} rows")
    if final_state is not None:
        _state_rows("final_state", final_state, H, V, K, dev)
        _req(final_state.shape[0] == N, f"final_state must have N = {N} rows")
    idx = flags = None
    if state_cache is not None:
        _state_rows("state_cache", state_cache, H, V, K, dev)
        _req(state_indices is not None and has_initial_state is not None,
             "state_cache needs state_indices and has_initial_state")
        idx = _i32(state_indices)
        flags = _flags(has_initial_state)
        _req(idx.numel() == N and flags.numel() == N, f"state_indices and has_initial_state need {N} entries")
    ck_off = ck_idx = None
    if checkpoint_state is not None or checkpoint_offsets is not None:
        _req(checkpoint_state is not None and checkpoint_offsets is not None,
             "checkpoint_state and checkpoint_offsets must be given together")
        _state_rows("checkpoint_state", checkpoint_state, H, V, K, dev)
        ck_off = _i32(checkpoint_offsets.reshape(-1))
        _req(ck_off.numel() == N, f"checkpoint_offsets needs {N} entries")
        if checkpoint_state_indices is not None:
            ck_idx = _i32(checkpoint_state_indices.reshape(-1))
            _req(ck_idx.numel() == N, f"checkpoint_state_indices needs {N} entries")

    # Workspace (kda-semantics.md 1.4, token-major): qg, w, kg [T, H, K]; u [T, H, V]; aqk [T, H, 64]
    # bf16; decay [chunks, H, K] fp32.
    qg = torch.empty(T, H, K, dtype=torch.bfloat16, device=dev)
    w = torch.empty_like(qg)
    kg = torch.empty_like(qg)
    u = torch.empty(T, H, V, dtype=torch.bfloat16, device=dev)
    aqk = torch.empty(T, H, CHUNK, dtype=torch.bfloat16, device=dev)
    decay = torch.empty(max(n_chunks, 1), H, K, dtype=torch.float32, device=dev)
    if groups is None:
        groups = _env_groups()
    if groups is None:
        groups = choose_groups(N, H, n_chunks, K, V, lib.v_slice, device_sms(dev),
                               lib.recurrence_blocks_per_sm())
    groups = check_groups(groups, OP)
    gws = torch.empty(group_workspace_numel(groups, N, H, K, V), dtype=torch.float32, device=dev) \
        if groups > 1 else None
    stream = torch.cuda.current_stream(dev).cuda_stream

    def stride0(t: torch.Tensor | None) -> int:
        return t.stride(0) if t is not None else 0

    with torch.cuda.device(dev):
        if n_chunks > 0:
            lib.prologue(dict(
                q=q.data_ptr(), k=k.data_ptr(), v=v.data_ptr(), g=raw_g.data_ptr(), beta=raw_beta.data_ptr(),
                A_log=A_log.data_ptr(), g_bias=_ptr(g_bias), cu_seqlens=cu.data_ptr(), chunk_indices=ci.data_ptr(),
                qg=qg.data_ptr(), w=w.data_ptr(), kg=kg.data_ptr(), u=u.data_ptr(), aqk=aqk.data_ptr(),
                decay=decay.data_ptr(),
                sq_t=q.stride(1), sq_h=q.stride(2), sk_t=k.stride(1), sk_h=k.stride(2), sv_t=v.stride(1),
                sv_h=v.stride(2), sg_t=raw_g.stride(1), sg_h=raw_g.stride(2), sb_t=raw_beta.stride(1),
                sb_h=raw_beta.stride(2),
                num_chunks=n_chunks, H=H, scale=float(scale),
                lower_bound=float(lower_bound) if lower_bound is not None else 0.0,
                lower_bound_gate=1 if lower_bound is not None else 0, use_l2norm=1 if use_qk_l2norm else 0,
                stream=stream))
        if N > 0:
            lib.recurrence(dict(
                qg=qg.data_ptr(), w=w.data_ptr(), kg=kg.data_ptr(), u=u.data_ptr(), aqk=aqk.data_ptr(),
                decay=decay.data_ptr(), out=out.data_ptr(), so_t=out.stride(1), so_h=out.stride(2),
                cu_seqlens=cu.data_ptr(), chunk_offsets=co.data_ptr(),
                h0=_ptr(initial_state), sh0_n=stride0(initial_state),
                ht=_ptr(final_state), sht_n=stride0(final_state),
                cache=_ptr(state_cache), sc_n=stride0(state_cache),
                n_slots=state_cache.shape[0] if state_cache is not None else 0,
                cache_idx=_ptr(idx), has_init=_ptr(flags),
                ckpt=_ptr(checkpoint_state), sck_n=stride0(checkpoint_state),
                n_ckpt_rows=checkpoint_state.shape[0] if checkpoint_state is not None else 0,
                ckpt_off=_ptr(ck_off), ckpt_idx=_ptr(ck_idx),
                num_seqs=N, H=H, scale=float(scale), groups=groups, group_ws=_ptr(gws), stream=stream))
