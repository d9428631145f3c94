# SPDX-License-Identifier: Apache-2.0
"""Every generated Triton variant compiled offline for each of its targets with Triton's own AOT.

No GPU and no interpreter: gfx942 and gfx950 are verified only by this compile (MFMA instructions in
the assembly, shared memory within the target, and the occupancy budget that stands in for a timing: no
scratch and at least AMD_MIN_WAVES_PER_SIMD waves per SIMD for every build), sm_90 also runs on the H200
(tests/gpu). Prints one line per build: on AMD the VGPRs, AGPRs, SGPRs, VGPR/SGPR spills, scratch, LDS,
waves per SIMD and MFMA count (kdagen.amdgcn), on sm_90 shared memory, registers and stack frame.
"""

from __future__ import annotations

import os

import pytest

import kdagen_kernels
from kdagen.aot import amd_budget_misses, compile_checked
from kdagen.launch_knobs import dense_tuning
from kdagen.targets import TARGETS

pytestmark = pytest.mark.skipif(os.environ.get("TRITON_INTERPRET", "0") not in ("", "0"),
                                reason="AOT compiles need the real Triton compiler (unset TRITON_INTERPRET)")

CASES = [(e, t) for e in kdagen_kernels.VARIANTS if e.backend == "triton" for t in e.targets]


@pytest.fixture(autouse=True, scope="module")
def _private_triton_cache(tmp_path_factory):
    # Keep the AOT artifacts out of the user's ~/.triton cache.
    old = os.environ.get("TRITON_CACHE_DIR")
    os.environ["TRITON_CACHE_DIR"] = str(tmp_path_factory.mktemp("triton-cache"))
    yield
    if old is None:
        os.environ.pop("TRITON_CACHE_DIR", None)
    else:
        os.environ["TRITON_CACHE_DIR"] = old


@pytest.mark.parametrize("e,target", CASES, ids=[f"{e.name}-{t}" for e, t in CASES])
def test_compiles_for_target(e, target, capsys):
    mod = e.load()
    tun = mod.TUNING[target]
    # Every kernel, recurrence pass (sparse stage counts included) and group scan, in each diagonal-block
    # mode of the prologue (kdagen.runtime.triton_path.diag_ref: factored and mid-point for bounded gates,
    # exact per-row for softplus); the paged state mode is the superset of the dense one. Each compiled once.
    reports = compile_checked(mod, target)
    with capsys.disabled():
        for r in reports:
            print("\n  " + r.row(), end="")
    misses = []
    for r in reports:
        assert r.shared <= TARGETS[target].smem_per_block, f"{r.kernel}: {r.shared} B of shared memory"
        if TARGETS[target].vendor == "amd":
            assert any(m.startswith("v_mfma") for m in r.mma), f"{r.kernel}: no MFMA instruction on {target}"
            # The waves figure takes LLVM's own occupancy line; a code object without one would go unchecked.
            assert r.res is not None and r.res.llvm_occupancy is not None, f"{r.kernel}: no '; Occupancy:' line"
            misses += [f"{r.kernel}: {why}" for why in amd_budget_misses(r)]
        else:
            assert r.mma, f"{r.kernel}: no tensor-core instruction on {target}"
    assert not misses, (f"{e.name} on {target} misses the AMD budget (tuning.triton.{target} in {e.spec}; "
                        f"tools/amd_triton_sweep.py sweeps it): " + "; ".join(misses))
    # The fp32-accurate products (the group scan, the inverse's off-diagonal blocks in every prologue
    # mode and in kda_intra): fp32 MFMA on CDNA, tf32 (x3) tensor cores on sm_90.
    want = "v_mfma_f32_16x16x4_f32" if TARGETS[target].vendor == "amd" else ".tf32.tf32."
    for r in reports:
        # kda_intra on 16-row programs has one diagonal block: no off-diagonal correction.
        rows = (dense_tuning(tun) if r.kernel.endswith("[dense]") else tun)["intra_rows"]
        two_blocks = r.kernel.startswith("kda_intra") and rows > 16  # kda_intra_tb too
        if r.kernel.split("[")[0] in ("kda_group_scan", "kda_prologue") or two_blocks:
            assert any(want in m for m in r.mma), f"{r.kernel} on {target}: no {want} in {sorted(set(r.mma))}"
    # Both stage counts of the walk compile where the spec gives two (the sparse one for small launches).
    sparse = {r.kernel for r in reports if r.kernel.endswith("_sparse")}
    # (both walks: kda_recurrence and kda_recurrence_tb, three passes each).
    assert len(sparse) == (6 if tun["recurrence_stages_sparse"] != tun["recurrence_stages"] else 0), sparse
    # And kda_intra and the plain walk with the dense_* knobs where the spec gives them (triton_path.launch_tuning).
    dense = {r.kernel for r in reports if r.kernel.endswith("[dense]")}
    differ = dense_tuning(tun) != tun
    assert dense == ({"kda_intra[dense]", "kda_recurrence[dense]", "kda_intra_tb[dense]", "kda_recurrence_tb[dense]"}
                     if differ else set()), dense
    # The tb pair is built in every mode its pipeline runs (bounded gate, plain walk and both passes).
    assert {"kda_intra_tb", "kda_recurrence_tb", "kda_recurrence_tb_p1", "kda_recurrence_tb_p2"} <= {
        r.kernel for r in reports}


@pytest.mark.parametrize("target", ["sm_90", "gfx950"])
def test_builds_are_those_of_an_aligned_contiguous_call(target):
    # The figures above are those of the build users run: on aligned, contiguous tensors the JIT proves 16-byte
    # accesses and vectorises them (kdagen.aot._typical_call). An unaligned build (scalar 2-byte loads, other
    # register counts) would be checked instead if the specialisation were dropped.
    from kdagen.aot import compile_variant

    e = next(e for e in kdagen_kernels.VARIANTS if e.name == "kda_chunk_fwd__triton__bf16__k128_v128_c64")
    ((rep, asm),) = compile_variant(e.load(), target, kernels=("kda_intra",), keep_asm=True)
    wide = ("ld.global.v4.", "ld.global.nc.v4.") if target == "sm_90" else ("buffer_load_dwordx4", "global_load_dwordx4")
    assert any(w in asm for w in wide), f"kda_intra on {target}: no 16-byte global load"
