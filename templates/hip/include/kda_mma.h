// SPDX-License-Identifier: Apache-2.0
// kda_mma.h: the per-target matrix layer under kdagen's portable fused kernels (copied verbatim).
//
// ONE interface, the same on every target: a 16 x 16 fp32 tile C += A (16 x KDA_MMA_K, bf16) * B
// (KDA_MMA_K x 16, bf16), computed by one wave/warp together.
//
//   kda_frag_a / kda_frag_b / kda_frag_c   this lane's share of A, B and of the fp32 accumulator tile
//   kda_load_a<SM, SK>(a, p)               A[m][k] = p[m * SM + k * SK]    (m < 16, k < KDA_MMA_K)
//   kda_load_b<SK, SN>(b, p)               B[k][n] = p[k * SK + n * SN]    (k < KDA_MMA_K, n < 16)
//   kda_load_a_lds<SM>, kda_load_b_lds<SK, SN>   the same from 16-byte aligned LDS rows (ldmatrix on sm_90)
//   kda_frag_zero(c); c.x[i], i < KDA_C_ELEMS, holds C[kda_c_row(i)][kda_c_col(i)]
//   kda_mma16(c, a, b)                     c += a * b (fp32 accumulation of exact bf16 products)
//
// Every lane of the wave must make the same calls (wave-uniform control flow), and the block must be
// one-dimensional with whole waves (lane = threadIdx.x % KDA_WARP).
//
// Layers (KDA_MMA_LAYER; the kernel source renders a per-target default, -DKDA_MMA_LAYER=0 forces the
// FMA fallback on any target):
//   0 KDA_LAYER_FMA          no matrix layer: the kernels take their plain FMA code path
//   1 KDA_LAYER_SM90_MMA     mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32, twice (n = 0..7, 8..15);
//                            warp 32, KDA_MMA_K = 16 (sm_80 and later, sm_90 included)
//   2 KDA_LAYER_GFX942_MFMA  v_mfma_f32_16x16x16_bf16 (__builtin_amdgcn_mfma_f32_16x16x16bf16_1k),
//                            wave 64, KDA_MMA_K = 16 (gfx90a / gfx940-942 / gfx950)
//   3 KDA_LAYER_GFX950_MFMA  v_mfma_f32_16x16x32_bf16 (__builtin_amdgcn_mfma_f32_16x16x32_bf16),
//                            wave 64, KDA_MMA_K = 32 (gfx950 only)
//
// The instruction itself is one small function per layer (kda_insn_*, below), taking this lane's raw
// registers. The CPU emulation (tests/build/hip_emulation/kda_port.h) defines KDA_MMA_EMULATED and
// supplies those functions as a model of the whole wave written from the ISA documents, so the fragment
// index math here is what the emulated tests exercise.
#pragma once

#define KDA_LAYER_FMA 0
#define KDA_LAYER_SM90_MMA 1
#define KDA_LAYER_GFX942_MFMA 2
#define KDA_LAYER_GFX950_MFMA 3

#ifndef KDA_MMA_LAYER
#ifdef KDA_MMA_LAYER_DEFAULT
#define KDA_MMA_LAYER KDA_MMA_LAYER_DEFAULT
#else
#define KDA_MMA_LAYER KDA_LAYER_FMA
#endif
#endif

// A device pass for the wrong architecture is a build error, never silently wrong code.
#if !defined(KDA_MMA_EMULATED)
#if KDA_MMA_LAYER == KDA_LAYER_SM90_MMA && defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 800
#error "KDA_LAYER_SM90_MMA needs sm_80 or later (mma.sync m16n8k16 bf16)"
#endif
#if KDA_MMA_LAYER == KDA_LAYER_GFX950_MFMA && defined(__AMDGCN__) && !defined(__gfx950__)
#error "KDA_LAYER_GFX950_MFMA needs gfx950 (v_mfma_f32_16x16x32_bf16)"
#endif
#if (KDA_MMA_LAYER == KDA_LAYER_SM90_MMA) && !defined(__CUDACC__)
#error "KDA_LAYER_SM90_MMA is a CUDA layer"
#endif
#if (KDA_MMA_LAYER == KDA_LAYER_GFX942_MFMA || KDA_MMA_LAYER == KDA_LAYER_GFX950_MFMA) && defined(__CUDACC__)
#error "the MFMA layers are AMD layers"
#endif
#endif

