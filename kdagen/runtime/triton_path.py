# SPDX-License-Identifier: Apache-2.0
"""Launches of the generated Triton kernels: workspaces, grids and tuning. Arguments are checked before."""

from __future__ import annotations

import math
from dataclasses import dataclass
from types import ModuleType

import torch
import triton

from ..targets import TARGETS
from .device import INTERPRETER, TRITON_COMPILE_OPTIONS, interpreting
from .group_scan import check_groups, choose_groups, device_sms, env_groups

OP = "chunk_kda_prefill (triton)"
GROUPS_ENV = "KDAGEN_TRITON_GROUPS"
# The group count's cost model (Note [Group count]), fitted to CUDA-graph timings of whole calls on an
# H200 with the one-stage walk (docs/perf-notes.md section 16: 11 shapes, 12 to 64 heads, 1 to 4
# sequences of 4K to 64K tokens; every pick within 0.3% of the measured best G): two walks share an SM
# (one stage's shared memory), a pass-1 step (two products, no output) weighs 0.5 of a pass-2 step, a
# scan step 2.5 (its launch included). Section 14's fit, made with two stages, lost up to 7%.
RECURRENCE_PROGRAMS_PER_SM = 2
PASS1_STEP, SCAN_STEP = 0.5, 2.5
# kda_group_scan: state rows per program (tl.dot's smallest tile).
SCAN_ROWS = 16

# The prologue's diagonal 16 x 16 blocks take their operands relative to the sub-block's mid-point (kernel
# DIAG_REF). A bounded gate keeps |g| <= |lower_bound| per token, |lower_bound| / ln 2 in the kernel's log2:
# - DIAG_REF 2 reuses factors that span all 16 rows of a sub-block, so 16 rows of decay must stay a normal
#   fp32 (exponent >= -126): |lower_bound| <= 125 ln 2 / 16;
# - DIAG_REF 1 spans 8 rows each way from the mid-point: 8 / ln 2 * |lower_bound| < 126 up to -10;
# - DIAG_REF 0, exact per-row products in fp32, for softplus gates and larger bounds.
FACTORED_DIAG_MIN_LOWER_BOUND = -125.0 * math.log(2.0) / 16
MIDPOINT_DIAG_MIN_LOWER_BOUND = -10.0


def diag_ref(lower_bound: float | None) -> int:
    if lower_bound is None or lower_bound < MIDPOINT_DIAG_MIN_LOWER_BOUND:
        return 0
    return 2 if lower_bound >= FACTORED_DIAG_MIN_LOWER_BOUND else 1


@dataclass(frozen=True)
class StateArgs:
    """Where the walk reads its initial state and writes its final state (V-first [., H, V, K] fp32)."""

    mode_in: int = 0  # 0 zeros, 1 dense, 2 paged
    mode_out: int = 0  # 0 none, 1 dense, 2 paged
    h0: torch.Tensor | None = None
    ht: torch.Tensor | None = None
    state_indices: torch.Tensor | None = None
    has_initial_state: torch.Tensor | None = None


@dataclass(frozen=True)
class Workspace:
    """What the prologue kernels write and the recurrence reads (kda-semantics.md 1.4), token-major."""

    qg: torch.Tensor  # [T, H, BK]   q * exp2(G)
    w: torch.Tensor  # [T, H, BK]    T diag(beta) (k * exp2(G))
    kg: torch.Tensor  # [T, H, BK]   k * exp2(G_last - G)
    u: torch.Tensor  # [T, H, BV]    T diag(beta) v
    aqk: torch.Tensor  # [T, H, BT]  tril(Aqk), scale included
    decay: torch.Tensor  # [chunks, H, BK] fp32 exp2(G_last)
    tinv: torch.Tensor  # [T, H, BT]   (I + Akk)^-1, lower blocks only (kda_prologue -> kda_wu)
    rnorm: torch.Tensor  # [T, H, 2]   fp32 1/|k|, 1/|q| (kda_prologue -> kda_wu)


def tuning_for(mod: ModuleType, target: str) -> dict[str, int]:
    if target == INTERPRETER:
        return next(iter(mod.TUNING.values()))
    return mod.TUNING[target]


def new_workspace(mod: ModuleType, T: int, H: int, n_chunks: int, io: torch.dtype, device) -> Workspace:
    # The interpreter rounds fp32 -> bf16 toward zero where GPUs round to nearest even, so under it the
    # workspace stays fp32 and CPU tests see the algorithm's own error; GPU runs store the I/O dtype.
    io = torch.float32 if interpreting() else io
    qg = torch.empty(T, H, mod.BK, dtype=io, device=device)
    return Workspace(qg=qg, w=torch.empty_like(qg), kg=torch.empty_like(qg),
                     u=torch.empty(T, H, mod.BV, dtype=io, device=device),
                     aqk=torch.empty(T, H, mod.CHUNK_SIZE, dtype=io, device=device),
                     decay=torch.empty(max(n_chunks, 1), H, mod.BK, dtype=torch.float32, device=device),
                     tinv=torch.empty(T, H, mod.CHUNK_SIZE, dtype=io, device=device),
                     rnorm=torch.empty(T, H, 2, dtype=torch.float32, device=device))


