// SPDX-License-Identifier: Apache-2.0
// kda_intra.h: the chunk-parallel half on 16-row walk chunks (copied verbatim; constants: kda_common.h). Two
// designs of one kernel, kda_intra_kernel, with one argument struct; the instantiation picks one per target
// (KDA_INTRA_WAVE, kdagen/targets.py Target.hip_intra_wave):
//  the block design  one workgroup of THREADS threads per item, INTRA_ITEMS items one after the other, phases
//                    separated by barriers (below, "Block design");
//  the wave design   one wave per item, INTRA_WAVES independent waves per workgroup, INTRA_WAVE_ITEMS each, no
//                    barrier: the element work runs in the matrix layer's A-fragment order (kda_mma.h "the A
//                    layout as an elementwise layout"), so the Aqk / Akk operands never leave registers
//                    ("Wave design"). It needs a matrix layer and about 16 KB of LDS per wave.
//
// The Triton kernel kda_intra at intra_rows 16 computes the same workspace (docs/design.md, "The chunk stages";
// docs/performance-model.md, "Per-kernel times as last measured" and "HIP kernel knobs"). A walk chunk
// is the ISPLIT-th part of a metadata chunk of BT rows. For the bounded gate and L2-normed q, k only (the plan's
// rule): factors relative to row IREF span at most 8 rows of decay, within bf16's range, and |q|, |k| <= 1.
#pragma once

#include "kda_common.h"

#if !defined(KDA_INTRA_WAVE)
#define KDA_INTRA_WAVE 0
#endif
// The wave design on a matrix layer only: -DKDA_MMA_LAYER=0 (the FMA fallback) takes the block design.
#if KDA_INTRA_WAVE && KDA_MMA_LAYER != KDA_LAYER_FMA
#define KDA_INTRA_WAVE_ON 1
#else
#define KDA_INTRA_WAVE_ON 0
#endif

