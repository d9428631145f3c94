# SPDX-License-Identifier: Apache-2.0
"""The Triton path of one plan: its workspace, grids, tuning and launches. Arguments are checked before."""

from __future__ import annotations

import math
import os
from collections.abc import Callable, Mapping
from types import ModuleType

import torch
import triton

from ..kernels.kda import KDA_GROUP_SCAN, KDA_INTRA, KDA_PROLOGUE, KDA_RECURRENCE, KDA_WU
from ..launch_knobs import dense_tuning
from ..targets import TARGETS, vendor_of
from .device import INTERPRETER, interpreting, jit_launch_forced
from .fused_path import INTRA_ROWS, WALK_VALUE_NAMES, WALK_VALUES
from .group_scan import check_groups, choose_groups, device_sms, env_groups
from .launch import KernelLaunch, spec_key
from .workspace import WorkspaceLayout

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


# The chunk-parallel half (Note [Chunk-parallel design]): "intra" (kda_intra on walk chunks of at most
# INTRA_CHUNK rows) where it fits, else "pair" (kda_prologue + kda_wu at the variant's chunk).
DESIGNS = ("intra", "pair")
DESIGN_ENV = "KDAGEN_TRITON_DESIGN"
INTRA_CHUNK = 32
FUSED_INTRA_ENV = "KDAGEN_FUSED_INTRA"
FUSED_WALK_ENV = "KDAGEN_FUSED_WALK"


def diag_ref(lower_bound: float | None) -> int:
    if lower_bound is None or lower_bound < MIDPOINT_DIAG_MIN_LOWER_BOUND:
        return 0
    return 2 if lower_bound >= FACTORED_DIAG_MIN_LOWER_BOUND else 1


def intra_fits(lower_bound: float | None, use_l2norm: bool) -> str | None:
    """Why kda_intra cannot run a batch, or None.

    Note [Chunk-parallel design]
        kda_intra forms Akk and Aqk of a walk chunk in one product each, every factor relative to the G of the
        chunk's middle row, so a factor spans up to 16 rows of decay: it needs the bound of DIAG_REF 2 (16 rows
        of decay stay a normal fp32) and |q|, |k| <= 1 (the L2 norm in kernel), else a factor could overflow.
        Its inverse takes at most two 16-row diagonal blocks, so the walk steps over chunks of at most 32 rows:
        half of vLLM's 64-row chunks, which chunk_indices / chunk_offsets still count (SPLIT = 2). The pair
        (kda_prologue, kda_wu) covers every gate at the variant's chunk with its 16-row sub-blocks.
    """
    if lower_bound is None or lower_bound < FACTORED_DIAG_MIN_LOWER_BOUND:
        return (f"the gate is not bounded by lower_bound >= {FACTORED_DIAG_MIN_LOWER_BOUND:.4f} "
                f"(got {lower_bound})")
    if not use_l2norm:
        return "q and k are not L2-normed in kernel"
    return None


def chunk_design(lower_bound: float | None, use_l2norm: bool, design: str | None = None) -> str:
    """The chunk-parallel design of a plan: `design` when given, else KDAGEN_TRITON_DESIGN (an override for
    experiments), else "intra" wherever it fits. An "intra" that does not fit is an error."""
    why = intra_fits(lower_bound, use_l2norm)
    source = "design"
    if design is None and os.environ.get(DESIGN_ENV, "").strip():
        design, source = os.environ[DESIGN_ENV].strip(), DESIGN_ENV
    if design is None:
        return "pair" if why is not None else "intra"
    if design not in DESIGNS:
        raise ValueError(f"{OP}: {source}={design!r}; use one of {', '.join(DESIGNS)}, or leave it unset for the "
                         "plan's choice")
    if design == "intra" and why is not None:
        raise ValueError(f"{OP}: {source}='intra', but kda_intra cannot run this batch: {why}; use 'pair' or leave "
                         "it unset")
    return design


