# SPDX-License-Identifier: Apache-2.0
"""The one table of per-target facts. Specs, templates and the runtime read only from here.

Dependency-free (no torch, YAML or Jinja), so the runtime can import it without the generator."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Literal

TargetName = Literal["gfx942", "gfx950", "sm_90"]
BackendName = Literal["triton", "hip"]
DTypeName = Literal["bf16", "fp16"]


@dataclass(frozen=True)
class Target:
    name: str
    vendor: Literal["amd", "nvidia"]
    triton_backend: Literal["hip", "cuda"]  # GPUTarget(backend, arch, warp_size) for Triton's AOT
    triton_arch: str | int
    warp_size: int
    smem_per_block: int  # bytes a single block/workgroup may use
    # The fused kernels' matrix layer (templates/hip/include/kda_mma.h KDA_MMA_LAYER: 0 FMA fallback,
    # 1 sm_90 mma.sync, 2 gfx942 MFMA, 3 gfx950 MFMA) and its instruction, for the generated comments.
    hip_mma_layer: int
    hip_mma_insn: str
    # tl.dot input_precision for products that must keep fp32 accuracy (the group scan, the inverse's
    # off-diagonal blocks): NVIDIA's fp32 "ieee" dot runs on FMA units and spills; tf32x3 runs on the
    # tensor cores. CDNA has fp32 MFMA.
    triton_fp32_dot: str
    triton_refused: tuple[RefusedConfig, ...] = ()
    # AMD compute-unit facts for occupancy read off code objects (kdagen/amdgcn.py); 0 on NVIDIA.
    lds_per_cu: int = 0  # bytes of LDS one CU shares among its workgroups
    simds_per_cu: int = 0
    vgprs_per_simd_lane: int = 0  # the unified VGPR + AGPR file per lane
    max_waves_per_simd: int = 0
    # kda_walk_kernel (templates/hip/include/kda_walk.h) holds the next step's K side in registers while a step
    # computes, then stores it to LDS: the loads overlap the products inside each wave. That takes 24 more VGPRs
    # per lane, which costs a workgroup per CU where registers, not LDS, bound it (gfx950: 2 -> 1), so it is on
    # where LDS already allows one workgroup only (gfx942). CUDA's cp.async needs no registers (always on).
    hip_walk_prefetch: bool = True
    # kda_intra_kernel's block design (templates/hip/include/kda_intra.h) takes this many (walk chunk, head) items per
    # workgroup, loading each next item's inputs during the current one's products (the wave design takes one item
    # per wave, INTRA_WAVE_ITEMS). On AMD the item loop makes the compiler
    # hoist per-lane masks out of it into SGPR pairs, past the 102 SGPRs (spills to VGPR lanes, which the AOT
    # budget refuses), so AMD takes one item per workgroup.
    hip_intra_items: int = 4
    # Columns one matrix-layer instruction reduces over (kda_mma.h KDA_MMA_K): kda_intra pads T's products to it.
    hip_mma_k: int = 16
    # kda_intra_kernel's design (kda_intra.h): False the block design (a workgroup per item, barriers between its
    # phases), True the wave design (a wave per item, about 21 KB of LDS per wave at K = V = 128). sm_90 takes the
    # wave design, one item per wave: 3-10% less kernel time on the H200 (docs/performance-model.md, "The wave
    # design"). AMD keeps the block design: gfx942's 64 KB of LDS per CU would hold 2 item-waves, half a wave per
    # SIMD, under the occupancy budget (gfx950's 160 KB: 5, barely over one).
    hip_intra_wave: bool = False


@dataclass(frozen=True)
class RefusedConfig:
    """A Triton launch config that a Triton release compiles wrongly for this target: specs, autotune and
    plans refuse it with `why`."""

    knobs: tuple[tuple[str, int], ...]  # every (knob, value) must match
    why: str

    def matches(self, tuning: Mapping[str, int]) -> bool:
        return all(tuning.get(k) == v for k, v in self.knobs)


# Measured on an H200 with triton 3.6.0 (2026-12-01, tools/repro_recurrence.py and compute-sanitizer):
# kda_recurrence with 4 warps and a 32-row V slice is miscompiled. Its wgmma operand read overruns the
# kernel's shared-memory allocation by 1 KiB ("Invalid __shared__ read of size 1024 bytes" at the tl.dot),
# an illegal address at one pipeline stage and NaN output at two, at every shape tried (H=2 T=200 to H=12
# T=4096). 2 and 8 warps at block_v 32, and 4 warps at block_v 64, agree with the spec config bit for bit, and
# the interpreter runs the same kernel correctly. Our kernel addresses no shared memory itself, so the fault
# is Triton's. Releases 3.7-3.9 have not run on a GPU here: it is refused on all of them.
_SM90_WGMMA_BV32 = RefusedConfig(
    knobs=(("recurrence_warps", 4), ("block_v", 32)),
    why="Triton (3.6.0 measured; 3.7-3.9 not verified) miscompiles kda_recurrence on sm_90 with "
        "recurrence_warps 4 and block_v 32: its wgmma reads past the shared-memory allocation (an illegal "
        "address or NaN output, compute-sanitizer on an H200). Use block_v 64, or 2 or 8 recurrence_warps")


def refused_config(target: str, tuning: Mapping[str, int]) -> str | None:
    """Why `tuning` must not run on `target`, or None."""
    known = TARGETS.get(target)
    for bad in known.triton_refused if known is not None else ():
        if bad.matches(tuning):
            return bad.why
    return None


def vendor_of(target: str) -> Literal["amd", "nvidia"]:
    """The vendor of a target name, also for one the table does not list (a device kdagen has no variant
    for, or a KDAGEN_TARGET override): gfx* is AMD, everything else NVIDIA."""
    known = TARGETS.get(target)
    if known is not None:
        return known.vendor
    return "amd" if target.startswith("gfx") else "nvidia"


TARGETS: dict[str, Target] = {
    "gfx942": Target(
        name="gfx942", vendor="amd", triton_backend="hip", triton_arch="gfx942", warp_size=64,
        smem_per_block=64 * 1024, triton_fp32_dot="ieee",
        hip_mma_layer=2, hip_mma_insn="v_mfma_f32_16x16x16_bf16, wave 64", hip_intra_items=1,
        lds_per_cu=64 * 1024, simds_per_cu=4, vgprs_per_simd_lane=512, max_waves_per_simd=8,
    ),
    "gfx950": Target(
        name="gfx950", vendor="amd", triton_backend="hip", triton_arch="gfx950", warp_size=64,
        smem_per_block=160 * 1024, triton_fp32_dot="ieee",
        hip_mma_layer=3, hip_mma_insn="v_mfma_f32_16x16x32_bf16, wave 64", hip_walk_prefetch=False,
        hip_intra_items=1, hip_mma_k=32,
        lds_per_cu=160 * 1024, simds_per_cu=4, vgprs_per_simd_lane=512, max_waves_per_simd=8,
    ),
    "sm_90": Target(
        name="sm_90", vendor="nvidia", triton_backend="cuda", triton_arch=90, warp_size=32,
        smem_per_block=227 * 1024, triton_fp32_dot="tf32x3", triton_refused=(_SM90_WGMMA_BV32,),
        hip_mma_layer=1, hip_mma_insn="mma.sync m16n8k16 bf16, warp 32", hip_intra_wave=True,
    ),
}

BACKENDS: tuple[str, ...] = ("triton", "hip")

# The occupancy budget of every AMD kernel, Triton and HIP alike (the AOT tests enforce it on the code
# objects): at least this many waves per SIMD, so one wave's memory latency hides behind another's work,
# and no scratch. Nothing here can time an AMD GPU, so this is the budget that stands in for a timing.
AMD_MIN_WAVES_PER_SIMD = 2

# ---- the fused HIP backend (templates/hip/): kda_intra_kernel (hip_intra_threads) and kda_walk_kernel (64 per
# 16 state rows, at most HIP_WALK_WAVES waves). What they can take is hip_limits() below.
HIP_DTYPES: tuple[str, ...] = ("bf16", "fp16")
HIP_CHUNK_SIZE = 64
HIP_THREADS = 256
# kda_intra_kernel's wide workgroup: where HIP_THREADS threads' LDS leaves an AMD target under the occupancy budget
# (K = V = 256 on gfx942: 54,080 B, one 4-wave workgroup per CU, 1 wave per SIMD), twice the waves share the same
# tiles, each thread half the row layout's columns: one 8-wave workgroup per CU is 2 waves per SIMD. The row
# layout then needs K a multiple of 64 (a thread's K / 32 columns are whole bf16 pairs).
HIP_WIDE_THREADS = 512
HIP_INTRA_WAVES = 2  # kda_intra.h INTRA_WAVES: the wave design's waves per workgroup (two share the 1 KB each
# workgroup reserves: 14 waves per H200 SM against 13 at one, 2026-12-04)
HIP_WALK_WAVES = 8  # kda_walk.h WALK_WAVES
HIP_WALK_STAGES = 2  # kda_walk.h WALK_STAGES
# K: a multiple of 32 (kda_intra's row layout packs each thread's K / 16 columns in bf16 pairs, and gfx950's MFMA
# reduces Aqk / Akk over 32 columns); V: a multiple of 16 (the u and state tiles). Both at most 256 (a thread's
# row-layout share, K / 16 and V / 16 columns, is at most 16).
HIP_K_MULTIPLE, HIP_V_MULTIPLE, HIP_MAX_HEAD_DIM = 32, 16, 256
HIP_ABI = 6  # bump when an extern "C" launcher's signature changes (fused_path.py checks it)


def _r16(n: int) -> int:
    return -(-n // 16) * 16


def hip_intra_lds(head_dim_k: int, head_dim_v: int, target: str, wave: bool | None = None) -> int:
    """sizeof(kda::IntraSmem) (templates/hip/include/kda_intra.h) on `target`'s matrix layer, in the target's design
    or the one `wave` names: rows padded by 8 bf16, T's products padded to the layer's reduction (tests check it
    against the compiled size)."""
    K, V, ir = head_dim_k, head_dim_v, 16
    ikp = max(ir, TARGETS[target].hip_mma_k)
    if TARGETS[target].hip_intra_wave if wave is None else wave:
        # IntraWaveSmem per wave: the q / v tile (max(K, V) wide, ikp rows), the k tile (max(K, V) wide), g / KW
        # (ikp rows), A (fp32) sharing its space with T and T diag(beta), TF (fp32), beta
        tiles = _r16(ikp * (max(K, V) + 8) * 2) + _r16(ir * (max(K, V) + 8) * 2) + _r16(ikp * (K + 8) * 2)
        shared = max(_r16(ir * (ir + 4) * 4), 2 * _r16(ir * (ikp + 8) * 2))
        return HIP_INTRA_WAVES * _r16(tiles + shared + _r16(ir * (ir + 4) * 4) + ir * 4)
    r1 = _r16(max(ir * K * 4, ikp * (V + 8) * 2))
    r2 = _r16(max(3 * ir * (K + 8) * 2, ir * (K + 8) * 2 + ir * (V + 8) * 2))
    kw, tb, aq = _r16(ikp * (K + 8) * 2), _r16(ir * (ikp + 8) * 2), _r16(ir * ir * 2)
    a = _r16(ir * (ir + 4) * 4)
    return _r16(r1 + r2 + kw + tb + aq + 2 * a + ir * 4)


def hip_walk_waves(head_dim_v: int) -> int:
    """kda_walk_kernel's waves per workgroup: the most, up to HIP_WALK_WAVES, whose 16-row tiles divide V."""
    tiles = head_dim_v // 16
    return next(w for w in range(min(HIP_WALK_WAVES, tiles), 0, -1) if tiles % w == 0)


