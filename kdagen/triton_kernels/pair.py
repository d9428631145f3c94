# SPDX-License-Identifier: Apache-2.0
"""kda_prologue and kda_wu: the chunk-parallel pair at the variant's chunk of BT rows, every gate.

kda_prologue, one program per (chunk, head): gate activation and in-chunk cumsum, beta, q/k L2 norms, the
intra-chunk matrices Akk/Aqk over NB = BT / BC sub-blocks of BC rows with reference rows so exp2 stays
finite, accumulated over BLOCK_K-wide column slices, and the fp32 inverse (I + Akk)^-1; writes aqk, the
inverse's lower blocks and the row norms. kda_wu, one program per (chunk, head), on whole-chunk tiles:
qg, kg, decay, w and u.

The lower-triangular [BC, BC] blocks (i, j), j <= i, of a chunk are tuples in row-major order: block (i, j)
is entry i (i + 1) / 2 + j. K, V: the head dims; BK, BV: them padded to powers of two; IO: the I/O dtype.
"""

import triton
import triton.language as tl

from .common import (
    bias_row, chunk_gate, chunk_rows, gate_a, mm, mm32, mma, mma_wide, to_io, u_slices,
)


@triton.jit
def offdiag_block(b_qr, b_kr, b_carry, b_Ej, b_kcj, acc_qk, acc_kk, IO: tl.constexpr, DOT_F32: tl.constexpr):
    # Block (i, j), j < i, of Aqk and Akk for one column slice. With E_j the last row's G of sub-block j
    # and G_before = E_{i-1} (b_carry), exp2(G_t - G_s) = exp2(G_t - G_before) * exp2(G_before - E_j) *
    # exp2(E_j - G_s): rows relative to the sub-block's start (b_qr, b_kr), a bridge per column, and sub-block
    # j's keys relative to its last row (b_kcj); every factor is <= 1.
    b_bridge = tl.exp2(b_carry - b_Ej)[None, :]
    acc_qk = mma(b_qr * b_bridge, tl.trans(b_kcj), acc_qk, IO, DOT_F32)
    acc_kk = mma(b_kr * b_bridge, tl.trans(b_kcj), acc_kk, IO, DOT_F32)
    return acc_qk, acc_kk


@triton.jit
def diag_block(b_q, b_k, b_qr, b_kr, b_kcf, b_G, b_E, b_carry, o_r, acc_qk, acc_kk, DIAG_REF: tl.constexpr,
               BC: tl.constexpr, DOT_F32: tl.constexpr):
    # Diagonal block (i, i). Both operands are taken relative to M = (G_before + G_last) / 2, so with a
    # bounded gate no factor is more than 8 rows of decay from 1 (DIAG_REF: the launcher's diag_ref).
    if DIAG_REF == 2:
        # |lower_bound| small enough that 16 rows of decay stay a normal fp32: the factors already formed
        # carry over, exp2(G - M) = b_dk * exp2(G_before - M) and exp2(M - G) = exp2(E - G) * exp2(M - E), so
        # only two column vectors go through exp2.
        b_M = (b_carry + b_E) * 0.5
        b_lift = tl.exp2(b_carry - b_M)[None, :]
        b_col = tl.trans(b_kcf * tl.exp2(b_M - b_E)[None, :])
        acc_qk = mma_wide(b_qr * b_lift, b_col, acc_qk, DOT_F32)
        acc_kk = mma_wide(b_kr * b_lift, b_col, acc_kk, DOT_F32)
    elif DIAG_REF == 1:
        # Larger bounds (up to |g| <= 10 per token): exp2(G - M) directly, which cannot underflow.
        b_M = ((b_carry + b_E) * 0.5)[None, :]
        b_col = tl.trans(b_k * tl.exp2(b_M - b_G))
        b_up = tl.exp2(b_G - b_M)
        acc_qk = mma_wide(b_q * b_up, b_col, acc_qk, DOT_F32)
        acc_kk = mma_wide(b_k * b_up, b_col, acc_kk, DOT_F32)
    else:
        # Unbounded (softplus) gate: exact per-row products in fp32, every exponent <= 0.
        for r in range(BC):
            sel = (o_r == r)[:, None]
            q_r = tl.sum(tl.where(sel, b_q, 0.0), axis=0)
            k_r = tl.sum(tl.where(sel, b_k, 0.0), axis=0)
            g_r = tl.sum(tl.where(sel, b_G, 0.0), axis=0)
            b_e = b_k * tl.exp2(tl.minimum(g_r[None, :] - b_G, 0.0))
            acc_qk += tl.where(sel, tl.sum(q_r[None, :] * b_e, axis=1)[None, :], 0.0)
            acc_kk += tl.where(sel, tl.sum(k_r[None, :] * b_e, axis=1)[None, :], 0.0)
    return acc_qk, acc_kk