def walk_split(design: str, chunk: int, rows: int = INTRA_CHUNK) -> int:
    """Walk chunks per metadata chunk (the kernels' SPLIT): kda_intra's programs of `rows` rows (the target's
    intra_rows) are the walk's steps; the pair's walk steps over whole chunks."""
    return max(1, chunk // rows) if design == "intra" else 1


def launch_tuning(mod: ModuleType, tun: Mapping[str, int], n_walks: int, groups: int, device: torch.device,
                  design: str = "intra") -> dict[str, int]:
    """The knobs a batch's launches take: the target's, with its dense_* knobs in place of intra_rows,
    intra_warps and block_v when kda_intra runs and the walks fill the GPU (a plain walk, G = 1, with at least
    a program per SM at dense_block_v; the pair's whole-chunk walk was not measured with them).

    There kda_intra's share dominates: on the H200, 16-row programs on one warp and 128-row V slices made the
    call 10% faster at H=96 T=16384 N=16 and 4% at H=12 (N = 16). With fewer walks the walk's doubled steps
    cost more than they save (H=96 T=4096 N=1 +4%, H=12 T=65536 N=1 +6%; docs/perf-notes.md section 25).
    Without a GPU (no SM count) the target's own knobs."""
    sms = device_sms(device)
    dense = dense_tuning(tun)
    fill = n_walks * triton.cdiv(mod.HEAD_DIM_V, min(dense["block_v"], mod.BV))
    if design == "intra" and groups == 1 and sms is not None and fill >= sms:
        return dense
    return dict(tun)


def hip_intra_pays(n_walks: int, device: torch.device) -> bool:
    """Whether a fused plan launches the HIP kda_intra_kernel, its walk then on 16-row steps (Note [Fused plans],
    plan.py), rather than the Triton program the Triton path would run.

    On the H200 it pays wherever the (sequence, head) walks fill at least half the SMs; fitted with the Triton
    walk (0.85-0.94x the Triton path's time at N x H >= 96, 1.01-1.09x at N x H = 12 or 32 on one sequence, where
    the walk's doubled steps cost more than the kernel saves: docs/perf-notes.md section 28). With kda_walk_kernel
    the fused plans above it measure 0.66-0.69x (section 32); below it the HIP walk, which has no group split,
    would walk long sequences whole, so the rule was kept, not re-fitted. KDAGEN_FUSED_INTRA=always / never
    overrides the rule (tests, A/B runs); without an SM count (no GPU), always."""
    raw = os.environ.get(FUSED_INTRA_ENV, "").strip() or "auto"
    if raw not in ("auto", "always", "never"):
        raise ValueError(f"{FUSED_INTRA_ENV}={raw!r}: expected auto, always or never")
    if raw != "auto":
        return raw == "always"
    sms = device_sms(device)
    return sms is None or 2 * n_walks >= sms


def hip_walk_runs(lib_has_walk: bool) -> bool:
    """Whether a fused plan that launches kda_intra_kernel walks with the HIP kda_walk_kernel (one group) rather
    than the Triton walk: wherever the library has it (not on the FMA fallback), unless KDAGEN_FUSED_WALK=triton
    (A/B runs)."""
    raw = os.environ.get(FUSED_WALK_ENV, "").strip() or "hip"
    if raw not in ("hip", "triton"):
        raise ValueError(f"{FUSED_WALK_ENV}={raw!r}: expected hip or triton")
    return lib_has_walk and raw == "hip"


def tuning_for(mod: ModuleType, target: str) -> dict[str, int]:
    if target == INTERPRETER:
        return dict(next(iter(mod.TUNING.values())))
    return dict(mod.TUNING[target])


def recurrence_groups(mod: ModuleType, tun: Mapping[str, int], n_seq: int, H: int, n_chunks: int,
                      device: torch.device, groups: int | None = None, checkpoints: bool = False) -> int:
    """`groups` when given; else KDAGEN_TRITON_GROUPS (an override for experiments); else 1 for a batch that
    writes checkpoints; else the cost model's count (1 under the interpreter: no SMs to fill).

    Checkpoints keep the plain walk unless asked otherwise: at G = 1 a snapshot is bit-identical to the final
    state of a prefill cut at its offset, which is what a prefix cache resumes from. Under the split it
    differs by rounding: on the H200, 6.5e-4 at G = 2, 7.9e-4 at G = 4 and 1.3e-3 at G = 8 (K = 128, V = 256,
    2026-12-01), past vLLM's 1e-3 bound for its fused path at G = 8.
    """
    forced = groups if groups is not None else env_groups(GROUPS_ENV)
    if forced is not None:
        return check_groups(forced, OP)
    if checkpoints:
        return 1
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


def recurrence_stages(tun: Mapping[str, int], programs: int, sms: int | None) -> int:
    """Pipeline stages of one walk launch. Fewer stages take less shared memory, so more walks share an
    SM; a launch with no more programs than SMs gains nothing from that and takes the deeper pipeline
    (docs/perf-notes.md section 15). Without a GPU (sms None), recurrence_stages."""
    if sms is not None and programs <= sms:
        return tun["recurrence_stages_sparse"]
    return tun["recurrence_stages"]


def fp32_dot(target: str) -> str:
    return "ieee" if target == INTERPRETER or target not in TARGETS else TARGETS[target].triton_fp32_dot




# The per-run values every launch reads (plan.bind builds them in this order; kdagen/kernels/kda.py names them).
RUN_ORDER = ("q", "k", "v", "raw_g", "raw_beta", "A_log", "g_bias", "scale", "sq_t", "sq_h", "sk_t", "sk_h", "sv_t",
             "sv_h", "sg_t", "sg_h", "sb_t", "sb_h", "o", "so_t", "so_h", "h0", "ht", "sh0_n", "sh0_h", "sht_n",
             "sht_h", "n_slots", "ckpt", "sck_n", "n_ckpt_rows")
assert RUN_ORDER[WALK_VALUES] == WALK_VALUE_NAMES and RUN_ORDER[7] == "scale", "fused_path.HipWalkLaunch's values"


def workspace_layout(mod: ModuleType, T: int, H: int, n_chunks: int, N: int, groups: int,
                     io: torch.dtype, design: str = "pair", rows: int = INTRA_CHUNK) -> WorkspaceLayout:
    """What the prologue kernels write and the recurrence reads (docs/design.md section 1.4), token-major.

    The interpreter rounds fp32 -> bf16 toward zero where GPUs round to nearest even, so under it the
    workspace stays fp32 and CPU tests see the algorithm's own error; GPU runs store the I/O dtype.
    kda_intra hands nothing to a second kernel (no tinv, rnorm) and its aqk and decay are per walk chunk.
    Group workspaces (fp32, G > 1): pass 1's operator rows [G - 1, N, H, BV + BK, BK] (B_g, then M_g) and
    the scanned start states [G, N, H, BV, BK].
    """
    io = torch.float32 if interpreting() else io
    f32 = torch.float32
    split = walk_split(design, mod.CHUNK_SIZE, rows)
    wbt = mod.CHUNK_SIZE // split
    bufs = [("qg", (T, H, mod.BK), io), ("w", (T, H, mod.BK), io), ("kg", (T, H, mod.BK), io),
            ("u", (T, H, mod.BV), io), ("aqk", (T, H, wbt), io)]
    if design == "pair":
        bufs += [("tinv", (T, H, wbt), io), ("rnorm", (T, H, 2), f32)]
    bufs.append(("decay", (max(n_chunks * split, 1), H, mod.BK), f32))
    if groups > 1:
        bufs += [("group_op", (groups - 1, N, H, mod.BV + mod.BK, mod.BK), f32),
                 ("group_in", (groups, N, H, mod.BV, mod.BK), f32)]
    return WorkspaceLayout.of(bufs)


class TritonProgram:
    """Every launch of one plan on the Triton path, built once; `run(values, state_in)` launches them.

    state_in: 0 zeros, 1 dense initial_state, 2 the paged cache (the recurrence's STATE_IN); the walk
    launches for each state_in the plan can see are built up front.
    """

    def __init__(self, mod: ModuleType, *, target: str, tuning: Mapping[str, int], ws: Mapping[str, torch.Tensor],
                 H: int, N: int, n_chunks: int, groups: int, lower_bound: float | None, has_bias: bool,
                 use_l2norm: bool, cu_seqlens: torch.Tensor, chunk_indices: torch.Tensor,
                 chunk_offsets: torch.Tensor, state_ins: tuple[int, ...], state_out: int,
                 state_indices: torch.Tensor | None, has_initial_state: torch.Tensor | None,
                 device: torch.device, checkpoint_offsets: torch.Tensor | None = None,
                 checkpoint_state_indices: torch.Tensor | None = None, design: str = "pair",
                 hip_intra: Callable[[dict[str, torch.Tensor]], Callable] | None = None,
                 hip_walk: Callable[[dict[str, torch.Tensor], int], Callable] | None = None):
        tun = tuning
        split = walk_split(design, mod.CHUNK_SIZE, tun["intra_rows"])
        self.groups = groups = check_groups(groups, OP)
        # Note [Compiled launch]: NVIDIA GPUs only; the interpreter has no compiled kernels.
        self.direct = direct = (not interpreting() and device.type == "cuda" and vendor_of(target) == "nvidia"
                                and not jit_launch_forced())
        lb = float(lower_bound) if lower_bound is not None else 0.0
        dot_f32 = interpreting()
        self.prologue: KernelLaunch | None = None
        self.wu: KernelLaunch | None = None
        self.intra: KernelLaunch | None = None
        if n_chunks > 0 and H > 0 and design == "intra" and hip_intra is not None:
            # The fused path's plans: the HIP kda_intra_kernel writes the same workspace (16-row walk chunks).
            if mod.CHUNK_SIZE // split != INTRA_ROWS:
                raise ValueError(f"{OP}: the HIP kda_intra_kernel takes {INTRA_ROWS}-row walk chunks, this plan "
                                 f"{mod.CHUNK_SIZE // split}")
            self.intra = hip_intra(dict(ws))
        elif n_chunks > 0 and H > 0 and design == "intra":
            self.intra = KernelLaunch(
                mod, KDA_INTRA, (n_chunks * split, H),
                constexprs=dict(SPLIT=split, BLOCK_V=min(tun["intra_block_v"], mod.BV), HAS_BIAS=has_bias,
                                DOT_F32=dot_f32, FP32_DOT=fp32_dot(target)),
                options=dict(num_warps=tun["intra_warps"], num_stages=tun["intra_stages"]),
                static=dict(cu_seqlens=cu_seqlens, chunk_indices=chunk_indices, lower_bound=lb, H=H, qg_ws=ws["qg"],
                            w_ws=ws["w"], kg_ws=ws["kg"], u_ws=ws["u"], aqk_ws=ws["aqk"], decay_ws=ws["decay"]),
                run_order=RUN_ORDER, direct=direct)
        elif n_chunks > 0 and H > 0:
            chunk_static = dict(cu_seqlens=cu_seqlens, chunk_indices=chunk_indices, lower_bound=lb, H=H)
            gates = dict(LOWER_BOUND=lower_bound is not None, HAS_BIAS=has_bias, DOT_F32=dot_f32)
            self.prologue = KernelLaunch(
                mod, KDA_PROLOGUE, (n_chunks, H),
                constexprs=dict(gates, BLOCK_K=tun["prologue_block_k"], USE_L2NORM=use_l2norm,
                                DIAG_REF=diag_ref(lower_bound), FP32_DOT=fp32_dot(target)),
                options=dict(num_warps=tun["prologue_warps"], num_stages=tun["prologue_stages"]),
                static=dict(chunk_static, aqk_ws=ws["aqk"], tinv_ws=ws["tinv"], rnorm_ws=ws["rnorm"]),
                run_order=RUN_ORDER, direct=direct)
            self.wu = KernelLaunch(
                mod, KDA_WU, (n_chunks, H), constexprs=dict(gates, BLOCK_K=tun["wu_block_k"]),
                options=dict(num_warps=tun["wu_warps"], num_stages=tun["wu_stages"]),
                static=dict(chunk_static, tinv_ws=ws["tinv"], rnorm_ws=ws["rnorm"], qg_ws=ws["qg"], w_ws=ws["w"],
                            kg_ws=ws["kg"], u_ws=ws["u"], decay_ws=ws["decay"]),
                run_order=RUN_ORDER, direct=direct)
        self.walks: dict[int, tuple[KernelLaunch, ...]] = {}
        if N > 0 and H > 0:
            # Any valid pointer stands in for an unused argument; the constexprs keep the kernel from reading it.
            spare = ws["decay"]
            idx = state_indices if state_indices is not None else cu_seqlens
            flag = has_initial_state if has_initial_state is not None else cu_seqlens
            group_op, group_in = ws.get("group_op", spare), ws.get("group_in", spare)
            sms = device_sms(device)
            block_v = min(tun["block_v"], mod.BV)
            walk_static = dict(qg_ws=ws["qg"], w_ws=ws["w"], kg_ws=ws["kg"], u_ws=ws["u"], aqk_ws=ws["aqk"],
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
                    mod, KDA_RECURRENCE, grid,
                    constexprs=dict(BLOCK_V=block, STATE_IN=state_in, STATE_OUT=state_out, PASS=pass_,
                                    DOT_F32=dot_f32, CHECKPOINT=mode, SPLIT=split),
                    options=dict(num_warps=tun["recurrence_warps"],
                                 num_stages=recurrence_stages(tun, grid[0] * grid[1] * grid[2], sms)),
                    static={**walk_static, **ck}, run_order=RUN_ORDER, direct=direct)

            for state_in in state_ins:
                if groups == 1 and hip_walk is not None:
                    # The fused path's plans: the HIP kda_walk_kernel on the HIP kda_intra_kernel's workspace.
                    self.walks[state_in] = (hip_walk(dict(ws), state_in),)
                    continue
                if groups == 1:
                    self.walks[state_in] = (walk(0, mod.HEAD_DIM_V, 1, block_v, state_in),)
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
                self.walks[state_in] = (walk(1, mod.BV + mod.BK, groups - 1, min(block_v, mod.BK), state_in), scan,
                                        walk(2, mod.HEAD_DIM_V, groups, block_v, state_in))

    def launches(self, state_in: int) -> tuple[KernelLaunch, ...]:
        pre = tuple(x for x in (self.intra, self.prologue, self.wu) if x is not None)
        return pre + self.walks.get(state_in, ())

    def run(self, values: list, state_in: int) -> None:
        key = spec_key(values) if self.direct else None
        if self.intra is not None:
            self.intra(values, key)
        elif self.prologue is not None:
            self.prologue(values, key)
            self.wu(values, key)  # type: ignore[misc]
        for launch in self.walks.get(state_in, ()):
            launch(values, key)