#if KDA_MMA_LAYER != KDA_LAYER_FMA

#if KDA_MMA_LAYER == KDA_LAYER_SM90_MMA
#define KDA_MMA_K 16
#define KDA_A_ELEMS 8   // a0..a7 of one m16n8k16 (4 .b32 registers)
#define KDA_B_ELEMS 8   // b0..b3 for n = 0..7, then b0..b3 for n = 8..15 (2 + 2 registers)
#define KDA_C_ELEMS 8   // c0..c3 for n = 0..7, then c0..c3 for n = 8..15
#define KDA_MMA_WAVE 32
#elif KDA_MMA_LAYER == KDA_LAYER_GFX942_MFMA
#define KDA_MMA_K 16
#define KDA_A_ELEMS 4
#define KDA_B_ELEMS 4
#define KDA_C_ELEMS 4
#define KDA_MMA_WAVE 64
#elif KDA_MMA_LAYER == KDA_LAYER_GFX950_MFMA
#define KDA_MMA_K 32
#define KDA_A_ELEMS 8
#define KDA_B_ELEMS 8
#define KDA_C_ELEMS 4
#define KDA_MMA_WAVE 64
#else
#error "unknown KDA_MMA_LAYER"
#endif
static_assert(KDA_WARP == KDA_MMA_WAVE, "the matrix layer's wave size is not the target's");

struct kda_frag_a { kda_bf16 x[KDA_A_ELEMS]; };
struct kda_frag_b { kda_bf16 x[KDA_B_ELEMS]; };
struct kda_frag_c { float x[KDA_C_ELEMS]; };

__device__ __forceinline__ int kda_mma_lane() { return (int)(threadIdx.x % KDA_MMA_WAVE); }

__device__ __forceinline__ void kda_frag_zero(kda_frag_c& c) {
#pragma unroll
  for (int i = 0; i < KDA_C_ELEMS; ++i) c.x[i] = 0.f;
}

// ---------------------------------------------------------------- lane -> (row, col) of each register
#if KDA_MMA_LAYER == KDA_LAYER_SM90_MMA
// PTX ISA, mma.m16n8k16 with .bf16 (g = lane >> 2 "groupID", t = lane % 4 "threadID_in_group"):
//   A a_i (i < 8): row g + 8 * ((i >> 1) & 1), col 2t + (i & 1) + 8 * (i >> 2)
//   B b_i (i < 4): row (k) 2t + (i & 1) + 8 * (i >> 1), col (n) g
//   C c_i (i < 4): row g + 8 * (i >> 1), col 2t + (i & 1)
// Element 2j is the low half of .b32 register j, 2j + 1 the high half. Our 16-wide B and C are two
// n8 halves: index i + 4 * half, n offset 8 * half.
__device__ __forceinline__ int kda_a_row(int i) { return (kda_mma_lane() >> 2) + 8 * ((i >> 1) & 1); }
__device__ __forceinline__ int kda_a_col(int i) { return 2 * (kda_mma_lane() & 3) + (i & 1) + 8 * (i >> 2); }
__device__ __forceinline__ int kda_b_row(int i) { return 2 * (kda_mma_lane() & 3) + (i & 1) + 8 * ((i & 3) >> 1); }
__device__ __forceinline__ int kda_b_col(int i) { return (kda_mma_lane() >> 2) + 8 * (i >> 2); }
__device__ __forceinline__ int kda_c_row(int i) { return (kda_mma_lane() >> 2) + 8 * ((i & 3) >> 1); }
__device__ __forceinline__ int kda_c_col(int i) { return 2 * (kda_mma_lane() & 3) + (i & 1) + 8 * (i >> 2); }
#else
// AMD CDNA3/CDNA4 ISA, 16 x 16 MFMA with 64 lanes (l = lane, j = element of the lane's operand vector):
//   A: row l % 16, k = KPL * (l / 16) + j      (KPL = 4 for 16x16x16, 8 for 16x16x32)
//   B: k = KPL * (l / 16) + j, col l % 16
//   D (4 VGPRs): row 4 * (l / 16) + j, col l % 16
#define KDA_KPL (KDA_MMA_K / 4)
__device__ __forceinline__ int kda_a_row(int) { return kda_mma_lane() & 15; }
__device__ __forceinline__ int kda_a_col(int j) { return KDA_KPL * (kda_mma_lane() >> 4) + j; }
__device__ __forceinline__ int kda_b_row(int j) { return KDA_KPL * (kda_mma_lane() >> 4) + j; }
__device__ __forceinline__ int kda_b_col(int) { return kda_mma_lane() & 15; }
__device__ __forceinline__ int kda_c_row(int j) { return 4 * (kda_mma_lane() >> 4) + j; }
__device__ __forceinline__ int kda_c_col(int) { return kda_mma_lane() & 15; }
#endif

