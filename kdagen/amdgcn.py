# SPDX-License-Identifier: Apache-2.0
"""Reading AMDGCN assembly: per kernel, the resources LLVM reports and the waves per SIMD they allow.

Both AMD code paths are verified only by compiling (no AMD GPU here), so their occupancy budget is read
off the code objects: clang-22's `.s` for the HIP kernels, Triton's `amdgcn` text for the Triton ones.
LLVM's own `; Occupancy:` line counts registers and static LDS; Triton's shared memory is dynamic (the
group segment reads 0), so `waves_per_simd` also takes the LDS a launch asks for.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from kdagen.targets import AMD_MIN_WAVES_PER_SIMD, TARGETS


@dataclass(frozen=True)
class KernelResources:
    name: str
    vgprs: int  # architectural VGPRs (LLVM's "; NumVgprs:")
    agprs: int  # accumulation VGPRs (MFMA results on gfx90a and later)
    # VGPRs + AGPRs as allocated from the unified file: the metadata's vgpr_count, which on gfx90a and later is
    # already align(vgprs, 4) + agprs (LLVM's NumVGPRsForWavesPerEU), so never add agprs to it again.
    unified_vgprs: int
    sgprs: int
    vgpr_spills: int
    sgpr_spills: int
    scratch: int  # private segment bytes per lane (spills and stack arrays)
    lds: int  # static group segment bytes per workgroup
    llvm_occupancy: int | None  # LLVM's "; Occupancy:" (waves per SIMD from registers and static LDS)
    mfma: int  # v_mfma instructions in the body (static count)
    mfma_insns: frozenset[str]  # the distinct v_mfma mnemonics among them
    lds_reads: int  # ds_read* / ds_load* instructions in the body (static count)
    insns: int
    workgroup: int = 0  # the launch bound's workgroup size (metadata max_flat_workgroup_size), 0 if absent

    @property
    def spills(self) -> int:
        return self.vgpr_spills + self.sgpr_spills


_META = ("group_segment_fixed_size", "private_segment_fixed_size", "vgpr_count", "agpr_count", "sgpr_count",
         "vgpr_spill_count", "sgpr_spill_count", "max_flat_workgroup_size")


def _segments(asm: str, names: list[str]) -> dict[str, str]:
    """Per kernel, the text from its label to the next kernel's: its body, then the comment block LLVM
    prints after it ("; Kernel info:", "; Occupancy: N")."""
    starts = sorted((m.start(), n) for n in names for m in [re.search(rf"^{re.escape(n)}:", asm, re.M)] if m)
    ends = [s for s, _ in starts[1:]] + [len(asm)]
    return {n: asm[s:e] for (s, n), e in zip(starts, ends)}


def _metadata(asm: str) -> dict[str, dict[str, int]]:
    """Per kernel, the amdhsa.kernels metadata fields in _META."""
    out: dict[str, dict[str, int]] = {}
    if "amdhsa.kernels:" not in asm:
        return out
    meta = asm.split("amdhsa.kernels:", 1)[1]
    for block in re.split(r"\n  - ", meta)[1:]:
        name = re.search(r"\.name:\s+(\S+)", block)
        if not name or name[1].endswith(".kd"):
            continue
        out[name[1]] = {k: int(v) for k, v in re.findall(rf"\.({'|'.join(_META)}):\s+(\d+)", block)}
    return out


def read_kernels(asm: str) -> dict[str, KernelResources]:
    """Every kernel of an AMDGCN assembly text, by symbol name."""
    meta = _metadata(asm)
    bodies = _segments(asm, list(meta))
    out = {}
    for name, f in meta.items():
        body = bodies.get(name, "")
        occ = re.search(r";\s*Occupancy:\s*(\d+)", body)
        mfma = re.findall(r"^\s+(v_mfma\w*)", body, re.M)
        arch = re.search(r";\s*NumVgprs:\s*(\d+)", body)
        unified, agprs = f.get("vgpr_count", 0), f.get("agpr_count", 0)
        out[name] = KernelResources(
            name=name, vgprs=int(arch[1]) if arch else unified - agprs, agprs=agprs, unified_vgprs=unified,
            sgprs=f.get("sgpr_count", 0),
            vgpr_spills=f.get("vgpr_spill_count", 0), sgpr_spills=f.get("sgpr_spill_count", 0),
            scratch=f.get("private_segment_fixed_size", 0), lds=f.get("group_segment_fixed_size", 0),
            llvm_occupancy=int(occ[1]) if occ else None,
            mfma=len(mfma), mfma_insns=frozenset(mfma),
            lds_reads=len(re.findall(r"^\s+ds_(?:read|load)\w*", body, re.M)),
            insns=sum(1 for line in body.splitlines() if re.match(r"\s+[a-z][a-z0-9_]*(\s|$)", line)),
            workgroup=f.get("max_flat_workgroup_size", 0))
    return out


def waves_per_simd(res: KernelResources, target: str, threads: int, dynamic_lds: int = 0) -> int:
    """Waves of this kernel one SIMD can hold on `target` with `threads` per workgroup: the least of
    LLVM's register/static-LDS figure and what the workgroup's total LDS (static + `dynamic_lds`) leaves."""
    t = TARGETS[target]
    assert t.vendor == "amd", target
    waves_per_group = -(-threads // t.warp_size)
    lds = res.lds + dynamic_lds
    groups = t.lds_per_cu // lds if lds else t.max_waves_per_simd * t.simds_per_cu
    by_lds = groups * waves_per_group // t.simds_per_cu
    # Registers: the unified VGPR + AGPR file, allocated in granules of 8 per lane.
    regs = -(-res.unified_vgprs // 8) * 8
    by_regs = t.vgprs_per_simd_lane // max(regs, 8)
    waves = min(by_lds, by_regs, t.max_waves_per_simd)
    if res.llvm_occupancy is not None:
        waves = min(waves, res.llvm_occupancy)
    return waves


def budget_misses(res: KernelResources, waves: int | None) -> list[str]:
    """Why a kernel with `waves` per SIMD misses the AMD occupancy budget (AMD_MIN_WAVES_PER_SIMD waves, no
    scratch); empty when it meets it."""
    why = []
    if res.scratch:
        why.append(f"{res.scratch} B of scratch")
    if waves is None or waves < AMD_MIN_WAVES_PER_SIMD:
        why.append(f"{waves} waves per SIMD < {AMD_MIN_WAVES_PER_SIMD} ({res.unified_vgprs} VGPR+AGPR, "
                   f"{res.lds} B static LDS, LLVM occupancy {res.llvm_occupancy})")
    return why