def launch_prologue(mod: ModuleType, tun: dict[str, int], ws: Workspace, *, target: str, q, k, raw_g, raw_beta,
                    A_log, g_bias, scale: float, lower_bound: float | None, use_qk_l2norm: bool, cu_seqlens,
                    chunk_indices) -> None:
    """kda_prologue: aqk, and the inverse and row norms that kda_wu reads."""
    n_chunks, H = chunk_indices.shape[0], q.shape[2]
    if n_chunks == 0 or H == 0:
        return
    mod.kda_prologue[(n_chunks, H)](
        q, k, raw_g, raw_beta, A_log, g_bias if g_bias is not None else A_log, cu_seqlens, chunk_indices,
        ws.aqk, ws.tinv, ws.rnorm,
        float(scale), float(lower_bound) if lower_bound is not None else 0.0,
        q.stride(1), q.stride(2), k.stride(1), k.stride(2),
        raw_g.stride(1), raw_g.stride(2), raw_beta.stride(1), raw_beta.stride(2),
        H,
        BLOCK_K=tun["prologue_block_k"],  # the spec loader bounds it by the head dims
        LOWER_BOUND=lower_bound is not None, HAS_BIAS=g_bias is not None, USE_L2NORM=bool(use_qk_l2norm),
        DIAG_REF=diag_ref(lower_bound), DOT_F32=interpreting(), FP32_DOT=fp32_dot(target),
        num_warps=tun["prologue_warps"], num_stages=tun["prologue_stages"], **TRITON_COMPILE_OPTIONS,
    )


def launch_wu(mod: ModuleType, tun: dict[str, int], ws: Workspace, *, q, k, v, raw_g, raw_beta, A_log, g_bias,
              lower_bound: float | None, cu_seqlens, chunk_indices) -> None:
    """kda_wu, after kda_prologue: qg, kg, decay, w, u."""
    n_chunks, H = chunk_indices.shape[0], q.shape[2]
    if n_chunks == 0 or H == 0:
        return
    mod.kda_wu[(n_chunks, H)](
        q, k, v, raw_g, raw_beta, A_log, g_bias if g_bias is not None else A_log, cu_seqlens, chunk_indices,
        ws.tinv, ws.rnorm, ws.qg, ws.w, ws.kg, ws.u, ws.decay,
        float(lower_bound) if lower_bound is not None else 0.0,
        q.stride(1), q.stride(2), k.stride(1), k.stride(2), v.stride(1), v.stride(2),
        raw_g.stride(1), raw_g.stride(2), raw_beta.stride(1), raw_beta.stride(2),
        H,
        BLOCK_K=tun["wu_block_k"], LOWER_BOUND=lower_bound is not None, HAS_BIAS=g_bias is not None,
        DOT_F32=interpreting(),
        num_warps=tun["wu_warps"], num_stages=tun["wu_stages"], **TRITON_COMPILE_OPTIONS,
    )


def recurrence_groups(mod: ModuleType, tun: dict[str, int], n_seq: int, H: int, n_chunks: int,
                      device: torch.device) -> int:
    """KDAGEN_TRITON_GROUPS, else the cost model's count (1 under the interpreter: no SMs to fill)."""
    forced = env_groups(GROUPS_ENV)
    if forced is not None:
        return check_groups(forced, OP)
    sms = device_sms(device)
    if sms is None:
        return 1
    v_slice = min(tun["block_v"], mod.BV)
    if 2 * n_seq * H * triton.cdiv(mod.HEAD_DIM_V, v_slice) > sms:
        # Plain walks on more than half the SMs: a split's programs would double up on SMs and share their
        # throughput, which the wave model does not see (H200: 96 programs lose 2.5-3% at G=2, 64 gain 10%
        # at G=3; docs/perf-notes.md section 16).
        return 1
    return choose_groups(n_seq, H, n_chunks, mod.HEAD_DIM_K, mod.HEAD_DIM_V, v_slice, sms,
                         RECURRENCE_PROGRAMS_PER_SM, pass1_step=PASS1_STEP, scan_step=SCAN_STEP)


def recurrence_stages(tun: dict[str, int], programs: int, sms: int | None) -> int:
    """Pipeline stages of one walk launch. Fewer stages take less shared memory, so more walks share an
    SM; a launch with no more programs than SMs gains nothing from that and takes the deeper pipeline
    (docs/perf-notes.md section 15). Without a GPU (sms None), recurrence_stages."""
    if sms is not None and programs <= sms:
        return tun["recurrence_stages_sparse"]
    return tun["recurrence_stages"]


def fp32_dot(target: str) -> str:
    return "ieee" if target == INTERPRETER or target not in TARGETS else TARGETS[target].triton_fp32_dot


