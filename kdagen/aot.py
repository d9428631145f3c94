# SPDX-License-Identifier: Apache-2.0
"""Offline (AOT) compiles of the generated Triton kernels for gfx942, gfx950 and sm_90, with no GPU.

Uses Triton's own compiler (`triton.compile` on an ASTSource with a GPUTarget), which needs neither a
driver nor torch. Reports per kernel: shared memory and the matrix instructions found; on NVIDIA the
ptxas registers and stack frame, on AMD what kdagen.amdgcn reads off the code object (registers, spills,
scratch) and the waves per SIMD a launch gets with Triton's shared memory as its LDS. Must not run under
TRITON_INTERPRET=1 (the kernels would be interpreted functions), so the tests for it run in their own process.
"""

from __future__ import annotations

import os
import re
import subprocess
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import ModuleType

from kdagen.amdgcn import KernelResources, budget_misses, read_kernels, waves_per_simd
from kdagen.kernels.kda import KERNELS as KDA_KERNELS
from kdagen.runtime.device import TRITON_COMPILE_OPTIONS
from kdagen.targets import TARGETS

TL_DTYPES = {"bf16": "bf16", "fp16": "fp16"}
CKPT_ARGS = ("ckpt", "ckpt_off", "ckpt_idx", "sck_n", "n_ckpt_rows")  # kda_recurrence's checkpoint arguments
WALKS = ("kda_recurrence", "kda_recurrence_tb")
INTRAS = ("kda_intra", "kda_intra_tb")
DENSE_BUILDS = (*INTRAS, *WALKS)  # the builds a dense launch makes (pass 0 only)


@dataclass
class KernelReport:
    kernel: str  # the build: the kernel's name, a recurrence pass (_p1, _p2) and/or _sparse
    target: str
    shared: int  # Triton's metadata.shared: the dynamic shared memory (LDS) a launch asks for
    num_warps: int
    registers: int | None = None  # NVIDIA: ptxas registers per thread; AMD: res.unified_vgprs
    stack: int | None = None  # NVIDIA: bytes of per-thread stack frame (spills and local arrays)
    res: KernelResources | None = None  # AMD: kdagen.amdgcn's reading of the code object
    waves: int | None = None  # AMD: waves per SIMD of a launch (amdgcn.waves_per_simd)
    mma: list[str] = field(default_factory=list)  # the matrix instructions' distinct names

    @property
    def spills(self) -> int | None:
        return self.res.spills if self.res is not None else None

    @property
    def scratch(self) -> int | None:
        return self.res.scratch if self.res is not None else None

    def row(self) -> str:
        if self.res is not None:
            r = self.res
            return (f"{self.kernel:24s} {self.target:7s} warps={self.num_warps} vgpr={r.vgprs:3d} "
                    f"agpr={r.agprs:3d} sgpr={r.sgprs:3d} spill(v/s)={r.vgpr_spills}/{r.sgpr_spills} "
                    f"scratch={r.scratch} lds={self.shared + r.lds} waves/simd={self.waves} mfma={r.mfma}")
        mma = ",".join(sorted(set(self.mma)))[:60]
        stack = f"{self.stack}B" if self.stack is not None else "?"  # no cuobjdump: ptxas figures unknown
        return (f"{self.kernel:24s} {self.target:7s} warps={self.num_warps} smem={self.shared:7d} "
                f"regs={self.registers} stack={stack} mma={mma}")


def _signatures(mod: ModuleType, target: str, *, lower_bound: bool, diag_ref: int, state_mode: int,
                checkpoint: int = 0, split: int = 1) -> dict:
    """Report name -> (kernel, AOT signature from its declaration, constexprs). split: the walk's SPLIT
    (triton_path.walk_split of the design a batch of this gate gets)."""
    io = TL_DTYPES[mod.DTYPE]
    sig = {name: abi.aot_signature(io) for name, abi in KDA_KERNELS.items()}
    fp32_dot = TARGETS[target].triton_fp32_dot
    pro_const = {"LOWER_BOUND": lower_bound, "HAS_BIAS": True, "USE_L2NORM": True, "DIAG_REF": diag_ref,
                 "DOT_F32": False, "FP32_DOT": fp32_dot}
    wu_const = {"LOWER_BOUND": lower_bound, "HAS_BIAS": True, "DOT_F32": False}
    intra_const = {"SPLIT": split, "HAS_BIAS": True, "DOT_F32": False, "FP32_DOT": fp32_dot}

    def rec(pass_: int, kernel: str = "kda_recurrence") -> tuple[dict, dict]:
        # The checkpoint arguments a launch passes as None (all of them without checkpoints and in pass 1, the
        # indices in mode 1) are constexprs, as the JIT specialises them (triton_path.walk_launches).
        mode = checkpoint if pass_ != 1 else 0
        none = [n for n in CKPT_ARGS if mode == 0 or (mode == 1 and n == "ckpt_idx")]
        return ({**sig[kernel], **dict.fromkeys(none, "constexpr")},
                {"STATE_IN": state_mode, "STATE_OUT": state_mode, "PASS": pass_, "DOT_F32": False,
                 "CHECKPOINT": mode, "SPLIT": split, **dict.fromkeys(none)})

    # The recurrence's passes: 0 the plain walk, 1 the group operators, 2 the walk from scanned start states
    # (runtime/group_scan.py); both walks (kda_recurrence reads u, kda_recurrence_tb forms it from v).
    return {"kda_prologue": ("kda_prologue", sig["kda_prologue"], pro_const),
            "kda_wu": ("kda_wu", sig["kda_wu"], wu_const),
            "kda_intra": ("kda_intra", sig["kda_intra"], intra_const),
            "kda_intra_tb": ("kda_intra_tb", sig["kda_intra_tb"], intra_const),
            **{f"{walk}{tag}": (walk, *rec(p, walk)) for walk in WALKS
               for tag, p in (("", 0), ("_p1", 1), ("_p2", 2))},
            "kda_group_scan": ("kda_group_scan", sig["kda_group_scan"],
                               {"STATE_IN": state_mode, "FP32_DOT": fp32_dot, "SPLIT": split})}


