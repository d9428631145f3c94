# SPDX-License-Identifier: Apache-2.0
"""kda_recurrence and kda_recurrence_tb (which forms u from v), the fp32 V-first state walk over a sequence's
chunks, and kda_group_scan, the start states of the group split (docs/design.md, "The walk stages";
runtime/group_scan.py).

K, V: the head dims; BK, BV: them padded to powers of two; BT: the variant's chunk; IO: the I/O dtype.
"""

import triton
import triton.language as tl

from .common import initial_state, mm, state_row


@triton.jit
def recurrence(qg_ws, w_ws, kg_ws, u_ws, aqk_ws, decay_ws, o, h0, ht, state_indices, has_initial_state,
               cu_seqlens, chunk_offsets, group_op, group_in, scale,
               so_t, so_h, sh0_n, sh0_h, sht_n, sht_h, H, n_slots, n_seq, G,
               ckpt, ckpt_off, ckpt_idx, sck_n, n_ckpt_rows,
               BLOCK_V: tl.constexpr, STATE_IN: tl.constexpr, STATE_OUT: tl.constexpr, PASS: tl.constexpr,
               DOT_F32: tl.constexpr, CHECKPOINT: tl.constexpr, SPLIT: tl.constexpr,
               K: tl.constexpr, V: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr, BT: tl.constexpr,
               IO: tl.constexpr):
    # kda_recurrence: u from the workspace.
    walk_chunks(qg_ws, w_ws, kg_ws, u_ws, None, None, aqk_ws, decay_ws, o, h0, ht, state_indices,
                has_initial_state, cu_seqlens, chunk_offsets, group_op, group_in, scale, 0, 0,
                so_t, so_h, sh0_n, sh0_h, sht_n, sht_h, H, n_slots, n_seq, G, ckpt, ckpt_off, ckpt_idx, sck_n,
                n_ckpt_rows, BLOCK_V, STATE_IN, STATE_OUT, PASS, DOT_F32, CHECKPOINT, SPLIT, False,
                K, V, BK, BV, BT, IO)


@triton.jit
def recurrence_tb(qg_ws, w_ws, kg_ws, v, tb_ws, aqk_ws, decay_ws, o, h0, ht, state_indices, has_initial_state,
                  cu_seqlens, chunk_offsets, group_op, group_in, scale,
                  sv_t, sv_h, so_t, so_h, sh0_n, sh0_h, sht_n, sht_h, H, n_slots, n_seq, G,
                  ckpt, ckpt_off, ckpt_idx, sck_n, n_ckpt_rows,
                  BLOCK_V: tl.constexpr, STATE_IN: tl.constexpr, STATE_OUT: tl.constexpr, PASS: tl.constexpr,
                  DOT_F32: tl.constexpr, CHECKPOINT: tl.constexpr, SPLIT: tl.constexpr,
                  K: tl.constexpr, V: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr, BT: tl.constexpr,
                  IO: tl.constexpr):
    # kda_recurrence_tb: u = (T diag(beta)) v per chunk, from kda_intra_tb's factor and v.
    walk_chunks(qg_ws, w_ws, kg_ws, None, v, tb_ws, aqk_ws, decay_ws, o, h0, ht, state_indices,
                has_initial_state, cu_seqlens, chunk_offsets, group_op, group_in, scale, sv_t, sv_h,
                so_t, so_h, sh0_n, sh0_h, sht_n, sht_h, H, n_slots, n_seq, G, ckpt, ckpt_off, ckpt_idx, sck_n,
                n_ckpt_rows, BLOCK_V, STATE_IN, STATE_OUT, PASS, DOT_F32, CHECKPOINT, SPLIT, True,
                K, V, BK, BV, BT, IO)