// ------------------------------------------------------------- the A layout as an elementwise layout
// A wave that holds a 16 x KDA_MMA_K tile in A-fragment order can compute on it element by element and feed it
// to the matrix layer with no data movement (kda_intra.h's wave design). What crosses lanes, per layer:
//   kda_a_scan_rows(x)        x[i] becomes the sum of column kda_a_col(i) over rows 0 .. kda_a_row(i)
//   kda_a_at_row<R>(x, y)     y[i] = x at (R, kda_a_col(i))
//   kda_a_row_total(x, y)     y[i] = the sum of x over every element of row kda_a_row(i) in the wave
//   kda_a_as_bt(a, b)         B = X^T from X's A fragment (the 16 rows of X become B's 16 columns)
// Every lane of the wave must call them (shuffles).
#if KDA_MMA_LAYER == KDA_LAYER_SM90_MMA
// Lane (g, t) holds rows g (elements with bit 1 clear) and g + 8 (bit 1 set) of columns 2t, 2t + 1, 2t + 8, 2t + 9:
// the scan runs over g (lanes 4 apart), then rows 8-15 add the column's total over rows 0-7 (lane 28 + t).
__device__ __forceinline__ void kda_a_scan_rows(float (&x)[KDA_A_ELEMS]) {
  const int lane = kda_mma_lane(), g = lane >> 2;
#pragma unroll
  for (int i = 0; i < KDA_A_ELEMS; ++i) {
    if (i & 2) continue;
    float lo = x[i], hi = x[i | 2];
#pragma unroll
    for (int d = 1; d < 8; d <<= 1) {
      const float a = kda_shfl_idx(lo, lane - 4 * d), b = kda_shfl_idx(hi, lane - 4 * d);
      if (g >= d) {
        lo += a;
        hi += b;
      }
    }
    x[i] = lo;
    x[i | 2] = hi + kda_shfl_idx(lo, 28 + (lane & 3));
  }
}
template <int R>
__device__ __forceinline__ void kda_a_at_row(const float (&x)[KDA_A_ELEMS], float (&y)[KDA_A_ELEMS]) {
  const int src = 4 * (R % 8) + (kda_mma_lane() & 3);
#pragma unroll
  for (int i = 0; i < KDA_A_ELEMS; ++i) {
    if (i & 2) continue;
    y[i] = y[i | 2] = kda_shfl_idx(x[(i & ~2) | (R / 8) * 2], src);
  }
}
__device__ __forceinline__ void kda_a_row_total(const float (&x)[KDA_A_ELEMS], float (&y)[KDA_A_ELEMS]) {
  const int lane = kda_mma_lane();
  float s[2] = {0.f, 0.f};
#pragma unroll
  for (int i = 0; i < KDA_A_ELEMS; ++i) s[(i >> 1) & 1] += x[i];
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    s[h] += kda_shfl_idx(s[h], lane ^ 1);
    s[h] += kda_shfl_idx(s[h], lane ^ 2);
  }
