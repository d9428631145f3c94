# SPDX-License-Identifier: Apache-2.0
"""The Triton path's kernels (templates/triton/kda_chunk.py.j2), declared once. See Note [Kernel ABI].

Token-major workspaces ([T, H, *], docs/design.md, "The workspace"): qg, w, kg [T, H, BK], u [T, H, BV] and
aqk, tinv, tb [T, H, walk chunk] in the I/O dtype (fp32 under the interpreter), decay [walk chunks, H, BK] and
rnorm [T, H, 2] fp32. Strides are in elements; `s<x>_t`, `s<x>_h` are a tensor's token and head strides.
SPLIT: the walk's chunks per metadata chunk (1: the kernel pair at the variant's chunk, 2 or 4: kda_intra's
32- or 16-row programs); chunk_indices and chunk_offsets always count the variant's (vLLM's) chunks.
"""

from __future__ import annotations

from .schema import KernelABI, Param, constexpr, f32, i32, ptr


def _al(name: str) -> Param:
    # A stride that is a multiple of 16 on contiguous tensors (D, V x K, H x D with D in 16s); beta's [T, H]
    # strides are H and 1 instead.
    return i32(name, typical="aligned")

_GATE_INPUTS = (
    ptr("q", "io"), ptr("k", "io"), ptr("raw_g", "io"), ptr("raw_beta", "io"), ptr("A_log", "fp32"),
    ptr("g_bias", "fp32", doc="A_log when there is no bias (never read then)"),
    ptr("cu_seqlens", "i32"), ptr("chunk_indices", "i32"),
)

KDA_PROLOGUE = KernelABI("kda_prologue", (
    *_GATE_INPUTS,
    ptr("aqk_ws", "io", writes=True), ptr("tinv_ws", "io", writes=True), ptr("rnorm_ws", "fp32", writes=True),
    f32("scale"), f32("lower_bound"),
    _al("sq_t"), _al("sq_h"), _al("sk_t"), _al("sk_h"), _al("sg_t"), _al("sg_h"),
    i32("sb_t"), i32("sb_h", typical="one"),
    i32("H"),
    constexpr("BLOCK_K", "column-slice width"), constexpr("LOWER_BOUND", "the bounded (sigmoid) gate"),
    constexpr("HAS_BIAS"), constexpr("USE_L2NORM"), constexpr("DIAG_REF", "diagonal blocks' reference rows"),
    constexpr("DOT_F32", "interpreter: fp32 matrix operands"), constexpr("FP32_DOT", "per-target fp32 dot"),
))

KDA_WU = KernelABI("kda_wu", (
    ptr("q", "io"), ptr("k", "io"), ptr("v", "io"), *_GATE_INPUTS[2:],
    ptr("tinv_ws", "io"), ptr("rnorm_ws", "fp32"),
    ptr("qg_ws", "io", writes=True), ptr("w_ws", "io", writes=True), ptr("kg_ws", "io", writes=True),
    ptr("u_ws", "io", writes=True), ptr("decay_ws", "fp32", writes=True),
    f32("lower_bound"),
    _al("sq_t"), _al("sq_h"), _al("sk_t"), _al("sk_h"), _al("sv_t"), _al("sv_h"), _al("sg_t"), _al("sg_h"),
    i32("sb_t"), i32("sb_h", typical="one"),
    i32("H"),
    constexpr("BLOCK_K"), constexpr("LOWER_BOUND"), constexpr("HAS_BIAS"), constexpr("DOT_F32"),
))

KDA_INTRA = KernelABI("kda_intra", (
    ptr("q", "io"), ptr("k", "io"), ptr("v", "io"), *_GATE_INPUTS[2:],
    ptr("qg_ws", "io", writes=True), ptr("w_ws", "io", writes=True), ptr("kg_ws", "io", writes=True),
    ptr("u_ws", "io", writes=True), ptr("aqk_ws", "io", writes=True), ptr("decay_ws", "fp32", writes=True),
    f32("scale"), f32("lower_bound"),
    _al("sq_t"), _al("sq_h"), _al("sk_t"), _al("sk_h"), _al("sv_t"), _al("sv_h"), _al("sg_t"), _al("sg_h"),
    i32("sb_t"), i32("sb_h", typical="one"),
    i32("H"),
    constexpr("SPLIT", "programs (walk chunks) per metadata chunk"), constexpr("BLOCK_V", "u's column slice"),
    constexpr("HAS_BIAS"), constexpr("DOT_F32"), constexpr("FP32_DOT"),
))