def _ptxas_report(cubin: bytes) -> tuple[int | None, int | None]:
    """Registers and stack-frame bytes of a cubin, from Triton's bundled cuobjdump when present."""
    try:
        import triton.backends.nvidia as nv
        tool = os.path.join(os.path.dirname(nv.__file__), "bin", "cuobjdump")
    except Exception:  # pragma: no cover - layout differs across Triton releases
        return None, None
    if not os.path.exists(tool):
        return None, None
    import tempfile
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(cubin)
        f.flush()
        res = subprocess.run([tool, "--dump-resource-usage", f.name], capture_output=True, text=True)
    m = re.search(r"REG:(\d+)", res.stdout)
    s = re.search(r"STACK:(\d+)", res.stdout)
    return (int(m.group(1)) if m else None), (int(s.group(1)) if s else None)


def compile_variant(mod: ModuleType, target: str, *, lower_bound: bool = True, diag_ref: int = 2,
                    state_mode: int = 1, checkpoint: int = 0, kernels: tuple[str, ...] | None = None,
                    keep_asm: bool = False, tuning: Mapping[str, int] | None = None, split: int | None = None) -> list:
    """One KernelReport per compiled kernel; with keep_asm, (report, PTX or AMDGCN text) pairs.
    checkpoint: the recurrence's CHECKPOINT mode (0 none, 1 row n, 2 indexed rows). tuning: knobs that
    replace the variant's own for `target` (tools/amd_triton_sweep.py). split: the walk's SPLIT, by default
    that of the design a batch of this gate gets (kda_intra's for diag_ref 2, the pair's otherwise)."""
    from kdagen.runtime.triton_path import SCAN_ROWS, tb_block_k, walk_split

    t = TARGETS[target]
    tun = {**mod.TUNING[target], **(tuning or {})}
    if split is None:
        split = walk_split("intra" if diag_ref == 2 else "pair", mod.CHUNK_SIZE, tun["intra_rows"])
    reports = []
    for name, (kernel, sig, const) in _signatures(mod, target, lower_bound=lower_bound, diag_ref=diag_ref,
                                                  state_mode=state_mode, checkpoint=checkpoint, split=split).items():
        if kernels is not None and name not in kernels:
            continue
        const = dict(const)
        builds = [name]
        if kernel in WALKS:  # pass 1's row slices also divide BK (triton_path.launch_recurrence)
            const["BLOCK_V"] = min(tun["block_v"], mod.BV, *((mod.BK,) if const["PASS"] == 1 else ()))
            options = {"num_warps": tun["recurrence_warps"], "num_stages": tun["recurrence_stages"]}
            # A launch with no more walks than SMs takes the sparse stage count (triton_path.recurrence_stages).
            if tun["recurrence_stages_sparse"] != tun["recurrence_stages"]:
                builds.append(name + "_sparse")
        elif kernel in INTRAS:
            if kernel == "kda_intra":
                const["BLOCK_V"] = min(tun["intra_block_v"], mod.BV)
            else:
                const["BLOCK_K"] = tb_block_k(tun, mod.BK)
            options = {"num_warps": tun["intra_warps"], "num_stages": tun["intra_stages"]}
        elif kernel == "kda_group_scan":
            const["BLOCK_V"] = min(SCAN_ROWS, mod.BV)
            options = {"num_warps": 4, "num_stages": 1}
        else:
            kind = kernel.removeprefix("kda_")
            const["BLOCK_K"] = tun[f"{kind}_block_k"]
            options = {"num_warps": tun[f"{kind}_warps"], "num_stages": tun[f"{kind}_stages"]}
        options.update(TRITON_COMPILE_OPTIONS)  # as every launch passes them
        if t.vendor == "amd":
            options["matrix_instr_nonkdim"] = 16
        sig, attrs = _typical_call(kernel, sig, const, t.vendor)
        for build in builds:
            if build.endswith("_sparse"):
                options = {**options, "num_stages": tun["recurrence_stages_sparse"]}
            rep, asm = _compile(getattr(mod, kernel), sig, const, attrs, options, t, build, target)
            reports.append((rep, asm) if keep_asm else rep)
    return reports


