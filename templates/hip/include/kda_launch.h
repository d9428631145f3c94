// SPDX-License-Identifier: Apache-2.0
// kda_launch.h: the fused path's launch sequences, host side (copied verbatim; constants: kda_common.h).
//
// The generated instantiation's extern "C" launchers (parameter lists rendered from kdagen/kernels/hip.py)
// pack their arguments into the kernels' argument structs and call these. Raw pointers, element strides
// and a stream handle; the caller (kdagen/runtime/fused_path.py) has checked shapes.
// KDA_LAUNCH_KERNEL(kernel, grid, threads, smem, stream)(args) is the one place a kernel is launched: the triple
// chevron here, a CPU model in tests/build/hip_emulation/kda_port.h (which defines it first).
#pragma once

#include "kda_intra.h"
#include "kda_walk.h"

#if !defined(KDA_DEVICE_ONLY)
#ifndef KDA_LAUNCH_KERNEL
#define KDA_LAUNCH_KERNEL(kernel, grid, threads, smem, stream) kernel<<<grid, threads, smem, stream>>>
#endif

namespace {
template <typename Kernel, typename Smem>
int kda_prepare(Kernel kernel) {
#if KDA_DYNAMIC_SMEM
  static int done = 0;
  if (!done) {
    cudaError_t e = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)sizeof(Smem));
    if (e != cudaSuccess) return (int)e;
    done = 1;
  }
#else
  (void)kernel;
#endif
  return 0;
}
constexpr size_t kda_dyn_smem(size_t bytes) { return KDA_DYNAMIC_SMEM ? bytes : 0; }
}  // namespace

namespace kda {

// IBLOCK_ITEMS (16-row walk chunk, head) items per workgroup of ITHREADS (kda_intra.h, either design): num_chunks
// metadata chunks of BT rows, ISPLIT walk chunks each, times H.
inline int intra_launch(IntraArgs a, int64_t num_chunks, kdaStream_t stream) {
  if (num_chunks <= 0 || a.H <= 0) return 0;
  int err = kda_prepare<decltype(&kda_intra_kernel), IntraSmem>(&kda_intra_kernel);
  if (err) return err;
  const int64_t items = num_chunks * ISPLIT * a.H;
  if (items > 0x7fffffff - IBLOCK_ITEMS) return (int)kdaErrorInvalidValue;  // (T H / 16 >= 2^31: no memory holds it)
  a.n_items = (int)items;
  a.vec = intra_vec(a);
  const unsigned blocks = (unsigned)((items + IBLOCK_ITEMS - 1) / IBLOCK_ITEMS);
  KDA_LAUNCH_KERNEL(kda_intra_kernel, dim3(blocks), ITHREADS, kda_dyn_smem(sizeof(IntraSmem)), stream)(a);
  return (int)kdaGetLastError();
}

// One workgroup per (sequence, head, WBV-row V slice); the FMA fallback has no walk (an error).
inline int walk_launch(const WalkArgs& a, kdaStream_t stream) {
#if defined(KDA_HAS_WALK)
  if (a.num_seqs <= 0 || a.H <= 0) return 0;
  int err = kda_prepare<decltype(&kda_walk_kernel), WalkSmem>(&kda_walk_kernel);
  if (err) return err;
  dim3 grid((unsigned)(a.num_seqs * a.H), (unsigned)(V / WBV));
  KDA_LAUNCH_KERNEL(kda_walk_kernel, grid, WTHREADS, kda_dyn_smem(sizeof(WalkSmem)), stream)(a);
  return (int)kdaGetLastError();
#else
  (void)a;
  (void)stream;
  return (int)kdaErrorInvalidValue;
#endif
}

// kda_intra_kernel then kda_walk_kernel on one stream (the fused plan's run): the first error, if any.
inline int pair_launch(const IntraArgs& intra, int64_t num_chunks, const WalkArgs& walk, kdaStream_t stream) {
  const int err = intra_launch(intra, num_chunks, stream);
  return err ? err : walk_launch(walk, stream);
}

}  // namespace kda
#endif  // !KDA_DEVICE_ONLY