def launch_recurrence(mod: ModuleType, tun: dict[str, int], ws: Workspace, *, target: str, scale: float,
                      cu_seqlens, chunk_offsets, out: torch.Tensor, state: StateArgs, groups: int = 1) -> None:
    """The state walk and the output: one pass (groups = 1), or pass 1, kda_group_scan and pass 2."""
    n_seq, H, V = cu_seqlens.numel() - 1, out.shape[2], out.shape[3]
    if n_seq == 0 or H == 0:
        return
    groups = check_groups(groups, OP)
    BK, BV = mod.BK, mod.BV
    block_v = min(tun["block_v"], BV)
    h0 = state.h0 if state.h0 is not None else ws.decay  # any valid pointer when unused
    ht = state.ht if state.ht is not None else ws.decay
    idx = state.state_indices if state.state_indices is not None else cu_seqlens
    flag = state.has_initial_state if state.has_initial_state is not None else cu_seqlens
    sh0 = (h0.stride(0), h0.stride(1)) if state.h0 is not None else (0, 0)
    sht = (ht.stride(0), ht.stride(1)) if state.ht is not None else (0, 0)
    n_slots = state.ht.shape[0] if state.mode_out == 2 and state.ht is not None else \
        state.h0.shape[0] if state.mode_in == 2 and state.h0 is not None else 0
    # Group workspaces (fp32): pass 1's operator rows [G - 1, N, H, BV + BK, BK] (B_g, then M_g) and the
    # scanned start states [G, N, H, BV, BK].
    group_op = group_in = ws.decay
    if groups > 1:
        group_op = torch.empty(groups - 1, n_seq, H, BV + BK, BK, dtype=torch.float32, device=out.device)
        group_in = torch.empty(groups, n_seq, H, BV, BK, dtype=torch.float32, device=out.device)

    sms = device_sms(out.device)

    def walk(pass_: int, rows: int, grid_groups: int, block: int) -> None:
        grid = (n_seq * H, triton.cdiv(rows, block), grid_groups)
        mod.kda_recurrence[grid](
            ws.qg, ws.w, ws.kg, ws.u, ws.aqk, ws.decay,
            out, h0, ht, idx, flag,
            cu_seqlens, chunk_offsets, group_op, group_in,
            float(scale),
            out.stride(1), out.stride(2), *sh0, *sht,
            H, n_slots, n_seq, groups,
            BLOCK_V=block, STATE_IN=state.mode_in, STATE_OUT=state.mode_out, PASS=pass_,
            DOT_F32=interpreting(),
            num_warps=tun["recurrence_warps"], num_stages=recurrence_stages(tun, grid[0] * grid[1] * grid[2], sms),
            **TRITON_COMPILE_OPTIONS,
        )

    if groups == 1:
        walk(0, V, 1, block_v)
        return
    # Pass 1's row slices must not straddle the state / transfer boundary at BV: a block dividing BV and BK.
    walk(1, BV + BK, groups - 1, min(block_v, BK))
    mod.kda_group_scan[(n_seq * H, triton.cdiv(BV, min(SCAN_ROWS, BV)))](
        group_op, group_in, h0, idx, flag, cu_seqlens, *sh0,
        H, n_slots, n_seq, groups,
        BLOCK_V=min(SCAN_ROWS, BV), STATE_IN=state.mode_in, FP32_DOT=fp32_dot(target),
        num_warps=4, num_stages=1, **TRITON_COMPILE_OPTIONS,
    )
    walk(2, V, groups, block_v)


def run(mod: ModuleType, *, target: str, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
        raw_g: torch.Tensor, raw_beta: torch.Tensor, A_log: torch.Tensor, g_bias: torch.Tensor | None,
        scale: float, lower_bound: float | None, use_qk_l2norm: bool, cu_seqlens: torch.Tensor,
        chunk_indices: torch.Tensor, chunk_offsets: torch.Tensor, out: torch.Tensor,
        state: StateArgs) -> None:
    """Run the three kernels for packed [1, T, H, *] inputs, writing `out` and the states in place."""
    _, T, H, _ = q.shape
    tun = tuning_for(mod, target)
    # Before any launch: a bad KDAGEN_TRITON_GROUPS must fail before anything is written.
    groups = recurrence_groups(mod, tun, cu_seqlens.numel() - 1, H, chunk_indices.shape[0], q.device)
    ws = new_workspace(mod, T, H, chunk_indices.shape[0], q.dtype, q.device)
    gates = dict(q=q, k=k, raw_g=raw_g, raw_beta=raw_beta, A_log=A_log, g_bias=g_bias, lower_bound=lower_bound,
                 cu_seqlens=cu_seqlens, chunk_indices=chunk_indices)
    launch_prologue(mod, tun, ws, target=target, **gates, scale=scale, use_qk_l2norm=use_qk_l2norm)
    launch_wu(mod, tun, ws, **gates, v=v)
    launch_recurrence(mod, tun, ws, target=target, scale=scale, cu_seqlens=cu_seqlens,
                      chunk_offsets=chunk_offsets, out=out, state=state, groups=groups)
