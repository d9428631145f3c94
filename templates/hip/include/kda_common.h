// SPDX-License-Identifier: Apache-2.0
// kda_common.h: what every fused KDA kernel header shares (copied verbatim).
//
// The kernel headers (kda_prologue.h, kda_recurrence.h, kda_group_scan.h, kda_launch.h) are not
// rendered: one generated instantiation per (variant, target), hip/<variant>__<target>.hip from
// templates/hip/kda_chunk.hip.j2, defines the compile-time constants they read and then includes them:
//   kda::K, kda::V     head dims                  kda::BT       chunk size
//   kda::DK            prologue column tile       kda::BVS      V rows per recurrence block
//   kda::THREADS       threads per block          kda::ABI      launcher ABI (kdagen/targets.py HIP_ABI)
//   KDA_MMA_LAYER_DEFAULT / KDA_TARGET_NAME (macros, before kda_port.h)
//
// Two kernels (kda-semantics.md 1.3, 1.4), and a third for few, long sequences:
//  kda_prologue_kernel   one block per (chunk, head): gate + in-chunk cumsum (log2), beta, q/k L2 norm,
//                        Aqk / Akk (diagonal 16 x 16 blocks in fp32 with exact exp2(G_t - G_s) per
//                        term; off-diagonal blocks factored at a reference row, every exponent <= 0, so
//                        nothing overflows for either gate form), (I + Akk)^-1 by fp32 forward
//                        substitution, w = T (beta k exp2(G)), u = T (beta v), and the workspace qg, w,
//                        u, kg, aqk (bf16) and decay (fp32).
//  kda_recurrence_kernel one block per (sequence, head, group, BVS-row V slice): fp32 V-first state
//                        held on chip for the whole walk; per chunk v_new = u - w S^T,
//                        o = scale qg S^T + tril(aqk) v_new, S = S diag(decay) + v_new^T kg.
//  kda_intra_kernel / kda_walk_kernel  the chunk-parallel half on 16-row walk chunks and the walk over its
//                        workspace with the state in registers (kda_intra.h, kda_walk.h: vLLM's Kimi gate).
//  kda_group_scan_kernel the two-pass group scan (kda-semantics.md 3.4) for few, long sequences: pass 1
//                        walks each group of chunks from a zero state (B_g) and, on K extra "transfer"
//                        rows with u = 0 started from I, M_g = prod (diag(decay) - w^T kg); the scan
//                        composes S_in[g + 1] = S_in[g] M_g + B_g in fp32; pass 2 walks every group
//                        from its scanned start state and writes the outputs. One group = one pass.
// The matrix products of both kernels run on the target's matrix layer (kda_mma.h): the prologue's
// off-diagonal Aqk/Akk blocks and w/u (bf16 operands where the Triton path rounds them: those blocks'
// operands, T and the w/u right operands), and the recurrence's four products. -DKDA_MMA_LAYER=0
// selects the plain FMA code instead.
// The instantiation includes kda_port.h first (not included here: the CPU emulation's stand-in,
// tests/build/hip_emulation/kda_port.h, replaces it through the include path).
#pragma once

namespace kda {

constexpr float RCP_LN2 = 1.4426950408889634f;

static_assert(THREADS == 4 * BT, "prologue maps 4 threads per chunk row and 8 per row pair");
static_assert(K % DK == 0 && V % DK == 0, "head dims must be multiples of the column tile");
static_assert(V % BVS == 0 && K % BVS == 0 && THREADS % BVS == 0 && BT % (THREADS / BVS) == 0,
              "V slice mapping (K too: the group scan's transfer rows are K more state rows)");
static_assert((BVS * K) % THREADS == 0 && THREADS % K == 0, "state ownership and group scan mappings");

#if KDA_DYNAMIC_SMEM
#define KDA_SMEM(Type, name) \
  extern __shared__ __align__(16) unsigned char kda_smem_raw[]; \
  Type& name = *reinterpret_cast<Type*>(kda_smem_raw)
#else
#define KDA_SMEM(Type, name) __shared__ Type name
#endif

__device__ __forceinline__ float bf(kda_bf16 x) { return kda_bf16_to_f32(x); }

}  // namespace kda
