# SPDX-License-Identifier: Apache-2.0
"""The Triton stages of a plan (Note [Pipelines], pipeline.py): their workspace buffers and launches.

Which stages run, with which knobs and group count, is pipeline.choose_pipeline's; this module builds what it
chose. Arguments are checked before.
"""

from __future__ import annotations

from collections.abc import Mapping
from types import ModuleType

import torch
import triton

from ..kernels.kda import (KDA_GROUP_SCAN, KDA_INTRA, KDA_INTRA_TB, KDA_PROLOGUE, KDA_RECURRENCE, KDA_RECURRENCE_TB,
                           KDA_WU)
from ..targets import TARGETS
from .device import INTERPRETER, interpreting
from .launch import KernelLaunch
from .pipeline import INTRA_MIN_LOWER_BOUND
from .run_values import RUN_ORDER
from .settings import GROUPS_ENV  # noqa: F401  (tools pin the group count through it)
from .workspace import WorkspaceLayout

# kda_group_scan: state rows per program (tl.dot's smallest tile).
SCAN_ROWS = 16

# The prologue's diagonal 16 x 16 blocks take their operands relative to the sub-block's mid-point (kernel
# DIAG_REF). A bounded gate keeps |g| <= |lower_bound| per token, |lower_bound| / ln 2 in the kernel's log2:
# - DIAG_REF 2 reuses factors that span all 16 rows of a sub-block, so 16 rows of decay must stay a normal
#   fp32 (exponent >= -126): |lower_bound| <= 125 ln 2 / 16;
# - DIAG_REF 1 spans 8 rows each way from the mid-point: 8 / ln 2 * |lower_bound| < 126 up to -10;
# - DIAG_REF 0, exact per-row products in fp32, for softplus gates and larger bounds.
FACTORED_DIAG_MIN_LOWER_BOUND = INTRA_MIN_LOWER_BOUND  # 125 ln 2 / 16: the bound kda_intra needs too
MIDPOINT_DIAG_MIN_LOWER_BOUND = -10.0

# Note [Chunk-parallel design]
#     kda_intra forms Akk and Aqk of a walk chunk in one product each, every factor relative to the G of the
#     chunk's middle row, so a factor spans up to 16 rows of decay: it needs the bound of DIAG_REF 2 (16 rows
#     of decay stay a normal fp32) and |q|, |k| <= 1 (the L2 norm in kernel), else a factor could overflow
#     (pipeline.intra_fits). Its inverse takes at most two 16-row diagonal blocks, so the walk steps over chunks
#     of at most 32 rows: half of vLLM's 64-row chunks, which chunk_indices / chunk_offsets still count
#     (SPLIT = 2). The pair (kda_prologue, kda_wu) covers every gate at the variant's chunk with its 16-row
#     sub-blocks.
INTRA_CHUNK = 32
# The chunk-stage designs: "intra" (kda_intra), "tb" (kda_intra_tb: T diag(beta) in place of u, the walk forms u
# from v), "pair" (kda_prologue + kda_wu). The first two step the walk over kda_intra's programs.
DESIGNS = {"triton_intra": "intra", "triton_intra_tb": "tb", "triton_pair": "pair", "hip_intra": "intra"}
# kda_intra_tb's column slice on 16-row programs (docs/performance-model.md, "What limits kda_intra"): on sm_90 at
# one warp, 16-wide slices take 117 registers and no spills where whole rows take 255 and spill, so 17 programs
# share an SM instead of 8, for 1.4x the instructions. 32-row programs on two warps gain no programs per SM from
# slices (201 registers at 16 columns), so they keep whole rows. A compile reading, not a timing: a tuning's
# intra_tb_block_k knob overrides it.
TB_BLOCK_K = 16


def tb_block_k(tun: Mapping[str, int], bk: int) -> int:
    """kda_intra_tb's BLOCK_K: the intra_tb_block_k knob if the tuning has one, else TB_BLOCK_K on 16-row programs
    and whole rows (BK) otherwise; at most BK."""
    if "intra_tb_block_k" in tun:
        return min(tun["intra_tb_block_k"], bk)
    return min(TB_BLOCK_K, bk) if tun["intra_rows"] == 16 else bk


