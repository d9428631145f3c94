# SPDX-License-Identifier: Apache-2.0
"""kdagen.targets.triton_walk_smem, the shared-memory model the spec loader checks every walk launch with, against
the figure Triton's own AOT build of that launch asks for (metadata.shared), with no GPU: exact on AMD at one stage
(every AMD tuning), an upper bound at two stages and on sm_90. The builds span both of the walk's product forms
(steps shorter than the V slice transpose them), pass 1 (the group operators: no qg, no output) and the step rows
of the pair (whole chunks), kda_intra (32 rows) and a dense launch (16 rows).

And the K = V = 256 variant of tests/variant_cases.py ALL_TARGETS_VARIANTS on both AMD targets, every kernel and
mode under the tuning it declares: the AMD budget (no scratch, at least AMD_MIN_WAVES_PER_SIMD waves per SIMD) the
registry's variants meet in tests/aot/test_aot_triton.py.
"""

from __future__ import annotations

import os

import pytest

from kdagen.aot import amd_budget_misses, compile_checked, compile_variant
from kdagen.targets import TARGETS, triton_walk_smem
from tests.variant_cases import all_targets_spec, render_triton_variants

pytestmark = pytest.mark.skipif(os.environ.get("TRITON_INTERPRET", "0") not in ("", "0"),
                                reason="AOT compiles need the real Triton compiler (unset TRITON_INTERPRET)")

# The file-level tuning only has to load (one stage fits both); each case sets the walk's knobs itself.
DIMS = """\
op: kda_chunk_fwd
tuning:
  triton:
    gfx942: {recurrence_stages: 1, recurrence_stages_sparse: 1}
    sm_90: {recurrence_stages: 1, recurrence_stages_sparse: 1}
variants:
  - {label: kimi, head_dim_k: 128, head_dim_v: 128, chunk_size: 64, dtype: bf16, backends: [triton], targets: [gfx942, sm_90]}
  - {label: d256, head_dim_k: 256, head_dim_v: 256, chunk_size: 64, dtype: bf16, backends: [triton], targets: [gfx942, sm_90]}
"""
# (target, K, walk split: rows = 64 / split, block_v, stages)
CASES = [("gfx942", 256, split, bv, 1) for split in (1, 2, 4) for bv in (16, 32, 64)] + [
    ("gfx942", 128, 1, 64, 2), ("gfx942", 128, 2, 64, 2), ("gfx942", 256, 2, 16, 2),
    ("sm_90", 256, 1, 64, 1), ("sm_90", 256, 1, 64, 2), ("sm_90", 256, 2, 64, 2), ("sm_90", 128, 4, 64, 1),
    ("sm_90", 256, 2, 32, 1), ("sm_90", 256, 4, 16, 1)]


@pytest.fixture(scope="module")
def modules(tmp_path_factory):
    os.environ.setdefault("TRITON_CACHE_DIR", str(tmp_path_factory.mktemp("triton-cache")))
    return {e.head_dim_k: e.load() for e in render_triton_variants(tmp_path_factory.mktemp("smem"), DIMS)}


@pytest.mark.parametrize(("target", "K", "split", "block_v", "stages"), CASES, ids=str)
def test_walk_smem_model_matches_the_build(modules, target, K, split, block_v, stages):
    mod = modules[K]
    tun = {"block_v": block_v, "recurrence_stages": stages, "recurrence_stages_sparse": stages,
           "recurrence_warps": 8 if target == "gfx942" or block_v < 64 else 4}
    rows = mod.CHUNK_SIZE // split
    for rep in compile_variant(mod, target, kernels=("kda_recurrence", "kda_recurrence_p1"), tuning=tun,
                               split=split, diag_ref=2 if split > 1 else 0, state_mode=2 if split > 1 else 1):
        transfer = rep.kernel.endswith("_p1")
        bv = min(block_v, mod.BV, *((mod.BK,) if transfer else ()))
        model = triton_walk_smem(target, K, K, "bf16", rows, bv, stages, transfer)
        what = f"{rep.kernel} {target} K={K} rows={rows} block_v={bv} stages={stages}"
        print(f"\n  {what}: build {rep.shared} B, model {model} B", end="")
        if TARGETS[target].vendor == "amd" and stages == 1:
            assert rep.shared == model, what
        else:
            assert rep.shared <= model, what


@pytest.mark.parametrize("target", ["gfx942", "gfx950"])
def test_k256_meets_the_amd_budget_under_its_tuning(target, tmp_path_factory):
    (e,) = [e for e in render_triton_variants(tmp_path_factory.mktemp("k256"), all_targets_spec())
            if e.head_dim_k == 256]
    mod = e.load()
    reports = compile_checked(mod, target)
    misses = [f"{r.kernel}: {why}" for r in reports for why in amd_budget_misses(r)]
    for r in reports:
        print("\n  " + r.row(), end="")
        assert r.shared <= TARGETS[target].smem_per_block, r.kernel
    assert not misses, "; ".join(misses)