#pragma unroll
  for (int i = 0; i < KDA_A_ELEMS; ++i) y[i] = s[(i >> 1) & 1];
}
// b_i = X[g + 8 (i >> 2)][2t + (i & 1) + 8 ((i & 3) >> 1)] is a_j with j = (i & 1) + 4 ((i & 3) >> 1) + 2 (i >> 2).
__device__ __forceinline__ void kda_a_as_bt(const kda_frag_a& a, kda_frag_b& b) {
#pragma unroll
  for (int i = 0; i < KDA_B_ELEMS; ++i) b.x[i] = a.x[(i & 1) + 4 * ((i & 3) >> 1) + 2 * (i >> 2)];
}
#else
// Lane l holds row l % 16 of columns KDA_KPL (l / 16) + j: the scan runs over the 16 lanes of a row group.
__device__ __forceinline__ void kda_a_scan_rows(float (&x)[KDA_A_ELEMS]) {
  const int lane = kda_mma_lane(), r = lane & 15;
#pragma unroll
  for (int j = 0; j < KDA_A_ELEMS; ++j) {
    float v = x[j];
#pragma unroll
    for (int d = 1; d < 16; d <<= 1) {
      const float a = kda_shfl_idx(v, lane - d);
      if (r >= d) v += a;
    }
    x[j] = v;
  }
}
template <int R>
__device__ __forceinline__ void kda_a_at_row(const float (&x)[KDA_A_ELEMS], float (&y)[KDA_A_ELEMS]) {
  const int src = R + (kda_mma_lane() & ~15);
#pragma unroll
  for (int j = 0; j < KDA_A_ELEMS; ++j) y[j] = kda_shfl_idx(x[j], src);
}
__device__ __forceinline__ void kda_a_row_total(const float (&x)[KDA_A_ELEMS], float (&y)[KDA_A_ELEMS]) {
  const int lane = kda_mma_lane();
  float s = 0.f;
#pragma unroll
  for (int j = 0; j < KDA_A_ELEMS; ++j) s += x[j];
  s += kda_shfl_idx(s, lane ^ 16);
  s += kda_shfl_idx(s, lane ^ 32);
#pragma unroll
  for (int j = 0; j < KDA_A_ELEMS; ++j) y[j] = s;
}
// A and B share the lane map with k and the row / column swapped: X^T's B fragment is X's A fragment.
__device__ __forceinline__ void kda_a_as_bt(const kda_frag_a& a, kda_frag_b& b) {
  static_assert(KDA_A_ELEMS == KDA_B_ELEMS, "A and B fragments of one size");
#pragma unroll
  for (int j = 0; j < KDA_B_ELEMS; ++j) b.x[j] = a.x[j];
}
#endif

// KDA_KRUN: elements i .. i + KDA_KRUN - 1 (i a multiple of KDA_KRUN) of an A or B fragment share their
// row (A) / column (B) and have consecutive k. When k is the contiguous memory direction (SK == 1) the
// loads below read each run as one aligned vector: the caller keeps p and the other stride multiples of
// KDA_KRUN elements (16-byte aligned rows, k offsets multiples of KDA_MMA_K).
// KDA_C_PAIRED: accumulator elements 2j and 2j + 1 share a row and have consecutive columns (a pair of bf16
// can then be stored as one 32-bit word).
#if KDA_MMA_LAYER == KDA_LAYER_SM90_MMA
#define KDA_C_PAIRED 1
#else
#define KDA_C_PAIRED 0
#endif
#if KDA_MMA_LAYER == KDA_LAYER_SM90_MMA
#define KDA_KRUN 2
#else
#define KDA_KRUN KDA_KPL
#endif
template <int N>
struct alignas(2 * N) kda_bf16_run { kda_bf16 v[N]; };

template <int SM, int SK>
__device__ __forceinline__ void kda_load_a(kda_frag_a& a, const kda_bf16* p) {
  if constexpr (SK == 1) {
    static_assert(SM % KDA_KRUN == 0, "row stride must keep k runs aligned");
#pragma unroll
    for (int i = 0; i < KDA_A_ELEMS; i += KDA_KRUN) {
      const kda_bf16_run<KDA_KRUN> r =
          *reinterpret_cast<const kda_bf16_run<KDA_KRUN>*>(p + kda_a_row(i) * SM + kda_a_col(i));
#pragma unroll
      for (int e = 0; e < KDA_KRUN; ++e) a.x[i + e] = r.v[e];
    }
  } else {
#pragma unroll
    for (int i = 0; i < KDA_A_ELEMS; ++i) a.x[i] = p[kda_a_row(i) * SM + kda_a_col(i) * SK];
  }
}
template <int SK, int SN>
__device__ __forceinline__ void kda_load_b(kda_frag_b& b, const kda_bf16* p) {
  if constexpr (SK == 1) {
    static_assert(SN % KDA_KRUN == 0, "column stride must keep k runs aligned");
#pragma unroll
    for (int i = 0; i < KDA_B_ELEMS; i += KDA_KRUN) {
      const kda_bf16_run<KDA_KRUN> r =
          *reinterpret_cast<const kda_bf16_run<KDA_KRUN>*>(p + kda_b_row(i) + kda_b_col(i) * SN);
#pragma unroll
      for (int e = 0; e < KDA_KRUN; ++e) b.x[i + e] = r.v[e];
    }
  } else {
#pragma unroll
    for (int i = 0; i < KDA_B_ELEMS; ++i) b.x[i] = p[kda_b_row(i) * SK + kda_b_col(i) * SN];
  }
}

