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
__device__ __forceinline__ void st8(kda_bf16* p, const kda_v8& v) { *reinterpret_cast<kda_v8*>(p) = v; }
__device__ __forceinline__ kda_bf16 lane8(const kda_v8& v, int i) {
  return (kda_bf16)((v.x[i >> 1] >> (16 * (i & 1))) & 0xffffu);
}
// Zero the elements of columns c0 + i > r (tril mask of aqk row r).
__device__ __forceinline__ void keep_tril(kda_v8& v, int c0, int r) {
#pragma unroll
  for (int i = 0; i < 4; ++i)
    v.x[i] &= (c0 + 2 * i <= r ? 0xffffu : 0u) | (c0 + 2 * i + 1 <= r ? 0xffff0000u : 0u);
}

#if KDA_MMA_LAYER == KDA_LAYER_FMA
struct RecurrenceSmem {
  kda_bf16 W[BT][K];    // w rows of the chunk, then its kg rows
  kda_bf16 QG[BT][K];
  kda_bf16 AQ[BT][BT];  // tril(aqk), masked
  float S[BVS][K + 1];  // the state slice, S[v][k] (V-first)
  float VN[BT][BVS + 1];
  float D[K];
};
#else
// Matrix layer: the fp32 state lives in accumulator fragments (registers) for the whole walk; the GEMM
// operands are bf16 (S and v_new rounded where the Triton path rounds them). Rows padded by 8 bf16.
constexpr int PAD = 8;
constexpr int LDK = K + PAD, LDT = BT + PAD;
// Every operand is stored with its reduction index contiguous, so kda_load_a/b read k runs as vectors.
struct alignas(16) RecurrenceSmem {
  union {
    kda_bf16 W[BT][LDK];  // w[t][k] of the chunk (phase 1) ...
    kda_bf16 KT[K][LDT];  // ... then kg transposed, KT[k][t] (phase 3)
  };
  kda_bf16 QG[BT][LDK];
  kda_bf16 AQ[BT][LDT];   // tril(aqk), masked
  kda_bf16 SB[BVS][LDK];  // bf16 copy of the state slice S[v][k] (the B operand of w S^T, qg S^T)
  kda_bf16 VT[BVS][LDT];  // v_new transposed, VT[v][t], bf16
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
    __syncthreads();  // the previous chunk's S update is done with W, D and S
    for (int idx = tid; idx < BT * K; idx += THREADS) {
      const int r = idx / K, d = idx % K;
      kda_bf16 wv = 0, qv = 0;
      if (r < L) {
        const int64_t o = ((t0 + r) * p.H + h) * K + d;
        wv = p.w[o];
        if (outputs) qv = p.qg[o];
      }
      s.W[r][d] = wv;
      s.QG[r][d] = qv;
    }
    if (outputs) {
      for (int idx = tid; idx < BT * BT; idx += THREADS) {
        const int r = idx / BT, c = idx % BT;
        s.AQ[r][c] = (r < L && c <= r) ? p.aqk[((t0 + r) * p.H + h) * BT + c] : (kda_bf16)0;
      }
    }
    for (int d = tid; d < K; d += THREADS) s.D[d] = p.decay[((c0 + ic) * p.H + h) * K + d];
    __syncthreads();

