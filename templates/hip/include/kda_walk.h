// SPDX-License-Identifier: Apache-2.0
// kda_walk.h: the sequential half on kda_intra_kernel's workspace, 16-row steps, the state in registers
// (copied verbatim; constants: kda_common.h, kda_intra.h).
//
// One workgroup per (sequence, head, WBV-row V slice) walks the sequence's walk chunks in order (the plain walk,
// one group: the Triton walk on 16-row steps computes the same):
//   v_new^T = u^T - S w^T,   o^T = scale S qg^T + v_new^T tril(aqk)^T,   S = S diag(decay) + v_new^T kg
// with S [V, K] fp32, its bf16 copy and v_new (bf16) as the products' operands, where the Triton walk rounds
// them. Each wave owns 16 state rows and every column: WCT accumulator tiles, held in registers for the whole
// walk, that are also the left operands of the next step's products (kda_mma.h's own / other products), so no
// operand of the state or of v_new ever passes through shared memory and the waves never wait for each other
// except on the K side. The K side of a step (w, qg, kg, aqk, decay and this slice's u: what every wave reads)
// goes to shared memory in WSTAGES stages: steps i + 1 .. i + WSTAGES - 1 are copied while step i's products run
// (cp.async on CUDA; through registers on AMD, held across the products where KDA_WALK_PREFETCH is set), one
// barrier per step. The design: docs/design.md, "The walk stages"; the knobs: docs/performance-model.md,
// "HIP kernel knobs".
//
// State routing as the Triton walk: state_in 0 zeros, 1 dense h0[n], 2 paged h0[state_idx[n]] when
// has_init[n]; state_out 0 none, 1 dense ht[n], 2 paged ht[state_idx[n]]; a paged row outside [0, n_slots) is
// neither read nor written. The checkpoint row (ckpt_idx[n], or n) gets the state after ckpt_off[n] tokens
// when that is a positive multiple of BT below the sequence's length. The FMA fallback has no walk.
#pragma once

#include "kda_common.h"
#include "kda_intra.h"

