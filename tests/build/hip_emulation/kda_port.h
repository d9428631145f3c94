// Test-only stand-in for kda_port.h: runs the generated kernels on the CPU, one std::thread per GPU
// thread and a std::barrier for __syncthreads (tests/build/test_hip_emulated.py). Not a product path.
//
// The matrix layer (templates/hip/include/kda_mma.h, the real one, included at the end) is selected with
// -DKDA_MMA_LAYER=0..3; this header then models the wave (32 or 64 lanes, a std::barrier per wave) and
// supplies each layer's instruction, kda_insn_*, as a model of the whole wave: every lane publishes its
// raw registers, one lane assembles A, B, C with the ISA's element -> (lane, register) maps, computes
// D = C + A B, and every lane takes back the elements the ISA says it holds. Nothing here is derived from
// the layer's own lane -> element functions.
#pragma once
#include <array>
#include <barrier>
#include <memory>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <thread>
#include <vector>

#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define KDA_LAUNCH_BOUNDS(n)
#define KDA_LAUNCH_BOUNDS_SM(n, blocks)
#define KDA_DYNAMIC_SMEM 0
#if !defined(KDA_MMA_LAYER) && defined(KDA_MMA_LAYER_DEFAULT)
#define KDA_MMA_LAYER KDA_MMA_LAYER_DEFAULT  // the generated source's per-target default
#elif !defined(KDA_MMA_LAYER)
#define KDA_MMA_LAYER 0
#endif
#define KDA_MMA_EMULATED 1
#if KDA_MMA_LAYER == 2 || KDA_MMA_LAYER == 3
#define KDA_WARP 64
#else
#define KDA_WARP 32
#endif
#define __shared__ static
struct kda_idx3 { unsigned x = 0, y = 0, z = 0; };
inline thread_local kda_idx3 threadIdx;
inline kda_idx3 blockIdx;  // blocks run one at a time
inline std::barrier<>* kda_emu_barrier = nullptr;
inline std::vector<std::unique_ptr<std::barrier<>>>* kda_emu_wave_barriers = nullptr;
inline float kda_emu_xchg[1024];
inline void __syncthreads() { kda_emu_barrier->arrive_and_wait(); }
inline float kda_exp2(float x) { return std::exp2(x); }
inline float kda_sqrt(float x) { return std::sqrt(x); }
inline float kda_exp(float x) { return std::exp2(x * 1.4426950408889634f); }
inline uint32_t kda_f2u(float x) { uint32_t u; std::memcpy(&u, &x, 4); return u; }
inline float kda_u2f(uint32_t u) { float x; std::memcpy(&x, &u, 4); return x; }
inline float kda_shfl_xor(float v, int m) {
  kda_emu_xchg[threadIdx.x] = v;
  __syncthreads();
  float r = kda_emu_xchg[threadIdx.x ^ m];
  __syncthreads();
  return r;
}
typedef uint16_t kda_bf16;
inline float kda_bf16_to_f32(kda_bf16 x) { return kda_u2f(((uint32_t)x) << 16); }
inline kda_bf16 kda_f32_to_bf16(float f) {
  uint32_t u = kda_f2u(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return (kda_bf16)((u >> 16) | 0x40u);
  u += 0x7fffu + ((u >> 16) & 1u);
  return (kda_bf16)(u >> 16);
}
inline float kda_fast_div(float a, float b) { return a / b; }
// fp16 through the compiler's _Float16 (x86-64, GCC 12 and later): round to nearest even, as the targets convert.
inline float kda_f16_to_f32(uint16_t x) { _Float16 h; std::memcpy(&h, &x, 2); return (float)h; }
inline uint16_t kda_f32_to_f16(float f) { _Float16 h = (_Float16)f; uint16_t x; std::memcpy(&x, &h, 2); return x; }
#ifndef KDA_IO_FP16
#define KDA_IO_FP16 0
#endif
typedef uint16_t kda_io;
inline float kda_io_to_f32(kda_io x) { return KDA_IO_FP16 ? kda_f16_to_f32(x) : kda_bf16_to_f32(x); }
inline kda_io kda_f32_to_io(float f) { return KDA_IO_FP16 ? kda_f32_to_f16(f) : kda_f32_to_bf16(f); }
inline uint32_t kda_f32x2_to_bf16x2(float lo, float hi) {
  return (uint32_t)kda_f32_to_bf16(lo) | ((uint32_t)kda_f32_to_bf16(hi) << 16);
}
inline void kda_copy16(void* dst, const void* src, bool valid) {
  if (valid) std::memcpy(dst, src, 16); else std::memset(dst, 0, 16);
}
inline void kda_copy_commit() {}
// The AMD form of the two halves (registers, then the LDS store), so that the walk's landing order is exercised.
struct kda_copy_reg { unsigned char v[16]; };
inline void kda_copy_issue(kda_copy_reg& r, void*, const void* src, bool valid) {
  if (valid) std::memcpy(r.v, src, 16); else std::memset(r.v, 0, 16);
}
inline void kda_copy_land(const kda_copy_reg& r, void* dst) { std::memcpy(dst, r.v, 16); }
template <int N>
inline void kda_copy_wait() {}
inline void kda_copy_wait_all() {}
inline float kda_sigmoid(float x) { return 1.0f / (1.0f + kda_exp(-x)); }
inline float kda_rsqrt(float x) { return 1.0f / kda_sqrt(x); }
// The device port's register barrier has no meaning for the CPU compiler's scheduling: the value itself.
inline int kda_opaque(int x) { return x; }

// Run `body` as a grid of (gx, gy, gz) blocks of `threads` threads, block after block.
inline void kda_emu_launch(unsigned gx, unsigned gy, unsigned threads, const std::function<void()>& body,
                           unsigned gz = 1) {
  for (unsigned bz = 0; bz < gz; ++bz)
    for (unsigned by = 0; by < gy; ++by)
      for (unsigned bx = 0; bx < gx; ++bx) {
        blockIdx.x = bx; blockIdx.y = by; blockIdx.z = bz;
        std::barrier<> bar((std::ptrdiff_t)threads);
        kda_emu_barrier = &bar;
        std::vector<std::unique_ptr<std::barrier<>>> waves;
        for (unsigned w = 0; w < (threads + KDA_WARP - 1) / KDA_WARP; ++w)
          waves.push_back(std::make_unique<std::barrier<>>((std::ptrdiff_t)(threads - w * KDA_WARP < KDA_WARP ? threads - w * KDA_WARP : KDA_WARP)));
        kda_emu_wave_barriers = &waves;
        std::vector<std::thread> ts;
        for (unsigned t = 0; t < threads; ++t)
          ts.emplace_back([&, t] { threadIdx.x = t; body(); });
        for (auto& t : ts) t.join();
      }
}

// The host runtime names of the generated launchers (include/kda_launch.h): the real extern "C"
// kda_intra_launch / kda_walk_launch run here, and each kernel launch runs its grid on the CPU.
struct dim3 {
  unsigned x, y, z;
  dim3(unsigned x_ = 1, unsigned y_ = 1, unsigned z_ = 1) : x(x_), y(y_), z(z_) {}
};
typedef void* kdaStream_t;
typedef int kdaError_t;
#define kdaErrorInvalidValue 1
inline kdaError_t kdaGetLastError() { return 0; }
inline const char* kdaGetErrorString(kdaError_t e) { return e ? "invalid value (emulated)" : "no error"; }
template <class Args>
struct kda_emu_grid {
  void (*kernel)(Args);
  dim3 grid;
  unsigned threads;
  void operator()(const Args& a) const { kda_emu_launch(grid.x, grid.y, threads, [&] { kernel(a); }, grid.z); }
};
template <class Args>
kda_emu_grid<Args> kda_emu_kernel(void (*kernel)(Args), dim3 grid, unsigned threads) { return {kernel, grid, threads}; }
#define KDA_LAUNCH_KERNEL(kernel, grid, threads, smem, stream) kda_emu_kernel(kernel, grid, threads)

// ---------------------------------------------------------------------------- wave-level instruction models
// Per-thread publication slots (raw registers) and one result tile per wave.
struct kda_emu_regs { uint32_t a[8]; uint32_t b[8]; float c[8]; };
inline kda_emu_regs kda_emu_slot[1024];
inline float kda_emu_tile[1024 / 32][16][16];
inline void kda_emu_wave_sync() { (*kda_emu_wave_barriers)[threadIdx.x / KDA_WARP]->arrive_and_wait(); }
inline void kda_wave_sync() { kda_emu_wave_sync(); }
// Lane `src` (modulo the wave) of the wave's value: a wave-level exchange, so that waves of one block run apart.
inline float kda_emu_wxchg[1024];
inline float kda_shfl_idx(float v, int src) {
  const unsigned lane = threadIdx.x % KDA_WARP, base = threadIdx.x - lane;
  kda_emu_wxchg[threadIdx.x] = v;
  kda_emu_wave_sync();
  const float r = kda_emu_wxchg[base + ((unsigned)src & (KDA_WARP - 1))];
  kda_emu_wave_sync();
  return r;
}

// The common skeleton. Loc describes the instruction from the ISA: for each element of A (M x KD),
// B (KD x N) and C/D (M x N), the lane holding it and the index of that element in the lane's operand
// (registers counted in elements). Elements 2r / 2r + 1 of a packed bf16x2 operand are register r's low /
// high halves; unpacked (one bf16 per slot, AMD's vector elements) operands use Loc::packed = false.
// D = C + sum_k A[m][k] B[k][n]: each bf16 product is exact in fp32; the sum runs in fp32 from C in k order.
template <class Loc>
inline void kda_emu_mma(const uint32_t* a, int na, const uint32_t* b, int nb, float* c, int nc) {
  const unsigned lane = threadIdx.x % KDA_WARP, base = threadIdx.x - lane;
  kda_emu_regs& mine = kda_emu_slot[threadIdx.x];
  for (int i = 0; i < na; ++i) mine.a[i] = a[i];
  for (int i = 0; i < nb; ++i) mine.b[i] = b[i];
  for (int i = 0; i < nc; ++i) mine.c[i] = c[i];
  kda_emu_wave_sync();
  float(&D)[16][16] = kda_emu_tile[threadIdx.x / KDA_WARP];
  auto bf16_of = [](const uint32_t* regs, int e) -> float {
    const uint32_t bits = Loc::packed ? (regs[e / 2] >> (16 * (e % 2))) & 0xffffu : regs[e] & 0xffffu;
    return kda_bf16_to_f32((kda_bf16)bits);
  };
  if (lane == 0) {
    for (int m = 0; m < Loc::M; ++m)
      for (int n = 0; n < Loc::N; ++n) {
        int l, e;
        Loc::c(m, n, l, e);
        float acc = kda_emu_slot[base + l].c[e];
        for (int k = 0; k < Loc::KD; ++k) {
          int la, ea, lb, eb;
          Loc::a(m, k, la, ea);
          Loc::b(k, n, lb, eb);
          acc += bf16_of(kda_emu_slot[base + la].a, ea) * bf16_of(kda_emu_slot[base + lb].b, eb);
        }
        D[m][n] = acc;
      }
  }
  kda_emu_wave_sync();
  for (int m = 0; m < Loc::M; ++m)
    for (int n = 0; n < Loc::N; ++n) {
      int l, e;
      Loc::c(m, n, l, e);
      if ((unsigned)l == lane) c[e] = D[m][n];
    }
}

// PTX ISA, "Matrix Fragments for mma.m16n8k16 with floating point type" (.bf16): groupID = lane >> 2,
// threadID_in_group = lane % 4. A (16 x 16, row-major): element A[r][k] is held by lane
// 4 (r % 8) + (k % 8) / 2 as a_i with i = (k % 2) + 2 (r / 8) + 4 (k / 8). B (16 x 8, "col"): B[k][n] is held
// by lane 4 n + (k % 8) / 2 as b_i with i = (k % 2) + 2 (k / 8). C/D (16 x 8): C[r][n] by lane
// 4 (r % 8) + n / 2 as c_i with i = (n % 2) + 2 (r / 8). a_i / b_i: .b32 register i / 2, half i % 2.
struct kda_emu_sm80_m16n8k16 {
  static constexpr int M = 16, N = 8, KD = 16;
  static constexpr bool packed = true;
  static void a(int r, int k, int& l, int& e) { l = 4 * (r % 8) + (k % 8) / 2; e = (k % 2) + 2 * (r / 8) + 4 * (k / 8); }
  static void b(int k, int n, int& l, int& e) { l = 4 * n + (k % 8) / 2; e = (k % 2) + 2 * (k / 8); }
  static void c(int r, int n, int& l, int& e) { l = 4 * (r % 8) + n / 2; e = (n % 2) + 2 * (r / 8); }
};
// AMD CDNA3 ISA / AMD matrix instruction calculator, v_mfma_f32_16x16x16_bf16 (wave64, 4 bf16 per lane
// for A and B, 4 fp32 for C/D): A[i][k] in lane i + 16 (k / 4), element k % 4; B[k][j] in lane
// j + 16 (k / 4), element k % 4; D[i][j] in lane j + 16 (i / 4), element i % 4.
struct kda_emu_mfma_16x16x16 {
  static constexpr int M = 16, N = 16, KD = 16;
  static constexpr bool packed = false;
  static void a(int i, int k, int& l, int& e) { l = i + 16 * (k / 4); e = k % 4; }
  static void b(int k, int j, int& l, int& e) { l = j + 16 * (k / 4); e = k % 4; }
  static void c(int i, int j, int& l, int& e) { l = j + 16 * (i / 4); e = i % 4; }
};
// AMD CDNA4 ISA, v_mfma_f32_16x16x32_bf16 (wave64, 8 bf16 per lane for A and B): A[i][k] in lane
// i + 16 (k / 8), element k % 8; B[k][j] in lane j + 16 (k / 8), element k % 8; D as 16x16x16.
struct kda_emu_mfma_16x16x32 {
  static constexpr int M = 16, N = 16, KD = 32;
  static constexpr bool packed = false;
  static void a(int i, int k, int& l, int& e) { l = i + 16 * (k / 8); e = k % 8; }
  static void b(int k, int j, int& l, int& e) { l = j + 16 * (k / 8); e = k % 8; }
  static void c(int i, int j, int& l, int& e) { l = j + 16 * (i / 4); e = i % 4; }
};

#if KDA_MMA_LAYER == 1
inline void kda_insn_mma_m16n8k16_bf16(const uint32_t a[4], const uint32_t b[2], float c[4]) {
  static_assert(KDA_WARP == 32, "mma.sync is a 32-lane warp instruction");
  kda_emu_mma<kda_emu_sm80_m16n8k16>(a, 4, b, 2, c, 4);
}
#endif
#if KDA_MMA_LAYER == 2 || KDA_MMA_LAYER == 3  // gfx950 runs the 16x16x16 MFMA too (kda_mma.h own / other products)
inline void kda_insn_mfma_f32_16x16x16_bf16(const kda_bf16 a[4], const kda_bf16 b[4], float c[4]) {
  static_assert(KDA_WARP == 64, "MFMA is a 64-lane wave instruction");
  uint32_t ra[4], rb[4];
  for (int i = 0; i < 4; ++i) { ra[i] = a[i]; rb[i] = b[i]; }
  kda_emu_mma<kda_emu_mfma_16x16x16>(ra, 4, rb, 4, c, 4);
}
#endif
#if KDA_MMA_LAYER == 3
inline void kda_insn_mfma_f32_16x16x32_bf16(const kda_bf16 a[8], const kda_bf16 b[8], float c[4]) {
  static_assert(KDA_WARP == 64, "MFMA is a 64-lane wave instruction");
  uint32_t ra[8], rb[8];
  for (int i = 0; i < 8; ++i) { ra[i] = a[i]; rb[i] = b[i]; }
  kda_emu_mma<kda_emu_mfma_16x16x32>(ra, 8, rb, 8, c, 4);
}
#endif

#include "kda_mma.h"
