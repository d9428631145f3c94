# SPDX-License-Identifier: Apache-2.0
"""kdagen.amdgcn on a hand-written AMDGCN text in LLVM's layout: two kernels, each body followed by its
"; Occupancy:" comment, then the amdhsa.kernels metadata."""

from __future__ import annotations

from kdagen.amdgcn import KernelResources, read_kernels, waves_per_simd

ASM = """\t.text
\t.globl\tkern_a
kern_a:
\tv_mfma_f32_16x16x32_bf16 v[0:3], v[4:7], v[8:11], v[0:3]
\tds_read_b128 v[4:7], v1
\tds_load_b64 v[8:9], v2
\ts_endpgm
.Lfunc_end0:
\t.section\t.rodata,"a"
\t.text
; -- End function
; Kernel info:
; NumVgprs: 130
; Occupancy: 3
\t.globl\tkern_b
kern_b:
\tv_add_f32 v0, v1, v2
\ts_endpgm
.Lfunc_end1:
; Occupancy: 8
\t.amdgpu_metadata
---
amdhsa.kernels:
  - .agpr_count:     4
    .group_segment_fixed_size: 1024
    .name:           kern_a
    .private_segment_fixed_size: 0
    .sgpr_count:     40
    .sgpr_spill_count: 2
    .vgpr_count:     130
    .vgpr_spill_count: 0
  - .agpr_count:     0
    .group_segment_fixed_size: 0
    .name:           kern_b
    .private_segment_fixed_size: 16
    .sgpr_count:     10
    .sgpr_spill_count: 0
    .vgpr_count:     8
    .vgpr_spill_count: 3
\t.end_amdgpu_metadata
"""


def test_reads_each_kernels_resources_and_llvm_occupancy():
    k = read_kernels(ASM)
    assert set(k) == {"kern_a", "kern_b"}
    a, b = k["kern_a"], k["kern_b"]
    assert (a.vgprs, a.agprs, a.sgprs, a.lds, a.scratch, a.spills) == (130, 4, 40, 1024, 0, 2)
    assert (a.llvm_occupancy, a.mfma, a.lds_reads) == (3, 1, 2)
    assert (b.scratch, b.vgpr_spills, b.llvm_occupancy, b.mfma) == (16, 3, 8, 0)
    assert (a.mfma_kinds, b.mfma_kinds, a.arch_vgprs) == (("v_mfma_f32_16x16x32_bf16",), (), 126)


def test_waves_per_simd_takes_the_tightest_of_registers_lds_and_llvm():
    k = read_kernels(ASM)
    # kern_b: 8 registers, no LDS: the SIMD's limit of 8 waves.
    assert waves_per_simd(k["kern_b"], "gfx950", threads=256) == 8
    # Dynamic LDS (Triton's shared memory): 40 KiB per 256-thread workgroup leaves 1 workgroup of a gfx942
    # CU's 64 KiB, so 4 waves over 4 SIMDs: 1 each; gfx950's 160 KiB holds 4 workgroups.
    assert waves_per_simd(k["kern_b"], "gfx942", threads=256, dynamic_lds=40 * 1024) == 1
    assert waves_per_simd(k["kern_b"], "gfx950", threads=256, dynamic_lds=40 * 1024) == 4
    # kern_a: LLVM's 3 is below what its 136 registers (3 waves of 512) and 1 KiB of LDS would allow.
    assert waves_per_simd(k["kern_a"], "gfx950", threads=256) == 3


def test_waves_per_simd_counts_the_agprs_once():
    # On gfx90a and later .vgpr_count is the unified file's total, AGPRs included (LLVM's TotalNumVgprs):
    # 256 of them (128 arch + 128 AGPRs) leave 512 / 256 = 2 waves, not the 1 of 256 + 128 more.
    res = KernelResources(name="k", vgprs=256, agprs=128, sgprs=40, vgpr_spills=0, sgpr_spills=0, scratch=0,
                          lds=0, llvm_occupancy=None, mfma=0, lds_reads=0, insns=0)
    assert waves_per_simd(res, "gfx942", threads=256) == 2
    assert res.arch_vgprs == 128
