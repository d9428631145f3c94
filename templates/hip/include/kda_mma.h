// SPDX-License-Identifier: Apache-2.0
// kda_mma.h: the per-target matrix layer under kdagen's portable fused kernels (copied verbatim).
//
// ONE interface, the same on every target: a 16 x 16 fp32 tile C += A (16 x KDA_MMA_K, bf16) * B
// (KDA_MMA_K x 16, bf16), computed by one wave/warp together.
//
//   kda_frag_a / kda_frag_b / kda_frag_c   this lane's share of A, B and of the fp32 accumulator tile
//   kda_load_a<SM, SK>(a, p)               A[m][k] = p[m * SM + k * SK]    (m < 16, k < KDA_MMA_K)
//   kda_load_b<SK, SN>(b, p)               B[k][n] = p[k * SK + n * SN]    (k < KDA_MMA_K, n < 16)
//   kda_load_a_rows(a, p, sm, rows)        A[m][k] = m < rows ? p[m * sm + k] : 0   (runtime row stride)
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

// A[m][k] = p[m * sm + k] for m < rows, 0 for the rows past them: an A operand read straight from a
// row-major array (global memory, a runtime row stride, k contiguous) into the fragment, so that operands
// no other wave needs never pass through shared memory. Alignment as for kda_load_a with SK == 1.
__device__ __forceinline__ void kda_load_a_rows(kda_frag_a& a, const kda_bf16* p, int64_t sm, int rows) {
#pragma unroll
  for (int i = 0; i < KDA_A_ELEMS; i += KDA_KRUN) {
    kda_bf16_run<KDA_KRUN> r = {};
    const int m = kda_a_row(i);
    if (m < rows) r = *reinterpret_cast<const kda_bf16_run<KDA_KRUN>*>(p + m * sm + kda_a_col(i));
#pragma unroll
    for (int e = 0; e < KDA_KRUN; ++e) a.x[i + e] = r.v[e];
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
#elif KDA_MMA_LAYER == KDA_LAYER_GFX942_MFMA
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
#elif KDA_MMA_LAYER == KDA_LAYER_GFX950_MFMA
typedef __bf16 kda_bf16x8 __attribute__((ext_vector_type(8)));
typedef float kda_float4 __attribute__((ext_vector_type(4)));
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

#endif  // KDA_MMA_LAYER != KDA_LAYER_FMA