namespace kda {

// WalkArgs: rendered by the instantiation from kdagen/kernels/hip.py.

#if KDA_MMA_LAYER != KDA_LAYER_FMA
#define KDA_HAS_WALK 1
#ifndef WALK_WAVES
#define WALK_WAVES 8
#endif
// 16 state rows per wave; the most waves (at most WALK_WAVES) whose rows tile V.
constexpr int walk_waves(int tiles, int most) { return most <= 1 || tiles % most == 0 ? most : walk_waves(tiles, most - 1); }
constexpr int WWAVES = walk_waves(V / 16, WALK_WAVES);
constexpr int WTHREADS = WWAVES * KDA_WARP;
constexpr int WBV = 16 * WWAVES;                   // V rows per workgroup
constexpr int WCT = K / 16;                        // state column tiles per wave
// Rows padded by 8 bf16: the fragment reads of 8 consecutive rows fall in distinct banks, rows stay 16-byte
// aligned for the copies.
constexpr int WLK = K + 8, WLV = WBV + 8, WLA = IR + 8;
static_assert(IR == 16 && V % WBV == 0 && K % 16 == 0 && V % 16 == 0, "walk tiles");
// The target's Target.hip_walk_prefetch (rendered by the instantiation): AMD copies' registers held across a step.
#ifndef KDA_WALK_PREFETCH
#define KDA_WALK_PREFETCH 1
#endif
// CUDA: resident workgroups per SM the register allocation must leave room for.
#ifndef WALK_BLOCKS_PER_SM
#define WALK_BLOCKS_PER_SM 2
#endif

struct alignas(16) WalkStage {
  kda_bf16 W[IR][WLK], Q[IR][WLK], KG[IR][WLK];
  kda_bf16 U[IR][WLV];   // this slice's columns of u
  kda_bf16 A[IR][WLA];   // aqk; only u <= t is defined (read masked)
  float D[K];
};
// Stages of the K-side pipeline: steps i + 1 .. i + WSTAGES - 1 are in flight while step i computes.
#ifndef WALK_STAGES
#define WALK_STAGES 2
#endif
constexpr int WSTAGES = WALK_STAGES;
static_assert(WSTAGES >= 2, "the walk overlaps the next step's copies with this step's products");
struct alignas(16) WalkSmem {
  WalkStage st[WSTAGES];
};

// Copies of one step's K side into a stage: 16-byte runs, rows past L zero. Every loop has a compile-time trip
// count (one iteration per array at K = V = 128), so a step's copies cost a few address computations. Each copy
// has its own slot (kda_copy_reg: nothing on CUDA, the 16 bytes in flight on AMD): walk_stage<kIssue> issues the
// loads, walk_stage<kLand> stores them to LDS (on CUDA cp.async lands by itself). With KDA_WALK_PREFETCH (the
// target's hip_walk_prefetch) an AMD wave lands them after the step's products, so it does not wait for the loads
// before its work; without it, walk_stage<kCopy> copies each run whole (no registers held across the step).
template <int ROWS, int RUN>
constexpr int WALK_TRIPS = (ROWS * RUN + WTHREADS - 1) / WTHREADS;
constexpr int WTK = WALK_TRIPS<IR, K / 8>, WTU = WALK_TRIPS<IR, WBV / 8>, WTA = WALK_TRIPS<IR, IR / 8>,
              WTD = WALK_TRIPS<1, K / 4>;
constexpr int WSLOTS = 3 * WTK + WTU + WTA + WTD;
struct WalkSlots {
  kda_copy_reg r[WSLOTS];
};

template <int ROWS, int RUN, typename F>
__device__ __forceinline__ void walk_copy_rows(int tid, F&& copy) {
  constexpr int N = ROWS * RUN;
#pragma unroll
  for (int it = 0; it < WALK_TRIPS<ROWS, RUN>; ++it) {
    const int i = tid + it * WTHREADS;
    if (N % WTHREADS == 0 || i < N) copy(it, i / RUN, 8 * (i % RUN));
  }
}

enum WalkCopy : int { kCopy = 0, kIssue = 1, kLand = 2 };  // whole copies, or their two halves
template <int MODE>
__device__ __forceinline__ void walk_copy(kda_copy_reg& r, void* dst, const void* src, bool ok) {
  if constexpr (MODE == kCopy) kda_copy16(dst, src, ok);
  else if constexpr (MODE == kIssue) kda_copy_issue(r, dst, src, ok);
  else kda_copy_land(r, dst);
}

template <int MODE>
__device__ __forceinline__ void walk_stage(WalkStage& s, WalkSlots& slot, const WalkArgs& p, int64_t t0, int L, int h,
                                           int v0, int64_t wchunk, int tid) {
  const int64_t row0 = t0 * p.H + h;  // (token t0, head h) of the [T, H, *] workspaces
  walk_copy_rows<IR, K / 8>(tid, [&](int it, int r, int c) {
    const bool ok = r < L;
    const int64_t o = ok ? (row0 + (int64_t)r * p.H) * K + c : 0;
    walk_copy<MODE>(slot.r[3 * it], &s.W[r][c], p.w + o, ok);
    walk_copy<MODE>(slot.r[3 * it + 1], &s.Q[r][c], p.qg + o, ok);
    walk_copy<MODE>(slot.r[3 * it + 2], &s.KG[r][c], p.kg + o, ok);
  });
  walk_copy_rows<IR, WBV / 8>(tid, [&](int it, int r, int c) {
    const bool ok = r < L;
    walk_copy<MODE>(slot.r[3 * WTK + it], &s.U[r][c], p.u + (ok ? (row0 + (int64_t)r * p.H) * V + v0 + c : 0), ok);
  });
  walk_copy_rows<IR, IR / 8>(tid, [&](int it, int r, int c) {
    const bool ok = r < L;
    walk_copy<MODE>(slot.r[3 * WTK + WTU + it], &s.A[r][c], p.aqk + (ok ? (row0 + (int64_t)r * p.H) * IR + c : 0), ok);
  });
  walk_copy_rows<1, K / 4>(tid, [&](int it, int, int c) {  // the decay row: K fp32, 4 per run (c counts 8 per run)
    walk_copy<MODE>(slot.r[3 * WTK + WTU + WTA + it], &s.D[c / 2], p.decay + (wchunk * p.H + h) * K + c / 2, true);
  });
}

__global__ KDA_LAUNCH_BOUNDS_SM(WTHREADS, WALK_BLOCKS_PER_SM) void kda_walk_kernel(WalkArgs p) {
  KDA_SMEM(WalkSmem, s);
  const int tid = threadIdx.x, wave = tid / KDA_WARP;
  const int64_t n = blockIdx.x / p.H;
  const int h = blockIdx.x % p.H;
  const int v0 = blockIdx.y * WBV, vw = 16 * wave;  // this wave's state rows: v0 + vw + [0, 16)
  const int64_t bos = p.cu_seqlens[n], eos = p.cu_seqlens[n + 1];
  const int64_t wc0 = p.chunk_offsets[n] * ISPLIT;  // the sequence's first walk chunk (decay rows)
  const int64_t steps = (eos - bos + IR - 1) / IR;

  int64_t row = -1;
  if (p.state_in == 2 || p.state_out == 2) {
    row = p.state_idx[n];
    if (row < 0 || row >= p.n_slots) row = -1;
  }
  const float* src = nullptr;
  if (p.state_in == 1) src = p.h0 + n * p.sh0_n + (int64_t)h * p.sh0_h;
  if (p.state_in == 2 && row >= 0 && p.has_init[n] != 0) src = p.h0 + row * p.sh0_n + (int64_t)h * p.sh0_h;
  int64_t ck_step = -1;
  float* ck = nullptr;
  if (p.ckpt) {
    const int64_t off = p.ckpt_off[n];
    const int64_t crow = p.ckpt_idx ? (int64_t)p.ckpt_idx[n] : n;
    if (off > 0 && off % BT == 0 && off < eos - bos && crow >= 0 && crow < p.n_ckpt_rows) {
      ck_step = off / IR - 1;
      ck = p.ckpt + crow * p.sck_n + (int64_t)h * V * K;
    }
  }

  // z[c]: state rows v0 + vw + x, columns 16 c + y (x, y: kda_oo_x / kda_oo_y of each element).
  kda_frag_c z[WCT];
#pragma unroll
  for (int c = 0; c < WCT; ++c)
#pragma unroll
    for (int e = 0; e < KDA_C_ELEMS; ++e)
      z[c].x[e] = src ? src[(int64_t)(v0 + vw + kda_oo_x(e)) * K + 16 * c + kda_oo_y(e)] : 0.f;

  // One copy group per step, empty past the last, so that "all but the newest WSTAGES - 2" is always step i's.
  WalkSlots slot;
#pragma unroll
  for (int j = 0; j < WSTAGES - 1; ++j) {
    const int64_t t1 = bos + (int64_t)j * IR;
    const int L1 = (int)(eos - t1 < IR ? eos - t1 : IR);
    if (j < steps) walk_stage<kCopy>(s.st[j], slot, p, t1, L1, h, v0, wc0 + j, tid);
    kda_copy_commit();
  }
  int cur = 0;  // stage of step i
  for (int64_t i = 0; i < steps; ++i) {
    kda_copy_wait<WSTAGES - 2>();
    __syncthreads();  // step i's stage is complete; every wave is done with step i - 1's, which is refilled now
    const int64_t j = i + WSTAGES - 1;
    const bool next = j < steps;
    const int fill = cur == 0 ? WSTAGES - 1 : cur - 1;  // step i - 1's stage
    const int64_t t1 = bos + j * IR;
    const int L1 = (int)(eos - t1 < IR ? eos - t1 : IR);
    if (next) walk_stage<KDA_WALK_PREFETCH ? kIssue : kCopy>(s.st[fill], slot, p, t1, L1, h, v0, wc0 + j, tid);
    kda_copy_commit();
    const WalkStage& st = s.st[cur];
    cur = cur + 1 == WSTAGES ? 0 : cur + 1;
    const int64_t t0 = bos + i * IR;
    const int L = (int)(eos - t0 < IR ? eos - t0 : IR);

    // (state row, chunk row) tiles of S w^T and S qg^T, two accumulator chains each (half the dependent steps).
    kda_frag_c xw[2], xq[2];
#pragma unroll
    for (int j = 0; j < 2; ++j) {
      kda_frag_zero(xw[j]);
      kda_frag_zero(xq[j]);
    }
#pragma unroll
    for (int c = 0; c < WCT; ++c) {
      kda_frag_own a;
      kda_own_from_c(a, z[c]);
      kda_frag_oth b;
      kda_load_oth<WLK, 1>(b, &st.W[0][16 * c]);  // oth(t, k) = w[t][16 c + k]
      kda_mma_oo(xw[c & 1], a, b);
      kda_load_oth<WLK, 1>(b, &st.Q[0][16 * c]);
      kda_mma_oo(xq[c & 1], a, b);
    }
    // v_new^T; rows past L are zero (their u and w are), so they add nothing below.
    kda_frag_c vn;
#pragma unroll
    for (int e = 0; e < KDA_C_ELEMS; ++e)
      vn.x[e] = bf(st.U[kda_oo_y(e)][vw + kda_oo_x(e)]) - (xw[0].x[e] + xw[1].x[e]);
    kda_frag_own an;
    kda_own_from_c(an, vn);

    // o^T = scale S qg^T + v_new^T tril(aqk)^T
    kda_frag_c o;
    kda_frag_zero(o);
    {
      kda_frag_oth b;
      kda_load_oth<WLA, 1>(b, &st.A[0][0]);  // oth(t, u) = aqk[t][u], u <= t
#pragma unroll
      for (int e = 0; e < KDA_OO_ELEMS; ++e)
        if (kda_oth_k(e) > kda_oth_y(e)) b.x[e] = 0;
      kda_mma_oo(o, an, b);
    }
    kda_io* orow = p.out + t0 * p.so_t + (int64_t)h * p.so_h + v0 + vw;
#pragma unroll
    for (int e = 0; e < KDA_C_ELEMS; ++e) {
      const int t = kda_oo_y(e);
      if (t < L) orow[t * p.so_t + kda_oo_x(e)] = kda_f32_to_io(p.scale * (xq[0].x[e] + xq[1].x[e]) + o.x[e]);
    }

    // S = S diag(decay) + v_new^T kg
#pragma unroll
    for (int c = 0; c < WCT; ++c) {
#pragma unroll
      for (int e = 0; e < KDA_C_ELEMS; ++e) z[c].x[e] *= st.D[16 * c + kda_oo_y(e)];
      kda_frag_oth b;
      kda_load_oth<1, WLK>(b, &st.KG[0][16 * c]);  // oth(k, t) = kg[t][16 c + k]
      kda_mma_oo(z[c], an, b);
    }
    if (next && KDA_WALK_PREFETCH) walk_stage<kLand>(s.st[fill], slot, p, t1, L1, h, v0, wc0 + j, tid);  // AMD: LDS stores
    if (i == ck_step) {
#pragma unroll
      for (int c = 0; c < WCT; ++c)
#pragma unroll
        for (int e = 0; e < KDA_C_ELEMS; ++e)
          ck[(int64_t)(v0 + vw + kda_oo_x(e)) * K + 16 * c + kda_oo_y(e)] = z[c].x[e];
    }
  }

  float* dst = nullptr;
  if (p.state_out == 1) dst = p.ht + n * p.sht_n + (int64_t)h * p.sht_h;
  if (p.state_out == 2 && row >= 0) dst = p.ht + row * p.sht_n + (int64_t)h * p.sht_h;
  if (dst) {
#pragma unroll
    for (int c = 0; c < WCT; ++c)
#pragma unroll
      for (int e = 0; e < KDA_C_ELEMS; ++e) dst[(int64_t)(v0 + vw + kda_oo_x(e)) * K + 16 * c + kda_oo_y(e)] = z[c].x[e];
  }
}
#else
constexpr int WTHREADS = 0;  // no walk on the FMA fallback (the plan then takes the Triton walk)
constexpr int WBV = 0;
struct WalkSmem { int unused; };
#endif

}  // namespace kda
