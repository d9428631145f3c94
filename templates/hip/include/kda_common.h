// SPDX-License-Identifier: Apache-2.0
// kda_common.h: what every fused KDA kernel header shares (copied verbatim).
//
// The kernel headers (kda_intra.h, kda_walk.h, launched by kda_launch.h) are not rendered: one generated
// instantiation per (variant, target), hip/<variant>__<target>.hip from templates/hip/kda_chunk.hip.j2, defines
// the compile-time constants they read and the kernels' argument structs, then includes them:
//   kda::K, kda::V     head dims                  kda::BT       chunk size (of the chunk metadata)
//   kda::THREADS       kda_intra's block design's threads      kda::ABI      launcher ABI (kdagen/targets.py HIP_ABI)
//   kda::IntraArgs, kda::WalkArgs (rendered from kdagen/kernels/hip.py), kda_io_t (the I/O element type)
//   KDA_MMA_LAYER_DEFAULT / KDA_TARGET_NAME / KDA_IO_FP16 (macros, before kda_port.h)
//
// Two kernels (vLLM's Kimi gate, bounded, with q and k L2-normed in the kernel):
//  kda_intra_kernel  the chunk-parallel half on 16-row walk chunks: the gate, its cumulative sum, the norms,
//                    Aqk and Akk, (I + Akk)^-1 and the workspace qg, w, kg, u, aqk (bf16) and decay (fp32).
//  kda_walk_kernel   the walk over that workspace, one workgroup per (sequence, head, V slice), the state in
//                    registers.
// Their products run on the target's matrix layer (kda_mma.h); -DKDA_MMA_LAYER=0 selects the plain FMA code
// (kda_intra only: the FMA fallback has no walk). The workspace is bf16 whatever the I/O dtype: the matrix
// layer takes bf16 operands, and Aqk / Akk's factors span up to 8 rows of decay, past fp16's range.
// The instantiation includes kda_port.h first (not included here: the CPU emulation's stand-in,
// tests/build/hip_emulation/kda_port.h, replaces it through the include path).
#pragma once

namespace kda {

constexpr float RCP_LN2 = 1.4426950408889634f;
// The gate's A_log is clamped to this before exp: exp(88.7) is past fp32's range (kda_intra.h).
constexpr float A_LOG_MAX = 80.f;

#if KDA_DYNAMIC_SMEM
#define KDA_SMEM(Type, name) \
  extern __shared__ __align__(16) unsigned char kda_smem_raw[]; \
  Type& name = *reinterpret_cast<Type*>(kda_smem_raw)
#else
#define KDA_SMEM(Type, name) __shared__ Type name
#endif

__device__ __forceinline__ float bf(kda_bf16 x) { return kda_bf16_to_f32(x); }

}  // namespace kda