@triton.jit
def prologue(q, k, raw_g, raw_beta, A_log, g_bias, cu_seqlens, chunk_indices, aqk_ws, tinv_ws, rnorm_ws,
             scale, lower_bound, sq_t, sq_h, sk_t, sk_h, sg_t, sg_h, sb_t, sb_h, H,
             BLOCK_K: tl.constexpr, LOWER_BOUND: tl.constexpr, HAS_BIAS: tl.constexpr, USE_L2NORM: tl.constexpr,
             DIAG_REF: tl.constexpr, DOT_F32: tl.constexpr, FP32_DOT: tl.constexpr,
             K: tl.constexpr, BK: tl.constexpr, BT: tl.constexpr, BC: tl.constexpr, IO: tl.constexpr):
    # Gate, cumsum and decay references are per column, so every quantity below can be formed one
    # BLOCK_K-wide column slice at a time; only the [BC, BC] blocks of Akk/Aqk, the row norms and the
    # inverse live across slices. Per-slice tiles stay small whatever K is: holding whole [BC, K] tiles for
    # all NB sub-blocks spilled 1.9 KB per thread at four warps (docs/perf-archive.md, "Triton prologue: column
    # slices, one warp", which also records what still spills at one warp).
    NB: tl.constexpr = BT // BC
    i_c = tl.program_id(0).to(tl.int64)
    i_h = tl.program_id(1)
    WS_DTYPE: tl.constexpr = aqk_ws.dtype.element_ty
    t0, L = chunk_rows(chunk_indices, cu_seqlens, i_c, BT)

    o_r = tl.arange(0, BC)
    o_s = tl.arange(0, BLOCK_K)
    diag_incl = o_r[:, None] >= o_r[None, :]
    diag_strict = o_r[:, None] > o_r[None, :]
    eye = (o_r[:, None] == o_r[None, :]).to(tl.float32)
    a_h, a_x = gate_a(A_log, i_h, LOWER_BOUND)
    # Per sub-block i: its valid rows, tokens, workspace rows, beta and the running row norms.
    m_ = ()
    tok_ = ()
    ws_ = ()
    beta_ = ()
    nk_ = ()
    nq_ = ()
    Akk = ()
    Aqk = ()
    for i in tl.static_range(NB):
        p = i * BC + o_r
        m = p < L
        tok = t0 + p
        ws = tok * H + i_h
        b_beta = tl.load(raw_beta + tok * sb_t + i_h * sb_h, mask=m, other=0.0).to(tl.float32)
        b_beta = tl.where(m, tl.sigmoid(b_beta), 0.0)
        m_ = m_ + (m,)
        tok_ = tok_ + (tok,)
        ws_ = ws_ + (ws,)
        beta_ = beta_ + (b_beta,)
        nk_ = nk_ + (tl.zeros([BC], dtype=tl.float32),)
        nq_ = nq_ + (tl.zeros([BC], dtype=tl.float32),)
        for j in tl.static_range(i + 1):
            Akk = Akk + (tl.zeros([BC, BC], dtype=tl.float32),)
            Aqk = Aqk + (tl.zeros([BC, BC], dtype=tl.float32),)

    # ---- pass 1: Akk / Aqk blocks of the un-normalized q, k, accumulated over column slices ----------
    for kk in range(0, BK, BLOCK_K):
        o_k = kk + o_s
        m_k = o_k < K
        b_bias = bias_row(g_bias, i_h, o_k, m_k, K, HAS_BIAS)
        # G (log2 cumulative gate) at the row before the current sub-block; 0 at the chunk start.
        b_carry = tl.zeros([BLOCK_K], dtype=tl.float32)
        kc_ = ()  # sub-block j's keys relative to its last row, the column operand of later blocks
        E_ = ()  # sub-block j's last-row G
        new_nk = ()
        new_nq = ()
        new_kk = ()
        new_qk = ()
        for i in tl.static_range(NB):
            # sub-block i: chunk rows i * BC .. i * BC + BC - 1
            b_G = b_carry[None, :] + tl.cumsum(chunk_gate(raw_g, tok_[i], L - i * BC, i_h, sg_t, sg_h, o_r, o_k,
                                                          m_k, b_bias, a_h, a_x, lower_bound, LOWER_BOUND), axis=0)
            # G is non-increasing down the rows, so its column minimum is the sub-block's last row.
            b_E = tl.min(b_G, axis=0)
            mk = m_[i][:, None] & m_k[None, :]
            b_k = tl.load(k + tok_[i][:, None] * sk_t + i_h * sk_h + o_k[None, :], mask=mk, other=0.0).to(tl.float32)
            b_q = tl.load(q + tok_[i][:, None] * sq_t + i_h * sq_h + o_k[None, :], mask=mk, other=0.0).to(tl.float32)
            new_nk = new_nk + (nk_[i] + tl.sum(b_k * b_k, axis=1),)
            new_nq = new_nq + (nq_[i] + tl.sum(b_q * b_q, axis=1),)
            # Rows of this sub-block relative to its own first row: exponents <= 0.
            b_dk = tl.exp2(b_G - b_carry[None, :])
            b_qr = b_q * b_dk
            b_kr = b_k * b_dk
            # k relative to this sub-block's last row, exponents <= 0: the column operand of later blocks.
            b_kcf = b_k * tl.exp2(b_E[None, :] - b_G)
            for j in tl.static_range(i):
                b_aqk, b_akk = offdiag_block(b_qr, b_kr, b_carry, E_[j], kc_[j], Aqk[i * (i + 1) // 2 + j],
                                             Akk[i * (i + 1) // 2 + j], IO, DOT_F32)
                new_qk = new_qk + (b_aqk,)
                new_kk = new_kk + (b_akk,)
            b_aqk, b_akk = diag_block(b_q, b_k, b_qr, b_kr, b_kcf, b_G, b_E, b_carry, o_r, Aqk[i * (i + 1) // 2 + i],
                                      Akk[i * (i + 1) // 2 + i], DIAG_REF, BC, DOT_F32)
            new_qk = new_qk + (b_aqk,)
            new_kk = new_kk + (b_akk,)
            if i < NB - 1:
                kc_ = kc_ + (to_io(b_kcf, IO, DOT_F32),)
                E_ = E_ + (b_E,)
            b_carry = b_E
        nk_ = new_nk
        nq_ = new_nq
        Akk = new_kk
        Aqk = new_qk

    # ---- L2 norm, beta and scale as row / column factors of the blocks -------------------------------
    rk_ = ()
    rq_ = ()
    for i in tl.static_range(NB):
        if USE_L2NORM:
            rk_ = rk_ + (tl.rsqrt(nk_[i] + 1e-6),)
            rq_ = rq_ + (tl.rsqrt(nq_[i] + 1e-6),)
        else:
            rk_ = rk_ + (tl.full([BC], 1.0, tl.float32),)
            rq_ = rq_ + (tl.full([BC], 1.0, tl.float32),)
    A = ()  # beta_i r_i Akk_ij r_j
    for i in tl.static_range(NB):
        for j in tl.static_range(i + 1):
            b_a = Aqk[i * (i + 1) // 2 + j] * (rq_[i] * scale)[:, None] * rk_[j][None, :]
            if i == j:
                b_a = tl.where(diag_incl, b_a, 0.0)
            tl.store(aqk_ws + ws_[i][:, None] * BT + j * BC + o_r[None, :], b_a.to(WS_DTYPE), mask=m_[i][:, None])
            b_akk = Akk[i * (i + 1) // 2 + j] * (rk_[i] * beta_[i])[:, None] * rk_[j][None, :]
            if i == j:
                b_akk = tl.where(diag_strict, b_akk, 0.0)
            A = A + (b_akk,)

    # ---- (I + Akk)^-1 in fp32 ---------------------------------------------------------------
    # Diagonal blocks by forward substitution, row r of every block per step: with N = T - I,
    # N[r, :] = -A[r, :] - A[r, :] @ N, and rows < r of N are final when row r is formed.
    Td = ()
    for i in tl.static_range(NB):
        Td = Td + (-A[i * (i + 1) // 2 + i],)
    for r in range(1, BC):
        sel = (o_r == r)[:, None]
        new_Td = ()
        for i in tl.static_range(NB):
            b_row = tl.sum(tl.where(sel, Td[i], 0.0), axis=0)
            b_row = b_row + tl.sum(b_row[:, None] * Td[i], axis=0)
            new_Td = new_Td + (tl.where(sel, b_row[None, :], Td[i]),)
        Td = new_Td
    diag = ()
    for i in tl.static_range(NB):
        diag = diag + (Td[i] + eye,)
    # Off-diagonal blocks: T_ij = -T_ii @ sum_{m=j}^{i-1} A_im @ T_mj, in the blocks' order.
    T = ()
    for i in tl.static_range(NB):
        for j in tl.static_range(i):
            b_s = mm32(A[i * (i + 1) // 2 + j], diag[j], FP32_DOT)
            for m in tl.static_range(j + 1, i):
                b_s = b_s + mm32(A[i * (i + 1) // 2 + m], T[m * (m + 1) // 2 + j], FP32_DOT)
            T = T + (-mm32(diag[i], b_s, FP32_DOT),)
        T = T + (diag[i],)
    # ---- hand-off to kda_wu: the inverse's lower blocks and the row factors -----------------------------
    for i in tl.static_range(NB):
        for j in tl.static_range(i + 1):
            tl.store(tinv_ws + ws_[i][:, None] * BT + j * BC + o_r[None, :],
                     T[i * (i + 1) // 2 + j].to(WS_DTYPE), mask=m_[i][:, None])
        tl.store(rnorm_ws + ws_[i] * 2, rk_[i], mask=m_[i])
        tl.store(rnorm_ws + ws_[i] * 2 + 1, rq_[i], mask=m_[i])


@triton.jit
def wu(q, k, v, raw_g, raw_beta, A_log, g_bias, cu_seqlens, chunk_indices, tinv_ws, rnorm_ws,
       qg_ws, w_ws, kg_ws, u_ws, decay_ws, lower_bound,
       sq_t, sq_h, sk_t, sk_h, sv_t, sv_h, sg_t, sg_h, sb_t, sb_h, H,
       BLOCK_K: tl.constexpr, LOWER_BOUND: tl.constexpr, HAS_BIAS: tl.constexpr, DOT_F32: tl.constexpr,
       K: tl.constexpr, V: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr, BT: tl.constexpr,
       BC: tl.constexpr, IO: tl.constexpr):
    # Everything here is per column, so unlike kda_prologue it runs on whole-chunk [BT, BLOCK_K] tiles:
    # one cumsum and one [BT, BT] x [BT, BLOCK_K] product per slice, spread over the warps.
    i_c = tl.program_id(0).to(tl.int64)
    i_h = tl.program_id(1)
    WS_DTYPE: tl.constexpr = qg_ws.dtype.element_ty
    t0, L = chunk_rows(chunk_indices, cu_seqlens, i_c, BT)

    o_t = tl.arange(0, BT)
    o_s = tl.arange(0, BLOCK_K)
    m_t = o_t < L
    tok = t0 + o_t
    ws = tok * H + i_h
    a_h, a_x = gate_a(A_log, i_h, LOWER_BOUND)
    b_beta = tl.load(raw_beta + tok * sb_t + i_h * sb_h, mask=m_t, other=0.0).to(tl.float32)
    b_beta = tl.where(m_t, tl.sigmoid(b_beta), 0.0)
    b_rk = tl.load(rnorm_ws + ws * 2, mask=m_t, other=0.0)
    b_rq = tl.load(rnorm_ws + ws * 2 + 1, mask=m_t, other=0.0)
    # (I + Akk)^-1 is block lower triangular; kda_prologue wrote only the blocks on and below the diagonal.
    blk = o_t // BC
    b_T = tl.load(tinv_ws + ws[:, None] * BT + o_t[None, :], mask=m_t[:, None] & (blk[None, :] <= blk[:, None]),
                  other=0.0)

    # ---- per column slice: G, decay, qg, kg and w = T diag(beta) (k * exp2(G)) -------------------------
    for kk in range(0, BK, BLOCK_K):
        o_k = kk + o_s
        m_k = o_k < K
        b_bias = bias_row(g_bias, i_h, o_k, m_k, K, HAS_BIAS)
        # The same gates as kda_prologue, summed over the whole chunk at once: G differs from the
        # sub-block sums there by fp32 rounding only, far below the workspace's bf16/fp16 step.
        b_G = tl.cumsum(chunk_gate(raw_g, tok, L, i_h, sg_t, sg_h, o_t, o_k, m_k, b_bias, a_h, a_x, lower_bound,
                                   LOWER_BOUND), axis=0)
        # G is non-increasing and rows past the end add 0, so the column minimum is G at the last valid row.
        b_last = tl.min(b_G, axis=0)
        tl.store(decay_ws + (i_c * H + i_h) * BK + o_k, tl.exp2(b_last))
        mk = m_t[:, None] & m_k[None, :]
        b_k = tl.load(k + tok[:, None] * sk_t + i_h * sk_h + o_k[None, :], mask=mk, other=0.0).to(tl.float32)
        b_q = tl.load(q + tok[:, None] * sq_t + i_h * sq_h + o_k[None, :], mask=mk, other=0.0).to(tl.float32)
        b_k = b_k * b_rk[:, None]
        b_eg = tl.exp2(b_G)
        tl.store(qg_ws + ws[:, None] * BK + o_k[None, :], (b_q * b_rq[:, None] * b_eg).to(WS_DTYPE),
                 mask=m_t[:, None])
        tl.store(kg_ws + ws[:, None] * BK + o_k[None, :], (b_k * tl.exp2(b_last[None, :] - b_G)).to(WS_DTYPE),
                 mask=m_t[:, None])
        b_w = mm(b_T, b_k * (b_eg * b_beta[:, None]), IO, DOT_F32)
        tl.store(w_ws + ws[:, None] * BK + o_k[None, :], b_w.to(WS_DTYPE), mask=m_t[:, None])

    # ---- u = T diag(beta) v, per column slice of V ------------------------------------------------
    u_slices(v, u_ws, b_T, b_beta, tok, ws, m_t, i_h, sv_t, sv_h, BLOCK_K, V, BV, IO, DOT_F32)
