# SPDX-License-Identifier: Apache-2.0
"""A spec declaring K=V=64, K=V=96, K=64/V=128, K=V=256 and an fp16 K=V=128, each with `backends: [triton, hip]`
on gfx942, gfx950 and sm_90 (tests/variant_cases.py ALL_TARGETS_VARIANTS) generates every Triton module and every
fused source; where a tuning does not fit, the refusal names the limit and by how much. Generation only: the
numerics of these variants are tests/interp/test_variants.py (Triton) and tests/build/test_hip_emulated.py (HIP)."""

from __future__ import annotations

import pytest

from conftest import copy_tree  # tests/ is on sys.path (rootdir conftest)

from kdagen.render import PACKAGE_DIR, emit
from kdagen.spec.errors import SpecError
from kdagen.spec.load import load_specs
from kdagen.targets import TARGETS
from tests.variant_cases import ALL_TARGETS_VARIANTS, all_targets_spec

DIMS = [("bf16", 64, 64), ("bf16", 96, 96), ("bf16", 64, 128), ("bf16", 256, 256), ("fp16", 128, 128)]


def test_every_variant_generates_on_both_backends_and_every_target(tmp_path):
    root = copy_tree(tmp_path / "project", ("templates", "specs", "generated"))
    (root / "specs" / "kda_chunk_fwd.yaml").write_text(all_targets_spec())
    emit(root)
    out = root / PACKAGE_DIR
    want = {f"triton/kda_chunk_fwd__triton__{d}__k{k}_v{v}_c64.py" for d, k, v in DIMS}
    want |= {f"hip/kda_chunk_fwd__hip__{d}__k{k}_v{v}_c64__{t}.hip" for d, k, v in DIMS for t in TARGETS}
    got = {p.relative_to(out).as_posix() for p in out.rglob("*") if p.suffix in (".py", ".hip")}
    assert want <= got, sorted(want - got)
    # The shipped variants are gone with the shipped list (only these are declared).
    assert not any("k128_v256" in name for name in got)
    # K = V = 256 on gfx942 is the one source whose kda_intra takes the 8-wave workgroup.
    wide = {p.name for p in (out / "hip").glob("*.hip") if "constexpr int THREADS = 512;" in p.read_text()}
    assert wide == {"kda_chunk_fwd__hip__bf16__k256_v256_c64__gfx942.hip"}


def _errors(tmp_path, text: str) -> list[str]:
    (tmp_path / "specs").mkdir(exist_ok=True)
    (tmp_path / "specs" / "k.yaml").write_text(text)
    with pytest.raises(SpecError) as info:
        load_specs(tmp_path / "specs", tmp_path)
    return info.value.errors


def test_without_its_tuning_k256_is_refused_naming_the_limit(tmp_path):
    """K = V = 256 under the shipped tuning alone: the Triton walk's shared memory on sm_90 (two stages of the
    pair's whole-chunk walk) is over the block's limit, and the error says by how much and which knob."""
    text = all_targets_spec()
    start = text.index("    tuning:\n      triton:\n        gfx942: {block_v: 16")
    end = text.index("  - {label: kimi_fp16")
    assert ALL_TARGETS_VARIANTS[ALL_TARGETS_VARIANTS.index("    tuning:"):].startswith(text[start:end])
    (err,) = _errors(tmp_path, text[:start] + text[end:])
    assert "shared memory estimate 240 KiB on sm_90 exceeds its 227 KiB per block" in err, err
    assert "recurrence_stages_sparse=2); lower block_v or recurrence_stages_sparse in tuning.triton.sm_90" in err, err


def test_a_hip_head_dim_no_workgroup_fits_names_the_lds_limit(tmp_path):
    """K = 224 on gfx942: kda_intra's 4-wave workgroup needs 47,936 B (1 wave per SIMD) and the 8-wave one needs
    K a multiple of 64; the refusal says so, with the margin."""
    text = all_targets_spec().replace("head_dim_k: 96, head_dim_v: 96", "head_dim_k: 224, head_dim_v: 96")
    errs = [e for e in _errors(tmp_path, text) if "hip backend" in e]
    (intra,) = [e for e in errs if "kda_intra_kernel needs 47936 B of LDS on gfx942" in e]
    assert "(15168 B over)" in intra and "needs head_dim_k a multiple of 64" in intra, intra
    # Every other refusal is a kernel's LDS with its margin too (the walk's K side at K = 224).
    assert all(e.count("B of LDS on") == 1 and "B over" in e for e in errs), errs
