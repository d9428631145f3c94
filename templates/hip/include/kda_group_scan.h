// SPDX-License-Identifier: Apache-2.0
// kda_group_scan.h: the group scan between the recurrence's passes 1 and 2 (copied verbatim;
// constants: kda_common.h).
#pragma once

#include "kda_recurrence.h"

namespace kda {

// One block per (sequence, head, SCAN_ROWS state rows): S_in[0] = the sequence's initial state (h0, cache
// row or zeros); S_in[g + 1] = S_in[g] M_g + B_g, all fp32. Pass 2 reads every group's start state from
// S_in, so the cache row is read here, before pass 2's last group overwrites it.
constexpr int SCAN_ROWS = 16;
static_assert(V % SCAN_ROWS == 0 && (SCAN_ROWS * K) % THREADS == 0, "scan mapping");

struct ScanSmem {
  float S[SCAN_ROWS][K];
};

__global__ KDA_LAUNCH_BOUNDS(THREADS) void kda_group_scan_kernel(RecurrenceArgs p) {
  __shared__ ScanSmem s;
  const int tid = threadIdx.x;
  const int64_t n = blockIdx.x / p.H;
  const int h = blockIdx.x % p.H;
  const int v0 = blockIdx.y * SCAN_ROWS;
  constexpr int RSTEP = THREADS / K, RPT = SCAN_ROWS / RSTEP;
  const int k = tid % K, r0 = tid / K;  // this thread: column k of rows r0 + RSTEP i
  const int64_t slot = cache_slot(p, n);
  const int64_t NHVK = p.num_seqs * p.H * V * K;
  const int64_t here = ((int64_t)h * V + v0) * K;  // this slice inside one [H, V, K] state
  const int64_t seq = n * p.H * V * K;
  float x[RPT];
#pragma unroll
  for (int i = 0; i < RPT; ++i) {
    const int v = r0 + RSTEP * i;
    const int64_t e = here + (int64_t)v * K + k;
    float y = 0.f;
    if (slot >= 0 && p.has_init[n] != 0) y = p.cache[slot * p.sc_n + e];
    else if (p.h0) y = p.h0[n * p.sh0_n + e];
    x[i] = y;
    s.S[v][k] = y;
    p.gin[seq + e] = y;
  }
  for (int g = 0; g + 1 < p.groups; ++g) {
    __syncthreads();  // s.S holds S_in[g]
    const int64_t op = (((int64_t)g * p.num_seqs + n) * p.H + h) * (int64_t)(V + K) * K;
    const float* M = p.gop + op + (int64_t)V * K;  // M_g[j][k]
#pragma unroll
    for (int i = 0; i < RPT; ++i) x[i] = p.gop[op + (int64_t)(v0 + r0 + RSTEP * i) * K + k];  // B_g
    for (int j = 0; j < K; ++j) {
      const float m = M[(int64_t)j * K + k];
#pragma unroll
      for (int i = 0; i < RPT; ++i) x[i] += s.S[r0 + RSTEP * i][j] * m;
    }
    __syncthreads();  // every thread has read S_in[g]
#pragma unroll
    for (int i = 0; i < RPT; ++i) {
      const int v = r0 + RSTEP * i;
      s.S[v][k] = x[i];
      p.gin[(g + 1) * NHVK + seq + here + (int64_t)v * K + k] = x[i];
    }
  }
}

}  // namespace kda
