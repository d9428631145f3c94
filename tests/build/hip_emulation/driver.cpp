// Test-only driver: a generated .hip (path via -DKDA_SOURCE), its extern "C" launchers included, built
// against the emulation's kda_port.h (tests/build/test_hip_emulated.py), plus one tile of the matrix layer.
#include KDA_SOURCE

// One wave computes C = C0 + A B, A [16 x 64], B [64 x 16] (bf16 bits), through the layer's own load /
// mma / accumulator-index functions, twice: from row-major A and B (C1), and from row-major A^T [64 x 16]
// and B^T [16 x 64] (C2, the transposed strides the kernel also uses). Returns KDA_MMA_K, or 0 (nothing
// computed) when built with the FMA fallback.
extern "C" int emu_mma_tile(const uint16_t* A, const uint16_t* B, const uint16_t* At, const uint16_t* Bt,
                            float* C1, float* C2) {
#if KDA_MMA_LAYER == KDA_LAYER_FMA
  (void)A; (void)B; (void)At; (void)Bt; (void)C1; (void)C2;
  return 0;
#else
  kda_emu_launch(1, 1, KDA_WARP, [&] {
    kda_frag_c c1, c2;
    for (int e = 0; e < KDA_C_ELEMS; ++e) c1.x[e] = c2.x[e] = C1[kda_c_row(e) * 16 + kda_c_col(e)];
    for (int kk = 0; kk < 64; kk += KDA_MMA_K) {
      kda_frag_a a;
      kda_frag_b b;
      kda_load_a<64, 1>(a, A + kk);       // A[m][k] = A[m * 64 + kk + k]
      kda_load_b<16, 1>(b, B + kk * 16);  // B[k][n] = B[(kk + k) * 16 + n]
      kda_mma16(c1, a, b);
      kda_load_a<1, 16>(a, At + kk * 16); // A[m][k] = At[(kk + k) * 16 + m]
      kda_load_b<1, 64>(b, Bt + kk);      // B[k][n] = Bt[n * 64 + kk + k]
      kda_mma16(c2, a, b);
    }
    kda_emu_wave_sync();  // every lane has read C1 before any writes it
    for (int e = 0; e < KDA_C_ELEMS; ++e) {
      C1[kda_c_row(e) * 16 + kda_c_col(e)] = c1.x[e];
      C2[kda_c_row(e) * 16 + kda_c_col(e)] = c2.x[e];
    }
  });
  return KDA_MMA_K;
#endif
}
