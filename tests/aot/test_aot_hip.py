# SPDX-License-Identifier: Apache-2.0
"""Every generated HIP source compiled offline for its target, no GPU: clang-22 for gfx942/gfx950
(device only, no ROCm install: -nogpulib -nogpuinc -DKDA_DEVICE_ONLY) and nvcc for sm_90.

Checks per kernel: no scratch and no spills, LDS (group segment) within the target's budget from
kdagen/targets.py, and on AMD the occupancy budget: at least AMD_MIN_WAVES_PER_SIMD waves per SIMD
(kdagen/amdgcn.py waves_per_simd: LLVM's "; Occupancy:", the unified VGPR+AGPR file and the static LDS, for
the kernels' workgroups: kdagen.targets.hip_intra_threads, the walk's); on sm_90 the ptxas report (registers, spills). Prints one line
per kernel. Skips with a reason when a compiler is missing.

Each source is built twice: with its target's matrix layer (templates/hip/include/kda_mma.h; both
kernels, kda_intra and kda_walk, must then contain the matrix instruction: v_mfma_f32_16x16x16_bf16 on gfx942,
v_mfma_f32_16x16x32_bf16 on gfx950 (the walk takes the 16x16x16 one on both), mma.sync.aligned.m16n8k16.row.col.
f32.bf16 in the sm_90 PTX and HMMA.16816.F32.BF16 in its SASS when a cuobjdump is found; per kernel in the PTX)
and with -DKDA_MMA_LAYER=0 (the FMA fallback: no matrix instruction at all, and no walk).

Every declared hip variant is built (the sources generated/ holds), and test_amd_head_dims renders head dims
and dtypes the spec does not ship but kdagen.targets.hip_limits admits, for both AMD targets; each kernel's LDS
is the figure hip_limits reads (hip_intra_lds / hip_walk_lds).
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from kdagen.amdgcn import budget_misses, read_kernels, waves_per_simd
from kdagen.render.context import hip_context
from kdagen.render.env import make_env, render_template
from kdagen.spec.model import VariantSpec
from kdagen.targets import (HIP_INTRA_WAVES, HIP_WIDE_THREADS, TARGETS, hip_intra_lds, hip_intra_threads, hip_limits,
                            hip_walk_lds)

ROOT = Path(__file__).resolve().parents[2]
HIP_DIR = ROOT / "generated" / "kdagen_kernels" / "hip"
SOURCES = sorted(HIP_DIR.glob("*.hip"))
CLANG = os.environ.get("KDAGEN_CLANG") or shutil.which("clang-22")
NVCC = os.environ.get("KDAGEN_NVCC") or shutil.which("nvcc")
LAYERS = ["mma", "fma"]  # the target's matrix layer (the rendered default) / -DKDA_MMA_LAYER=0
AMD_MFMA = {"gfx942": "v_mfma_f32_16x16x16_bf16", "gfx950": "v_mfma_f32_16x16x32_bf16"}
# The walk's own / other products take the 16x16x16 MFMA on both (kda_mma.h).
AMD_MFMA_WALK = "v_mfma_f32_16x16x16_bf16"
PTX_MMA = "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32"


def _cuobjdump() -> str | None:
    found = os.environ.get("KDAGEN_CUOBJDUMP") or shutil.which("cuobjdump")
    if found:
        return found
    try:  # Triton's wheel ships one
        import triton
        cand = Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "cuobjdump"
        return str(cand) if cand.is_file() else None
    except ImportError:
        return None


def _layer_flags(layer: str) -> list[str]:
    return ["-DKDA_MMA_LAYER=0"] if layer == "fma" else []


def _target(src: Path) -> str:
    return src.stem.rsplit("__", 1)[1]


KERNELS = ("intra", "walk")


def _expected(layer: str) -> set[str]:
    # The FMA fallback has no walk (kda_walk.h: fused plans then take the Triton walk).
    return set(KERNELS) - ({"walk"} if layer == "fma" else set())


def _short(kernel: str) -> str:
    return next(k for k in KERNELS if k in kernel)


AMD = [s for s in SOURCES if TARGETS[_target(s)].vendor == "amd"]
NV = [s for s in SOURCES if TARGETS[_target(s)].vendor == "nvidia"]


def test_every_hip_variant_has_sources():
    assert AMD and NV, f"no generated HIP sources under {HIP_DIR}"


def _dims(src: Path) -> tuple[int, int]:
    kv = src.stem.split("__")[3].split("_")  # k128_v256_c64
    return int(kv[0][1:]), int(kv[1][1:])


@pytest.mark.skipif(CLANG is None, reason="clang-22 not found (apt-get install clang-22 lld-22, or set KDAGEN_CLANG)")
@pytest.mark.parametrize("layer", LAYERS)
@pytest.mark.parametrize("src", AMD, ids=lambda p: p.stem)
def test_amd_compile(src, layer, tmp_path, capsys):
    _amd_check(src, layer, tmp_path, capsys)


# Off-spec combinations hip_limits admits on both AMD targets (K a multiple of 32, V of 16): the extremes, odd
# per-thread column counts (K 96, V 48 and 80) and fp16; K = V = 256 is kda_intra's 8-wave workgroup on gfx942.
# K = V = 96 and K = 64 / V = 128: the head dims of tests/variant_cases.py ALL_TARGETS_VARIANTS the registry lacks.
OFF_SPEC = [(32, 16, "bf16"), (96, 48, "fp16"), (128, 128, "fp16"), (160, 80, "bf16"), (64, 256, "fp16"),
            (128, 48, "bf16"), (256, 256, "bf16"), (224, 128, "fp16"), (96, 96, "bf16"), (64, 128, "bf16")]


@pytest.mark.skipif(CLANG is None, reason="clang-22 not found (apt-get install clang-22 lld-22, or set KDAGEN_CLANG)")
@pytest.mark.parametrize("target", ["gfx942", "gfx950"])
@pytest.mark.parametrize(("K", "V", "dtype"), OFF_SPEC, ids=str)
def test_amd_head_dims(K, V, dtype, target, tmp_path, capsys):
    if why := hip_limits(K, V, 64, dtype, target):
        pytest.skip("; ".join(why))
    v = VariantSpec(op="kda_chunk_fwd", label="off_spec", backend="hip", dtype=dtype, head_dim_k=K, head_dim_v=V,
                    chunk_size=64, targets=(target,), tuning=(), spec_path="tests/aot/test_aot_hip.py", line=0)
    src = tmp_path / f"{v.name}__{target}.hip"
    src.write_text(render_template(make_env(ROOT), "hip/kda_chunk.hip.j2", hip_context(v, target, "// (test)"), "test"))
    _amd_check(src, "mma", tmp_path, capsys)


def _amd_check(src: Path, layer: str, tmp_path: Path, capsys) -> None:
    target = _target(src)
    asm = tmp_path / f"{src.stem}.s"
    cmd = [CLANG, "-x", "hip", f"--offload-arch={target}", "--cuda-device-only", "-nogpulib", "-nogpuinc",
           "-O3", "-std=c++17", "-DKDA_DEVICE_ONLY", *_layer_flags(layer), "-I", str(HIP_DIR / "include"), "-S",
           "-o", str(asm), str(src)]
    r = subprocess.run(cmd, capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    kernels = read_kernels(asm.read_text())
    want = AMD_MFMA[target]
    for name, k in kernels.items():
        if layer == "mma":  # kda_intra's Akk/Aqk and w/u, the walk's products
            w = AMD_MFMA_WALK if "walk" in name else want
            assert k.mfma_insns == {w}, f"{name}: {sorted(k.mfma_insns)}, not {w}, on {target}"
        else:
            assert k.mfma == 0, f"{name}: unexpected MFMA with layer {layer}"
    assert {_short(n) for n in kernels} == _expected(layer), list(kernels)
    t = TARGETS[target]
    # Each kernel's own workgroup (its launch bound): hip_intra_threads, the walk 64 per 16 state rows.
    K, V = _dims(src)
    assert all(k.workgroup == hip_intra_threads(K, V, target) for n, k in kernels.items() if "walk" not in n)
    waves = {name: waves_per_simd(k, target, threads=k.workgroup) for name, k in kernels.items()}
    with capsys.disabled():
        for name, k in kernels.items():
            print(f"\n  {'__'.join(src.stem.split('__')[2:4]):19s} {_short(name):10s} {target} {layer}: vgpr={k.vgprs} "
                  f"agpr={k.agprs} sgpr={k.sgprs} lds={k.lds} waves/simd={waves[name]} (llvm {k.llvm_occupancy}) "
                  f"mfma={k.mfma} lds_reads={k.lds_reads} scratch={k.scratch} spills={k.spills} insns={k.insns}",
                  end="")
    for name, k in kernels.items():
        assert not (why := budget_misses(k, waves[name])), f"{name} on {target}: {'; '.join(why)}"
        # Stricter than the Triton kernels' budget: no SGPR spills to VGPR lanes either.
        assert k.spills == 0, f"{name}: {k.vgpr_spills} VGPR and {k.sgpr_spills} SGPR spills on {target}"
        assert k.lds <= t.smem_per_block, f"{name}: {k.lds} B LDS > {t.smem_per_block} on {target}"
        if layer == "mma":  # the LDS model kdagen.targets.hip_limits reads
            assert k.lds == (hip_walk_lds(K, V) if "walk" in name else hip_intra_lds(K, V, target)), name


@pytest.mark.skipif(NVCC is None, reason="nvcc not found (CUDA toolkit or `pip install nvidia-cuda-nvcc`; or set KDAGEN_NVCC)")
@pytest.mark.parametrize("layer", LAYERS)
@pytest.mark.parametrize("src", NV, ids=lambda p: p.stem)
def test_nvcc_compile(src, layer, tmp_path, capsys):
    _nvcc_check(src, layer, tmp_path, capsys)


# Head dims the spec does not ship on sm_90: those of the all-targets spec (tests/variant_cases.py) and the K >= 160
# ones whose kernels take one resident block fewer (kdagen.targets.hip_cuda_blocks: the defaults spill there).
NV_OFF_SPEC = [(96, 96), (64, 128), (160, 128), (192, 192), (192, 256), (256, 64), (256, 256)]


@pytest.mark.skipif(NVCC is None, reason="nvcc not found (CUDA toolkit or `pip install nvidia-cuda-nvcc`; or set KDAGEN_NVCC)")
@pytest.mark.parametrize(("K", "V"), NV_OFF_SPEC, ids=str)
def test_nvcc_head_dims(K, V, tmp_path, capsys):
    v = VariantSpec(op="kda_chunk_fwd", label="off_spec", backend="hip", dtype="bf16", head_dim_k=K, head_dim_v=V,
                    chunk_size=64, targets=("sm_90",), tuning=(), spec_path="tests/aot/test_aot_hip.py", line=0)
    src = tmp_path / f"{v.name}__sm_90.hip"
    src.write_text(render_template(make_env(ROOT), "hip/kda_chunk.hip.j2", hip_context(v, "sm_90", "// (test)"), "test"))
    _nvcc_check(src, "mma", tmp_path, capsys)


def _nvcc_check(src: Path, layer: str, tmp_path: Path, capsys) -> None:
    target = _target(src)
    arch = target.replace("sm_", "")
    obj = tmp_path / f"{src.stem}.o"
    cmd = [NVCC, "-O3", "-std=c++17", f"-arch=sm_{arch}", "-x", "cu", "-c", "-Xptxas", "-v", *_layer_flags(layer),
           "-I", str(HIP_DIR / "include"), "-o", str(obj), str(src)]
    r = subprocess.run(cmd, capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    report = r.stdout + r.stderr
    ptx = tmp_path / f"{src.stem}.ptx"
    r = subprocess.run([NVCC, "-O3", "-std=c++17", f"-arch=sm_{arch}", "-x", "cu", "--ptx", *_layer_flags(layer),
                        "-I", str(HIP_DIR / "include"), "-o", str(ptx), str(src)], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    ptx_text = ptx.read_text()
    n_ptx = ptx_text.count(PTX_MMA)
    assert (n_ptx > 0) == (layer == "mma"), f"{n_ptx} x {PTX_MMA} in the PTX with layer {layer}"
    # Per entry: every kernel uses the layer (kda_intra's Akk/Aqk and w/u, the walk), or none does.
    entries = {m[1]: m[2] for m in re.finditer(r"\.entry\s+(\w+)\((.*?)(?=\.entry\s|\Z)", ptx_text, re.S)}
    ptx_per = {name: body.count(PTX_MMA) for name, body in entries.items()}
    assert {_short(n) for n in ptx_per} == _expected(layer), list(ptx_per)
    for name, cnt in ptx_per.items():
        want_mma = layer == "mma"
        assert (cnt > 0) == want_mma, f"{name}: {cnt} x {PTX_MMA} in the PTX with layer {layer}"
    sass_note = ""
    dump = _cuobjdump()
    if dump:
        sass = subprocess.run([dump, "-sass", str(obj)], capture_output=True, text=True)
        if sass.returncode == 0:
            n_hmma = len(re.findall(r"HMMA\.16816\.F32\.BF16", sass.stdout))
            assert (n_hmma > 0) == (layer == "mma"), f"{n_hmma} HMMA.16816.F32.BF16 in the SASS with layer {layer}"
            n_sass = len(re.findall(r"^\s+/\*[0-9a-f]{4,}\*/", sass.stdout, re.M))
            sass_note = f" sass_insns(both)={n_sass} hmma={n_hmma}"
    blocks = re.findall(r"Compiling entry function '(\S+)' for 'sm_\d+'.*?"
                        r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads.*?"
                        r"Used (\d+) registers", report, re.S)
    assert len(blocks) == len(_expected(layer)), report
    with capsys.disabled():
        for name, stack, st, ld, regs in blocks:
            short = _short(name)
            print(f"\n  {'__'.join(src.stem.split('__')[2:4]):19s} {short:10s} {target} {layer}: regs={regs} stack={stack} "
                  f"spill_stores={st} spill_loads={ld} "
                  f"ptx_mma={next((c for n, c in ptx_per.items() if n == name), '-')}"
                  f"{sass_note if 'walk' in name else ''}", end="")
    for name, stack, st, ld, regs in blocks:
        assert int(st) == 0 and int(ld) == 0, f"{name}: spills on {target}"
    # Dynamic shared memory on CUDA: the launcher sets the attribute to sizeof(the Smem struct).
    kernels = "".join(h.read_text() for h in sorted((HIP_DIR / "include").glob("*.h")))  # the kernels' headers
    structs = re.findall(r"struct (?:alignas\(\d+\) )?(\w+Smem) \{(.*?)\n\};", kernels, re.S)
    assert {s for s, _ in structs} == {"IntraSmem", "IntraWaveSmem", "WalkSmem"}


def test_hip_limits_name_the_limit_and_the_margin():
    """The spec loader's rule (no compiler needed): the shipped head dims fit everywhere; a combination over the
    AMD budget names the kernel, its LDS and how far over it is; shapes the kernels cannot take name the argument."""
    for target in TARGETS:
        assert hip_limits(128, 128, 64, "fp16", target) == []
    # K = V = 256 on gfx942: 54,080 B of LDS is one workgroup per CU, so kda_intra takes the wide workgroup there
    # (8 waves: 2 per SIMD) and nowhere else.
    assert hip_limits(256, 256, 64, "bf16", "gfx942") == hip_limits(256, 256, 64, "bf16", "gfx950") == []
    assert hip_intra_threads(256, 256, "gfx942") == HIP_WIDE_THREADS
    assert {hip_intra_threads(256, 256, t, wave=False) for t in ("gfx950", "sm_90")} == {256}
    assert {hip_intra_threads(k, v, t, wave=False) for k, v in ((128, 128), (64, 64), (128, 256), (96, 96))
            for t in TARGETS} == {256}
    # sm_90 takes the wave design: HIP_INTRA_WAVES independent warps per workgroup, whatever the head dims.
    assert {hip_intra_threads(k, v, "sm_90") for k, v in ((128, 128), (256, 256), (96, 96))} == {32 * HIP_INTRA_WAVES}
    # K = 224 cannot take the wide row layout (K / 32 columns per thread): the limit and the margin.
    (why,) = hip_limits(224, 128, 64, "bf16", "gfx942")
    assert why.startswith("kda_intra_kernel needs 47936 B of LDS on gfx942: 1 waves per SIMD") and "15168 B over" in why
    assert hip_limits(48, 64, 64, "bf16", "gfx950") == [
        "head_dim_k 48: the HIP kernels take multiples of 32 from 32 to 256"]
    assert [w.split(":")[0] for w in hip_limits(128, 264, 32, "fp32", "sm_90")] == [
        "dtype fp32", "chunk_size 32", "head_dim_v 264"]