namespace kda {

constexpr int IR = 16;                  // rows of a walk chunk: one matrix-layer tile
constexpr int ISPLIT = BT / IR;         // walk chunks per metadata chunk
constexpr int IREF = IR / 2 - 1;        // reference row of the Aqk / Akk factors
constexpr int IH = IR / 2;              // rows of the inverse's diagonal blocks
// (walk chunk, head) items per workgroup of the block design, one after the other: the target's
// Target.hip_intra_items (rendered by the instantiation).
#ifndef INTRA_ITEMS
#define INTRA_ITEMS 4
#endif
static_assert(K % 32 == 0 && V % 16 == 0 && K <= 256 && V <= 256, "K a multiple of 32, V of 16, both <= 256");
#if KDA_MMA_LAYER == KDA_LAYER_FMA
constexpr int IKP = IR;
#else
// The T products' reduction runs over KDA_MMA_K rows (32 on gfx950): T's columns and the B tiles' rows past
// IR are zero.
constexpr int IKP = IR > KDA_MMA_K ? IR : KDA_MMA_K;
#endif
// Rows padded by 8 bf16 (16 bytes): the matrix layer's fragment reads and writes of consecutive rows then
// fall in different banks.
constexpr int ILK = K + 8, ILV = V + 8, ILT = IKP + 8;
constexpr int ILA = IR + 4;  // fp32 rows of A: 16-byte aligned for the substitution's row reads

template <int N>
constexpr int IRUN = N % 8 == 0 ? 8 : N % 4 == 0 ? 4 : N % 2 == 0 ? 2 : 1;  // elements per access
template <int N>
struct alignas(2 * IRUN<N>) IntraRun { kda_bf16 x[N]; };

template <int N>
struct alignas(2 * IRUN<N>) IntraWords { uint32_t w[N / 2]; };
// N I/O elements from global memory as N / 2 words (element 2i in the low half of word i), zeros when !valid: 8- or
// 16-byte loads when `vec`, else one by one (strided projections). Words, not 16-bit lanes: the compiler then
// neither splits nor merges halves, and a float costs one shift or mask (intra_f).
template <int N>
__device__ __forceinline__ void intra_load(IntraWords<N>& out, const kda_io* p, bool vec, bool valid) {
#pragma unroll
  for (int i = 0; i < N / 2; ++i) out.w[i] = 0u;
  if (!valid) return;
  if (vec) {
#pragma unroll
    for (int i = 0; i < N; i += IRUN<N>)
      *reinterpret_cast<IntraWords<IRUN<N>>*>(&out.w[i / 2]) = *reinterpret_cast<const IntraWords<IRUN<N>>*>(p + i);
  } else {
#pragma unroll
    for (int e = 0; e < N; e += 2) out.w[e / 2] = (uint32_t)p[e] | ((uint32_t)p[e + 1] << 16);
  }
}
template <int N>
__device__ __forceinline__ float intra_f(const IntraWords<N>& r, int e) {  // element e as fp32
#if KDA_IO_FP16
  return kda_f16_to_f32((uint16_t)(e % 2 == 0 ? r.w[e / 2] & 0xffffu : r.w[e / 2] >> 16));
#else
  return kda_u2f(e % 2 == 0 ? r.w[e / 2] << 16 : r.w[e / 2] & 0xffff0000u);
#endif
}
template <int N>
__device__ __forceinline__ void intra_store(kda_bf16* p, const float* x) {  // p 2 IRUN<N>-byte aligned
#pragma unroll
  for (int i = 0; i < N; i += IRUN<N>) {
    IntraWords<IRUN<N>> r;
#pragma unroll
    for (int e = 0; e < IRUN<N> / 2; ++e) r.w[e] = kda_f32x2_to_bf16x2(x[i + 2 * e], x[i + 2 * e + 1]);
    *reinterpret_cast<IntraWords<IRUN<N>>*>(p + i) = r;
  }
}
template <int N>
__device__ __forceinline__ void intra_copy(kda_bf16* dst, const kda_bf16* src) {  // both 2 IRUN<N>-byte aligned
#pragma unroll
  for (int i = 0; i < N; i += IRUN<N>)
    *reinterpret_cast<IntraRun<IRUN<N>>*>(dst + i) = *reinterpret_cast<const IntraRun<IRUN<N>>*>(src + i);
}
template <int R>
struct alignas(4 * R) IntraF { float x[R]; };
template <int N>
constexpr int IFRUN = N % 4 == 0 ? 4 : N % 2 == 0 ? 2 : 1;  // fp32 per access
template <int N>
__device__ __forceinline__ void intra_ld_f(float* out, const float* p) {  // N fp32, 4 IFRUN-byte aligned
  using F = IntraF<IFRUN<N>>;
#pragma unroll
  for (int i = 0; i < N; i += IFRUN<N>) *reinterpret_cast<F*>(out + i) = *reinterpret_cast<const F*>(p + i);
}
template <int N>
__device__ __forceinline__ void intra_st_f(float* p, const float* x) {
  using F = IntraF<IFRUN<N>>;
#pragma unroll
  for (int i = 0; i < N; i += IFRUN<N>) *reinterpret_cast<F*>(p + i) = *reinterpret_cast<const F*>(x + i);
}
__host__ __device__ __forceinline__ bool intra_aligned(const void* p, int64_t s1, int64_t s2, int run) {
  return ((uintptr_t)p % 16 == 0) && (s1 % run == 0) && (s2 % run == 0);
}

// T = (I + A)^-1 in fp32, A strictly lower, exact: the two IH-row diagonal blocks by forward substitution at once
// (lane j < IR solves column j % IH of block j / IH: N = T - I, N[i][j] = -A[i][j] - sum_m A[i][m] N[m][j]), then
// the off-diagonal block T21 = -T22 (A21 T11); half the dependent steps of one 16-row substitution. Lanes < 32 of
// the calling wave work, in TF (fp32; T12 = 0 is never stored, its place holds A21 T11 meanwhile); the wave
// syncs between the steps, so every lane of it must call. Ends with TB = bf16(T), with kBetaCols also
// TBb = bf16(T diag(s.beta)), padding columns zero. S: either design's LDS (A, TF, TB, beta, TBb).
template <bool kBetaCols, class S>
__device__ __forceinline__ void intra_inverse(S& s, int lane) {
  if (lane < IR) {
    const int o = (lane / IH) * IH, j = lane % IH;
    float n[IH];
#pragma unroll
    for (int i = 0; i < IH; ++i) {
      float a[IH];  // row o + i of the block: one address per half of the lanes, 16-byte reads
      intra_ld_f<IH>(a, &s.A[o + i][o]);
      float x0 = -s.A[o + i][o + j], x1 = 0.f;  // two chains
#pragma unroll
      for (int m = 0; m < i; m += 2) {
        x0 -= a[m] * n[m];
        if (m + 1 < i) x1 -= a[m + 1] * n[m + 1];
      }
      n[i] = x0 + x1;
    }
#pragma unroll
    for (int i = 0; i < IH; ++i) s.TF[o + i][o + j] = n[i] + (i == j ? 1.f : 0.f);
  }
  kda_wave_sync();
  if (lane < 32) {  // X = A21 T11 into TF's upper-right block
#pragma unroll
    for (int e = lane; e < IH * IH; e += 32) {
      const int i = e / IH, j = e % IH;
      float a[IH], x = 0.f;
      intra_ld_f<IH>(a, &s.A[IH + i][0]);
#pragma unroll
      for (int m = 0; m < IH; ++m) x += a[m] * s.TF[m][j];
      s.TF[i][IH + j] = x;
    }
  }
  kda_wave_sync();
  if (lane < 32) {  // T21 = -T22 X
#pragma unroll
    for (int e = lane; e < IH * IH; e += 32) {
      const int i = e / IH, j = e % IH;
      float x = 0.f;
#pragma unroll
      for (int m = 0; m < IH; ++m) x -= s.TF[IH + i][IH + m] * s.TF[m][IH + j];
      s.TF[IH + i][j] = x;
    }
  }
  kda_wave_sync();
  static_assert(IR == 16 && IH == 8, "TB out: lane l < 32 converts row l / 2, columns 8 (l % 2) + [0, 8)");
  if (lane < 32) {
    const int i = lane / 2, c = 8 * (lane % 2);
    float t[8];
    intra_ld_f<8>(t, &s.TF[i][c]);
    if (i < IH && c >= IH) {  // T12 = 0: its place in TF holds A21 T11
#pragma unroll
      for (int e = 0; e < 8; ++e) t[e] = 0.f;
    }
    intra_store<8>(&s.TB[i][c], t);
    if constexpr (kBetaCols) {
#pragma unroll
      for (int e = 0; e < 8; ++e) t[e] *= s.beta[c + e];
      intra_store<8>(&s.TBb[i][c], t);
    }
#pragma unroll
    for (int z = IR + c; z < IKP; z += 16) {  // the padding columns the products read (IKP > IR)
#pragma unroll
      for (int e = 0; e < 8; ++e) t[e] = 0.f;
      intra_store<8>(&s.TB[i][z], t);
      if constexpr (kBetaCols) intra_store<8>(&s.TBb[i][z], t);
    }
  }
}

#if KDA_INTRA_WAVE_ON
// ============================================================================================== Wave design
// One wave per item, INTRA_WAVES waves per workgroup that never wait for each other: an SM keeps about fourteen items
// in flight (LDS-bound) where the block design keeps three, and the only syncs are the wave's own. Per item:
//  1 q, k and g rows into the wave's LDS tiles (16-byte copies, cp.async on CUDA; rows past the end zero);
//  2 the row norms of q and k, in A-fragment order;
//  3 per KDA_MMA_K columns: the gate, its cumulative sum over the rows (kda_a_scan_rows), the exp2 factors, then
//    Aqk += QU KD^T and Akk += KU KD^T straight from registers; qg out from registers, kg and KW = beta k exp2(G)
//    / |k| back into the tiles k and g came from, the decay row out; then v's copy into the q tile starts;
//  4 aqk out, A = diag(beta) Akk (strict) into LDS, T = (I + A)^-1 as TB = bf16(T) and TBb = bf16(T diag(beta));
//  5 kg out; 6 w = TB KW on the matrix layer into the k tile, out; 7 u = TBb v into the k tile, out.
// v has no tile of its own (the q tile is free once step 3 has read it, and v's copy overlaps steps 4-6) and T shares
// A's space: 15.9 KB of LDS per wave instead of 21.5, so fourteen waves per H200 SM instead of ten.
// The factors: e = exp2(G) and d = exp2(Gr - G) per element, exp2(-Gr) and exp2(Gl - Gr) per column (shared by
// the lane's two rows of it): exp2(G - Gr) = e exp2(-Gr), exp2(Gl - G) = d exp2(Gl - Gr), five MUFU ops per element
// with the gate's two where each factor's own exp2 took six. Under the gate bound every one is a normal fp32
// (|G| <= 125, |Gr|, |Gl - Gr| <= 62.5), and the extra rounding (2^-24) is far below the bf16 operands'.
// For u, beta rides on T's columns (the peer's T diag(beta) factor) rather than on v: 256 products instead of 16 V,
// and v feeds the matrix layer as loaded, at the same error (v is exact in bf16). For w it stays on k: there T's
// unit diagonal is exact in bf16 and beta k exp2(G) is rounded once, half the error of rounding beta into T.
#ifndef INTRA_WAVES
#define INTRA_WAVES 2  // targets.HIP_INTRA_WAVES: two waves share a workgroup's 1 KB reservation (H200: 14 per SM, not 13)
#endif
// Items per wave, one after the other (1: measured fastest on the H200, docs/performance-model.md).
#ifndef INTRA_WAVE_ITEMS
#define INTRA_WAVE_ITEMS 1
#endif
constexpr int IITEMS = INTRA_WAVE_ITEMS;
constexpr int IWAVES = INTRA_WAVES;
constexpr int ITHREADS = IWAVES * KDA_WARP;
constexpr int IBLOCK_ITEMS = IWAVES * IITEMS;  // items per workgroup
constexpr int IE = KDA_A_ELEMS;                // elements per lane of one 16 x KDA_MMA_K tile
// Column blocks per step of the element work (INTRA_KB_BLOCKS where it divides K / KDA_MMA_K).
#ifndef INTRA_KB_BLOCKS
#define INTRA_KB_BLOCKS 1  // (2 and 4 measured no faster on the H200: docs/performance-model.md; a plain loop
                           // in place of this one, IKB = 1, measured 4% slower at 32/65536/64, so the loop stays)
#endif
constexpr int IKB = (K / KDA_MMA_K) % INTRA_KB_BLOCKS == 0 ? INTRA_KB_BLOCKS : 1;
constexpr int ILX = (K > V ? K : V) + 8;       // the q / k tiles hold qg / kg, then w / u
static_assert(K % KDA_MMA_K == 0 && IR == 16, "whole A tiles of 16 rows");

struct alignas(16) IntraWaveSmem {
  alignas(16) kda_bf16 Q[IKP][ILX];  // q, then v as bf16 (the B operand of u; rows past IR zero)
  alignas(16) kda_bf16 Kt[IR][ILX];  // k, then kg, then w, then u
  alignas(16) kda_bf16 G[IKP][ILK];  // g, then KW (the B operand of w; rows past IR zero)
  union {  // A is read by the inverse's first two phases, T and T diag(beta) written by its last
    alignas(16) float A[IR][ILA];
    struct {
      alignas(16) kda_bf16 TB[IR][ILT];   // T
      alignas(16) kda_bf16 TBb[IR][ILT];  // T diag(beta)
    };
  };
  alignas(16) float TF[IR][ILA];
  float beta[IR];
};
struct alignas(16) IntraSmem {
  IntraWaveSmem w[IWAVES];
};
// CUDA: resident workgroups per SM as the LDS allows (227 KB, 1 KB reserved per workgroup), at most 16 waves (a
// scheduler's four, 128 registers each: fewer spill); the launch bound leaves each thread the registers of that many.
#ifndef INTRA_WAVE_BLOCKS_PER_SM
#define INTRA_WAVE_BLOCKS_PER_SM \
  ((int)(232448 / (sizeof(kda::IntraSmem) + 1024)) < 16 / kda::IWAVES ? (int)(232448 / (sizeof(kda::IntraSmem) + 1024)) \
                                                                       : 16 / kda::IWAVES)
#endif

// Every projection moves in 16-byte runs, or element by element where its strides or base do not allow them.
inline int intra_vec(const IntraArgs& a) {
  return intra_aligned(a.g, a.sg_t, a.sg_h, 8) | intra_aligned(a.q, a.sq_t, a.sq_h, 8) << 1 |
         intra_aligned(a.k, a.sk_t, a.sk_h, 8) << 2 | intra_aligned(a.v, a.sv_t, a.sv_h, 8) << 3;
}

// A lane's share of a 16-row tile of N columns in 16-byte runs: where the runs of a row divide the wave, a fixed run
// column and every (KDA_WARP / runs)-th row, so each step is one pointer increment (the addressing was a fifth of
// the wave design's instructions); otherwise run by run.
template <int N>
constexpr bool IRUNS_SPLIT_WAVE = KDA_WARP % (N / 8) == 0;
// Rows t0 .. t0 + 15 of one head's N columns into an LDS tile (row stride LD), rows >= L zero.
template <int N, int LD>
__device__ __forceinline__ void intra_wave_in(kda_bf16* dst, const kda_io* src, int64_t s_t, int64_t t0, int L,
                                              bool vec, int lane) {
  constexpr int CPR = N / 8;
  if (vec && IRUNS_SPLIT_WAVE<N>) {
    constexpr int RP = KDA_WARP / CPR;  // rows per pass
    const int col = (lane % CPR) * 8, r0 = lane / CPR;
    const kda_io* g = src + t0 * s_t + col;
#pragma unroll
    for (int row = r0; row < IR; row += RP)
      kda_copy16(dst + row * LD + col, g + (row < L ? row : 0) * s_t, row < L);
  } else if (vec) {
    // (kda_opaque: else the lane's first row and column are computed at the kernel's start and held, or spilled,
    // across the whole item)
    for (int c = kda_opaque(lane); c < IR * CPR; c += KDA_WARP) {
      const int row = c / CPR, col = (c % CPR) * 8;
      kda_copy16(dst + row * LD + col, src + (t0 + (row < L ? row : 0)) * s_t + col, row < L);
    }
  } else {
    for (int e = kda_opaque(lane); e < IR * N; e += KDA_WARP) {
      const int row = e / N, col = e % N;
      dst[row * LD + col] = row < L ? src[(t0 + row) * s_t + col] : (kda_io)0;
    }
  }
}
// Rows < L of an LDS tile out to a workspace tensor of N columns per (token, head), 16 bytes per access.
template <int N, int LD>
__device__ __forceinline__ void intra_wave_out(kda_bf16* dst, const kda_bf16* src, int64_t t0, int L, int H, int h,
                                               int lane) {
  constexpr int CPR = N / 8;
  if constexpr (IRUNS_SPLIT_WAVE<N>) {
    constexpr int RP = KDA_WARP / CPR;
    const int col = (lane % CPR) * 8, r0 = lane / CPR;
    kda_bf16* g = dst + (t0 * H + h) * N + col;
    const int64_t step = (int64_t)H * N;
#pragma unroll
    for (int row = r0; row < IR; row += RP)
      if (row < L) intra_copy<8>(g + row * step, src + row * LD + col);
  } else {
    for (int c = lane; c < L * CPR; c += KDA_WARP) {
      const int row = c / CPR, col = (c % CPR) * 8;
      intra_copy<8>(dst + ((t0 + row) * H + h) * N + col, src + row * LD + col);
    }
  }
}
// This lane's elements of an A-fragment-ordered tile (fp32) into LDS as bf16, pairs of columns per 32-bit store.
template <int LD>
__device__ __forceinline__ void intra_wave_put(kda_bf16* tile, const float (&x)[IE]) {
#pragma unroll
  for (int i = 0; i < IE; i += 2)
    *reinterpret_cast<uint32_t*>(tile + kda_a_row(i) * LD + kda_a_col(i)) = kda_f32x2_to_bf16x2(x[i], x[i + 1]);
}
__device__ __forceinline__ float intra_io(kda_bf16 x) { return kda_io_to_f32((kda_io)x); }  // an I/O element
// This lane's elements of an A-fragment-ordered tile (fp32) out to rows < L of a workspace tensor (row stride
// `step`) as bf16, pairs of columns per 32-bit store (elements 2j, 2j + 1 are adjacent columns on every layer).
__device__ __forceinline__ void intra_wave_store(kda_bf16* dst, int64_t step, int L, const float (&x)[IE]) {
#pragma unroll
  for (int i = 0; i < IE; i += 2)
    if (kda_a_row(i) < L)
      *reinterpret_cast<uint32_t*>(dst + kda_a_row(i) * step + kda_a_col(i)) = kda_f32x2_to_bf16x2(x[i], x[i + 1]);
}

// dst[:, :N] = T B for a 16 x IKP factor T (row stride ILT) and an IKP x N tile B (row stride LB), 16 columns
// at a time on the matrix layer; dst has the q / k tiles' row stride.
template <int N, int LB>
__device__ __forceinline__ void intra_wave_product(kda_bf16* dst, const kda_bf16* T, const kda_bf16* B) {
  kda_frag_a t[IKP / KDA_MMA_K];
#pragma unroll
  for (int kk = 0; kk < IKP; kk += KDA_MMA_K) kda_load_a_lds<ILT>(t[kk / KDA_MMA_K], T + kk);
#pragma unroll 2
  for (int n0 = 0; n0 < N; n0 += 16) {
    kda_frag_c c;
    kda_frag_zero(c);
#pragma unroll
    for (int kk = 0; kk < IKP; kk += KDA_MMA_K) {
      kda_frag_b b;
      kda_load_b_lds<LB, 1>(b, B + kk * LB + n0);  // B[k][n] = B[kk + k][n0 + n]
      kda_mma16(c, t[kk / KDA_MMA_K], b);
    }
#if KDA_C_PAIRED
#pragma unroll
    for (int e = 0; e < KDA_C_ELEMS; e += 2)
      *reinterpret_cast<uint32_t*>(dst + kda_c_row(e) * ILX + n0 + kda_c_col(e)) = kda_f32x2_to_bf16x2(c.x[e], c.x[e + 1]);
#else
#pragma unroll
    for (int e = 0; e < KDA_C_ELEMS; ++e) dst[kda_c_row(e) * ILX + n0 + kda_c_col(e)] = kda_f32_to_bf16(c.x[e]);
#endif
  }
}

__global__ KDA_LAUNCH_BOUNDS_SM(ITHREADS, INTRA_WAVE_BLOCKS_PER_SM) void kda_intra_kernel(IntraArgs p) {
  KDA_SMEM(IntraSmem, sm);
  const int wave = (int)threadIdx.x / KDA_WARP, lane = (int)threadIdx.x % KDA_WARP;
  IntraWaveSmem& s = sm.w[wave];
  if (IKP > IR) {  // the zero rows of the w / u products' B tiles (items write rows < IR only)
    for (int i = lane; i < (IKP - IR) * ILK; i += KDA_WARP) s.G[IR + i / ILK][i % ILK] = 0;
    for (int i = lane; i < (IKP - IR) * ILX; i += KDA_WARP) s.Q[IR + i / ILX][i % ILX] = 0;
  }
  const int first = ((int)blockIdx.x * IWAVES + wave) * IITEMS;
  const int end = first + IITEMS < p.n_items ? first + IITEMS : p.n_items;
  for (int n = first; n < end; ++n) {  // (wave-uniform)
    const int h = n % p.H, i_s = n / p.H;
    const int ic = i_s / ISPLIT, part = i_s % ISPLIT;
    const int64_t i_n = p.chunk_indices[2 * ic], i_t = p.chunk_indices[2 * ic + 1];
    const int64_t eos = p.cu_seqlens[i_n + 1];
    const int64_t t0 = p.cu_seqlens[i_n] + i_t * BT + part * IR;
    const int L = eos - t0 < IR ? (int)(eos - t0) : IR;
    if (L <= 0) continue;  // a walk chunk past its sequence's end: nothing to write

    // ---- 1: the item's rows in; beta ---------------------------------------------------------------------
    kda_wave_sync();  // the previous item's reads of the tiles are done
    intra_wave_in<K, ILX>(&s.Q[0][0], p.q + h * p.sq_h, p.sq_t, t0, L, p.vec & 2, lane);
    intra_wave_in<K, ILX>(&s.Kt[0][0], p.k + h * p.sk_h, p.sk_t, t0, L, p.vec & 4, lane);
    intra_wave_in<K, ILK>(&s.G[0][0], p.g + h * p.sg_h, p.sg_t, t0, L, p.vec & 1, lane);
    kda_copy_commit();
    if (lane < IR)
      s.beta[lane] = lane < L ? kda_sigmoid(kda_io_to_f32(p.beta[(t0 + lane) * p.sb_t + h * p.sb_h])) : 0.f;
    const float a_log = p.A_log[h];
    const float cexp = -kda_exp(a_log > A_LOG_MAX ? A_LOG_MAX : a_log) * RCP_LN2;  // (the A_log clamp: the block design's gate)
    const float lbv = p.lower_bound * RCP_LN2;
    kda_copy_wait<0>();  // q, k and g landed
    kda_wave_sync();

    // ---- 2: row norms -------------------------------------------------------------------------------------
    float rq[IE], rk[IE];
    {
      float sq[IE], sk[IE];
#pragma unroll
      for (int i = 0; i < IE; ++i) sq[i] = sk[i] = 0.f;
#pragma unroll
      for (int kb = 0; kb < K; kb += KDA_MMA_K) {
        kda_frag_a qa, ka;
        kda_load_a_lds<ILX>(qa, &s.Q[0][0] + kb);
        kda_load_a_lds<ILX>(ka, &s.Kt[0][0] + kb);
#pragma unroll
        for (int i = 0; i < IE; ++i) {
          const float qe = intra_io(qa.x[i]), ke = intra_io(ka.x[i]);
          sq[i] += qe * qe;
          sk[i] += ke * ke;
        }
      }
      kda_a_row_total(sq, sq);
      kda_a_row_total(sk, sk);
#pragma unroll
      for (int i = 0; i < IE; ++i) {
        rq[i] = kda_rsqrt(sq[i] + 1e-6f);
        rk[i] = kda_rsqrt(sk[i] + 1e-6f);
      }
    }

    // ---- 3: per column block: gate, cumulative sum, factors, Aqk and Akk ------------------------------------
    kda_frag_c cq, ck;
    kda_frag_zero(cq);
    kda_frag_zero(ck);
#pragma unroll 1
    for (int kb0 = 0; kb0 < K; kb0 += IKB * KDA_MMA_K) {
      // IKB column blocks at once: their chains are independent, so one wave overlaps them (its only ILP: a
      // scheduler holds two or three of these waves).
      kda_frag_a qa[IKB], ka[IKB], ga[IKB];
#pragma unroll
      for (int b = 0; b < IKB; ++b) {
        kda_load_a_lds<ILX>(qa[b], &s.Q[0][0] + kb0 + b * KDA_MMA_K);
        kda_load_a_lds<ILX>(ka[b], &s.Kt[0][0] + kb0 + b * KDA_MMA_K);
        kda_load_a_lds<ILK>(ga[b], &s.G[0][0] + kb0 + b * KDA_MMA_K);
      }
      float qg[IKB][IE], kg[IKB][IE], kw[IKB][IE];
#pragma unroll
      for (int b = 0; b < IKB; ++b) {
        const int kb = kb0 + b * KDA_MMA_K;
        float G[IE], Gr[IE], Gl[IE];
        float bias[IE];  // elements 2j, 2j + 1 are adjacent columns: 8-byte reads (torch's allocation is aligned)
#pragma unroll
        for (int i = 0; i < IE; i += 2) {
          bias[i] = bias[i + 1] = 0.f;
          if (p.g_bias) intra_ld_f<2>(&bias[i], p.g_bias + h * K + kb + kda_a_col(i));
        }
#pragma unroll
        for (int i = 0; i < IE; ++i) {
          // lower_bound * sigmoid(a (z + bias)) / ln 2 (the block design's form); rows past the end gate 0
          const float lb = kda_a_row(i) < L ? lbv : 0.f;
          G[i] = kda_fast_div(lb, 1.f + kda_exp2((intra_io(ga[b].x[i]) + bias[i]) * cexp));
        }
        kda_a_scan_rows(G);
        kda_a_at_row<IREF>(G, Gr);
        kda_a_at_row<IR - 1>(G, Gl);
        // Per column: exp2(-Gr) and exp2(Gl - Gr). kda_a_at_row gives a lane's elements of one column the same
        // value, so the compiler computes each once per column.
        float up[IE], down[IE];
#pragma unroll
        for (int i = 0; i < IE; ++i) {
          up[i] = kda_exp2(-Gr[i]);
          down[i] = kda_exp2(Gl[i] - Gr[i]);
        }
        kda_frag_a qu, ku, kd;
#pragma unroll
        for (int i = 0; i < IE; ++i) {
          const float qn = intra_io(qa[b].x[i]) * rq[i], kn = intra_io(ka[b].x[i]) * rk[i];
          const float e = kda_exp2(G[i]), d = kda_exp2(Gr[i] - G[i]), er = e * up[i];
          qg[b][i] = qn * e;
          kw[b][i] = kn * (e * s.beta[kda_a_row(i)]);
          kg[b][i] = kn * (d * down[i]);
          qu.x[i] = kda_f32_to_bf16(qn * er);
          ku.x[i] = kda_f32_to_bf16(kn * er);
          kd.x[i] = kda_f32_to_bf16(kn * d);
        }
#pragma unroll
        for (int i = 0; i < IE; ++i)
          if (kda_a_row(i) == 0) p.decay[((int64_t)i_s * p.H + h) * K + kb + kda_a_col(i)] = kda_exp2(Gl[i]);
        kda_frag_b kdt;
        kda_a_as_bt(kd, kdt);
        kda_mma16(cq, qu, kdt);
        kda_mma16(ck, ku, kdt);
      }
#pragma unroll
      for (int b = 0; b < IKB; ++b)  // qg out from registers, pairs of columns per 32-bit store
        intra_wave_store(p.qg + (t0 * p.H + h) * K + kb0 + b * KDA_MMA_K, (int64_t)p.H * K, L, qg[b]);
      kda_wave_sync();  // every lane's fragment reads of these blocks are done before they are overwritten
#pragma unroll
      for (int b = 0; b < IKB; ++b) {
        const int kb = kb0 + b * KDA_MMA_K;
        intra_wave_put<ILX>(&s.Kt[0][0] + kb, kg[b]);
        intra_wave_put<ILK>(&s.G[0][0] + kb, kw[b]);
      }
    }
    // The q tile is free (the loop's last sync): v's copy into it runs under steps 4-6.
    intra_wave_in<V, ILX>(&s.Q[0][0], p.v + h * p.sv_h, p.sv_t, t0, L, p.vec & 8, lane);
    kda_copy_commit();

    // ---- 4: aqk out; T = (I + diag(beta) Akk)^-1 as TB and TBb ---------------------------------------------
    kda_wave_sync();
#pragma unroll
    for (int e = 0; e < KDA_C_ELEMS; ++e) {
      const int i = kda_c_row(e), j = kda_c_col(e);
      // Entries above the diagonal may overflow; a select discards them, nothing multiplies them.
      if (i < L) p.aqk[((t0 + i) * p.H + h) * IR + j] = kda_f32_to_bf16(i >= j ? cq.x[e] * p.scale : 0.f);
      s.A[i][j] = i > j ? ck.x[e] * s.beta[i] : 0.f;
    }
    kda_wave_sync();
    // The inverse's lane addresses from an opaque copy of the lane: computed here, not held live from the kernel's
    // start (at the 128 registers of 14 waves per SM they otherwise spill).
    intra_inverse<true>(s, kda_opaque(lane));

    // ---- 5: kg out -------------------------------------------------------------------------------------------
    intra_wave_out<K, ILX>(p.kg, &s.Kt[0][0], t0, L, p.H, h, lane);
    kda_wave_sync();

    // ---- 6: w = TB KW into the k tile, 16 columns per tile, out --------------------------------------------------
    intra_wave_product<K, ILK>(&s.Kt[0][0], &s.TB[0][0], &s.G[0][0]);
    kda_wave_sync();
    intra_wave_out<K, ILX>(p.w, &s.Kt[0][0], t0, L, p.H, h, lane);
    kda_copy_wait<0>();  // v landed
    kda_wave_sync();     // (and w's reads of the k tile are done)
#if KDA_IO_FP16
    for (int e = lane; e < IR * V; e += KDA_WARP) {  // the matrix layer takes bf16: v converted in place
      kda_bf16& x = s.Q[e / V][e % V];
      x = kda_f32_to_bf16(kda_f16_to_f32(x));
    }
    kda_wave_sync();
#endif

    // ---- 7: u = TBb v into the k tile, out ---------------------------------------------------------------------
    intra_wave_product<V, ILX>(&s.Kt[0][0], &s.TBb[0][0], &s.Q[0][0]);
    kda_wave_sync();
    intra_wave_out<V, ILX>(p.u, &s.Kt[0][0], t0, L, p.H, h, lane);
  }  // items
}

#else

// ============================================================================================= Block design
// Phases (one barrier after each): 1 the gate per element, row layout (ITPR threads per row, IEK columns
// each, 16-byte loads); 2 its cumulative sum over the 16 rows, ISCAN lanes per column; 3 norms, beta and every
// exp2 factor in the row layout: qg, kg and the decay row go out, the operand tiles into LDS; 4 Aqk on one
// wave (aqk out), Akk and then (I + A)^-1 (blocked forward substitution) on another, beta v into LDS on the rest;
// 5 w = T (beta k exp2(G)) and u = T (beta v) on the matrix layer, staged in LDS; 6 w and u out in 16-byte
// runs. Each item's q, k and g are loaded while the previous item's products run, so only the first waits for
// global memory.
constexpr int ITPR = THREADS / IR;      // threads per row in the row layout
constexpr int IEK = K / ITPR;           // K columns per thread in the row layout
constexpr int IEV = V / ITPR;           // V columns per thread
constexpr int IWAVES = THREADS / KDA_WARP;
// CUDA: resident blocks per SM the register allocation must leave room for (80 registers at 256 threads: the item
// loop spills at four blocks' 64; docs/performance-model.md, "HIP kernel knobs").
#ifndef INTRA_BLOCKS_PER_SM
#define INTRA_BLOCKS_PER_SM 3
#endif
// K a multiple of 32: a thread's K columns are whole bf16 pairs (q, k and g stay packed in 32-bit words) and
// gfx950's MFMA reduces Aqk / Akk over 32 columns at a time. V a multiple of 16 (the u tiles).
static_assert(BT % IR == 0 && THREADS % IR == 0 && K % (2 * ITPR) == 0 && V % ITPR == 0, "row layout");
static_assert(K % 32 == 0 && IEK <= 16 && IEV <= 16, "row layout: K a multiple of 32, K, V <= 256");
static_assert(KDA_WARP % ITPR == 0, "a row's threads share one wave (the norms' shuffles)");
constexpr int kda_pow2_floor(int x) { return x >= 2 ? 2 * kda_pow2_floor(x / 2) : 1; }
// Threads per column in the cumulative sum (adjacent lanes), a power of two: every column in one pass
// (THREADS / ISCAN >= K), the lanes past K idle.
constexpr int ISCAN = kda_pow2_floor(THREADS / K) < IR ? kda_pow2_floor(THREADS / K) : IR;
static_assert(THREADS / ISCAN >= K && IR % ISCAN == 0 && KDA_WARP % ISCAN == 0, "scan layout");
static_assert(IWAVES >= 3, "Aqk and Akk run on two waves while the others load v");
static_assert(V % 8 == 0, "v moves in runs of 8");
static_assert(IR * IR <= THREADS, "FMA fallback: one thread per Aqk / Akk entry");
constexpr int IITEMS = INTRA_ITEMS;
constexpr int ITHREADS = THREADS;
constexpr int IBLOCK_ITEMS = IITEMS;  // items per workgroup

// IntraArgs: rendered by the instantiation from kdagen/kernels/hip.py.

// Buffers alias by phase: r1 holds the gate (1-3), then beta v (4-5); r2 the Aqk / Akk operands (3-4), then
// the w / u rows on their way out (5-6).
struct alignas(16) IntraSmem {
  union alignas(16) {
    float G[IR][K];
    kda_bf16 VB[IKP][ILV];
  } r1;
  union alignas(16) {
    struct { kda_bf16 QU[IR][ILK], KU[IR][ILK], KD[IR][ILK]; } op;
    struct { kda_bf16 W[IR][ILK], U[IR][ILV]; } out;
  } r2;
  alignas(16) kda_bf16 KW[IKP][ILK];
  alignas(16) kda_bf16 TB[IR][ILT];
  alignas(16) kda_bf16 AQ[IR][IR];
  alignas(16) float A[IR][ILA];
  alignas(16) float TF[IR][ILA];  // T in fp32 while it is formed
  float beta[IR];
};

// Row-layout accesses are whole runs of a thread's IEK or IEV consecutive elements, up to 16 bytes (8- or
// Which projections are read in whole runs (loop-invariant: computed once on the host, not per item).
inline int intra_vec(const IntraArgs& a) {
  return intra_aligned(a.g, a.sg_t, a.sg_h, IRUN<IEK>) | intra_aligned(a.q, a.sq_t, a.sq_h, IRUN<IEK>) << 1 |
         intra_aligned(a.k, a.sk_t, a.sk_h, IRUN<IEK>) << 2 | intra_aligned(a.v, a.sv_t, a.sv_h, 8) << 3;
}
// aqk rows (< L) to global memory, 16 bytes per thread: threads `lane` < 2 IR.
__device__ __forceinline__ void intra_aqk_out(const IntraSmem& s, const IntraArgs& p, int64_t t0, int L, int h,
                                              int lane) {
  const int i = lane / 2, half = lane % 2;
  if (lane < 2 * IR && i < L)
    intra_copy<IR / 2>(p.aqk + ((t0 + i) * p.H + h) * IR + half * (IR / 2), &s.AQ[i][half * (IR / 2)]);
}

// beta v into LDS (rows >= L and the padding rows zero), 8 columns per step, threads first, first + stride, ...
__device__ __forceinline__ void intra_beta_v(IntraSmem& s, const IntraArgs& p, int64_t t0, int L, int h, int first,
                                             int stride) {
  const bool vec = p.vec & 8;
  for (int i = first; i < IR * (V / 8); i += stride) {
    const int row = i / (V / 8), col = (i % (V / 8)) * 8;
    IntraWords<8> vr;
    intra_load<8>(vr, p.v + (t0 + row) * p.sv_t + h * p.sv_h + col, vec, row < L);
    float vb[8];
#pragma unroll
    for (int e = 0; e < 8; ++e) vb[e] = intra_f(vr, e) * s.beta[row];
    intra_store<8>(&s.r1.VB[row][col], vb);
  }
  for (int i = first; i < (IKP - IR) * ILV; i += stride) s.r1.VB[IR + i / ILV][i % ILV] = 0;
}

// Item n is walk chunk n / H of head n % H; L <= 0 for a walk chunk past its sequence's end (nothing to write).
struct IntraItem {
  int64_t t0;
  int i_s, h, L;
};
// This thread's share of an item's inputs in the row layout (row r, columns c0 ...), zeros past the end.
struct IntraIn {
  IntraWords<IEK> q, k, z;
  kda_io beta;
};
__device__ __forceinline__ void intra_fetch(const IntraArgs& p, int n, int r, int c0, IntraItem& it, IntraIn& in) {
  it.h = n % p.H;
  it.i_s = n / p.H;
  const int ic = it.i_s / ISPLIT, part = it.i_s % ISPLIT;
  const int64_t i_n = p.chunk_indices[2 * ic], i_t = p.chunk_indices[2 * ic + 1];
  const int64_t eos = p.cu_seqlens[i_n + 1];
  it.t0 = p.cu_seqlens[i_n] + i_t * BT + part * IR;
  it.L = eos - it.t0 < IR ? (int)(eos - it.t0) : IR;
  const bool valid = r < it.L;
  const int64_t tok = it.t0 + r;
  const int h = it.h;
  intra_load<IEK>(in.z, p.g + tok * p.sg_t + h * p.sg_h + c0, p.vec & 1, valid);
  intra_load<IEK>(in.q, p.q + tok * p.sq_t + h * p.sq_h + c0, p.vec & 2, valid);
  intra_load<IEK>(in.k, p.k + tok * p.sk_t + h * p.sk_h + c0, p.vec & 4, valid);
  in.beta = valid ? p.beta[tok * p.sb_t + h * p.sb_h] : (kda_io)0;
}

__global__ KDA_LAUNCH_BOUNDS_SM(THREADS, INTRA_BLOCKS_PER_SM) void kda_intra_kernel(IntraArgs p) {
  KDA_SMEM(IntraSmem, s);
  const int tid = threadIdx.x;
  const int r = tid / ITPR, c0 = (tid % ITPR) * IEK, cv0 = (tid % ITPR) * IEV;
#if KDA_MMA_LAYER != KDA_LAYER_FMA
  if (IKP > IR) {  // the zero rows of the T products' B tile (KW is written only in rows < IR)
    for (int i = tid; i < (IKP - IR) * ILK; i += THREADS) s.KW[IR + i / ILK][i % ILK] = 0;
  }
#endif
  const int first = (int)blockIdx.x * IITEMS;
  const int end = first + IITEMS < p.n_items ? first + IITEMS : p.n_items;
  IntraItem next;
  IntraIn in;
  if (first < end) intra_fetch(p, first, r, c0, next, in);
  // One item per workgroup: a trip count the compiler sees is 1 (a runtime one keeps per-lane values live across
  // the loop, twice the VGPRs on AMD). The grid gives every workgroup at least one item.
  const int last = IITEMS == 1 ? first + 1 : end;
  for (int n = first; n < last; ++n) {
    const IntraItem it = next;
    if (it.L <= 0) {  // (the whole block)
      if (IITEMS > 1 && n + 1 < end) intra_fetch(p, n + 1, r, c0, next, in);
      continue;
    }
    const int64_t t0 = it.t0, i_s = it.i_s;
    const int h = it.h, L = it.L;

    // ---- 1: the gate, row layout ---------------------------------------------------------------------
    const bool valid = r < L;
    const int64_t tok = t0 + r;
    // exp(A_log) overflows fp32 from A_log = 88.7 on (NaN where float64 is finite): clamped at 80. exp(80) ~ 5.5e34
    // saturates the gate (lb or 0) unless |z + bias| < ~1e-33, so the clamp changes nothing float64 can tell from
    // fp32 rounding; z + bias is summed before the product, so a huge a never meets inf - inf. (NaN stays NaN.)
    const float a_log = p.A_log[h];
    const float a_h = kda_exp(a_log > A_LOG_MAX ? A_LOG_MAX : a_log);
    // Rows past the end get the gate 0 (lb 0), so that row IR - 1's cumulative sum is the last valid row's; the
    // factor is computed on every row, a branch per element would cost more than it saves.
    const float cexp = -a_h * RCP_LN2, lb = valid ? p.lower_bound * RCP_LN2 : 0.f;
    const IntraWords<IEK> qr = in.q, kr = in.k, zr = in.z;  // (v: phase 4)
    const float beta = valid ? kda_sigmoid(kda_io_to_f32(in.beta)) : 0.f;
    {
      float ga[IEK], bias[IEK];
#pragma unroll
      for (int e = 0; e < IEK; ++e) bias[e] = 0.f;
      if (p.g_bias) intra_ld_f<IEK>(bias, p.g_bias + h * K + c0);  // torch's allocation: 16-byte aligned
#pragma unroll
      for (int e = 0; e < IEK; ++e) {
        // lower_bound * sigmoid(a (z + bias)) / ln 2 as one exp2 and one division (the Triton kernels' form)
        ga[e] = kda_fast_div(lb, 1.f + kda_exp2((intra_f(zr, e) + bias[e]) * cexp));
      }
      intra_st_f<IEK>(&s.r1.G[r][c0], ga);
    }
    __syncthreads();

    // ---- 2: cumulative sum of each column over the 16 rows: ISCAN adjacent lanes per column, IR / ISCAN rows
    // each, their offsets by a butterfly over those lanes ------------------------------------------------
    {
      const int cl = tid / ISCAN, part = tid % ISCAN, r0 = part * (IR / ISCAN);
      const bool live = cl < K;  // lanes past K shuffle among themselves (their sums are never used), write nothing
      const int c = live ? cl : K - 1;
      float x[IR / ISCAN], tot = 0.f;
#pragma unroll
      for (int i = 0; i < IR / ISCAN; ++i) {
        tot += s.r1.G[r0 + i][c];
        x[i] = tot;
      }
      float pre = 0.f;
#pragma unroll
      for (int d = 1; d < ISCAN; d <<= 1) {
        const float other = kda_shfl_xor(tot, d);
        if (part & d) pre += other;
        tot += other;
      }
      if (live) {
#pragma unroll
        for (int i = 0; i < IR / ISCAN; ++i) s.r1.G[r0 + i][c] = x[i] + pre;
      }
    }
    __syncthreads();

    // ---- 3: norms, factors; qg, kg, decay out; operand tiles in ---------------------------------------
    {
      // q and k stay packed (half the registers); each use widens its element again, one instruction.
      float sq = 0.f, sk = 0.f;
#pragma unroll
      for (int e = 0; e < IEK; ++e) {
        const float qe = intra_f(qr, e), ke = intra_f(kr, e);
        sq += qe * qe;
        sk += ke * ke;
      }
#pragma unroll
      for (int m = 1; m < ITPR; m <<= 1) { sq += kda_shfl_xor(sq, m); sk += kda_shfl_xor(sk, m); }
      const float rq = kda_rsqrt(sq + 1e-6f), rk = kda_rsqrt(sk + 1e-6f);
      // Each product goes to its destination as soon as it is formed (fewer live registers).
      float G[IEK], D[IEK], T[IEK], X[IEK];
      intra_ld_f<IEK>(G, &s.r1.G[r][c0]);
      intra_ld_f<IEK>(T, &s.r1.G[IREF][c0]);
#pragma unroll
      for (int e = 0; e < IEK; ++e) D[e] = G[e] - T[e];  // G - G_ref
      intra_ld_f<IEK>(T, &s.r1.G[IR - 1][c0]);          // G_last
      const int64_t o = (tok * p.H + h) * K + c0;
      if (r == 0) {
#pragma unroll
        for (int e = 0; e < IEK; ++e) X[e] = kda_exp2(T[e]);
        intra_st_f<IEK>(p.decay + (i_s * p.H + h) * K + c0, X);
      }
#pragma unroll
      for (int e = 0; e < IEK; ++e) X[e] = intra_f(kr, e) * rk * kda_exp2(T[e] - G[e]);
      if (valid) intra_store<IEK>(p.kg + o, X);
#pragma unroll
      for (int e = 0; e < IEK; ++e) G[e] = kda_exp2(G[e]);  // exp2(G)
#pragma unroll
      for (int e = 0; e < IEK; ++e) X[e] = intra_f(qr, e) * rq * G[e];
      if (valid) intra_store<IEK>(p.qg + o, X);
#pragma unroll
      for (int e = 0; e < IEK; ++e) X[e] = intra_f(kr, e) * rk * (G[e] * beta);
      intra_store<IEK>(&s.KW[r][c0], X);
#pragma unroll
      for (int e = 0; e < IEK; ++e) X[e] = intra_f(kr, e) * rk * kda_exp2(-D[e]);
      intra_store<IEK>(&s.r2.op.KD[r][c0], X);
#pragma unroll
      for (int e = 0; e < IEK; ++e) D[e] = kda_exp2(D[e]);  // exp2(G - G_ref)
#pragma unroll
      for (int e = 0; e < IEK; ++e) X[e] = intra_f(qr, e) * rq * D[e];
      intra_store<IEK>(&s.r2.op.QU[r][c0], X);
#pragma unroll
      for (int e = 0; e < IEK; ++e) X[e] = intra_f(kr, e) * rk * D[e];
      intra_store<IEK>(&s.r2.op.KU[r][c0], X);
      if (tid % ITPR == 0) s.beta[r] = beta;
    }
    // The next item's inputs, in flight during this item's products.
    if (IITEMS > 1 && n + 1 < end) intra_fetch(p, n + 1, r, c0, next, in);
    __syncthreads();

    // ---- 4: Aqk and Akk, T = (I + A)^-1, beta v ------------------------------------------------------
    // Matrix layer: wave 0 forms Aqk and stores aqk; wave 1 forms Akk and inverts I + A right away (a wave-level
    // sync between them); the other waves bring beta v into LDS meanwhile. FMA fallback: the same, one step
    // after the other on all threads.
#if KDA_MMA_LAYER != KDA_LAYER_FMA
    {
      const int wave = tid / KDA_WARP, lane = tid % KDA_WARP;
      if (wave < 2) {
        const kda_bf16* A = wave == 0 ? &s.r2.op.QU[0][0] : &s.r2.op.KU[0][0];
        kda_frag_c c;
        kda_frag_zero(c);
#pragma unroll
        for (int kk = 0; kk < K; kk += KDA_MMA_K) {
          kda_frag_a a;
          kda_frag_b b;
          kda_load_a_lds<ILK>(a, A + kk);
          kda_load_b_lds<1, ILK>(b, &s.r2.op.KD[0][0] + kk);  // B[k][n] = KD[n][kk + k]
          kda_mma16(c, a, b);
        }
        // Entries above the diagonal may overflow; a select discards them, nothing multiplies them.
#pragma unroll
        for (int e = 0; e < KDA_C_ELEMS; ++e) {
          const int i = kda_c_row(e), j = kda_c_col(e);
          if (wave == 0) s.AQ[i][j] = kda_f32_to_bf16(i >= j ? c.x[e] * p.scale : 0.f);
          else s.A[i][j] = i > j ? c.x[e] * s.beta[i] : 0.f;
        }
        kda_wave_sync();
        if (wave == 0) intra_aqk_out(s, p, t0, L, h, lane);
        else intra_inverse<false>(s, lane);
      } else {
        intra_beta_v(s, p, t0, L, h, tid - 2 * KDA_WARP, THREADS - 2 * KDA_WARP);
      }
    }
#else
    {
      const int i = tid / IR, j = tid % IR;
      if (tid < IR * IR) {
        float aq = 0.f, ak = 0.f;
        for (int c = 0; c < K; ++c) {
          const float kd = bf(s.r2.op.KD[j][c]);
          aq += bf(s.r2.op.QU[i][c]) * kd;
          ak += bf(s.r2.op.KU[i][c]) * kd;
        }
        s.AQ[i][j] = kda_f32_to_bf16(i >= j ? aq * p.scale : 0.f);
        s.A[i][j] = i > j ? ak * s.beta[i] : 0.f;
      }
      intra_beta_v(s, p, t0, L, h, tid, THREADS);
    }
    __syncthreads();
    intra_aqk_out(s, p, t0, L, h, tid);
    intra_inverse<false>(s, tid);  // (its wave syncs: each wave of the block calls them)
#endif
    __syncthreads();

    // ---- 5: w = T KW and u = T VB, 16 columns per tile ------------------------------------------------
#if KDA_MMA_LAYER != KDA_LAYER_FMA
    {
      const int wave = tid / KDA_WARP;
      constexpr int NW = K / 16, NU = V / 16;
      for (int tile = wave; tile < NW + NU; tile += IWAVES) {
        const bool is_w = tile < NW;
        const int n0 = (is_w ? tile : tile - NW) * 16;
        kda_frag_c c;
        kda_frag_zero(c);
#pragma unroll
        for (int kk = 0; kk < IKP; kk += KDA_MMA_K) {
          kda_frag_a a;
          kda_frag_b b;
          kda_load_a_lds<ILT>(a, &s.TB[0][0] + kk);
          if (is_w) kda_load_b_lds<ILK, 1>(b, &s.KW[kk][n0]);  // B[k][n] = KW[kk + k][n0 + n]
          else kda_load_b_lds<ILV, 1>(b, &s.r1.VB[kk][n0]);
          kda_mma16(c, a, b);
        }
        kda_bf16* dst = is_w ? &s.r2.out.W[0][n0] : &s.r2.out.U[0][n0];
        const int ld = is_w ? ILK : ILV;
#if KDA_C_PAIRED
#pragma unroll
        for (int e = 0; e < KDA_C_ELEMS; e += 2)  // (row, col) and (row, col + 1), col even: one 32-bit store
          *reinterpret_cast<uint32_t*>(dst + kda_c_row(e) * ld + kda_c_col(e)) =
              kda_f32x2_to_bf16x2(c.x[e], c.x[e + 1]);
#else
#pragma unroll
        for (int e = 0; e < KDA_C_ELEMS; ++e) dst[kda_c_row(e) * ld + kda_c_col(e)] = kda_f32_to_bf16(c.x[e]);
#endif
      }
    }
#else
    for (int idx = tid; idx < IR * (K + V); idx += THREADS) {
      const int i = idx / (K + V), col = idx % (K + V);
      float acc = 0.f;
      for (int m = 0; m < IR; ++m)
        acc += bf(s.TB[i][m]) * (col < K ? bf(s.KW[m][col]) : bf(s.r1.VB[m][col - K]));
      if (col < K) s.r2.out.W[i][col] = kda_f32_to_bf16(acc);
      else s.r2.out.U[i][col - K] = kda_f32_to_bf16(acc);
    }
#endif
    __syncthreads();

    // ---- 6: w and u out --------------------------------------------------------------------------------
    if (valid) {
      intra_copy<IEK>(p.w + (tok * p.H + h) * K + c0, &s.r2.out.W[r][c0]);
      intra_copy<IEV>(p.u + (tok * p.H + h) * V + cv0, &s.r2.out.U[r][cv0]);
    }
  }  // items
}

#endif  // KDA_INTRA_WAVE_ON

}  // namespace kda