// ---------------------------------------------------------------------------------- the instructions
#if !defined(KDA_MMA_EMULATED)
#if KDA_MMA_LAYER == KDA_LAYER_SM90_MMA
// One m16n8k16: D = A B + C, A 4 x .b32 (bf16x2), B 2 x .b32, C/D 4 x f32.
__device__ __forceinline__ void kda_insn_mma_m16n8k16_bf16(const uint32_t a[4], const uint32_t b[2], float c[4]) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
      "{%0, %1, %2, %3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}
#endif
#if KDA_MMA_LAYER == KDA_LAYER_GFX942_MFMA || KDA_MMA_LAYER == KDA_LAYER_GFX950_MFMA
// gfx950 has it too: the own / other products below take it on both MFMA layers.
typedef short kda_short4 __attribute__((ext_vector_type(4)));
typedef float kda_float4 __attribute__((ext_vector_type(4)));
__device__ __forceinline__ void kda_insn_mfma_f32_16x16x16_bf16(const kda_bf16 a[4], const kda_bf16 b[4], float c[4]) {
  kda_short4 va, vb;
  kda_float4 vc;
#pragma unroll
  for (int i = 0; i < 4; ++i) { va[i] = (short)a[i]; vb[i] = (short)b[i]; vc[i] = c[i]; }
  vc = __builtin_amdgcn_mfma_f32_16x16x16bf16_1k(va, vb, vc, 0, 0, 0);
#pragma unroll
  for (int i = 0; i < 4; ++i) c[i] = vc[i];
}
#endif
#if KDA_MMA_LAYER == KDA_LAYER_GFX950_MFMA
typedef __bf16 kda_bf16x8 __attribute__((ext_vector_type(8)));
__device__ __forceinline__ void kda_insn_mfma_f32_16x16x32_bf16(const kda_bf16 a[8], const kda_bf16 b[8], float c[4]) {
  kda_bf16x8 va, vb;
  kda_float4 vc;
#pragma unroll
  for (int i = 0; i < 8; ++i) {
    va[i] = __builtin_bit_cast(__bf16, a[i]);
    vb[i] = __builtin_bit_cast(__bf16, b[i]);
  }
#pragma unroll
  for (int i = 0; i < 4; ++i) vc[i] = c[i];
  vc = __builtin_amdgcn_mfma_f32_16x16x32_bf16(va, vb, vc, 0, 0, 0);
#pragma unroll
  for (int i = 0; i < 4; ++i) c[i] = vc[i];
}
#endif
#endif  // !KDA_MMA_EMULATED

__device__ __forceinline__ void kda_mma16(kda_frag_c& c, const kda_frag_a& a, const kda_frag_b& b) {
#if KDA_MMA_LAYER == KDA_LAYER_SM90_MMA
  uint32_t ra[4], rb[2];
#pragma unroll
  for (int r = 0; r < 4; ++r) ra[r] = (uint32_t)a.x[2 * r] | ((uint32_t)a.x[2 * r + 1] << 16);
#pragma unroll
  for (int half = 0; half < 2; ++half) {
#pragma unroll
    for (int r = 0; r < 2; ++r) rb[r] = (uint32_t)b.x[4 * half + 2 * r] | ((uint32_t)b.x[4 * half + 2 * r + 1] << 16);
    kda_insn_mma_m16n8k16_bf16(ra, rb, &c.x[4 * half]);
  }
#elif KDA_MMA_LAYER == KDA_LAYER_GFX942_MFMA
  kda_insn_mfma_f32_16x16x16_bf16(a.x, b.x, c.x);
#else
  kda_insn_mfma_f32_16x16x32_bf16(a.x, b.x, c.x);
#endif
}