@triton.jit
def walk_chunks(qg_ws, w_ws, kg_ws, u_ws, v, tb_ws, aqk_ws, decay_ws, o, h0, ht, state_indices, has_initial_state,
                cu_seqlens, chunk_offsets, group_op, group_in, scale, sv_t, sv_h,
                so_t, so_h, sh0_n, sh0_h, sht_n, sht_h, H, n_slots, n_seq, G,
                ckpt, ckpt_off, ckpt_idx, sck_n, n_ckpt_rows,
                BLOCK_V: tl.constexpr, STATE_IN: tl.constexpr, STATE_OUT: tl.constexpr, PASS: tl.constexpr,
                DOT_F32: tl.constexpr, CHECKPOINT: tl.constexpr, SPLIT: tl.constexpr, U_FROM_V: tl.constexpr,
                K: tl.constexpr, V: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr, BT: tl.constexpr,
                IO: tl.constexpr):
    # Program (sequence x head, row slice, group g of G). Group g walks chunks [g * cpg, (g + 1) * cpg) of
    # its sequence, cpg = ceil(chunks / G):
    # PASS 0: G = 1, the whole walk from the initial state, writing the output and the final state.
    # PASS 1: groups 0..G-2 on BV + BK rows, no output: rows < BV from zero with u give B_g, the "transfer"
    #         rows from I with u = 0 give M_g = prod (diag(decay) - w^T kg); both to group_op.
    # PASS 2: every group from its start state in group_in (kda_group_scan), writing the output; the
    #         last group writes the final state.
    # STATE_OUT: 0 none, 1 dense ht[n], 2 paged ht[state_indices[n]].
    # CHECKPOINT: 0 none (ckpt, ckpt_off, ckpt_idx, sck_n, n_ckpt_rows are None), 1 row n, 2 row ckpt_idx[n]
    # of ckpt [rows, H, V, K] gets the state after ckpt_off[n] tokens when that is a positive multiple of BT
    # below the sequence's length; PASS 2 writes it from the group holding that chunk.
    # SPLIT: the walk steps over chunks of WBT = BT / SPLIT rows (kda_intra's); chunk_offsets counts BT-row
    # chunks, so this sequence's first walk chunk is SPLIT * chunk_offsets[n].
    # U_FROM_V: u = (T diag(beta)) v per chunk from kda_intra_tb's factor tb_ws [T, H, WBT] and v (u_ws is None),
    # kept in fp32 (it is never stored); else u is read from u_ws (v and tb_ws are None).
    WBT: tl.constexpr = BT // SPLIT
    i_nh = tl.program_id(0).to(tl.int64)
    i_v = tl.program_id(1)
    g = tl.program_id(2).to(tl.int64)
    i_n = i_nh // H
    i_h = i_nh % H
    bos = tl.load(cu_seqlens + i_n).to(tl.int64)
    eos = tl.load(cu_seqlens + i_n + 1).to(tl.int64)
    c0 = tl.load(chunk_offsets + i_n).to(tl.int64) * SPLIT
    n_chunks = tl.cdiv(eos - bos, WBT)
    cpg = tl.cdiv(n_chunks, G)
    c_begin = tl.minimum(g * cpg, n_chunks)
    c_end = tl.minimum(c_begin + cpg, n_chunks)

    o_t = tl.arange(0, WBT)
    o_k = tl.arange(0, BK)
    o_v = i_v * BLOCK_V + tl.arange(0, BLOCK_V)
    m_k = o_k < K
    m_v = o_v < V
    m_s = m_v[:, None] & m_k[None, :]
    causal = o_t[:, None] >= o_t[None, :]
    # State slice P = S^T[v, k], V-first, fp32 for the whole walk.
    p_state = o_v[:, None] * K + o_k[None, :]
    # This (group, sequence, head)'s [rows, BK] block of the group workspaces.
    p_group = o_v[:, None] * BK + o_k[None, :]
    gseq = (g * n_seq + i_n) * H + i_h

    row, row_ok = state_row(state_indices, i_n, n_slots, STATE_IN == 2 or STATE_OUT == 2)
    if PASS == 0:
        b_P = initial_state(h0, has_initial_state, i_n, row, row_ok, i_h, sh0_n, sh0_h, p_state, m_s, STATE_IN)
    elif PASS == 1:
        # Transfer row BV + j starts as e_j; the rows < BV start at zero.
        b_P = ((o_v[:, None] - BV) == o_k[None, :]).to(tl.float32)
    else:
        b_P = tl.load(group_in + gseq * (BV * BK) + p_group)

    if CHECKPOINT != 0 and PASS != 1:
        ck_tok = tl.load(ckpt_off + i_n).to(tl.int64)
        if CHECKPOINT == 2:
            ck_row = tl.load(ckpt_idx + i_n).to(tl.int64)
        else:
            ck_row = i_n
        ck_ok = (ck_tok > 0) & (ck_tok % BT == 0) & (ck_tok < eos - bos) & (ck_row >= 0) & (ck_row < n_ckpt_rows)
        # The chunk after which the snapshot is taken; -1 matches no chunk.
        ck_chunk = tl.where(ck_ok, ck_tok // WBT - 1, -1)
        p_ckpt = ckpt + ck_row * sck_n + i_h * (V * K) + p_state

    for i_t in range(c_begin, c_end):
        tok = bos + i_t * WBT + o_t
        m_t = tok < eos
        ws = tok * H + i_h
        # Loads in the plain walk's order (w, qg, kg, u, aqk, decay): the software pipeliner stages them so.
        b_w = tl.load(w_ws + ws[:, None] * BK + o_k[None, :], mask=m_t[:, None], other=0.0)
        if PASS != 1:
            b_qg = tl.load(qg_ws + ws[:, None] * BK + o_k[None, :], mask=m_t[:, None], other=0.0)
        b_kg = tl.load(kg_ws + ws[:, None] * BK + o_k[None, :], mask=m_t[:, None], other=0.0)
        # Transfer rows (o_v >= BV) fall outside m_v, so their u is 0.
        if U_FROM_V:
            b_tb = tl.load(tb_ws + ws[:, None] * WBT + o_t[None, :], mask=m_t[:, None] & causal, other=0.0)
            b_v = tl.load(v + tok[:, None] * sv_t + i_h * sv_h + o_v[None, :], mask=m_t[:, None] & m_v[None, :],
                          other=0.0)
        else:
            b_u = tl.load(u_ws + ws[:, None] * BV + o_v[None, :], mask=m_t[:, None] & m_v[None, :], other=0.0)
        if PASS != 1:
            b_a = tl.load(aqk_ws + ws[:, None] * WBT + o_t[None, :], mask=m_t[:, None] & causal, other=0.0)
        b_d = tl.load(decay_ws + ((c0 + i_t) * H + i_h) * BK + o_k)
        if WBT < BLOCK_V:
            # Chunks shorter than the V slice: every product transposed, so that its M (rows on the matrix
            # units) is BLOCK_V: Hopper's wgmma takes M = 64 per warpgroup, and a 32-row chunk as M would fall
            # back to mma.sync.
            if U_FROM_V:
                b_vnT = mm(tl.trans(b_v), tl.trans(b_tb), IO, DOT_F32) - mm(b_P, tl.trans(b_w), IO, DOT_F32)
            else:
                b_vnT = tl.trans(b_u).to(tl.float32) - mm(b_P, tl.trans(b_w), IO, DOT_F32)
            if PASS != 1:
                b_oT = mm(b_P, tl.trans(b_qg), IO, DOT_F32) * scale + mm(b_vnT, tl.trans(b_a), IO, DOT_F32)
                tl.store(o + tok[None, :] * so_t + i_h * so_h + o_v[:, None], b_oT.to(o.dtype.element_ty),
                         mask=m_t[None, :] & m_v[:, None])
            b_P = b_P * b_d[None, :] + mm(b_vnT, b_kg, IO, DOT_F32)
        else:
            b_Pt = tl.trans(b_P)
            if U_FROM_V:
                b_vn = mm(b_tb, b_v, IO, DOT_F32) - mm(b_w, b_Pt, IO, DOT_F32)
            else:
                b_vn = b_u.to(tl.float32) - mm(b_w, b_Pt, IO, DOT_F32)
            if PASS != 1:
                b_o = mm(b_qg, b_Pt, IO, DOT_F32) * scale + mm(b_a, b_vn, IO, DOT_F32)
                tl.store(o + tok[:, None] * so_t + i_h * so_h + o_v[None, :], b_o.to(o.dtype.element_ty),
                         mask=m_t[:, None] & m_v[None, :])
            b_P = b_P * b_d[None, :] + mm(tl.trans(b_vn), b_kg, IO, DOT_F32)
        if CHECKPOINT != 0 and PASS != 1:
            # A branch, not a masked store: the store's layout conversion then runs once, not per chunk.
            if i_t == ck_chunk:
                tl.store(p_ckpt, b_P, mask=m_s)

    if PASS == 1:
        tl.store(group_op + gseq * ((BV + BK) * BK) + p_group, b_P)
    else:
        last = g == G - 1
        if STATE_OUT == 1:
            tl.store(ht + i_n * sht_n + i_h * sht_h + p_state, b_P, mask=m_s & last)
        if STATE_OUT == 2:
            tl.store(ht + row * sht_n + i_h * sht_h + p_state, b_P, mask=m_s & row_ok & last)


@triton.jit
def group_scan(group_op, group_in, h0, state_indices, has_initial_state, cu_seqlens, sh0_n, sh0_h,
               H, n_slots, n_seq, G,
               BLOCK_V: tl.constexpr, STATE_IN: tl.constexpr, FP32_DOT: tl.constexpr, SPLIT: tl.constexpr,
               K: tl.constexpr, V: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr, BT: tl.constexpr):
    # Start states of the G groups of one (sequence, head, row slice): S_0 = the initial state,
    # S_{g+1} = S_g M_g + B_g, at fp32 accuracy (FP32_DOT, per target: M_g carries the whole decay of a
    # group, so rounding it to bf16 would cost more than the walk itself does). S_g stays in registers as
    # NSC column tiles [BLOCK_V, SC], S_{g+1}[:, j] = B_g[:, j] + sum_i S_g[:, i] M_g[i, j]: a register tile
    # cannot be sliced, and going through memory to slice it costs a barrier and a round trip per group. An
    # empty group (past the sequence's last chunk, or T = 0) passes S through untouched, so a T = 0 sequence's
    # state is its initial state bit for bit (S I rounds on tf32x3).
    SC: tl.constexpr = min(32, BK)
    NSC: tl.constexpr = BK // SC
    i_nh = tl.program_id(0).to(tl.int64)
    i_v = tl.program_id(1)
    i_n = i_nh // H
    i_h = i_nh % H
    n_chunks = tl.cdiv(tl.load(cu_seqlens + i_n + 1) - tl.load(cu_seqlens + i_n), BT // SPLIT)
    cpg = tl.cdiv(n_chunks, G)
    n_seq64 = n_seq.to(tl.int64)  # group offsets below reach past 2^31 elements
    o_c = tl.arange(0, SC)
    o_v = i_v * BLOCK_V + tl.arange(0, BLOCK_V)
    m_v = o_v < V
    row, row_ok = state_row(state_indices, i_n, n_slots, STATE_IN == 2)
    p_row = o_v[:, None] * BK + o_c[None, :]
    p_in = group_in + (i_n * H + i_h) * (BV * BK) + p_row
    S = ()
    for j in tl.static_range(NSC):
        m_s = m_v[:, None] & ((j * SC + o_c) < K)[None, :]
        b_S = initial_state(h0, has_initial_state, i_n, row, row_ok, i_h, sh0_n, sh0_h,
                            o_v[:, None] * K + j * SC + o_c[None, :], m_s, STATE_IN)
        tl.store(p_in + j * SC, b_S)
        S = S + (b_S,)
    for g in range(0, G - 1):
        p_op = group_op + ((g * n_seq64 + i_n) * H + i_h) * ((BV + BK) * BK)
        p_b = p_op + p_row
        p_m = p_op + (BV + o_c)[:, None] * BK + o_c[None, :]
        N = ()
        for j in tl.static_range(NSC):
            b_N = tl.load(p_b + j * SC)
            for i in tl.static_range(NSC):
                b_N = tl.dot(S[i], tl.load(p_m + (i * SC * BK + j * SC)), b_N, input_precision=FP32_DOT)
            N = N + (b_N,)
        busy = g * cpg < n_chunks
        p_in = group_in + (((g + 1) * n_seq64 + i_n) * H + i_h) * (BV * BK) + p_row
        new_S = ()
        for j in tl.static_range(NSC):
            b_S = tl.where(busy, N[j], S[j])
            tl.store(p_in + j * SC, b_S)
            new_S = new_S + (b_S,)
        S = new_S
