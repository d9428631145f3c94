// SPDX-License-Identifier: Apache-2.0
// kda_recurrence.h: the fused path's recurrence kernel: one pass, or passes 1 and 2 of the group split
// (copied verbatim; constants: kda_common.h).
#pragma once

#include "kda_common.h"

namespace kda {

// pass: what one launch of kda_recurrence_kernel does.
enum Pass : int { kSinglePass = 0, kGroupOperators = 1, kGroupOutputs = 2 };

struct RecurrenceArgs {
  const kda_bf16 *qg, *w, *kg, *u, *aqk;
  const float* decay;
  kda_bf16* out;
  int64_t so_t, so_h;
  const int32_t* cu_seqlens;
  const int64_t* chunk_offsets;
  const float* h0;  // dense initial state [N, H, V, K] (row stride sh0_n), or null
  int64_t sh0_n;
  float* ht;        // dense final state, or null
  int64_t sht_n;
  float* cache;     // paged state [slots, H, V, K] (row stride sc_n), read and written in place, or null
  int64_t sc_n, n_slots;
  const int32_t* cache_idx;
  const uint8_t* has_init;
  float* ckpt;      // checkpoint rows [rows, H, V, K] (row stride sck_n), or null
  int64_t sck_n, n_ckpt_rows;
  const int32_t* ckpt_off;
  const int32_t* ckpt_idx;  // null: row = sequence index
  int64_t num_seqs;
  int H;
  float scale;
  int groups;       // G >= 1 groups of consecutive chunks per sequence
  int pass;         // Pass
  float* gop;       // pass 1 output: [G - 1][N][H][V + K][K] (rows < V: B_g, rows >= V: M_g)
  float* gin;       // pass 2 input: [G][N][H][V][K] start state of each group (the scan writes it)
};

// The cache row a sequence reads / writes: -1 (neither) for a negative or out-of-range index.
__device__ __forceinline__ int64_t cache_slot(const RecurrenceArgs& p, int64_t n) {
  if (!p.cache) return -1;
  const int64_t slot = p.cache_idx[n];
  return slot < 0 || slot >= p.n_slots ? -1 : slot;
}

// Start value of state row v0 + v, column k, of this block.
__device__ __forceinline__ float start_value(const RecurrenceArgs& p, int64_t n, int h, int g, int v0, int v,
                                             int k, int64_t slot) {
  if (p.pass == kGroupOperators) return v0 >= V && v0 - V + v == k ? 1.f : 0.f;  // B_g from 0, M_g from I
  const int64_t e = ((int64_t)h * V + v0 + v) * K + k;
  if (p.pass == kGroupOutputs) return p.gin[((int64_t)g * p.num_seqs + n) * p.H * V * K + e];
  if (slot >= 0 && p.has_init[n] != 0) return p.cache[slot * p.sc_n + e];
  return p.h0 ? p.h0[n * p.sh0_n + e] : 0.f;
}

// End of the walk: pass 1 publishes the group operator rows; the last group of the other passes writes the
// final state (T = 0 sequences included: h0 passthrough or zeros).
__device__ __forceinline__ void end_value(const RecurrenceArgs& p, int64_t n, int h, int g, int v0, int v, int k,
                                          int64_t slot, float x) {
  if (p.pass == kGroupOperators) {
    p.gop[(((int64_t)g * p.num_seqs + n) * p.H + h) * (int64_t)(V + K) * K + (int64_t)(v0 + v) * K + k] = x;
    return;
  }
  if (g != p.groups - 1) return;
  const int64_t e = ((int64_t)h * V + v0 + v) * K + k;
  if (p.ht) p.ht[n * p.sht_n + e] = x;
  if (slot >= 0) p.cache[slot * p.sc_n + e] = x;
}

// 8 bf16 moved as one 16-byte access (every row start here is 16-byte aligned).
struct alignas(16) kda_v8 { uint32_t x[4]; };
__device__ __forceinline__ kda_v8 ld8(const kda_bf16* p) { return *reinterpret_cast<const kda_v8*>(p); }
__device__ __forceinline__ kda_bf16 lane8(const kda_v8& v, int i) {
  return (kda_bf16)((v.x[i >> 1] >> (16 * (i & 1))) & 0xffffu);
}
#if KDA_MMA_LAYER == KDA_LAYER_FMA
// FMA fallback: each thread reads the w, qg and aqk rows of its output rows from global memory itself (the
// threads of one row read the same addresses); kg, which every state entry's owner reads whole, is staged.
struct RecurrenceSmem {
  kda_bf16 KG[BT][K];   // kg rows of the chunk (rows past L zero)
  float S[BVS][K + 1];  // the state slice, S[v][k] (V-first)
  float VN[BT][BVS + 1];
  float D[K];
};
#else
// Matrix layer: the fp32 state lives in accumulator fragments (registers) for the whole walk; the GEMM
// operands are bf16 (S and v_new rounded where the Triton path rounds them). Shared memory holds only what
// crosses waves or needs a transpose: the A operands w, qg (of w S^T, qg S^T) and aqk (of tril(aqk) v_new)
// are row-major with their reduction index contiguous, the fragment layout, so each wave reads its own row
// tile of them from global memory straight into fragments (kda_load_a_rows). That keeps a block's LDS at
// BVS (K + BT) + K BT bf16 (plus row padding and the decay row): 31.5 KiB at gfx942's 32-row slice, so
// that two blocks share its 64 KiB CU (kdagen/targets.py hip_v_slice, AMD_MIN_WAVES_PER_SIMD).
// Rows padded by 8 bf16; every operand has its reduction index contiguous (kda_load_a/b read vectors).
constexpr int PAD = 8;
constexpr int LDK = K + PAD, LDT = BT + PAD;
struct alignas(16) RecurrenceSmem {
  kda_bf16 SB[BVS][LDK];  // bf16 copy of the state slice S[v][k] (the B operand of w S^T, qg S^T)
  kda_bf16 VT[BVS][LDT];  // v_new transposed, VT[v][t], bf16 (B of tril(aqk) v_new, A of v_new^T kg)
  kda_bf16 KT[K][LDT];    // kg transposed, KT[k][t] (B of v_new^T kg)
  float D[K];
};
#endif

__global__ KDA_LAUNCH_BOUNDS(THREADS) void kda_recurrence_kernel(RecurrenceArgs p) {
  KDA_SMEM(RecurrenceSmem, s);
  const int tid = threadIdx.x;
  const int64_t n = blockIdx.x / p.H;
  const int h = blockIdx.x % p.H;
  const int v0 = blockIdx.y * BVS;  // first state row; pass 1 rows >= V are the transfer rows of M_g
  const int g = blockIdx.z;
  const bool transfer = v0 >= V;
  const bool outputs = p.pass != kGroupOperators;
  const int64_t bos = p.cu_seqlens[n], eos = p.cu_seqlens[n + 1];
  const int64_t c0 = p.chunk_offsets[n];
  const int64_t nchunks = (eos - bos + BT - 1) / BT;
  // Group g walks chunks [cb, ce): consecutive, ceil(nchunks / G) each; trailing groups may be empty
  // (pass 1 then publishes the identity operator, pass 2 walks nothing).
  const int64_t per_group = (nchunks + p.groups - 1) / p.groups;
  const int64_t cb = (int64_t)g * per_group < nchunks ? (int64_t)g * per_group : nchunks;
  const int64_t ce = cb + per_group < nchunks ? cb + per_group : nchunks;

  const int64_t slot = p.pass == kGroupOperators ? -1 : cache_slot(p, n);
  int64_t ck_row = -1, ck_chunk = -1;
  if (p.ckpt && outputs) {
    const int64_t off = p.ckpt_off[n];
    const int64_t row = p.ckpt_idx ? (int64_t)p.ckpt_idx[n] : n;
    if (off > 0 && off % BT == 0 && off < eos - bos && row >= 0 && row < p.n_ckpt_rows) {
      ck_row = row;
      ck_chunk = off / BT - 1;
    }
  }
  const int64_t ck_base = ((int64_t)h * V + v0) * K;  // this slice inside one [H, V, K] checkpoint row
#if KDA_MMA_LAYER == KDA_LAYER_FMA
  // State ownership: v = sv, k = sk0 + KSTEP i.
  constexpr int KPT = BVS * K / THREADS;
  constexpr int KSTEP = THREADS / BVS;
  const int sv = tid / KSTEP, sk0 = tid % KSTEP;
#pragma unroll
  for (int i = 0; i < KPT; ++i) {
    const int k = sk0 + KSTEP * i;
    s.S[sv][k] = start_value(p, n, h, g, v0, sv, k, slot);
  }

  // Output rows of this thread: t = tg + (THREADS / BVS) j, column v = ov.
  constexpr int TSTEP = THREADS / BVS;
  constexpr int TPT = BT / TSTEP;
  const int ov = tid % BVS, tg = tid / BVS;

  for (int64_t ic = cb; ic < ce; ++ic) {
    const int64_t t0 = bos + ic * BT;
    const int L = (int)((eos - t0) < BT ? (eos - t0) : BT);
    __syncthreads();  // the previous chunk's S update is done with KG, D and S
    // kg (rows past L are zero, so they add nothing to the state) and decay: read after the next barrier
    for (int idx = tid; idx < BT * K; idx += THREADS) {
      const int r = idx / K, d = idx % K;
      s.KG[r][d] = r < L ? p.kg[((t0 + r) * p.H + h) * K + d] : (kda_bf16)0;
    }
    for (int d = tid; d < K; d += THREADS) s.D[d] = p.decay[((c0 + ic) * p.H + h) * K + d];

    // v_new = u - w S^T (u = 0 on transfer rows) and the inter-chunk part of o, qg S^T; w and qg 8 at a time
    float accw[TPT], accq[TPT];
#pragma unroll
    for (int j = 0; j < TPT; ++j) { accw[j] = 0.f; accq[j] = 0.f; }
    for (int k8 = 0; k8 < K; k8 += 8) {
      kda_v8 wv[TPT], qv[TPT];
#pragma unroll
      for (int j = 0; j < TPT; ++j) {
        const int t = tg + TSTEP * j;
        wv[j] = {};
        qv[j] = {};
        if (t < L) {
          const int64_t o = ((t0 + t) * p.H + h) * K + k8;
          wv[j] = ld8(p.w + o);
          if (outputs) qv[j] = ld8(p.qg + o);
        }
      }
#pragma unroll
      for (int i = 0; i < 8; ++i) {
        const float sk = s.S[ov][k8 + i];
#pragma unroll
        for (int j = 0; j < TPT; ++j) {
          accw[j] += bf(lane8(wv[j], i)) * sk;
          accq[j] += bf(lane8(qv[j], i)) * sk;
        }
      }
    }
#pragma unroll
    for (int j = 0; j < TPT; ++j) {
      const int t = tg + TSTEP * j;
      float vn = 0.f;
      if (t < L) vn = (transfer ? 0.f : bf(p.u[((t0 + t) * p.H + h) * V + v0 + ov])) - accw[j];
      s.VN[t][ov] = vn;
    }
    __syncthreads();  // v_new complete; kg and decay staged
    // o = scale qg S^T + tril(aqk) v_new (aqk[t][u] is defined for u <= t only)
    if (outputs) {
#pragma unroll
      for (int j = 0; j < TPT; ++j) {
        const int t = tg + TSTEP * j;
        if (t >= L) continue;
        const kda_bf16* ar = p.aqk + ((t0 + t) * p.H + h) * BT;
        float acc = 0.f;
        for (int u8 = 0; u8 <= t; u8 += 8) {
          const kda_v8 av = ld8(ar + u8);
#pragma unroll
          for (int i = 0; i < 8; ++i)
            if (u8 + i <= t) acc += bf(lane8(av, i)) * s.VN[u8 + i][ov];
        }
        const float o = p.scale * accq[j] + acc;
        p.out[(t0 + t) * p.so_t + h * p.so_h + v0 + ov] = kda_f32_to_bf16(o);
      }
    }
    // S = S diag(decay) + v_new^T kg, each entry by its owner (phase A, the only other reader of S, is done)
#pragma unroll
    for (int i = 0; i < KPT; ++i) {
      const int k = sk0 + KSTEP * i;
      float acc = s.S[sv][k] * s.D[k];
      for (int t = 0; t < BT; ++t) acc += s.VN[t][sv] * bf(s.KG[t][k]);
      s.S[sv][k] = acc;
      if (ic == ck_chunk) p.ckpt[ck_row * p.sck_n + ck_base + (int64_t)sv * K + k] = acc;
    }
  }

#pragma unroll
  for (int i = 0; i < KPT; ++i) {
    const int k = sk0 + KSTEP * i;
    end_value(p, n, h, g, v0, sv, k, slot, s.S[sv][k]);
  }
#else
  // ---- matrix layer. 16 x 16 tiles, one wave per tile job. Row tile r (chunk rows), V tile vt (state
  // rows), K tile c (state columns). Each wave owns row tile r1 = wave % RT of the chunk and the V tiles
  // vw + VW i (i < NVP) of the slice:
  //   phase 1: tiles (r1, vt) of w S^T and qg S^T, reduction K (A from global, B = SB)
  //   phase 2: o tiles (r1, vt) = scale qg S^T + tril(aqk)[r1 tile, :] v_new (A from global, B = VT)
  //   phase 3 (JS state tiles per wave, tile = wave + NW i = vt CT + c): S = S diag(decay) + v_new^T kg,
  //            reduction BT (A = VT, B = KT)
  constexpr int NW = THREADS / KDA_WARP;
  constexpr int RT = BT / 16, CT = K / 16, NVT = BVS / 16;
  constexpr int VW = NW / RT, NVP = NVT / VW;  // waves per row tile, V tiles per wave
  constexpr int JS = (NVT * CT) / NW;
  static_assert(BVS % 16 == 0, "whole 16-row V tiles per slice");
  static_assert(NW % RT == 0 && NVT % VW == 0 && (NVT * CT) % NW == 0 && K % KDA_MMA_K == 0 &&
                BT % KDA_MMA_K == 0, "tile jobs");
  constexpr int KV8 = K / 8;
  const int wave = tid / KDA_WARP;
  const int r1 = wave % RT, vw = wave / RT;
  const int64_t HK = (int64_t)p.H * K, HT = (int64_t)p.H * BT;  // token strides of w/qg/kg and of aqk

  kda_frag_c st[JS];  // state tile (vt, c), tile = wave + NW i = vt CT + c
#pragma unroll
  for (int i = 0; i < JS; ++i) {
    const int tile = wave + NW * i, vt = tile / CT, c = tile % CT;
#pragma unroll
    for (int e = 0; e < KDA_C_ELEMS; ++e) {
      const int sv = 16 * vt + kda_c_row(e), k = 16 * c + kda_c_col(e);
      const float x = start_value(p, n, h, g, v0, sv, k, slot);
      st[i].x[e] = x;
      s.SB[sv][k] = kda_f32_to_bf16(x);
    }
  }

  for (int64_t ic = cb; ic < ce; ++ic) {
    const int64_t t0 = bos + ic * BT;
    const int L = (int)((eos - t0) < BT ? (eos - t0) : BT);
    const int rows = L - 16 * r1;  // valid rows of this wave's row tile (<= 0: none)
    __syncthreads();  // the previous chunk is done with VT, KT and D, and its state is in SB
    // kg, transposed, into KT (read in phase 3, after the next barrier: its loads overlap phase 1; rows past
    // L are zero, so they add nothing to the state). Consecutive threads take consecutive rows, so the
    // transposed 2-byte stores fall in distinct banks.
    for (int idx = tid; idx < BT * KV8; idx += THREADS) {
      const int r = idx % BT, d = 8 * (idx / BT);
      kda_v8 kv = {};
      if (r < L) kv = ld8(p.kg + (t0 + r) * HK + (int64_t)h * K + d);
#pragma unroll
      for (int i = 0; i < 8; ++i) s.KT[d + i][r] = lane8(kv, i);
    }
    for (int d = tid; d < K; d += THREADS) s.D[d] = p.decay[((c0 + ic) * p.H + h) * K + d];

    // phase 1: w S^T -> v_new = u - w S^T (u = 0 on transfer rows; bf16, rows past L zero) and qg S^T
    // (kept for phase 2; not needed in pass 1). One A fragment of w (and qg) per k step serves all NVP tiles.
    const int64_t arow = (t0 + 16 * r1) * HK + (int64_t)h * K;  // w / qg row 16 r1 of the chunk
    kda_frag_c aw[NVP], aq[NVP];
#pragma unroll
    for (int i = 0; i < NVP; ++i) {
      kda_frag_zero(aw[i]);
      kda_frag_zero(aq[i]);
    }
#pragma unroll
    for (int kk = 0; kk < K; kk += KDA_MMA_K) {
      kda_frag_a a_w, a_q;
      kda_load_a_rows(a_w, p.w + arow + kk, HK, rows);        // A[t][k] = w[16 r1 + t][kk + k]
      if (outputs) kda_load_a_rows(a_q, p.qg + arow + kk, HK, rows);
#pragma unroll
      for (int i = 0; i < NVP; ++i) {
        kda_frag_b b;
        kda_load_b<1, LDK>(b, &s.SB[16 * (vw + VW * i)][kk]);  // B[k][v] = S[16 vt + v][kk + k]
        kda_mma16(aw[i], a_w, b);
        if (outputs) kda_mma16(aq[i], a_q, b);  // wave-uniform
      }
    }
#pragma unroll
    for (int i = 0; i < NVP; ++i) {
      const int vt = vw + VW * i;
#pragma unroll
      for (int e = 0; e < KDA_C_ELEMS; ++e) {
        const int t = 16 * r1 + kda_c_row(e), v = 16 * vt + kda_c_col(e);
        float vn = 0.f;
        if (t < L) vn = (transfer ? 0.f : bf(p.u[((t0 + t) * p.H + h) * V + v0 + v])) - aw[i].x[e];
        s.VT[v][t] = kda_f32_to_bf16(vn);
      }
    }
    __syncthreads();  // v_new complete in VT, kg in KT, decay in D; SB no longer read
    // phase 2: o = scale qg S^T + tril(aqk) v_new (column tiles past the diagonal are zero: skipped)
    if (outputs) {
      const int kend = ((16 * (r1 + 1) + KDA_MMA_K - 1) / KDA_MMA_K) * KDA_MMA_K;
      const int64_t qrow = (t0 + 16 * r1) * HT + (int64_t)h * BT;  // aqk row 16 r1 of the chunk
      kda_frag_c o[NVP];
#pragma unroll
      for (int i = 0; i < NVP; ++i) kda_frag_zero(o[i]);
      for (int kk = 0; kk < kend; kk += KDA_MMA_K) {
        kda_frag_a a;
        kda_load_a_rows(a, p.aqk + qrow + kk, HT, rows);  // A[t][u] = aqk[16 r1 + t][kk + u]
#pragma unroll
        for (int e = 0; e < KDA_A_ELEMS; ++e)  // tril: aqk[t][u] is not defined for u > t
          if (kk + kda_a_col(e) > 16 * r1 + kda_a_row(e)) a.x[e] = 0;
#pragma unroll
        for (int i = 0; i < NVP; ++i) {
          kda_frag_b b;
          kda_load_b<1, LDT>(b, &s.VT[16 * (vw + VW * i)][kk]);  // B[u][v] = v_new[kk + u][16 vt + v]
          kda_mma16(o[i], a, b);
        }
      }
#pragma unroll
      for (int i = 0; i < NVP; ++i) {
        const int vt = vw + VW * i;
#pragma unroll
        for (int e = 0; e < KDA_C_ELEMS; ++e) {
          const int t = 16 * r1 + kda_c_row(e), v = 16 * vt + kda_c_col(e);
          if (t < L)
            p.out[(t0 + t) * p.so_t + h * p.so_h + v0 + v] = kda_f32_to_bf16(p.scale * aq[i].x[e] + o[i].x[e]);
        }
      }
    }
    // phase 3: S = S diag(decay) + v_new^T kg, tile by tile in the owners' registers (SB is rewritten: every
    // wave has passed phase 1)
#pragma unroll
    for (int i = 0; i < JS; ++i) {
      const int c = (wave + NW * i) % CT;
#pragma unroll
      for (int e = 0; e < KDA_C_ELEMS; ++e) st[i].x[e] *= s.D[16 * c + kda_c_col(e)];
    }
#pragma unroll
    for (int kk = 0; kk < BT; kk += KDA_MMA_K) {
#pragma unroll
      for (int i = 0; i < JS; ++i) {
        const int tile = wave + NW * i, vt = tile / CT, c = tile % CT;
        kda_frag_a a;
        kda_frag_b b;
        kda_load_a<LDT, 1>(a, &s.VT[16 * vt][kk]);  // A[v][t] = v_new[kk + t][16 vt + v]
        kda_load_b<1, LDT>(b, &s.KT[16 * c][kk]);   // B[t][k] = kg[kk + t][16 c + k]
        kda_mma16(st[i], a, b);
      }
    }
#pragma unroll
    for (int i = 0; i < JS; ++i) {
      const int tile = wave + NW * i, vt = tile / CT, c = tile % CT;
#pragma unroll
      for (int e = 0; e < KDA_C_ELEMS; ++e) {
        const int sv = 16 * vt + kda_c_row(e), k = 16 * c + kda_c_col(e);
        s.SB[sv][k] = kda_f32_to_bf16(st[i].x[e]);
        if (ic == ck_chunk) p.ckpt[ck_row * p.sck_n + ck_base + (int64_t)sv * K + k] = st[i].x[e];
      }
    }
  }

#pragma unroll
  for (int i = 0; i < JS; ++i) {
    const int tile = wave + NW * i, vt = tile / CT, c = tile % CT;
#pragma unroll
    for (int e = 0; e < KDA_C_ELEMS; ++e)
      end_value(p, n, h, g, v0, 16 * vt + kda_c_row(e), 16 * c + kda_c_col(e), slot, st[i].x[e]);
  }
#endif
}

}  // namespace kda
