# SPDX-License-Identifier: Apache-2.0
"""kda_intra and kda_intra_tb: kda_prologue and kda_wu in one program per (walk chunk of 16 or 32 rows, head).

For the bounded gate with |lower_bound| <= 125 ln 2 / 16 and L2-normed q and k (the plan's rule,
triton_path.intra_fits): each input is read once and only what the walk reads is written (docs/design.md,
"The chunk stages"). kda_intra writes u = T diag(beta) v; kda_intra_tb writes the [WBT, WBT] factor T diag(beta)
instead and does not read v, so that the walk that follows (kda_recurrence_tb) forms u from v: 512 fewer bytes
per token and head at V = 128 (docs/performance-model.md, "Bytes by design"). K: the head dim, BK, BV: the head
dims padded to powers of two, BT: the variant's chunk, BC: the sub-block rows, IO: the I/O dtype.
"""

import triton
import triton.language as tl

from .common import bias_row, chunk_gate, chunk_rows, fast_sigmoid, gate_a, mm, mm32, mma_wide, to_io, u_slices


@triton.jit
def walk_chunk(chunk_indices, cu_seqlens, SPLIT: tl.constexpr, BT: tl.constexpr):
    # This program's walk chunk: its index, first token and valid rows. A walk chunk is WBT = BT / SPLIT rows,
    # the metadata chunk's SPLIT-th part; L <= 0 for a part past its sequence's end, whose loads and stores are
    # then all masked off.
    i_s = tl.program_id(0).to(tl.int64)
    t0, L = chunk_rows(chunk_indices, cu_seqlens, i_s // SPLIT, BT)
    part = i_s % SPLIT
    return i_s, t0 + part * (BT // SPLIT), L - part * (BT // SPLIT)


@triton.jit
def unit_inverse(b_A, o_t, WBT: tl.constexpr, BC: tl.constexpr, FP32_DOT: tl.constexpr):
    # T = (I + A)^-1 in fp32 for strictly lower-triangular A. Diagonal BC-row blocks by forward substitution,
    # row r of every block per step (their column ranges are disjoint, so one reduction gathers the rows): with
    # N = T - I, N[r, :] = -A[r, :] - A[r, :] @ N.
    same = (o_t // BC)[:, None] == (o_t // BC)[None, :]
    b_T = tl.where(same, -b_A, 0.0)
    for r in range(1, BC):
        sel = (o_t % BC == r)[:, None]
        b_row = tl.sum(tl.where(sel, b_T, 0.0), axis=0)
        b_row = b_row + tl.sum(b_row[:, None] * b_T, axis=0)
        b_T = tl.where(sel & same, b_row[None, :], b_T)
    b_T = b_T + (o_t[:, None] == o_t[None, :]).to(tl.float32)
    if WBT > BC:
        # Two blocks: with Td the block-diagonal inverse and O the off-diagonal block of A, O Td O = 0, so
        # (I + A)^-1 = Td - Td O Td exactly.
        b_T = b_T - mm32(b_T, mm32(tl.where(same, 0.0, b_A), b_T, FP32_DOT), FP32_DOT)
    return b_T


@triton.jit
def chunk_setup(A_log, cu_seqlens, chunk_indices, H, SPLIT: tl.constexpr, BT: tl.constexpr):
    # This program's head, walk chunk (index, valid rows L), its rows (o_t, m_t, tokens, workspace rows) and
    # gate_a's pair.
    i_h = tl.program_id(1)
    i_s, t0, L = walk_chunk(chunk_indices, cu_seqlens, SPLIT, BT)
    o_t = tl.arange(0, BT // SPLIT)
    m_t = o_t < L
    tok = t0 + o_t
    a_h, a_x = gate_a(A_log, i_h, True)
    return i_h, i_s, L, o_t, m_t, tok, tok * H + i_h, a_h, a_x


@triton.jit
def chunk_beta(raw_beta, tok, m_t, i_h, sb_t, sb_h, DOT_F32: tl.constexpr):
    b_beta = tl.load(raw_beta + tok * sb_t + i_h * sb_h, mask=m_t, other=0.0).to(tl.float32)
    return tl.where(m_t, fast_sigmoid(b_beta, DOT_F32), 0.0)


@triton.jit
def decayed_products(b_q, b_k, b_G, o_t, acc_qk, acc_kk, WBT: tl.constexpr, DOT_F32: tl.constexpr):
    # acc + (q k^T) and acc + (k k^T), each entry decayed by exp2(G_i - G_j), on the columns of b_G.
    # exp2(G_i - G_j) = exp2(G_i - R) exp2(R - G_j) with R the G of row WBT / 2 - 1: no factor spans more than
    # BC rows of decay (< 2^125 at the gate's bound), and |q|, |k| <= 1 keep every kept product finite.
    # Entries above the diagonal may overflow; they are discarded by a select, never multiplied.
    b_R = tl.sum(tl.where((o_t == WBT // 2 - 1)[:, None], b_G, 0.0), axis=0)
    b_col = tl.trans(b_k * tl.exp2(b_R[None, :] - b_G))
    b_up = tl.exp2(b_G - b_R[None, :])
    return mma_wide(b_q * b_up, b_col, acc_qk, DOT_F32), mma_wide(b_k * b_up, b_col, acc_kk, DOT_F32)


@triton.jit
def chunk_inverse(b_Aqk, b_Akk, b_beta, o_t, ws, m_t, aqk_ws, scale, WBT: tl.constexpr, BC: tl.constexpr,
                  FP32_DOT: tl.constexpr):
    # Stores Aqk (causal, scaled) and returns T = (I + A)^-1, A = diag(beta) Akk strictly below the diagonal.
    b_aqk = tl.where(o_t[:, None] >= o_t[None, :], b_Aqk * scale, 0.0)
    tl.store(aqk_ws + ws[:, None] * WBT + o_t[None, :], b_aqk.to(aqk_ws.dtype.element_ty), mask=m_t[:, None])
    b_A = tl.where(o_t[:, None] > o_t[None, :], b_Akk * b_beta[:, None], 0.0)
    return unit_inverse(b_A, o_t, WBT, BC, FP32_DOT)


@triton.jit
def chunk_factors(q, k, raw_g, raw_beta, A_log, g_bias, cu_seqlens, chunk_indices,
                  qg_ws, kg_ws, aqk_ws, decay_ws, scale, lower_bound,
                  sq_t, sq_h, sk_t, sk_h, sg_t, sg_h, sb_t, sb_h, H,
                  SPLIT: tl.constexpr, HAS_BIAS: tl.constexpr, DOT_F32: tl.constexpr, FP32_DOT: tl.constexpr,
                  NARROW_KW: tl.constexpr,
                  K: tl.constexpr, BK: tl.constexpr, BT: tl.constexpr, BC: tl.constexpr, IO: tl.constexpr):
    # One program's walk chunk: writes the decay row, qg, kg and Aqk, and returns T = (I + A)^-1 (fp32), w's
    # operand diag(beta) k exp2(G) (in IO when NARROW_KW: w's product rounds it so anyway, and half the registers
    # stay live across the inverse), beta and the chunk's rows (tok, ws, m_t).
    # Whole [WBT, BK] tiles, so no value crosses a column slice.
    WBT: tl.constexpr = BT // SPLIT
    tl.static_assert(WBT <= 2 * BC, "kda_intra's inverse takes at most two diagonal blocks")
    WS_DTYPE: tl.constexpr = qg_ws.dtype.element_ty
    i_h, i_s, L, o_t, m_t, tok, ws, a_h, a_x = chunk_setup(A_log, cu_seqlens, chunk_indices, H, SPLIT, BT)
    o_k = tl.arange(0, BK)
    m_k = o_k < K
    mk = m_t[:, None] & m_k[None, :]
    b_bias = bias_row(g_bias, i_h, o_k, m_k, K, HAS_BIAS)
    b_G = tl.cumsum(chunk_gate(raw_g, tok, L, i_h, sg_t, sg_h, o_t, o_k, m_k, b_bias, a_h, a_x, lower_bound,
                               True), axis=0)
    # G is non-increasing and rows past the end add 0, so the column minimum is G at the last valid row.
    b_last = tl.min(b_G, axis=0)
    tl.store(decay_ws + (i_s * H + i_h) * BK + o_k, tl.exp2(b_last), mask=(o_k >= 0) & (L > 0))
    b_beta = chunk_beta(raw_beta, tok, m_t, i_h, sb_t, sb_h, DOT_F32)
    b_k = tl.load(k + tok[:, None] * sk_t + i_h * sk_h + o_k[None, :], mask=mk, other=0.0).to(tl.float32)
    b_k = b_k * tl.rsqrt(tl.sum(b_k * b_k, axis=1) + 1e-6)[:, None]
    b_q = tl.load(q + tok[:, None] * sq_t + i_h * sq_h + o_k[None, :], mask=mk, other=0.0).to(tl.float32)
    b_q = b_q * tl.rsqrt(tl.sum(b_q * b_q, axis=1) + 1e-6)[:, None]
    # qg and kg go out first, and w's operand is formed before the products, so that only it and the
    # [WBT, WBT] tiles stay live across the inverse (ptxas at 8 warps: 255 -> 238 registers).
    b_eg = tl.exp2(b_G)
    tl.store(qg_ws + ws[:, None] * BK + o_k[None, :], (b_q * b_eg).to(WS_DTYPE), mask=m_t[:, None])
    tl.store(kg_ws + ws[:, None] * BK + o_k[None, :], (b_k * tl.exp2(b_last[None, :] - b_G)).to(WS_DTYPE),
             mask=m_t[:, None])
    b_kw = b_k * (b_eg * b_beta[:, None])
    if NARROW_KW:
        b_kw = to_io(b_kw, IO, DOT_F32)

    # ---- Akk and Aqk, one product each, and the inverse -----------------------------------------------
    zeros = tl.zeros([WBT, WBT], dtype=tl.float32)
    b_Aqk, b_Akk = decayed_products(b_q, b_k, b_G, o_t, zeros, zeros, WBT, DOT_F32)
    b_T = chunk_inverse(b_Aqk, b_Akk, b_beta, o_t, ws, m_t, aqk_ws, scale, WBT, BC, FP32_DOT)
    return b_T, b_kw, b_beta, tok, ws, m_t


@triton.jit
def intra(q, k, v, raw_g, raw_beta, A_log, g_bias, cu_seqlens, chunk_indices,
          qg_ws, w_ws, kg_ws, u_ws, aqk_ws, decay_ws, scale, lower_bound,
          sq_t, sq_h, sk_t, sk_h, sv_t, sv_h, sg_t, sg_h, sb_t, sb_h, H,
          SPLIT: tl.constexpr, BLOCK_V: tl.constexpr, HAS_BIAS: tl.constexpr, DOT_F32: tl.constexpr,
          FP32_DOT: tl.constexpr,
          K: tl.constexpr, V: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr, BT: tl.constexpr,
          BC: tl.constexpr, IO: tl.constexpr):
    # w = T diag(beta) (k exp2(G)) and u = T diag(beta) v.
    b_T, b_kw, b_beta, tok, ws, m_t = chunk_factors(
        q, k, raw_g, raw_beta, A_log, g_bias, cu_seqlens, chunk_indices, qg_ws, kg_ws, aqk_ws, decay_ws, scale,
        lower_bound, sq_t, sq_h, sk_t, sk_h, sg_t, sg_h, sb_t, sb_h, H, SPLIT, HAS_BIAS, DOT_F32, FP32_DOT, False,
        K, BK, BT, BC, IO)
    o_k = tl.arange(0, BK)
    b_w = mm(b_T, b_kw, IO, DOT_F32)
    tl.store(w_ws + ws[:, None] * BK + o_k[None, :], b_w.to(w_ws.dtype.element_ty), mask=m_t[:, None])
    u_slices(v, u_ws, b_T, b_beta, tok, ws, m_t, tl.program_id(1), sv_t, sv_h, BLOCK_V, V, BV, IO, DOT_F32)


@triton.jit
def gate_slice(raw_g, g_bias, tok, L, i_h, sg_t, sg_h, o_t, o_k, m_k, a_h, a_x, lower_bound,
               K: tl.constexpr, HAS_BIAS: tl.constexpr):
    # G (log2 cumulative bounded gate) of the walk chunk on columns o_k.
    b_bias = bias_row(g_bias, i_h, o_k, m_k, K, HAS_BIAS)
    return tl.cumsum(chunk_gate(raw_g, tok, L, i_h, sg_t, sg_h, o_t, o_k, m_k, b_bias, a_h, a_x, lower_bound, True),
                     axis=0)


@triton.jit
def unit_slice(x, tok, s_t, s_h, i_h, o_k, mk, b_r):
    # Rows of q or k on columns o_k, times their inverse L2 norms b_r.
    return tl.load(x + tok[:, None] * s_t + i_h * s_h + o_k[None, :], mask=mk, other=0.0).to(tl.float32) * b_r[:, None]


@triton.jit
def sliced_factors(q, k, raw_g, raw_beta, A_log, g_bias, cu_seqlens, chunk_indices,
                   qg_ws, kg_ws, aqk_ws, decay_ws, scale, lower_bound,
                   sq_t, sq_h, sk_t, sk_h, sg_t, sg_h, sb_t, sb_h, H,
                   SPLIT: tl.constexpr, BLOCK_K: tl.constexpr, HAS_BIAS: tl.constexpr, DOT_F32: tl.constexpr,
                   FP32_DOT: tl.constexpr, K: tl.constexpr, BK: tl.constexpr, BT: tl.constexpr, BC: tl.constexpr):
    # chunk_factors on [WBT, BLOCK_K] column slices: gate, cumsum, decay, qg, kg and the factors of Akk, Aqk are
    # per column, so only the row norms, beta and the [WBT, WBT] products live across slices, and a program holds
    # a fraction of the registers (more programs per SM to hide the loads behind). A first pass takes the row
    # norms (the factors need |q|, |k| <= 1 before any product); the slices' re-reads hit L1 / L2. Returns T,
    # beta, k's inverse norms and the chunk's rows; the caller forms w per slice (recomputing G: cheaper than
    # keeping it).
    WBT: tl.constexpr = BT // SPLIT
    tl.static_assert(WBT <= 2 * BC, "kda_intra's inverse takes at most two diagonal blocks")
    WS_DTYPE: tl.constexpr = qg_ws.dtype.element_ty
    i_h, i_s, L, o_t, m_t, tok, ws, a_h, a_x = chunk_setup(A_log, cu_seqlens, chunk_indices, H, SPLIT, BT)
    o_s = tl.arange(0, BLOCK_K)
    b_beta = chunk_beta(raw_beta, tok, m_t, i_h, sb_t, sb_h, DOT_F32)
    n_q = tl.zeros([WBT], dtype=tl.float32)
    n_k = tl.zeros([WBT], dtype=tl.float32)
    ones = tl.full([WBT], 1.0, dtype=tl.float32)
    for kk in tl.static_range(0, BK, BLOCK_K):
        o_k = kk + o_s
        mk = m_t[:, None] & (o_k < K)[None, :]
        b_k = unit_slice(k, tok, sk_t, sk_h, i_h, o_k, mk, ones)
        b_q = unit_slice(q, tok, sq_t, sq_h, i_h, o_k, mk, ones)
        n_k += tl.sum(b_k * b_k, axis=1)
        n_q += tl.sum(b_q * b_q, axis=1)
    r_k = tl.rsqrt(n_k + 1e-6)
    r_q = tl.rsqrt(n_q + 1e-6)
    b_Aqk = tl.zeros([WBT, WBT], dtype=tl.float32)
    b_Akk = tl.zeros([WBT, WBT], dtype=tl.float32)
    for kk in tl.static_range(0, BK, BLOCK_K):
        o_k = kk + o_s
        m_k = o_k < K
        mk = m_t[:, None] & m_k[None, :]
        b_G = gate_slice(raw_g, g_bias, tok, L, i_h, sg_t, sg_h, o_t, o_k, m_k, a_h, a_x, lower_bound, K, HAS_BIAS)
        b_last = tl.min(b_G, axis=0)
        tl.store(decay_ws + (i_s * H + i_h) * BK + o_k, tl.exp2(b_last), mask=(o_k >= 0) & (L > 0))
        b_k = unit_slice(k, tok, sk_t, sk_h, i_h, o_k, mk, r_k)
        b_q = unit_slice(q, tok, sq_t, sq_h, i_h, o_k, mk, r_q)
        tl.store(qg_ws + ws[:, None] * BK + o_k[None, :], (b_q * tl.exp2(b_G)).to(WS_DTYPE), mask=m_t[:, None])
        tl.store(kg_ws + ws[:, None] * BK + o_k[None, :], (b_k * tl.exp2(b_last[None, :] - b_G)).to(WS_DTYPE),
                 mask=m_t[:, None])
        b_Aqk, b_Akk = decayed_products(b_q, b_k, b_G, o_t, b_Aqk, b_Akk, WBT, DOT_F32)
    b_T = chunk_inverse(b_Aqk, b_Akk, b_beta, o_t, ws, m_t, aqk_ws, scale, WBT, BC, FP32_DOT)
    return b_T, b_beta, r_k, tok, ws, m_t, L


@triton.jit
def intra_tb(q, k, raw_g, raw_beta, A_log, g_bias, cu_seqlens, chunk_indices,
             qg_ws, w_ws, kg_ws, tb_ws, aqk_ws, decay_ws, scale, lower_bound,
             sq_t, sq_h, sk_t, sk_h, sg_t, sg_h, sb_t, sb_h, H,
             SPLIT: tl.constexpr, BLOCK_K: tl.constexpr, HAS_BIAS: tl.constexpr, DOT_F32: tl.constexpr,
             FP32_DOT: tl.constexpr,
             K: tl.constexpr, BK: tl.constexpr, BT: tl.constexpr, BC: tl.constexpr, IO: tl.constexpr):
    # w = T diag(beta) (k exp2(G)) and the factor T diag(beta) itself (row i of the chunk at tb_ws[tok_i, h, :]);
    # whole rows at BLOCK_K >= BK, else BLOCK_K-wide column slices (sliced_factors).
    WBT: tl.constexpr = BT // SPLIT
    o_t = tl.arange(0, WBT)
    if BLOCK_K >= BK:
        b_T, b_kw, b_beta, tok, ws, m_t = chunk_factors(
            q, k, raw_g, raw_beta, A_log, g_bias, cu_seqlens, chunk_indices, qg_ws, kg_ws, aqk_ws, decay_ws, scale,
            lower_bound, sq_t, sq_h, sk_t, sk_h, sg_t, sg_h, sb_t, sb_h, H, SPLIT, HAS_BIAS, DOT_F32, FP32_DOT,
            True, K, BK, BT, BC, IO)
        o_k = tl.arange(0, BK)
        b_w = mm(b_T, b_kw, IO, DOT_F32)
        tl.store(w_ws + ws[:, None] * BK + o_k[None, :], b_w.to(w_ws.dtype.element_ty), mask=m_t[:, None])
    else:
        b_T, b_beta, r_k, tok, ws, m_t, L = sliced_factors(
            q, k, raw_g, raw_beta, A_log, g_bias, cu_seqlens, chunk_indices, qg_ws, kg_ws, aqk_ws, decay_ws, scale,
            lower_bound, sq_t, sq_h, sk_t, sk_h, sg_t, sg_h, sb_t, sb_h, H, SPLIT, BLOCK_K, HAS_BIAS, DOT_F32,
            FP32_DOT, K, BK, BT, BC)
        i_h = tl.program_id(1)
        a_h, a_x = gate_a(A_log, i_h, True)
        o_s = tl.arange(0, BLOCK_K)
        for kk in tl.static_range(0, BK, BLOCK_K):
            o_k = kk + o_s
            m_k = o_k < K
            b_G = gate_slice(raw_g, g_bias, tok, L, i_h, sg_t, sg_h, o_t, o_k, m_k, a_h, a_x, lower_bound, K,
                             HAS_BIAS)
            b_k = unit_slice(k, tok, sk_t, sk_h, i_h, o_k, m_t[:, None] & m_k[None, :], r_k)
            b_w = mm(b_T, b_k * (tl.exp2(b_G) * b_beta[:, None]), IO, DOT_F32)
            tl.store(w_ws + ws[:, None] * BK + o_k[None, :], b_w.to(w_ws.dtype.element_ty), mask=m_t[:, None])
    # beta is 0 past the sequence's end, so those columns are 0 and the walk may read v there as 0 or not at all.
    b_tb = b_T * b_beta[None, :]
    tl.store(tb_ws + ws[:, None] * WBT + o_t[None, :], b_tb.to(tb_ws.dtype.element_ty), mask=m_t[:, None])