// ------------------------------------------------------------------ own / other products (K = 16 everywhere)
// For kernels whose product results are the next products' operands (kda_walk.h): a 16 x 16 fp32 tile
//   C(x, y) += sum_{k < 16} own(x, k) oth(y, k)
// where `own` is made from an accumulator tile in registers alone and `oth` is read from memory. Each layer
// has one operand whose register layout is its accumulator's: sm_90's A (rows g + 8 ..., the m16n8k16 C
// layout), MFMA's B (k = 4 (lane / 16) + j, the 16x16 D layout with k as the row). So on sm_90 own is A and
// C = own oth^T; on MFMA own is B and C = oth own^T: C(x, y) sits at C row x on sm_90 and at C row y on AMD,
// which kda_oo_x / kda_oo_y hide. gfx950 takes the 16x16x16 MFMA here: its 16x16x32 B spans two accumulator
// tiles with another lane map.
//   kda_frag_own / kda_frag_oth          this lane's share of the operands
//   kda_own_from_c(o, c)                 own(x, k) = bf16(C(x, k)) of an accumulator tile (registers only)
//   kda_load_oth<SY, SK>(b, p)           oth(y, k) = p[y * SY + k * SK]
//   kda_oth_y(i), kda_oth_k(i)           (y, k) of element i of an oth fragment
//   kda_oo_x(i), kda_oo_y(i)             (x, y) of accumulator element i
//   kda_mma_oo(c, own, oth)
#if KDA_MMA_LAYER == KDA_LAYER_SM90_MMA
#define KDA_OO_ELEMS 8
typedef kda_frag_a kda_frag_own;
typedef kda_frag_b kda_frag_oth;
__device__ __forceinline__ int kda_oo_x(int i) { return kda_c_row(i); }
__device__ __forceinline__ int kda_oo_y(int i) { return kda_c_col(i); }
__device__ __forceinline__ int kda_oth_y(int i) { return kda_b_col(i); }
__device__ __forceinline__ int kda_oth_k(int i) { return kda_b_row(i); }
#else
#define KDA_OO_ELEMS 4
struct kda_frag_own { kda_bf16 x[4]; };
struct kda_frag_oth { kda_bf16 x[4]; };
__device__ __forceinline__ int kda_oo_x(int i) { return kda_c_col(i); }
__device__ __forceinline__ int kda_oo_y(int i) { return kda_c_row(i); }
__device__ __forceinline__ int kda_oth_y(int) { return kda_mma_lane() & 15; }
__device__ __forceinline__ int kda_oth_k(int j) { return 4 * (kda_mma_lane() >> 4) + j; }
#endif
static_assert(KDA_C_ELEMS == KDA_OO_ELEMS, "own fragments hold one accumulator tile");

// Same element order on both layers: own element i is accumulator element i (sm_90: A a_i and C c_i share
// row g + 8 ((i >> 1) & 1) and column 2t + (i & 1) + 8 (i >> 2); MFMA: B and D element j share lane and j).
__device__ __forceinline__ void kda_own_from_c(kda_frag_own& o, const kda_frag_c& c) {
#pragma unroll
  for (int i = 0; i < KDA_OO_ELEMS; i += 2) {
    const uint32_t pair = kda_f32x2_to_bf16x2(c.x[i], c.x[i + 1]);
    o.x[i] = (kda_bf16)(pair & 0xffffu);
    o.x[i + 1] = (kda_bf16)(pair >> 16);
  }
}

