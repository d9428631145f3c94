# SPDX-License-Identifier: Apache-2.0
"""kdagen.amdgcn on a hand-written AMDGCN text in LLVM's layout: two kernels, each body followed by its
"; Occupancy:" comment, then the amdhsa.kernels metadata."""

from __future__ import annotations

from dataclasses import replace

from kdagen.amdgcn import budget_misses, read_kernels, waves_per_simd

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
; NumVgprs: 128
; NumAgprs: 120
; TotalNumVgprs: 248
; Occupancy: 2
\t.globl\tkern_b
kern_b:
\tv_add_f32 v0, v1, v2
\ts_endpgm
.Lfunc_end1:
; Occupancy: 8
\t.amdgpu_metadata
---
amdhsa.kernels:
  - .agpr_count:     120
    .group_segment_fixed_size: 1024
    .name:           kern_a
    .private_segment_fixed_size: 0
    .sgpr_count:     40
    .sgpr_spill_count: 2
    .vgpr_count:     248
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
    # On gfx90a and later the metadata's vgpr_count is the unified figure, AGPRs included.
    assert (a.vgprs, a.agprs, a.unified_vgprs, a.sgprs, a.lds, a.scratch, a.spills) == (128, 120, 248, 40, 1024, 0, 2)
    assert (a.llvm_occupancy, a.mfma, a.mfma_insns, a.lds_reads) == (2, 1, {"v_mfma_f32_16x16x32_bf16"}, 2)
    assert (b.vgprs, b.unified_vgprs, b.scratch, b.vgpr_spills, b.llvm_occupancy, b.mfma) == (8, 8, 16, 3, 8, 0)


def test_waves_per_simd_takes_the_tightest_of_registers_lds_and_llvm():
    k = read_kernels(ASM)
    # kern_b: 8 registers, no LDS: the SIMD's limit of 8 waves.
    assert waves_per_simd(k["kern_b"], "gfx950", threads=256) == 8
    # Dynamic LDS (Triton's shared memory): 40 KiB per 256-thread workgroup leaves 1 workgroup of a gfx942
    # CU's 64 KiB, so 4 waves over 4 SIMDs: 1 each; gfx950's 160 KiB holds 4 workgroups.
    assert waves_per_simd(k["kern_b"], "gfx942", threads=256, dynamic_lds=40 * 1024) == 1
    assert waves_per_simd(k["kern_b"], "gfx950", threads=256, dynamic_lds=40 * 1024) == 4
    # kern_a: 248 unified registers leave 2 waves of a 512-register lane (adding its AGPRs to vgpr_count again
    # would say 1).
    assert waves_per_simd(k["kern_a"], "gfx950", threads=256) == 2
    # LLVM's own figure wins when it is the lower one.
    assert waves_per_simd(replace(k["kern_b"], llvm_occupancy=3), "gfx950", threads=256) == 3


def test_budget_misses_names_scratch_and_too_few_waves():
    k = read_kernels(ASM)
    assert budget_misses(k["kern_a"], 2) == []
    one = budget_misses(k["kern_a"], 1)
    assert len(one) == 1 and one[0].startswith("1 waves per SIMD < 2")
    # kern_b has 16 B of scratch: a miss whatever its occupancy.
    assert budget_misses(k["kern_b"], 8) == ["16 B of scratch"]