def diag_ref(lower_bound: float | None) -> int:
    if lower_bound is None or lower_bound < MIDPOINT_DIAG_MIN_LOWER_BOUND:
        return 0
    return 2 if lower_bound >= FACTORED_DIAG_MIN_LOWER_BOUND else 1


def walk_split(design: str, chunk: int, rows: int = INTRA_CHUNK) -> int:
    """Walk chunks per metadata chunk (the kernels' SPLIT): kda_intra's programs of `rows` rows (the target's
    intra_rows) are the walk's steps; the pair's walk steps over whole chunks."""
    return max(1, chunk // rows) if design in ("intra", "tb") else 1


def tuning_for(mod: ModuleType, target: str) -> dict[str, int]:
    if target == INTERPRETER:
        return dict(next(iter(mod.TUNING.values())))
    return dict(mod.TUNING[target])


def recurrence_stages(tun: Mapping[str, int], programs: int, sms: int | None) -> int:
    """Pipeline stages of one walk launch. Fewer stages take less shared memory, so more walks share an
    SM; a launch with no more programs than SMs gains nothing from that and takes the deeper pipeline
    (docs/performance-model.md, "Walk pipeline stages"). Without a GPU (sms None), recurrence_stages."""
    if sms is not None and programs <= sms:
        return tun["recurrence_stages_sparse"]
    return tun["recurrence_stages"]


def fp32_dot(target: str) -> str:
    return "ieee" if target == INTERPRETER or target not in TARGETS else TARGETS[target].triton_fp32_dot


Specs = list[tuple[str, tuple[int, ...], torch.dtype]]


def chunk_buffers(design: str, T: int, H: int, bk: int, bv: int, chunk: int, n_chunks: int, io: torch.dtype,
                  rows: int = INTRA_CHUNK) -> Specs:
    """What a chunk stage writes and the walk reads (docs/design.md, "The workspace"), token-major: the Triton
    intra and the HIP intra ("intra", on walk chunks of `rows` rows) write qg, w, kg, u, their aqk and decay per
    walk chunk; kda_intra_tb ("tb") writes tb (T diag(beta), [T, H, rows]) in place of u; the pair ("pair") adds
    its tinv and rnorm for kda_wu.

    The interpreter rounds fp32 -> bf16 toward zero where GPUs round to nearest even, so under it the
    workspace stays fp32 and CPU tests see the algorithm's own error; GPU runs store the I/O dtype."""
    io = torch.float32 if interpreting() else io
    split = walk_split(design, chunk, rows)
    wbt = chunk // split
    u = ("tb", (T, H, wbt), io) if design == "tb" else ("u", (T, H, bv), io)
    bufs = [("qg", (T, H, bk), io), ("w", (T, H, bk), io), ("kg", (T, H, bk), io), u, ("aqk", (T, H, wbt), io)]
    if design == "pair":
        bufs += [("tinv", (T, H, wbt), io), ("rnorm", (T, H, 2), torch.float32)]
    bufs.append(("decay", (max(n_chunks * split, 1), H, bk), torch.float32))
    return bufs


def walk_buffers(groups: int, N: int, H: int, bk: int, bv: int) -> Specs:
    """The Triton walk's group workspaces (fp32, G > 1): pass 1's operator rows [G - 1, N, H, BV + BK, BK] (B_g,
    then M_g) and the scanned start states [G, N, H, BV, BK]."""
    if groups <= 1:
        return []
    return [("group_op", (groups - 1, N, H, bv + bk, bk), torch.float32),
            ("group_in", (groups, N, H, bv, bk), torch.float32)]


def workspace_layout(mod: ModuleType, T: int, H: int, n_chunks: int, N: int, groups: int,
                     io: torch.dtype, design: str = "pair", rows: int = INTRA_CHUNK) -> WorkspaceLayout:
    """The workspace of the Triton stages of `mod` (tools and tests; plans compose the stages' buffers)."""
    return WorkspaceLayout.of(chunk_buffers(design, T, H, mod.BK, mod.BV, mod.CHUNK_SIZE, n_chunks, io, rows)
                              + walk_buffers(groups, N, H, mod.BK, mod.BV))


def chunk_launches(mod: ModuleType, design: str, *, target: str, tuning: Mapping[str, int],
                   ws: Mapping[str, torch.Tensor], H: int, n_chunks: int, lower_bound: float | None,
                   has_bias: bool, use_l2norm: bool, cu_seqlens: torch.Tensor, chunk_indices: torch.Tensor,
                   direct: bool) -> dict[str, KernelLaunch]:
    """The Triton chunk stage: {"intra": kda_intra} ("intra"), {"intra": kda_intra_tb} ("tb") or {"prologue", "wu"}
    ("pair"); {} for no work."""
    if n_chunks == 0 or H == 0:
        return {}
    tun = tuning
    lb = float(lower_bound) if lower_bound is not None else 0.0
    dot_f32 = interpreting()
    if design == "intra":
        split = walk_split(design, mod.CHUNK_SIZE, tun["intra_rows"])
        return {"intra": KernelLaunch(
            mod, KDA_INTRA, (n_chunks * split, H),
            constexprs=dict(SPLIT=split, BLOCK_V=min(tun["intra_block_v"], mod.BV), HAS_BIAS=has_bias,
                            DOT_F32=dot_f32, FP32_DOT=fp32_dot(target)),
            options=dict(num_warps=tun["intra_warps"], num_stages=tun["intra_stages"]),
            static=dict(cu_seqlens=cu_seqlens, chunk_indices=chunk_indices, lower_bound=lb, H=H, qg_ws=ws["qg"],
                        w_ws=ws["w"], kg_ws=ws["kg"], u_ws=ws["u"], aqk_ws=ws["aqk"], decay_ws=ws["decay"]),
            run_order=RUN_ORDER, direct=direct)}
    if design == "tb":
        split = walk_split(design, mod.CHUNK_SIZE, tun["intra_rows"])
        return {"intra": KernelLaunch(
            mod, KDA_INTRA_TB, (n_chunks * split, H),
            constexprs=dict(SPLIT=split, BLOCK_K=tb_block_k(tun, mod.BK), HAS_BIAS=has_bias, DOT_F32=dot_f32,
                            FP32_DOT=fp32_dot(target)),
            options=dict(num_warps=tun["intra_warps"], num_stages=tun["intra_stages"]),
            static=dict(cu_seqlens=cu_seqlens, chunk_indices=chunk_indices, lower_bound=lb, H=H, qg_ws=ws["qg"],
                        w_ws=ws["w"], kg_ws=ws["kg"], tb_ws=ws["tb"], aqk_ws=ws["aqk"], decay_ws=ws["decay"]),
            run_order=RUN_ORDER, direct=direct)}
    chunk_static = dict(cu_seqlens=cu_seqlens, chunk_indices=chunk_indices, lower_bound=lb, H=H)
    gates = dict(LOWER_BOUND=lower_bound is not None, HAS_BIAS=has_bias, DOT_F32=dot_f32)
    return {
        "prologue": KernelLaunch(
            mod, KDA_PROLOGUE, (n_chunks, H),
            constexprs=dict(gates, BLOCK_K=tun["prologue_block_k"], USE_L2NORM=use_l2norm,
                            DIAG_REF=diag_ref(lower_bound), FP32_DOT=fp32_dot(target)),
            options=dict(num_warps=tun["prologue_warps"], num_stages=tun["prologue_stages"]),
            static=dict(chunk_static, aqk_ws=ws["aqk"], tinv_ws=ws["tinv"], rnorm_ws=ws["rnorm"]),
            run_order=RUN_ORDER, direct=direct),
        "wu": KernelLaunch(
            mod, KDA_WU, (n_chunks, H), constexprs=dict(gates, BLOCK_K=tun["wu_block_k"]),
            options=dict(num_warps=tun["wu_warps"], num_stages=tun["wu_stages"]),
            static=dict(chunk_static, tinv_ws=ws["tinv"], rnorm_ws=ws["rnorm"], qg_ws=ws["qg"], w_ws=ws["w"],
                        kg_ws=ws["kg"], u_ws=ws["u"], decay_ws=ws["decay"]),
            run_order=RUN_ORDER, direct=direct)}


def walk_launches(mod: ModuleType, *, split: int, target: str, tuning: Mapping[str, int],
                  ws: Mapping[str, torch.Tensor], H: int, N: int, groups: int, sms: int | None,
                  cu_seqlens: torch.Tensor, chunk_offsets: torch.Tensor, state_ins: tuple[int, ...], state_out: int,
                  state_indices: torch.Tensor | None, has_initial_state: torch.Tensor | None,
                  checkpoint_offsets: torch.Tensor | None, checkpoint_state_indices: torch.Tensor | None,
                  direct: bool, u_from_v: bool = False) -> dict[int, tuple[KernelLaunch, ...]]:
    """The Triton walk stage: per state_in, the plain walk (G = 1) or pass 1, the group scan and pass 2.
    u_from_v: kda_recurrence_tb, which forms u from v and the workspace's tb (triton_walk_tb), else
    kda_recurrence reading u."""
    walks: dict[int, tuple[KernelLaunch, ...]] = {}
    if N == 0 or H == 0:
        return walks
    tun = tuning
    dot_f32 = interpreting()
    # Any valid pointer stands in for an unused argument; the constexprs keep the kernel from reading it.
    spare = ws["decay"]
    idx = state_indices if state_indices is not None else cu_seqlens
    flag = has_initial_state if has_initial_state is not None else cu_seqlens
    group_op, group_in = ws.get("group_op", spare), ws.get("group_in", spare)
    block_v = min(tun["block_v"], mod.BV)
    kernel, u_source = (KDA_RECURRENCE_TB, dict(tb_ws=ws["tb"])) if u_from_v else (KDA_RECURRENCE, dict(u_ws=ws["u"]))
    walk_static = dict(qg_ws=ws["qg"], w_ws=ws["w"], kg_ws=ws["kg"], **u_source, aqk_ws=ws["aqk"],
                       decay_ws=ws["decay"], state_indices=idx, has_initial_state=flag,
                       cu_seqlens=cu_seqlens, chunk_offsets=chunk_offsets, group_op=group_op,
                       group_in=group_in, H=H, n_seq=N, G=groups)
    # Checkpoints (passes 0 and 2): mode 1 writes row n, mode 2 row checkpoint_state_indices[n]; the
    # arguments a mode does not read are None, so Triton compiles them away.
    ck_mode = 0 if checkpoint_offsets is None else 1 if checkpoint_state_indices is None else 2
    no_ck = dict(ckpt=None, ckpt_off=None, ckpt_idx=None, sck_n=None, n_ckpt_rows=None)

    def walk(pass_: int, rows: int, grid_groups: int, block: int, state_in: int) -> KernelLaunch:
        grid = (N * H, triton.cdiv(rows, block), grid_groups)
        mode = ck_mode if pass_ != 1 else 0
        ck = no_ck if mode == 0 else dict(ckpt_off=checkpoint_offsets,
                                          ckpt_idx=checkpoint_state_indices if mode == 2 else None)
        return KernelLaunch(
            mod, kernel, grid,
            constexprs=dict(BLOCK_V=block, STATE_IN=state_in, STATE_OUT=state_out, PASS=pass_,
                            DOT_F32=dot_f32, CHECKPOINT=mode, SPLIT=split),
            options=dict(num_warps=tun["recurrence_warps"],
                         num_stages=recurrence_stages(tun, grid[0] * grid[1] * grid[2], sms)),
            static={**walk_static, **ck}, run_order=RUN_ORDER, direct=direct)

    for state_in in state_ins:
        if groups == 1:
            walks[state_in] = (walk(0, mod.HEAD_DIM_V, 1, block_v, state_in),)
            continue
        # Pass 1's row slices must not straddle the state / transfer boundary at BV: a block dividing
        # BV and BK.
        scan_rows = min(SCAN_ROWS, mod.BV)
        scan = KernelLaunch(
            mod, KDA_GROUP_SCAN, (N * H, triton.cdiv(mod.BV, scan_rows)),
            constexprs=dict(BLOCK_V=scan_rows, STATE_IN=state_in, FP32_DOT=fp32_dot(target), SPLIT=split),
            options=dict(num_warps=4, num_stages=1),
            static=dict(group_op=group_op, group_in=group_in, state_indices=idx, has_initial_state=flag,
                        cu_seqlens=cu_seqlens, H=H, n_seq=N, G=groups),
            run_order=RUN_ORDER, direct=direct)
        walks[state_in] = (walk(1, mod.BV + mod.BK, groups - 1, min(block_v, mod.BK), state_in), scan,
                           walk(2, mod.HEAD_DIM_V, groups, block_v, state_in))
    return walks