def _typical_call(kernel: str, sig: dict, const: dict, vendor: str) -> tuple[dict, dict]:
    """The signature and attributes of the build the JIT makes for a call on contiguous tensors (16-byte
    aligned pointers and strides, beta's head stride 1; schema.KernelABI.aot_specialization): the figures of
    an unaligned build (scalar loads and stores) are not what users run. `const` takes the ints that are 1."""
    import triton

    ones, attrs = KDA_KERNELS[kernel].aot_specialization(
        buffer_ops=vendor == "amd" and bool(triton.knobs.amd.use_buffer_ops))
    const.update(ones)
    sig = {**sig, **dict.fromkeys(ones, "constexpr")}
    names = list(sig)
    return sig, {i: a for i, a in attrs.items() if sig[names[i[0]]] != "constexpr"}


def _compile(fn, sig: dict, const: dict, attrs: dict, options: dict, t, name: str,
             target: str) -> tuple[KernelReport, str]:
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    k = triton.compile(ASTSource(fn=fn, signature=sig, constexprs=const, attrs=attrs),
                       target=GPUTarget(t.triton_backend, t.triton_arch, t.warp_size), options=options)
    warps = options["num_warps"]
    rep = KernelReport(kernel=name, target=target, shared=int(k.metadata.shared), num_warps=warps)
    if t.vendor == "amd":
        asm = k.asm["amdgcn"]
        found = read_kernels(asm)
        assert len(found) == 1, f"{name}: {len(found)} kernels in one code object ({sorted(found)})"
        rep.res = res = next(iter(found.values()))
        rep.registers = res.unified_vgprs
        rep.waves = waves_per_simd(res, target, threads=warps * t.warp_size, dynamic_lds=rep.shared)
        rep.mma = sorted(res.mfma_insns)
        return rep, asm
    rep.registers, rep.stack = _ptxas_report(k.asm["cubin"])
    rep.mma = sorted(set(re.findall(r"\b(wgmma\.mma_async\.\S+|mma\.sync\.\S+)", k.asm["ptx"])))
    return rep, k.asm["ptx"]


def compile_checked(mod: ModuleType, target: str, *, tuning: Mapping[str, int] | None = None,
                    kernels: tuple[str, ...] | None = None) -> list[KernelReport]:
    """The builds tests/aot/test_aot_triton.py checks, each compiled once: every kernel and recurrence pass
    (the sparse stage counts and the group scan included) with a bounded gate (DIAG_REF 2: kda_intra and the
    walk on its intra_rows steps) and the paged state, the superset of the dense one; the prologue with DIAG_REF 1;
    the prologue, kda_wu, the walk's passes and the group scan on whole chunks with the softplus gate (DIAG_REF 0,
    kdagen.runtime.triton_path.diag_ref) and the dense state; kda_intra and the plain walk with the dense_*
    knobs that a batch whose walks fill the GPU takes (pipeline.choose_pipeline), where they differ (kda_intra_tb
    and kda_recurrence_tb alongside: the same bounded gate and knobs). The
    extra modes' reports are named kernel[dr1], kernel[dr0] and kernel[dense]."""
    def only(names: tuple[str, ...]) -> tuple[str, ...]:
        return tuple(n for n in names if kernels is None or n in kernels)

    reports = compile_variant(mod, target, lower_bound=True, diag_ref=2, state_mode=2, kernels=kernels,
                              tuning=tuning)
    for tag, lower_bound, diag_ref, state_mode, names in (("dr1", True, 1, 2, ("kda_prologue",)),
                                                          ("dr0", False, 0, 1, ("kda_prologue", "kda_wu",
                                                                                "kda_recurrence", "kda_recurrence_p1",
                                                                                "kda_recurrence_p2",
                                                                                "kda_group_scan"))):
        if not only(names):
            continue
        for rep in compile_variant(mod, target, lower_bound=lower_bound, diag_ref=diag_ref, state_mode=state_mode,
                                   kernels=only(names), tuning=tuning):
            rep.kernel = f"{rep.kernel}[{tag}]"
            reports.append(rep)
    from kdagen.launch_knobs import dense_tuning

    tun = {**mod.TUNING[target], **(tuning or {})}
    dense = dense_tuning(tun)
    if only(DENSE_BUILDS) and dense != tun:
        # Dense launches run the plain walk only, on more programs than SMs (the non-sparse stage count).
        dense["recurrence_stages_sparse"] = tun["recurrence_stages"]
        for rep in compile_variant(mod, target, lower_bound=True, diag_ref=2, state_mode=2,
                                   kernels=only(DENSE_BUILDS), tuning=dense):
            rep.kernel = f"{rep.kernel}[dense]"
            reports.append(rep)
    return reports


def amd_budget_misses(rep: KernelReport) -> list[str]:
    """Why an AMD build misses the occupancy budget (kdagen.amdgcn.budget_misses at its launch's waves)."""
    assert rep.res is not None, rep.kernel
    return budget_misses(rep.res, rep.waves)