template <int SY, int SK>
__device__ __forceinline__ void kda_load_oth(kda_frag_oth& b, const kda_bf16* p) {
#if KDA_MMA_LAYER == KDA_LAYER_SM90_MMA && !defined(KDA_MMA_EMULATED)
  if constexpr (SK == 1 || SY == 1) {
    // One ldmatrix.x4 (.trans when y is the contiguous direction): 8 x 8 matrix m = lane / 8 holds
    // y in [8 (m >> 1), +8) and k in [8 (m & 1), +8), the order of b's four registers; lane l gives the
    // address of row l % 8 of matrix l / 8 (a y row, or with .trans a k row). Rows 16-byte aligned.
    const int l = kda_mma_lane(), m = l >> 3, r = l & 7;
    const int y = 8 * (m >> 1) + (SK == 1 ? r : 0), k = 8 * (m & 1) + (SK == 1 ? 0 : r);
    const unsigned addr = (unsigned)__cvta_generic_to_shared(p + y * SY + k * SK);
    uint32_t d0, d1, d2, d3;
    if constexpr (SK == 1)
      asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                   : "=r"(d0), "=r"(d1), "=r"(d2), "=r"(d3) : "r"(addr));
    else
      asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                   : "=r"(d0), "=r"(d1), "=r"(d2), "=r"(d3) : "r"(addr));
    const uint32_t d[4] = {d0, d1, d2, d3};
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      b.x[2 * j] = (kda_bf16)(d[j] & 0xffffu);
      b.x[2 * j + 1] = (kda_bf16)(d[j] >> 16);
    }
    return;
  }
#endif
  if constexpr (SK == 1) {
    // Runs of consecutive k: pairs on sm_90 (b_2j, b_2j+1), the whole fragment on MFMA (one 8-byte read).
    constexpr int RUN = KDA_OO_ELEMS == 4 ? 4 : 2;
    static_assert(SY % RUN == 0, "row stride must keep k runs aligned");
#pragma unroll
    for (int i = 0; i < KDA_OO_ELEMS; i += RUN) {
      const kda_bf16_run<RUN> r = *reinterpret_cast<const kda_bf16_run<RUN>*>(p + kda_oth_y(i) * SY + kda_oth_k(i));
#pragma unroll
      for (int e = 0; e < RUN; ++e) b.x[i + e] = r.v[e];
    }
  } else {
#pragma unroll
    for (int i = 0; i < KDA_OO_ELEMS; ++i) b.x[i] = p[kda_oth_y(i) * SY + kda_oth_k(i) * SK];
  }
}

// kda_load_a<SM, 1> and kda_load_b from shared memory whose 8-element row runs start 16-byte aligned (A's
// rows; B's n rows when SK == 1, its k rows when SN == 1; offsets multiples of 8 elements): one ldmatrix.x4
// per fragment on sm_90, where B is exactly an `oth` fragment with y = n. The general loads elsewhere.
template <int SM>
__device__ __forceinline__ void kda_load_a_lds(kda_frag_a& a, const kda_bf16* p) {
#if KDA_MMA_LAYER == KDA_LAYER_SM90_MMA && !defined(KDA_MMA_EMULATED)
  // Register j of A (elements 2j, 2j + 1) is 8 x 8 matrix j: rows 8 (j & 1) + g, k 8 (j >> 1) + 2t.
  const int l = kda_mma_lane(), m = l >> 3;
  const unsigned addr = (unsigned)__cvta_generic_to_shared(p + (8 * (m & 1) + (l & 7)) * SM + 8 * (m >> 1));
  uint32_t d[4];
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(d[0]), "=r"(d[1]), "=r"(d[2]), "=r"(d[3]) : "r"(addr));
#pragma unroll
  for (int j = 0; j < 4; ++j) {
    a.x[2 * j] = (kda_bf16)(d[j] & 0xffffu);
    a.x[2 * j + 1] = (kda_bf16)(d[j] >> 16);
  }
#else
  kda_load_a<SM, 1>(a, p);
#endif
}
template <int SK, int SN>
__device__ __forceinline__ void kda_load_b_lds(kda_frag_b& b, const kda_bf16* p) {
  static_assert(SK == 1 || SN == 1, "one contiguous direction");
#if KDA_MMA_LAYER == KDA_LAYER_SM90_MMA && !defined(KDA_MMA_EMULATED)
  kda_load_oth<SN, SK>(b, p);
#else
  kda_load_b<SK, SN>(b, p);
#endif
}

__device__ __forceinline__ void kda_mma_oo(kda_frag_c& c, const kda_frag_own& a, const kda_frag_oth& b) {
#if KDA_MMA_LAYER == KDA_LAYER_SM90_MMA
  kda_mma16(c, a, b);
#else
  kda_insn_mfma_f32_16x16x16_bf16(b.x, a.x, c.x);  // A = oth (rows y), B = own (columns x)
#endif
}

#endif  // KDA_MMA_LAYER != KDA_LAYER_FMA