    // v_new = u - w S^T (u = 0 on transfer rows) and the inter-chunk part of o, qg S^T
    float accw[TPT], accq[TPT];
#pragma unroll
    for (int j = 0; j < TPT; ++j) { accw[j] = 0.f; accq[j] = 0.f; }
    for (int k = 0; k < K; ++k) {
      const float sk = s.S[ov][k];
#pragma unroll
      for (int j = 0; j < TPT; ++j) {
        const int t = tg + TSTEP * j;
        accw[j] += bf(s.W[t][k]) * sk;
        accq[j] += bf(s.QG[t][k]) * sk;
      }
    }
#pragma unroll
    for (int j = 0; j < TPT; ++j) {
      const int t = tg + TSTEP * j;
      float vn = 0.f;
      if (t < L) vn = (transfer ? 0.f : bf(p.u[((t0 + t) * p.H + h) * V + v0 + ov])) - accw[j];
      s.VN[t][ov] = vn;
    }
    __syncthreads();
    // kg replaces w (rows past L are zero, so they add nothing to the state)
    for (int idx = tid; idx < BT * K; idx += THREADS) {
      const int r = idx / K, d = idx % K;
      s.W[r][d] = r < L ? p.kg[((t0 + r) * p.H + h) * K + d] : (kda_bf16)0;
    }
    // o = scale qg S^T + tril(aqk) v_new
    if (outputs) {
#pragma unroll
      for (int j = 0; j < TPT; ++j) {
        const int t = tg + TSTEP * j;
        if (t >= L) continue;
        float acc = 0.f;
        for (int u = 0; u <= t; ++u) acc += bf(s.AQ[t][u]) * s.VN[u][ov];
        const float o = p.scale * accq[j] + acc;
        p.out[(t0 + t) * p.so_t + h * p.so_h + v0 + ov] = kda_f32_to_bf16(o);
      }
    }
    __syncthreads();
    // S = S diag(decay) + v_new^T kg, each entry by its owner
#pragma unroll
    for (int i = 0; i < KPT; ++i) {
      const int k = sk0 + KSTEP * i;
      float acc = s.S[sv][k] * s.D[k];
      for (int t = 0; t < BT; ++t) acc += s.VN[t][sv] * bf(s.W[t][k]);
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
  // ---- matrix layer. 16 x 16 tiles, one wave per tile job, jobs dealt round-robin over the NW waves.
  // Row tile r (chunk rows), V tile vt (state rows), K tile c (state columns):
  //   phase 1 (2 JW jobs): tile (r, vt) of w S^T (jobs < JW) and of qg S^T (jobs >= JW), reduction K
  //   phase 2: the qg S^T owner of (r, vt) adds tril(aqk)[r tile, :] v_new and writes o
  //   phase 3 (NVT CT jobs): S[vt tile][c tile] = S diag(decay) + v_new^T kg, reduction BT
  constexpr int NW = THREADS / KDA_WARP;
  constexpr int RT = BT / 16, CT = K / 16, NVT = BVS / 16;
  constexpr int JW = RT * NVT;
  constexpr int J1 = (2 * JW) / NW, JS = (NVT * CT) / NW;
  static_assert(BVS % 16 == 0, "whole 16-row V tiles per slice");
  static_assert((2 * JW) % NW == 0 && (NVT * CT) % NW == 0 && K % KDA_MMA_K == 0 && BT % KDA_MMA_K == 0,
                "tile jobs");
  constexpr int KV8 = K / 8, TV8 = BT / 8;
  const int wave = tid / KDA_WARP;

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
    __syncthreads();  // the previous chunk is done with W, QG, AQ, VT, D
    for (int idx = tid; idx < BT * KV8; idx += THREADS) {
      const int r = idx / KV8, d = 8 * (idx % KV8);
      kda_v8 wv = {}, qv = {};
      if (r < L) {
        const int64_t o = ((t0 + r) * p.H + h) * K + d;
        wv = ld8(p.w + o);
        if (outputs) qv = ld8(p.qg + o);
      }
      st8(&s.W[r][d], wv);
      if (outputs) st8(&s.QG[r][d], qv);
    }
    if (outputs) {
      for (int idx = tid; idx < BT * TV8; idx += THREADS) {
        const int r = idx / TV8, c = 8 * (idx % TV8);
        kda_v8 a = {};
        if (r < L) {
          a = ld8(p.aqk + ((t0 + r) * p.H + h) * BT + c);
          keep_tril(a, c, r);
        }
        st8(&s.AQ[r][c], a);
      }
    }
    for (int d = tid; d < K; d += THREADS) s.D[d] = p.decay[((c0 + ic) * p.H + h) * K + d];
    __syncthreads();

    // phase 1: w S^T -> v_new = u - w S^T (u = 0 on transfer rows; bf16, rows past L zero) and qg S^T
    // (kept for phase 2; not needed in pass 1)
    kda_frag_c acc[J1];
#pragma unroll
    for (int j = 0; j < J1; ++j) {
      const int job = wave + NW * j;
      const bool is_w = job < JW;
      const int jj = is_w ? job : job - JW, r = jj / NVT, vt = jj % NVT;
      kda_frag_zero(acc[j]);
      if (!is_w && !outputs) continue;  // wave-uniform
      const kda_bf16* A = is_w ? &s.W[16 * r][0] : &s.QG[16 * r][0];
#pragma unroll 2
      for (int kk = 0; kk < K; kk += KDA_MMA_K) {
        kda_frag_a a;
        kda_frag_b b;
        kda_load_a<LDK, 1>(a, A + kk);                 // A[t][k] = w[16 r + t][kk + k]
        kda_load_b<1, LDK>(b, &s.SB[16 * vt][kk]);     // B[k][v] = S[16 vt + v][kk + k]
        kda_mma16(acc[j], a, b);
      }
      if (is_w) {
#pragma unroll
        for (int e = 0; e < KDA_C_ELEMS; ++e) {
          const int t = 16 * r + kda_c_row(e), v = 16 * vt + kda_c_col(e);
          float vn = 0.f;
          if (t < L) vn = (transfer ? 0.f : bf(p.u[((t0 + t) * p.H + h) * V + v0 + v])) - acc[j].x[e];
          s.VT[v][t] = kda_f32_to_bf16(vn);
        }
      }
    }
    __syncthreads();  // v_new complete; w no longer read
    // kg, transposed, replaces w (rows past L are zero, so they add nothing to the state). Consecutive
    // threads take consecutive rows, so the transposed 2-byte stores fall in distinct banks.
    for (int idx = tid; idx < BT * KV8; idx += THREADS) {
      const int r = idx % BT, d = 8 * (idx / BT);
      kda_v8 kv = {};
      if (r < L) kv = ld8(p.kg + ((t0 + r) * p.H + h) * K + d);
#pragma unroll
      for (int i = 0; i < 8; ++i) s.KT[d + i][r] = lane8(kv, i);
    }
    // phase 2: o = scale qg S^T + tril(aqk) v_new (column tiles past the diagonal are zero: skipped)
    if (outputs) {
#pragma unroll
      for (int j = 0; j < J1; ++j) {
        const int job = wave + NW * j;
        if (job < JW) continue;  // wave-uniform
        const int jj = job - JW, r = jj / NVT, vt = jj % NVT;
        const int kend = ((16 * (r + 1) + KDA_MMA_K - 1) / KDA_MMA_K) * KDA_MMA_K;
        kda_frag_c o;
        kda_frag_zero(o);
        for (int kk = 0; kk < kend; kk += KDA_MMA_K) {
          kda_frag_a a;
          kda_frag_b b;
          kda_load_a<LDT, 1>(a, &s.AQ[16 * r][kk]);       // A[t][u] = aqk[16 r + t][kk + u]
          kda_load_b<1, LDT>(b, &s.VT[16 * vt][kk]);      // B[u][v] = v_new[kk + u][16 vt + v]
          kda_mma16(o, a, b);
        }
#pragma unroll
        for (int e = 0; e < KDA_C_ELEMS; ++e) {
          const int t = 16 * r + kda_c_row(e), v = 16 * vt + kda_c_col(e);
          if (t < L)
            p.out[(t0 + t) * p.so_t + h * p.so_h + v0 + v] = kda_f32_to_bf16(p.scale * acc[j].x[e] + o.x[e]);
        }
      }
    }
    __syncthreads();  // kg in KT
    // phase 3: S = S diag(decay) + v_new^T kg, tile by tile in the owners' registers
#pragma unroll
    for (int i = 0; i < JS; ++i) {
      const int tile = wave + NW * i, vt = tile / CT, c = tile % CT;
#pragma unroll
      for (int e = 0; e < KDA_C_ELEMS; ++e) st[i].x[e] *= s.D[16 * c + kda_c_col(e)];
#pragma unroll
      for (int kk = 0; kk < BT; kk += KDA_MMA_K) {
        kda_frag_a a;
        kda_frag_b b;
        kda_load_a<LDT, 1>(a, &s.VT[16 * vt][kk]);  // A[v][t] = v_new[kk + t][16 vt + v]
        kda_load_b<1, LDT>(b, &s.KT[16 * c][kk]);   // B[t][k] = kg[kk + t][16 c + k]
        kda_mma16(st[i], a, b);
      }
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