# CUDA launch bounds (kda_intra.h INTRA_BLOCKS_PER_SM, kda_walk.h WALK_BLOCKS_PER_SM): the resident blocks per SM
# the register allocation leaves room for, 80 and 128 registers a thread at these defaults.
HIP_CUDA_INTRA_BLOCKS, HIP_CUDA_WALK_BLOCKS = 3, 2


def hip_cuda_blocks(head_dim_k: int, head_dim_v: int) -> tuple[int, int]:
    """(kda_intra_kernel, kda_walk_kernel) resident blocks per SM on sm_90, one fewer than the defaults where those
    spill (ptxas -v, 2026-12-03). kda_intra: from K = 160 on (62-754 B at 80 registers; its thread holds K / 16
    columns of q, k and the gate). The walk's thread holds K / 2 fp32 of the state (K x its V slice over 2 threads
    a row); it spilled wherever that left fewer than 64 of its register cap (K, V = 160, 128: 40 B; 192, 256:
    224 B; 256, 256: 624 B) and never with 64 or more (128, 256; 192, 192; 256, 64)."""
    intra = HIP_CUDA_INTRA_BLOCKS - (head_dim_k > 128)
    cap = 65536 // (HIP_CUDA_WALK_BLOCKS * 32 * hip_walk_waves(head_dim_v))
    return intra, HIP_CUDA_WALK_BLOCKS - (min(cap, 255) - head_dim_k // 2 < 64)


def hip_walk_lds(head_dim_k: int, head_dim_v: int) -> int:
    """sizeof(kda::WalkSmem) (templates/hip/include/kda_walk.h): HIP_WALK_STAGES stages of one step's K side."""
    K, wbv, ir = head_dim_k, 16 * hip_walk_waves(head_dim_v), 16
    stage = _r16(3 * ir * (K + 8) * 2 + ir * (wbv + 8) * 2 + ir * (ir + 8) * 2 + K * 4)
    return HIP_WALK_STAGES * stage


def _lds_waves(lds: int, threads: int, target: Target) -> int:
    """Waves per SIMD that a workgroup's LDS alone leaves room for (kdagen/amdgcn.py waves_per_simd's rule)."""
    groups = target.lds_per_cu // lds
    return min(groups * (threads // target.warp_size) // target.simds_per_cu, target.max_waves_per_simd)


def hip_intra_threads(head_dim_k: int, head_dim_v: int, target: str, wave: bool | None = None) -> int:
    """kda_intra_kernel's threads per workgroup on `target` in its design (or the one `wave` names): HIP_INTRA_WAVES
    waves in the wave design; in the block design HIP_THREADS, or HIP_WIDE_THREADS on an AMD target where HIP_THREADS misses the occupancy budget from LDS
    alone and the wide row layout takes K."""
    t = TARGETS[target]
    if t.hip_intra_wave if wave is None else wave:
        return HIP_INTRA_WAVES * t.warp_size
    if t.vendor != "amd" or head_dim_k % (2 * HIP_WIDE_THREADS // 16):
        return HIP_THREADS
    lds = hip_intra_lds(head_dim_k, head_dim_v, target)
    if lds > t.smem_per_block or _lds_waves(lds, HIP_THREADS, t) >= AMD_MIN_WAVES_PER_SIMD:
        return HIP_THREADS
    return HIP_WIDE_THREADS


def hip_limits(head_dim_k: int, head_dim_v: int, chunk_size: int, dtype: str, target: str) -> list[str]:
    """Why the fused HIP kernels cannot take this variant on `target`: one sentence per limit, naming it and by
    how much it is missed; empty when they can. On AMD the budget is the occupancy one (AMD_MIN_WAVES_PER_SIMD
    waves per SIMD from LDS alone; registers and scratch are checked on the code objects, tests/aot/test_aot_hip.py),
    elsewhere the target's shared memory per block."""
    why = []
    if dtype not in HIP_DTYPES:
        why.append(f"dtype {dtype}: the HIP kernels take {', '.join(HIP_DTYPES)}")
    if chunk_size != HIP_CHUNK_SIZE:
        why.append(f"chunk_size {chunk_size}: the HIP kernels take {HIP_CHUNK_SIZE}")
    for name, dim, mult in (("head_dim_k", head_dim_k, HIP_K_MULTIPLE), ("head_dim_v", head_dim_v, HIP_V_MULTIPLE)):
        if dim % mult or not mult <= dim <= HIP_MAX_HEAD_DIM:
            why.append(f"{name} {dim}: the HIP kernels take multiples of {mult} from {mult} to {HIP_MAX_HEAD_DIM}")
    t = TARGETS.get(target)
    if t is None:
        why.append(f"target {target}: not one of {', '.join(TARGETS)}")
    if why:
        return why
    for kernel, lds, threads in (("kda_intra_kernel", hip_intra_lds(head_dim_k, head_dim_v, target),
                                  hip_intra_threads(head_dim_k, head_dim_v, target)),
                                 ("kda_walk_kernel", hip_walk_lds(head_dim_k, head_dim_v),
                                  64 * hip_walk_waves(head_dim_v))):
        if lds > t.smem_per_block:
            why.append(f"{kernel} needs {lds} B of shared memory on {target}, {lds - t.smem_per_block} B over its "
                       f"{t.smem_per_block} B per workgroup")
        elif t.vendor == "amd" and (waves := _lds_waves(lds, threads, t)) < AMD_MIN_WAVES_PER_SIMD:
            need = t.lds_per_cu // -(-AMD_MIN_WAVES_PER_SIMD * t.simds_per_cu // (threads // t.warp_size))
            wide = (f" (its {HIP_WIDE_THREADS}-thread workgroup, 2 waves per SIMD at this LDS, needs head_dim_k a "
                    f"multiple of {HIP_WIDE_THREADS // 8})" if kernel == "kda_intra_kernel" and _lds_waves(
                        lds, HIP_WIDE_THREADS, t) >= AMD_MIN_WAVES_PER_SIMD else "")
            why.append(f"{kernel} needs {lds} B of LDS on {target}: {waves} waves per SIMD, under the budget of "
                       f"{AMD_MIN_WAVES_PER_SIMD}; it fits at {need} B or less ({lds - need} B over){wide}")
    return why


# dtype name -> (bytes per element, torch dtype attribute, triton dtype attribute)
DTYPES: dict[str, tuple[int, str, str]] = {
    "bf16": (2, "bfloat16", "bfloat16"),
    "fp16": (2, "float16", "float16"),
}

# What the Triton templates can do. The prologue unrolls chunk_size / SUB_CHUNK sub-blocks of 16 rows,
# and tl.dot needs every dimension >= 16.
SUB_CHUNK = 16
CHUNK_SIZES: tuple[int, ...] = (16, 32, 64)
MIN_HEAD_DIM, MAX_HEAD_DIM = 16, 256
WARPS: tuple[int, ...] = (1, 2, 4, 8, 16)
MAX_STAGES = 4


def next_pow2(x: int) -> int:
    return 1 << (x - 1).bit_length()


def triton_walk_smem(target: str, head_dim_k: int, head_dim_v: int, dtype: str, rows: int, block_v: int,
                     stages: int, transfer: bool = False) -> int:
    """Shared memory (bytes) one kda_recurrence build asks for: walk steps of `rows` rows (the pair's whole
    chunk, kda_intra's intra_rows), V slices of `block_v` rows (as launched: at most next_pow2(V), and at most BK
    in pass 1), `stages` pipeline stages; transfer: pass 1 (no qg, no output). What Triton stages is the dot
    operands: with rows < block_v the walk transposes its products (kdagen/triton_kernels/walk.py) and stages
    the state slice, else the w / qg tiles and the transposed slice. Read off triton 3.7's AOT builds
    (tests/aot/test_triton_smem.py compares): exact on AMD at one stage (every AMD tuning), an upper bound at
    two and on sm_90 (wgmma; 4 and 8 warps), whose builds stage more per pipeline stage."""
    elt = DTYPES[dtype][0]
    bk, bv = next_pow2(head_dim_k), block_v
    extra = max(0, stages - 1)
    if TARGETS[target].vendor == "amd":
        if rows < bv:
            base, per_stage = (1 if transfer else 2) * bv * bk, (2 * rows * bk + rows * bv) if transfer else rows * bk
        else:
            base, per_stage = rows * bk + (0 if transfer else bk * bv), 2 * rows * bk
    elif rows < bv:
        base = max(128, bv) * bk  # never under 128 state rows' worth in the builds read (block_v 64 and 128)
        per_stage = 1024 if transfer else 2 * rows * bk + rows * bv
    else:
        base = (3 if transfer else 4) * rows * bk + (0 if transfer else rows * bv)
        per_stage = (2 if transfer else 3) * rows * bk + rows * bv
    return (base + extra * per_stage) * elt


def estimate_triton_smem(head_dim_k: int, head_dim_v: int, chunk_size: int, dtype: str,
                         block_v: int, stages: int, target: str, intra_rows: int = 32) -> int:
    """The most shared memory a kda_recurrence launch at this block_v and stage count asks for on `target`: the
    pair's walk on whole chunks and kda_intra's on `intra_rows`-row steps (the built-in 32 by default), passes 0-2
    (triton_walk_smem)."""
    bv = min(block_v, next_pow2(head_dim_v))
    bv1 = min(bv, next_pow2(head_dim_k))  # pass 1's slices also divide BK (runtime/triton_path.walk_launches)
    return max(triton_walk_smem(target, head_dim_k, head_dim_v, dtype, rows, b, stages, transfer)
               for rows in {chunk_size, min(chunk_size, intra_rows)}
               for b, transfer in ((bv, False), (bv1, True)))
