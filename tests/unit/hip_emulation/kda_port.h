// Test-only stand-in for kda_port.h: runs the generated kernels on the CPU, one std::thread per GPU
// thread and a std::barrier for __syncthreads (tests/unit/test_hip_emulated.py). Not a product path.
#pragma once
#include <barrier>
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
#define KDA_DYNAMIC_SMEM 0
#define KDA_WARP 32
#define __shared__ static
struct kda_idx3 { unsigned x = 0, y = 0, z = 0; };
inline thread_local kda_idx3 threadIdx;
inline kda_idx3 blockIdx;  // blocks run one at a time
inline std::barrier<>* kda_emu_barrier = nullptr;
inline float kda_emu_xchg[1024];
inline void __syncthreads() { kda_emu_barrier->arrive_and_wait(); }
inline float kda_exp2(float x) { return std::exp2(x); }
inline float kda_log(float x) { return std::log(x); }
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
inline float kda_sigmoid(float x) { return 1.0f / (1.0f + kda_exp(-x)); }
inline float kda_rsqrt(float x) { return 1.0f / kda_sqrt(x); }

// Run `body` as a grid of (gx, gy) blocks of `threads` threads, block after block.
inline void kda_emu_launch(unsigned gx, unsigned gy, unsigned threads, const std::function<void()>& body) {
  for (unsigned by = 0; by < gy; ++by)
    for (unsigned bx = 0; bx < gx; ++bx) {
      blockIdx.x = bx; blockIdx.y = by;
      std::barrier<> bar((std::ptrdiff_t)threads);
      kda_emu_barrier = &bar;
      std::vector<std::thread> ts;
      for (unsigned t = 0; t < threads; ++t)
        ts.emplace_back([&, t] { threadIdx.x = t; body(); });
      for (auto& t : ts) t.join();
    }
}
