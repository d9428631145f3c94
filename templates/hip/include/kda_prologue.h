// SPDX-License-Identifier: Apache-2.0
// kda_prologue.h: the fused path's prologue kernel (copied verbatim; constants: kda_common.h).
#pragma once

#include "kda_common.h"

namespace kda {

struct PrologueArgs {
  const kda_bf16 *q, *k, *v, *g, *beta;
  const float *A_log, *g_bias;  // g_bias may be null
  const int32_t *cu_seqlens, *chunk_indices;
  kda_bf16 *qg, *w, *kg, *u, *aqk;  // [T, H, K] x3 (qg, w, kg), [T, H, V], [T, H, BT]
  float* decay;                     // [chunks, H, K]
  int64_t sq_t, sq_h, sk_t, sk_h, sv_t, sv_h, sg_t, sg_h, sb_t, sb_h;
  int H;
  float scale, lower_bound;
  int lower_bound_gate;  // 1: lower_bound * sigmoid(a z); 0: -a softplus(z)
  int use_l2norm;
};

// bf16 operand tiles of the matrix layer: rows padded by 8 bf16 (16-byte aligned rows, k contiguous).
constexpr int PLDK = DK + 8, PLDT = BT + 8;

// Shared memory by phase: (1) per column tile, G, Kt and Q (and, matrix layer, KC) for Aqk/Akk; (2) A from
// their accumulators; (3) the inverse reads A and writes T; (4) per column tile, G, Kt and the right operand
// of w/u (FMA: in Kt's place; matrix layer: XT) with T. A is live only in (2)-(3), when no column tile is,
// so it shares their space; T sits past G, Kt (and XT), so that it neither overlaps A while the inverse
// writes it nor the tiles while (4) reads it. That keeps a block under 32 KiB (two blocks per gfx942 CU:
// kdagen/targets.py AMD_MIN_WAVES_PER_SIMD).
struct alignas(16) PrologueSmem {
  union {
    struct {
      float G[BT][DK + 1];   // log2 cumulative gate of the current column tile
      float Kt[BT][DK + 1];  // normalised k tile; (FMA, phase 4) then beta k exp2(G) or beta v
      union {
        struct {                        // phase 1
          float Q[BT][DK + 1];          // normalised q tile
#if KDA_MMA_LAYER != KDA_LAYER_FMA
          kda_bf16 KC[BT - 16][PLDK];   // k_s exp2(E_j - G_s), E_j = G at row 16 j + 15, j = s / 16
#endif
        } qk;
        struct {                        // phases 3-4
#if KDA_MMA_LAYER == KDA_LAYER_FMA
          // (I + A)^-1, lower triangle by rows: T[t][s] at t (t + 1) / 2 + s; then one slot per column
          // for the inverse's stores above the diagonal (see there)
          float T[BT * (BT + 1) / 2 + BT];
#else
          kda_bf16 XT[DK][PLDT];        // beta k exp2(G) or beta v, bf16 and transposed: XT[d][s]
          kda_bf16 TB[BT][PLDT];        // (I + A)^-1 in bf16
#endif
        } wu;
      };
    } tile;                  // one column tile of the chunk (load_tile)
    float A[BT][BT + 1];     // phases 2-3: beta_t * Akk[t, s], s < t
  };
  float beta[BT], rq[BT], rk[BT];
  float GL[DK];            // G at the chunk's last valid row (rows past it carry g = 0)
};
#if KDA_MMA_LAYER == KDA_LAYER_FMA
static_assert(offsetof(PrologueSmem, tile.wu.T) >= sizeof(PrologueSmem::A),
              "T (written by the inverse) must not overlap A (read by it)");
#else
static_assert(offsetof(PrologueSmem, tile.wu.TB) >= sizeof(PrologueSmem::A),
              "TB (written by the inverse) must not overlap A (read by it)");
#endif

__device__ __forceinline__ float gate(float z, float a, const PrologueArgs& p) {
  if (p.lower_bound_gate) return p.lower_bound * kda_sigmoid(a * z);
  // softplus(z) = max(z, 0) + log(1 + exp(-|z|)), overflow-free
  float az = z < 0.f ? -z : z;
  return -a * ((z > 0.f ? z : 0.f) + kda_log(1.0f + kda_exp(-az)));
}

// Fill s.G (cumsummed), s.Kt and (when want_q) s.Q for columns [kt*DK, kt*DK + DK) of this chunk.
__device__ __forceinline__ void load_tile(PrologueSmem& s, const PrologueArgs& p, int kt, int64_t t0, int L,
                                          int h, float ah, bool want_q) {
  const int tid = threadIdx.x;
  for (int idx = tid; idx < BT * DK; idx += THREADS) {
    const int r = idx / DK, d = idx % DK, col = kt * DK + d;
    float gv = 0.f, qv = 0.f, kv = 0.f;
    if (r < L) {
      const int64_t tok = t0 + r;
      float z = bf(p.g[tok * p.sg_t + h * p.sg_h + col]);
      if (p.g_bias) z += p.g_bias[(int64_t)h * K + col];
      gv = gate(z, ah, p) * RCP_LN2;
      kv = bf(p.k[tok * p.sk_t + h * p.sk_h + col]) * s.rk[r];
      if (want_q) qv = bf(p.q[tok * p.sq_t + h * p.sq_h + col]) * s.rq[r];
    }
    s.tile.G[r][d] = gv;
    s.tile.Kt[r][d] = kv;
    if (want_q) s.tile.qk.Q[r][d] = qv;
  }
  __syncthreads();
  if (tid < DK) {
    float acc = 0.f;
    for (int r = 0; r < BT; ++r) {
      acc += s.tile.G[r][tid];
      s.tile.G[r][tid] = acc;
    }
    s.GL[tid] = acc;  // g = 0 past the last valid row, so this is G at row L - 1
  }
  __syncthreads();
}

__global__ KDA_LAUNCH_BOUNDS(THREADS) void kda_prologue_kernel(PrologueArgs p) {
  KDA_SMEM(PrologueSmem, s);
  const int tid = threadIdx.x;
  const int64_t c = blockIdx.x;
  const int h = blockIdx.y;
  const int64_t n = p.chunk_indices[2 * c], it = p.chunk_indices[2 * c + 1];
  const int64_t bos = p.cu_seqlens[n], eos = p.cu_seqlens[n + 1];
  const int64_t t0 = bos + it * BT;
  const int L = (int)((eos - t0) < BT ? (eos - t0) : BT);
  const float ah = kda_exp(p.A_log[h]);

  // ---- beta and the q/k row norms: 4 threads per row
  {
    const int r = tid >> 2, part = tid & 3;
    float sq = 0.f, sk = 0.f;
    if (r < L) {
      const kda_bf16* qr = p.q + (t0 + r) * p.sq_t + h * p.sq_h;
      const kda_bf16* kr = p.k + (t0 + r) * p.sk_t + h * p.sk_h;
      for (int d = part; d < K; d += 4) {
        const float x = bf(qr[d]), y = bf(kr[d]);
        sq += x * x;
        sk += y * y;
      }
    }
    sq += kda_shfl_xor(sq, 1);
    sq += kda_shfl_xor(sq, 2);
    sk += kda_shfl_xor(sk, 1);
    sk += kda_shfl_xor(sk, 2);
    if (part == 0) {
      s.rq[r] = p.use_l2norm ? kda_rsqrt(sq + 1e-6f) : 1.f;
      s.rk[r] = p.use_l2norm ? kda_rsqrt(sk + 1e-6f) : 1.f;
      s.beta[r] = r < L ? kda_sigmoid(bf(p.beta[(t0 + r) * p.sb_t + h * p.sb_h])) : 0.f;
    }
  }

#if KDA_MMA_LAYER == KDA_LAYER_FMA
  // ---- entries (t, s <= t) of Aqk and Akk: rows rp and BT-1-rp share 8 threads (BT + 1 entries)
  constexpr int SLOTS = (BT + 1 + 7) / 8;
  const int rp = tid >> 3, sub = tid & 7;
  int pt[SLOTS], ps[SLOTS];
  float accq[SLOTS], acck[SLOTS];
#pragma unroll
  for (int j = 0; j < SLOTS; ++j) {
    const int e = sub + 8 * j;
    pt[j] = -1;
    ps[j] = 0;
    if (e <= BT) {
      if (e <= rp) { pt[j] = rp; ps[j] = e; }
      else { pt[j] = BT - 1 - rp; ps[j] = e - rp - 1; }
    }
    accq[j] = 0.f;
    acck[j] = 0.f;
  }

  for (int kt = 0; kt < K / DK; ++kt) {
    __syncthreads();  // the previous tile's readers are done (and beta/norms are visible)
    load_tile(s, p, kt, t0, L, h, ah, true);
    // qg = q exp2(G), kg = k exp2(G_L - G), decay = exp2(G_L)
    for (int idx = tid; idx < BT * DK; idx += THREADS) {
      const int r = idx / DK, d = idx % DK;
      if (r < L) {
        const int64_t o = ((t0 + r) * p.H + h) * K + kt * DK + d;
        const float Gv = s.tile.G[r][d];
        p.qg[o] = kda_f32_to_bf16(s.tile.qk.Q[r][d] * kda_exp2(Gv));
        p.kg[o] = kda_f32_to_bf16(s.tile.Kt[r][d] * kda_exp2(s.GL[d] - Gv));
      }
    }
    if (tid < DK) p.decay[(c * p.H + h) * K + kt * DK + tid] = kda_exp2(s.GL[tid]);
#pragma unroll
    for (int j = 0; j < SLOTS; ++j) {
      if (pt[j] < 0) continue;
      const int t = pt[j], u = ps[j];
      float aq = accq[j], ak = acck[j];
      for (int d = 0; d < DK; ++d) {
        // s <= t: G_t <= G_s, so the factor is exact and <= 1 whatever the gate.
        const float kd = s.tile.Kt[u][d] * kda_exp2(s.tile.G[t][d] - s.tile.G[u][d]);
        aq += s.tile.qk.Q[t][d] * kd;
        ak += s.tile.Kt[t][d] * kd;
      }
      accq[j] = aq;
      acck[j] = ak;
    }
  }
  __syncthreads();
#pragma unroll
  for (int j = 0; j < SLOTS; ++j) {
    if (pt[j] < 0) continue;
    const int t = pt[j], u = ps[j];
    if (t < L) p.aqk[((t0 + t) * p.H + h) * BT + u] = kda_f32_to_bf16(accq[j] * p.scale);
    s.A[t][u] = u < t ? acck[j] * s.beta[t] : 0.f;
  }
  __syncthreads();

#else
  // ---- Aqk and Akk on the matrix layer. Off-diagonal 16 x 16 blocks (i, j), j < i, reference row
  // 16 j + 15 (E_j = its G): A operand x_t exp2(G_t - E_j), B operand k_s exp2(E_j - G_s), both
  // exponents <= 0 whatever the gate, both rounded to bf16 (as the Triton path's off-diagonal blocks);
  // fp32 accumulation over all K. Each pair's Aqk and Akk tiles share one wave and the B fragment.
  // Diagonal blocks stay fp32 with the exact exp2(G_t - G_s) per term (s <= t, every factor <= 1).
  constexpr int NW = THREADS / KDA_WARP;
  constexpr int NB = BT / 16;
  constexpr int NP = NB * (NB - 1) / 2;  // off-diagonal block pairs
  constexpr int JP = (NP + NW - 1) / NW;
  constexpr int DTRI = 16 * 17 / 2;      // entries s <= t of one diagonal block
  constexpr int DSLOTS = (NB * DTRI + THREADS - 1) / THREADS;
  static_assert(BT % 16 == 0 && DK % KDA_MMA_K == 0 && BT % KDA_MMA_K == 0, "prologue tile jobs");
  const int wave = tid / KDA_WARP;
  int pt[DSLOTS], ps[DSLOTS];
  float accq[DSLOTS], acck[DSLOTS];
#pragma unroll
  for (int j = 0; j < DSLOTS; ++j) {
    const int e = tid + THREADS * j;
    pt[j] = -1;
    ps[j] = 0;
    if (e < NB * DTRI) {
      const int b = e / DTRI, l = e % DTRI;
      int r = 0;
      while ((r + 1) * (r + 2) / 2 <= l) ++r;
      pt[j] = 16 * b + r;
      ps[j] = 16 * b + l - r * (r + 1) / 2;
    }
    accq[j] = 0.f;
    acck[j] = 0.f;
  }
  int pi[JP], pj[JP];
  kda_frag_c mq[JP], mk[JP];
#pragma unroll
  for (int jp = 0; jp < JP; ++jp) {
    int q = wave + NW * jp, i = 1;
    while (q >= i) { q -= i; ++i; }  // pair index -> (i, j), j < i
    pi[jp] = wave + NW * jp < NP ? i : -1;
    pj[jp] = q;
    kda_frag_zero(mq[jp]);
    kda_frag_zero(mk[jp]);
  }

  for (int kt = 0; kt < K / DK; ++kt) {
    __syncthreads();  // the previous tile's readers are done (and beta/norms are visible)
    load_tile(s, p, kt, t0, L, h, ah, true);
    // qg = q exp2(G), kg = k exp2(G_L - G), decay = exp2(G_L)
    for (int idx = tid; idx < BT * DK; idx += THREADS) {
      const int r = idx / DK, d = idx % DK;
      if (r < L) {
        const int64_t o = ((t0 + r) * p.H + h) * K + kt * DK + d;
        const float Gv = s.tile.G[r][d];
        p.qg[o] = kda_f32_to_bf16(s.tile.qk.Q[r][d] * kda_exp2(Gv));
        p.kg[o] = kda_f32_to_bf16(s.tile.Kt[r][d] * kda_exp2(s.GL[d] - Gv));
      }
    }
    if (tid < DK) p.decay[(c * p.H + h) * K + kt * DK + tid] = kda_exp2(s.GL[tid]);
    // B operand rows s < BT - 16 (column blocks j < NB - 1)
    for (int idx = tid; idx < (BT - 16) * DK; idx += THREADS) {
      const int r = idx / DK, d = idx % DK;
      s.tile.qk.KC[r][d] = kda_f32_to_bf16(s.tile.Kt[r][d] * kda_exp2(s.tile.G[r | 15][d] - s.tile.G[r][d]));
    }
    // diagonal blocks, fp32
#pragma unroll
    for (int j = 0; j < DSLOTS; ++j) {
      if (pt[j] < 0) continue;
      const int t = pt[j], u = ps[j];
      float aq = accq[j], ak = acck[j];
      for (int d = 0; d < DK; ++d) {
        const float kd = s.tile.Kt[u][d] * kda_exp2(s.tile.G[t][d] - s.tile.G[u][d]);
        aq += s.tile.qk.Q[t][d] * kd;
        ak += s.tile.Kt[t][d] * kd;
      }
      accq[j] = aq;
      acck[j] = ak;
    }
    __syncthreads();  // KC complete
#pragma unroll
    for (int jp = 0; jp < JP; ++jp) {
      if (pi[jp] < 0) continue;  // wave-uniform
      const int i = pi[jp], j = pj[jp], er = 16 * j + 15;
#pragma unroll
      for (int kk = 0; kk < DK; kk += KDA_MMA_K) {
        kda_frag_a aq, ak;
        kda_frag_b b;
        kda_load_b<1, PLDK>(b, &s.tile.qk.KC[16 * j][kk]);  // B[d][s] = KC[16 j + s][kk + d]
#pragma unroll
        for (int e = 0; e < KDA_A_ELEMS; ++e) {
          const int t = 16 * i + kda_a_row(e), d = kk + kda_a_col(e);
          const float f = kda_exp2(s.tile.G[t][d] - s.tile.G[er][d]);
          aq.x[e] = kda_f32_to_bf16(s.tile.qk.Q[t][d] * f);
          ak.x[e] = kda_f32_to_bf16(s.tile.Kt[t][d] * f);
        }
        kda_mma16(mq[jp], aq, b);
        kda_mma16(mk[jp], ak, b);
      }
    }
  }
  __syncthreads();  // G, Kt, Q and KC (in A's place) no longer read
#pragma unroll
  for (int j = 0; j < DSLOTS; ++j) {
    if (pt[j] < 0) continue;
    const int t = pt[j], u = ps[j];
    if (t < L) p.aqk[((t0 + t) * p.H + h) * BT + u] = kda_f32_to_bf16(accq[j] * p.scale);
    s.A[t][u] = u < t ? acck[j] * s.beta[t] : 0.f;
  }
#pragma unroll
  for (int jp = 0; jp < JP; ++jp) {
    if (pi[jp] < 0) continue;
#pragma unroll
    for (int e = 0; e < KDA_C_ELEMS; ++e) {
      const int t = 16 * pi[jp] + kda_c_row(e), u = 16 * pj[jp] + kda_c_col(e);
      if (t < L) p.aqk[((t0 + t) * p.H + h) * BT + u] = kda_f32_to_bf16(mq[jp].x[e] * p.scale);
      s.A[t][u] = mk[jp].x[e] * s.beta[t];
    }
  }
  __syncthreads();
#endif

  // ---- (I + A)^-1 by forward substitution in fp32: one thread per column, the column in registers. Each
  // entry is stored as soon as it is final (stored at the end, the column and the loads of A scheduled
  // ahead of it overflow 256 VGPRs on gfx942 and spill).
  if (tid < BT) {
    const int cidx = tid;
    const float(*__restrict__ A)[BT + 1] = s.A;  // (T does not overlap A: static_assert above)
#if KDA_MMA_LAYER == KDA_LAYER_FMA
    float* __restrict__ T = s.tile.wu.T;
#else
    kda_bf16(*__restrict__ T)[PLDT] = s.tile.wu.TB;
#endif
    float col[BT];
#pragma unroll
    for (int t = 0; t < BT; ++t) {
      float acc = t == cidx ? 1.f : 0.f;
#pragma unroll
      for (int u = 0; u < t; ++u) acc -= A[t][u] * col[u];
      col[t] = acc;
#if KDA_MMA_LAYER == KDA_LAYER_FMA
      // Entries above the diagonal (0, never read) go to this column's spare slot: an unconditional store
      // (guarded by t >= cidx, ptxas spills).
      T[t >= cidx ? t * (t + 1) / 2 + cidx : BT * (BT + 1) / 2 + cidx] = acc;
#else
      T[t][cidx] = kda_f32_to_bf16(acc);  // (the Triton path rounds T for w/u too; 0 above the diagonal)
#endif
    }
  }

#if KDA_MMA_LAYER == KDA_LAYER_FMA
  // ---- w = T diag(beta) (k exp2(G)), u = T diag(beta) v, one column tile at a time
  for (int kt = 0; kt < K / DK + V / DK; ++kt) {
    const bool is_w = kt < K / DK;
    __syncthreads();
    if (is_w) {
      load_tile(s, p, kt, t0, L, h, ah, false);
      for (int idx = tid; idx < BT * DK; idx += THREADS) {  // in place: each entry by its own thread
        const int r = idx / DK, d = idx % DK;
        s.tile.Kt[r][d] = s.beta[r] * s.tile.Kt[r][d] * kda_exp2(s.tile.G[r][d]);
      }
    } else {
      const int vt = kt - K / DK;
      for (int idx = tid; idx < BT * DK; idx += THREADS) {
        const int r = idx / DK, d = idx % DK;
        s.tile.Kt[r][d] = r < L ? s.beta[r] * bf(p.v[(t0 + r) * p.sv_t + h * p.sv_h + vt * DK + d]) : 0.f;
      }
    }
    __syncthreads();
    for (int idx = tid; idx < BT * DK; idx += THREADS) {
      const int r = idx / DK, d = idx % DK;
      if (r >= L) continue;
      const float* Tr = s.tile.wu.T + r * (r + 1) / 2;
      float acc = 0.f;
      for (int u = 0; u <= r; ++u) acc += Tr[u] * s.tile.Kt[u][d];
      if (is_w) p.w[((t0 + r) * p.H + h) * K + kt * DK + d] = kda_f32_to_bf16(acc);
      else p.u[((t0 + r) * p.H + h) * V + (kt - K / DK) * DK + d] = kda_f32_to_bf16(acc);
    }
  }
#else
  // ---- w = T diag(beta) (k exp2(G)), u = T diag(beta) v on the matrix layer: T rounded to bf16 (as the
  // Triton path does for w/u), the right operand bf16 and transposed, XT[d][s]. Jobs: 16 x 16 output
  // tiles (row block i, column tile c) of each column tile; T is lower triangular, so row block i
  // reduces over its first 16 (i + 1) columns (rounded up to KDA_MMA_K; T is exactly 0 above the diagonal).
  // (TB is complete after the loop's first barrier; A is no longer read)
  constexpr int CTN = DK / 16, WJ = NB * CTN, JW = (WJ + NW - 1) / NW;
  for (int kt = 0; kt < K / DK + V / DK; ++kt) {
    const bool is_w = kt < K / DK;
    __syncthreads();
    if (is_w) {
      load_tile(s, p, kt, t0, L, h, ah, false);
      for (int idx = tid; idx < BT * DK; idx += THREADS) {
        const int r = idx % BT, d = idx / BT;
        s.tile.wu.XT[d][r] = kda_f32_to_bf16(s.beta[r] * s.tile.Kt[r][d] * kda_exp2(s.tile.G[r][d]));
      }
    } else {
      const int vt = kt - K / DK;
      for (int idx = tid; idx < BT * DK; idx += THREADS) {
        const int r = idx % BT, d = idx / BT;
        const float x = r < L ? s.beta[r] * bf(p.v[(t0 + r) * p.sv_t + h * p.sv_h + vt * DK + d]) : 0.f;
        s.tile.wu.XT[d][r] = kda_f32_to_bf16(x);
      }
    }
    __syncthreads();
#pragma unroll
    for (int jw = 0; jw < JW; ++jw) {
      const int q = wave + NW * jw;
      if (q >= WJ) continue;  // wave-uniform
      const int ct = q / NB, r = q % NB;
      const int i = (ct & 1) ? NB - 1 - r : r;  // zigzag: a wave's jobs even out the triangle
      const int kend = ((16 * (i + 1) + KDA_MMA_K - 1) / KDA_MMA_K) * KDA_MMA_K;
      kda_frag_c acc;
      kda_frag_zero(acc);
      for (int kk = 0; kk < kend; kk += KDA_MMA_K) {
        kda_frag_a a;
        kda_frag_b b;
        kda_load_a<PLDT, 1>(a, &s.tile.wu.TB[16 * i][kk]);   // A[t][s] = T[16 i + t][kk + s]
        kda_load_b<1, PLDT>(b, &s.tile.wu.XT[16 * ct][kk]);  // B[s][d] = X[kk + s][16 ct + d]
        kda_mma16(acc, a, b);
      }
#pragma unroll
      for (int e = 0; e < KDA_C_ELEMS; ++e) {
        const int t = 16 * i + kda_c_row(e), d = 16 * ct + kda_c_col(e);
        if (t >= L) continue;
        if (is_w) p.w[((t0 + t) * p.H + h) * K + kt * DK + d] = kda_f32_to_bf16(acc.x[e]);
        else p.u[((t0 + t) * p.H + h) * V + (kt - K / DK) * DK + d] = kda_f32_to_bf16(acc.x[e]);
      }
    }
  }
#endif
}

}  // namespace kda
