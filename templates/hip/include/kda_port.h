// SPDX-License-Identifier: Apache-2.0
// kda_port.h: the tiny HIP <-> CUDA portability layer of kdagen's fused kernels (copied verbatim).
//
// One kernel source compiles three ways:
//   nvcc -x cu -arch=sm_90 ...                         (__CUDACC__: CUDA runtime, warp 32)
//   hipcc / clang -x hip --offload-arch=gfx9xx ...     (ROCm's HIP headers, wave 64)
//   clang -x hip --cuda-device-only -nogpulib -nogpuinc -DKDA_DEVICE_ONLY   (offline device compile:
//        no HIP headers at all, so this header supplies threadIdx, __syncthreads, ... itself)
// Math goes through kda_* helpers that lower to native instructions everywhere (no ocml needed).
#pragma once

#include <stddef.h>
#include <stdint.h>

#if defined(__CUDACC__)
// ------------------------------------------------------------------------------------------ CUDA
#include <cuda_runtime.h>
#include <cuda_fp16.h>
#define KDA_WARP 32
typedef cudaStream_t kdaStream_t;
typedef cudaError_t kdaError_t;
#define kdaSuccess cudaSuccess
#define kdaGetLastError cudaGetLastError
#define kdaGetErrorString cudaGetErrorString
#define kdaErrorInvalidValue cudaErrorInvalidValue
#define KDA_DYNAMIC_SMEM 1
#define KDA_LAUNCH_BOUNDS(n) __launch_bounds__(n)
// ... and at least `blocks` resident blocks per SM (registers capped to fit); AMD keeps its waves-per-SIMD floor.
#define KDA_LAUNCH_BOUNDS_SM(n, blocks) __launch_bounds__(n, blocks)
// exp2 and 1/sqrt as the bare special-function instructions: results below 2^-126 flush to zero, which no
// kernel here can tell from a denormal (they scale bounded values), and exp2f's denormal guard costs four
// instructions per call.
__device__ __forceinline__ float kda_exp2(float x) {
  float r;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(r) : "f"(x));
  return r;
}
__device__ __forceinline__ float kda_rsqrt(float x) {
  float r;
  asm("rsqrt.approx.ftz.f32 %0, %1;" : "=f"(r) : "f"(x));
  return r;
}
__device__ __forceinline__ uint32_t kda_f2u(float x) { return __float_as_uint(x); }
__device__ __forceinline__ float kda_u2f(uint32_t x) { return __uint_as_float(x); }
__device__ __forceinline__ float kda_shfl_xor(float v, int m) { return __shfl_xor_sync(0xffffffffu, v, m); }
// Lane `src` of the warp's value (src taken modulo the warp: a negative one reads some lane, the caller discards it).
__device__ __forceinline__ float kda_shfl_idx(float v, int src) { return __shfl_sync(0xffffffffu, v, src & 31); }
__device__ __forceinline__ float kda_fast_div(float a, float b) { return __fdividef(a, b); }
__device__ __forceinline__ void kda_wave_sync() { __syncwarp(); }
// 16 bytes global -> LDS without a register round trip (cp.async, sm_80 and later), zeros when !valid (src is
// then not read); kda_copy_wait_all() waits for this thread's copies, a barrier then publishes them.
__device__ __forceinline__ void kda_copy16(void* dst, const void* src, bool valid) {
  const unsigned s = (unsigned)__cvta_generic_to_shared(dst);
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(s), "l"(src), "r"(valid ? 16 : 0) : "memory");
}
__device__ __forceinline__ void kda_copy_commit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }
// A copy in two halves, for a loop that issues the next step's copies before this step's work and lands them
// after it: cp.async needs no register and lands by itself.
struct kda_copy_reg {};
__device__ __forceinline__ void kda_copy_issue(kda_copy_reg&, void* dst, const void* src, bool valid) {
  kda_copy16(dst, src, valid);
}
__device__ __forceinline__ void kda_copy_land(const kda_copy_reg&, void*) {}
// ... or all but the newest N groups of them.
template <int N>
__device__ __forceinline__ void kda_copy_wait() { asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory"); }
__device__ __forceinline__ void kda_copy_wait_all() { kda_copy_wait<0>(); }
#define KDA_HW_BF16 1
__device__ __forceinline__ float kda_f16_to_f32(uint16_t x) { return __half2float(__ushort_as_half(x)); }
__device__ __forceinline__ uint16_t kda_f32_to_f16(float f) { return __half_as_ushort(__float2half_rn(f)); }
__device__ __forceinline__ uint16_t kda_cvt_bf16(float f) {  // cvt.rn: round to nearest even, NaN stays NaN
  uint16_t r;
  asm("cvt.rn.bf16.f32 %0, %1;" : "=h"(r) : "f"(f));
  return r;
}

#else
// ------------------------------------------------------------------------------------------ AMD
// Every kernel asks the compiler to leave room for this many waves per SIMD (registers at most 512 / it
// per lane): the budget of kdagen/targets.py AMD_MIN_WAVES_PER_SIMD, rendered by the instantiation.
#ifndef KDA_AMD_MIN_WAVES_PER_EU
#define KDA_AMD_MIN_WAVES_PER_EU 1
#endif
#if defined(KDA_DEVICE_ONLY)
// No HIP headers (-nogpuinc): the handful of HIP names the kernels use, from clang builtins.
#define __global__ __attribute__((global))
#define __device__ __attribute__((device))
#define __host__ __attribute__((host))
#define __shared__ __attribute__((shared))
#define __forceinline__ inline __attribute__((always_inline))
#define KDA_IDX(name, fn)                                                                     \
  struct name##_t {                                                                         \
    __declspec(property(get = get_x)) unsigned x;                                           \
    __declspec(property(get = get_y)) unsigned y;                                           \
    __declspec(property(get = get_z)) unsigned z;                                           \
    static __device__ __forceinline__ unsigned get_x() { return fn##_x(); }               \
    static __device__ __forceinline__ unsigned get_y() { return fn##_y(); }               \
    static __device__ __forceinline__ unsigned get_z() { return fn##_z(); }               \
  };                                                                                        \
  extern const __device__ name##_t name;
KDA_IDX(threadIdx, __builtin_amdgcn_workitem_id)
KDA_IDX(blockIdx, __builtin_amdgcn_workgroup_id)
#undef KDA_IDX
__device__ __forceinline__ void __syncthreads() {
  __builtin_amdgcn_fence(__ATOMIC_RELEASE, "workgroup");
  __builtin_amdgcn_s_barrier();
  __builtin_amdgcn_fence(__ATOMIC_ACQUIRE, "workgroup");
}
#define KDA_LAUNCH_BOUNDS(n) \
  __attribute__((amdgpu_flat_work_group_size(1, n), amdgpu_waves_per_eu(KDA_AMD_MIN_WAVES_PER_EU)))
typedef void* kdaStream_t;
#else
#include <hip/hip_runtime.h>
typedef hipStream_t kdaStream_t;
typedef hipError_t kdaError_t;
#define kdaSuccess hipSuccess
#define kdaGetLastError hipGetLastError
#define kdaGetErrorString hipGetErrorString
#define kdaErrorInvalidValue hipErrorInvalidValue
// HIP's second __launch_bounds__ argument is the minimum waves per EU (SIMD): amdgpu_waves_per_eu.
#define KDA_LAUNCH_BOUNDS(n) __launch_bounds__(n, KDA_AMD_MIN_WAVES_PER_EU)
#endif
#define KDA_LAUNCH_BOUNDS_SM(n, blocks) KDA_LAUNCH_BOUNDS(n)
#define KDA_WARP 64
// LDS is static on AMD so that the code object's group segment shows the real figure.
#define KDA_DYNAMIC_SMEM 0
// v_exp_f32 and v_rsq_f32 without the library's denormal range scaling (see the CUDA side).
__device__ __forceinline__ float kda_exp2(float x) { return __builtin_amdgcn_exp2f(x); }
__device__ __forceinline__ float kda_rsqrt(float x) { return __builtin_amdgcn_rsqf(x); }
__device__ __forceinline__ uint32_t kda_f2u(float x) { return __builtin_bit_cast(uint32_t, x); }
__device__ __forceinline__ float kda_u2f(uint32_t x) { return __builtin_bit_cast(float, x); }
__device__ __forceinline__ float kda_fast_div(float a, float b) { return a * __builtin_amdgcn_rcpf(b); }
// fp16 <-> fp32: one v_cvt each (round to nearest even).
__device__ __forceinline__ float kda_f16_to_f32(uint16_t x) { return (float)__builtin_bit_cast(_Float16, x); }
__device__ __forceinline__ uint16_t kda_f32_to_f16(float f) { return __builtin_bit_cast(uint16_t, (_Float16)f); }
// LDS writes of one wave visible to the whole wave.
__device__ __forceinline__ void kda_wave_sync() {
  __builtin_amdgcn_fence(__ATOMIC_RELEASE, "wavefront");
  __builtin_amdgcn_wave_barrier();
  __builtin_amdgcn_fence(__ATOMIC_ACQUIRE, "wavefront");
}
// The copies of kda_copy16 through registers (the loads are not asynchronous here: other waves hide them).
typedef unsigned kda_u32x4 __attribute__((ext_vector_type(4)));
__device__ __forceinline__ void kda_copy16(void* dst, const void* src, bool valid) {
  *reinterpret_cast<kda_u32x4*>(dst) = valid ? *reinterpret_cast<const kda_u32x4*>(src) : kda_u32x4{0u, 0u, 0u, 0u};
}
__device__ __forceinline__ void kda_copy_commit() {}
// The two halves of kda_copy16 (see the CUDA side): the load issued into registers now, the LDS store when the
// caller lands it, so that the wave waits for the load only there (after the work between the two).
struct kda_copy_reg { kda_u32x4 v; };
__device__ __forceinline__ void kda_copy_issue(kda_copy_reg& r, void*, const void* src, bool valid) {
  r.v = valid ? *reinterpret_cast<const kda_u32x4*>(src) : kda_u32x4{0u, 0u, 0u, 0u};
}
__device__ __forceinline__ void kda_copy_land(const kda_copy_reg& r, void* dst) {
  *reinterpret_cast<kda_u32x4*>(dst) = r.v;
}
template <int N>
__device__ __forceinline__ void kda_copy_wait() {}
__device__ __forceinline__ void kda_copy_wait_all() {}
__device__ __forceinline__ int kda_lane() {
  return __builtin_amdgcn_mbcnt_hi(~0u, __builtin_amdgcn_mbcnt_lo(~0u, 0u));
}
__device__ __forceinline__ float kda_shfl_xor(float v, int m) {
  int src = (kda_lane() ^ m) << 2;
  return __builtin_bit_cast(float, __builtin_amdgcn_ds_bpermute(src, __builtin_bit_cast(int, v)));
}
__device__ __forceinline__ float kda_shfl_idx(float v, int src) {
  return __builtin_bit_cast(float, __builtin_amdgcn_ds_bpermute((src & 63) << 2, __builtin_bit_cast(int, v)));
}
#endif

// ----------------------------------------------------------------------------------- shared helpers
static_assert(KDA_WARP == 32 || KDA_WARP == 64, "warp/wave size");

// bf16 as raw 16-bit patterns: the same code on every target, round to nearest even.
typedef uint16_t kda_bf16;
__device__ __forceinline__ float kda_bf16_to_f32(kda_bf16 x) { return kda_u2f(((uint32_t)x) << 16); }
__device__ __forceinline__ kda_bf16 kda_f32_to_bf16(float f) {
#if defined(KDA_HW_BF16)
  return kda_cvt_bf16(f);  // one instruction where the target has it
#else
  uint32_t u = kda_f2u(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return (kda_bf16)((u >> 16) | 0x40u);  // quiet NaN
  u += 0x7fffu + ((u >> 16) & 1u);
  return (kda_bf16)(u >> 16);
#endif
}
// Two floats as one bf16 pair (lo in the low half): one instruction where the target converts pairs.
__device__ __forceinline__ uint32_t kda_f32x2_to_bf16x2(float lo, float hi) {
#if defined(KDA_HW_BF16)
  uint32_t r;
  asm("cvt.rn.bf16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(hi), "f"(lo));
  return r;
#else
  return (uint32_t)kda_f32_to_bf16(lo) | ((uint32_t)kda_f32_to_bf16(hi) << 16);
#endif
}
// The I/O element type (q, k, v, g, beta, out) as raw 16-bit patterns: bf16, or fp16 where the instantiation sets
// KDA_IO_FP16. Everything past the loads is fp32 or the bf16 workspace.
#ifndef KDA_IO_FP16
#define KDA_IO_FP16 0
#endif
typedef uint16_t kda_io;
__device__ __forceinline__ float kda_io_to_f32(kda_io x) {
#if KDA_IO_FP16
  return kda_f16_to_f32(x);
#else
  return kda_bf16_to_f32(x);
#endif
}
__device__ __forceinline__ kda_io kda_f32_to_io(float f) {
#if KDA_IO_FP16
  return kda_f32_to_f16(f);
#else
  return kda_f32_to_bf16(f);
#endif
}
__device__ __forceinline__ float kda_exp(float x) { return kda_exp2(x * 1.4426950408889634f); }
// 1 / (1 + inf) is 0 here too: the fast division returns 0 for a divisor past 2^126.
__device__ __forceinline__ float kda_sigmoid(float x) { return kda_fast_div(1.0f, 1.0f + kda_exp(-x)); }
// x, which the compiler must take as changed here: what is derived from it is computed after this point, so a
// lane-derived address is not held in a register across a whole kernel.
__device__ __forceinline__ int kda_opaque(int x) {
  asm volatile("" : "+r"(x));
  return x;
}

// The per-target matrix layer (kda_mma.h; KDA_MMA_LAYER, default from the kernel source's target).
#include "kda_mma.h"
