# SPDX-License-Identifier: Apache-2.0
"""Every generated HIP source compiled offline for its target, no GPU: clang-22 for gfx942/gfx950
(device only, no ROCm install: -nogpulib -nogpuinc -DKDA_DEVICE_ONLY) and nvcc for sm_90.

Checks per kernel: no scratch and no spills, LDS (group segment) within the target's budget from
kdagen/spec/targets.py; on sm_90 the ptxas report (registers, spills) and the shared-memory structs'
sizes within the budget. Prints one line per kernel. Skips with a reason when a compiler is missing.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from kdagen.spec.targets import TARGETS

ROOT = Path(__file__).resolve().parents[2]
HIP_DIR = ROOT / "generated" / "kdagen_kernels" / "hip"
SOURCES = sorted(HIP_DIR.glob("*.hip"))
CLANG = os.environ.get("KDAGEN_CLANG") or shutil.which("clang-22")
NVCC = os.environ.get("KDAGEN_NVCC") or shutil.which("nvcc")


def _target(src: Path) -> str:
    return src.stem.rsplit("__", 1)[1]


def _amd_kernels(asm: str) -> dict[str, dict[str, int]]:
    """Per kernel, the AMDGPU metadata fields we check, from the .s file's amdhsa.kernels block."""
    out: dict[str, dict[str, int]] = {}
    meta = asm.split("amdhsa.kernels:", 1)[1]
    for block in re.split(r"\n  - ", meta)[1:]:
        name = re.search(r"\.name:\s+(\S+)", block)
        if not name or name[1].endswith(".kd"):
            continue
        fields = {k: int(v) for k, v in re.findall(
            r"\.(group_segment_fixed_size|private_segment_fixed_size|vgpr_count|vgpr_spill_count|"
            r"sgpr_spill_count|agpr_count):\s+(\d+)", block)}
        out[name[1]] = fields
    return out


AMD = [s for s in SOURCES if TARGETS[_target(s)].vendor == "amd"]
NV = [s for s in SOURCES if TARGETS[_target(s)].vendor == "nvidia"]


def test_every_hip_variant_has_sources():
    assert AMD and NV, f"no generated HIP sources under {HIP_DIR}"


@pytest.mark.skipif(CLANG is None, reason="clang-22 not found (apt-get install clang-22 lld-22, or set KDAGEN_CLANG)")
@pytest.mark.parametrize("src", AMD, ids=lambda p: p.stem)
def test_amd_compile(src, tmp_path, capsys):
    target = _target(src)
    asm = tmp_path / f"{src.stem}.s"
    cmd = [CLANG, "-x", "hip", f"--offload-arch={target}", "--cuda-device-only", "-nogpulib", "-nogpuinc",
           "-O3", "-std=c++17", "-DKDA_DEVICE_ONLY", "-I", str(HIP_DIR / "include"), "-S", "-o", str(asm), str(src)]
    r = subprocess.run(cmd, capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    kernels = _amd_kernels(asm.read_text())
    assert {k.split("kda_")[-1].split("_kernel")[0] for k in kernels} >= {"prologue", "recurrence"}, list(kernels)
    budget = TARGETS[target].smem_per_block
    with capsys.disabled():
        for name, f in kernels.items():
            short = "prologue" if "prologue" in name else "recurrence"
            print(f"\n  {src.stem.split('__')[-2]:14s} {short:10s} {target}: lds={f['group_segment_fixed_size']} "
                  f"vgpr={f.get('vgpr_count')} agpr={f.get('agpr_count')} scratch={f['private_segment_fixed_size']} "
                  f"vgpr_spill={f['vgpr_spill_count']} sgpr_spill={f['sgpr_spill_count']}", end="")
    for name, f in kernels.items():
        assert f["private_segment_fixed_size"] == 0, f"{name}: scratch on {target}"
        assert f["vgpr_spill_count"] == 0 and f["sgpr_spill_count"] == 0, f"{name}: spills on {target}"
        assert f["group_segment_fixed_size"] <= budget, f"{name}: {f['group_segment_fixed_size']} B LDS > {budget}"


@pytest.mark.skipif(NVCC is None, reason="nvcc not found (CUDA toolkit or `pip install nvidia-cuda-nvcc`; or set KDAGEN_NVCC)")
@pytest.mark.parametrize("src", NV, ids=lambda p: p.stem)
def test_nvcc_compile(src, tmp_path, capsys):
    target = _target(src)
    arch = target.replace("sm_", "")
    obj = tmp_path / f"{src.stem}.o"
    cmd = [NVCC, "-O3", "-std=c++17", f"-arch=sm_{arch}", "-x", "cu", "-c", "-Xptxas", "-v",
           "-I", str(HIP_DIR / "include"), "-o", str(obj), str(src)]
    r = subprocess.run(cmd, capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    report = r.stdout + r.stderr
    blocks = re.findall(r"Compiling entry function '(\S+)' for 'sm_\d+'.*?"
                        r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads.*?"
                        r"Used (\d+) registers", report, re.S)
    assert len(blocks) >= 2, report
    with capsys.disabled():
        for name, stack, st, ld, regs in blocks:
            short = "prologue" if "prologue" in name else "recurrence"
            print(f"\n  {src.stem.split('__')[-2]:14s} {short:10s} {target}: regs={regs} stack={stack} "
                  f"spill_stores={st} spill_loads={ld}", end="")
    for name, stack, st, ld, regs in blocks:
        assert int(st) == 0 and int(ld) == 0, f"{name}: spills on {target}"
    # Dynamic shared memory on CUDA: the launcher sets the attribute to sizeof(the Smem struct).
    structs = re.findall(r"struct (\w+Smem) \{(.*?)\n\};", src.read_text(), re.S)
    assert {s for s, _ in structs} == {"PrologueSmem", "RecurrenceSmem"}
