# SPDX-License-Identifier: Apache-2.0
"""An install without the generated HIP sources (a wheel without package data) runs the Triton path with
one warning, as a missing compiler does, instead of failing the call."""

from __future__ import annotations

import warnings

import pytest

from kdagen.runtime import fused_choice
from kdagen.runtime.registry import VariantEntry

NAME = "kda_chunk_fwd__hip__bf16__k128_v128_c64"


@pytest.fixture
def entry_without_sources(tmp_path, monkeypatch) -> VariantEntry:
    """A registered hip variant whose package has no hip/ folder."""
    pkg = tmp_path / "kdagen_kernels_without_hip"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setattr(fused_choice, "_fused_libs", {})
    monkeypatch.setattr(fused_choice, "_no_compiler", {})
    monkeypatch.setattr(fused_choice, "_warned_no_compiler", set())
    return VariantEntry(name=NAME, op="kda_chunk_fwd", backend="hip", dtype="bf16", head_dim_k=128,
                        head_dim_v=128, chunk_size=64, targets=("sm_90",), module=pkg.name,
                        spec="specs/kda_chunk_fwd.yaml:1")


def test_missing_hip_source_falls_back_with_one_warning(entry_without_sources, tmp_path):
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        assert fused_choice.fused_library(entry_without_sources, "sm_90") is None
        assert fused_choice.fused_library(entry_without_sources, "sm_90") is None
    assert [w.category for w in seen] == [RuntimeWarning]
    source = tmp_path / "kdagen_kernels_without_hip" / "hip" / f"{NAME}__sm_90.hip"
    assert str(seen[0].message) == (
        f"chunk_kda_prefill: use_fused_chunk=True, but the fused variant {NAME} cannot be built for sm_90: "
        f"the generated HIP source of {NAME} is not installed ({source} is missing): reinstall kdagen from a "
        "wheel or checkout that ships kdagen_kernels/hip/*.hip and hip/include/*.h, or run `nox -s generate` "
        "in a checkout. Running the Triton path instead (same results; this warning is shown once per process).")


def test_can_use_fused_is_false_without_the_sources(entry_without_sources, monkeypatch):
    """can_use_fused_kda_chunk answers as the call would run: a found compiler without the installed sources is
    the Triton path, so False; with the sources (the checkout's package) True."""
    from kdagen.runtime import jit_hip

    monkeypatch.setattr(jit_hip, "find_compiler", lambda target: jit_hip.Compiler("nvcc", "/fake/nvcc"))
    assert not fused_choice._toolchain_present(entry_without_sources, "sm_90")
    shipped = VariantEntry(**{**entry_without_sources.__dict__, "module": "kdagen_kernels"})
    assert fused_choice._toolchain_present(shipped, "sm_90")