# kda_intra without v and u: it writes the [WBT, WBT] factor T diag(beta) (tb_ws, [T, H, walk chunk]) instead,
# from which kda_recurrence_tb forms u.
KDA_INTRA_TB = KernelABI("kda_intra_tb", (
    *_GATE_INPUTS,
    ptr("qg_ws", "io", writes=True), ptr("w_ws", "io", writes=True), ptr("kg_ws", "io", writes=True),
    ptr("tb_ws", "io", writes=True), ptr("aqk_ws", "io", writes=True), ptr("decay_ws", "fp32", writes=True),
    f32("scale"), f32("lower_bound"),
    _al("sq_t"), _al("sq_h"), _al("sk_t"), _al("sk_h"), _al("sg_t"), _al("sg_h"),
    i32("sb_t"), i32("sb_h", typical="one"),
    i32("H"),
    constexpr("SPLIT", "programs (walk chunks) per metadata chunk"),
    constexpr("BLOCK_K", "column-slice width (BK: whole rows)"),
    constexpr("HAS_BIAS"), constexpr("DOT_F32"), constexpr("FP32_DOT"),
))


def _walk(name: str, u_source: tuple[Param, ...], v_strides: tuple[Param, ...]) -> KernelABI:
    # kda_recurrence reads u_ws; kda_recurrence_tb reads kda_intra_tb's tb_ws and v instead.
    return KernelABI(name, (
        ptr("qg_ws", "io"), ptr("w_ws", "io"), ptr("kg_ws", "io"), *u_source, ptr("aqk_ws", "io"),
        ptr("decay_ws", "fp32"),
        ptr("o", "io", writes=True), ptr("h0", "fp32", doc="dense initial state, or the paged cache"),
        ptr("ht", "fp32", writes=True, doc="dense final state, or the paged cache"),
        ptr("state_indices", "i32"), ptr("has_initial_state", "i1"),
        ptr("cu_seqlens", "i32"), ptr("chunk_offsets", "i64"),
        ptr("group_op", "fp32", writes=True), ptr("group_in", "fp32", writes=True),
        f32("scale"),
        *v_strides, _al("so_t"), _al("so_h"), _al("sh0_n"), _al("sh0_h"), _al("sht_n"), _al("sht_h"),
        i32("H"), i32("n_slots"), i32("n_seq", specialize=False), i32("G", specialize=False),
        # Checkpoints (None each without them, and in pass 1: the kernel then compiles as if they did not exist).
        ptr("ckpt", "fp32", writes=True, doc="checkpoint_state [rows, H, V, K]"), ptr("ckpt_off", "i32"),
        ptr("ckpt_idx", "i32"), _al("sck_n"), i32("n_ckpt_rows"),
        constexpr("BLOCK_V"), constexpr("STATE_IN", "0 zeros, 1 dense, 2 paged"),
        constexpr("STATE_OUT", "0 none, 1 dense, 2 paged"), constexpr("PASS", "0 plain walk, 1 and 2 the group split"),
        constexpr("DOT_F32"), constexpr("CHECKPOINT", "0 none, 1 row n, 2 row ckpt_idx[n]"),
        constexpr("SPLIT", "walk chunks per metadata chunk"),
    ))


KDA_RECURRENCE = _walk("kda_recurrence", (ptr("u_ws", "io"),), ())
KDA_RECURRENCE_TB = _walk("kda_recurrence_tb", (ptr("v", "io"), ptr("tb_ws", "io")), (_al("sv_t"), _al("sv_h")))

KDA_GROUP_SCAN = KernelABI("kda_group_scan", (
    ptr("group_op", "fp32"), ptr("group_in", "fp32", writes=True), ptr("h0", "fp32"), ptr("state_indices", "i32"),
    ptr("has_initial_state", "i1"), ptr("cu_seqlens", "i32"),
    _al("sh0_n"), _al("sh0_h"),
    i32("H"), i32("n_slots"), i32("n_seq", specialize=False), i32("G", specialize=False),
    constexpr("BLOCK_V"), constexpr("STATE_IN"), constexpr("FP32_DOT"), constexpr("SPLIT"),
))

KERNELS: dict[str, KernelABI] = {k.name: k for k in (KDA_PROLOGUE, KDA_WU, KDA_INTRA, KDA_INTRA_TB, KDA_RECURRENCE,
                                                     KDA_RECURRENCE_TB, KDA_GROUP_SCAN)}
