# SPDX-License-Identifier: Apache-2.0
"""Every Triton variant the registry declares, through each Triton pipeline, in the interpreter against the
float64 reference, with a spy proving the variant's own kernels ran (tests/variant_cases.py): a variant added
to the spec is tested here the moment `generate` renders it. Tolerances: tests/tolerances.py."""

from __future__ import annotations

import os

import pytest

from tests.variant_cases import PIPELINES, inputs, run_and_check, spy_on_kernels, triton_cases, triton_variants

pytestmark = pytest.mark.skipif(os.environ.get("TRITON_INTERPRET") != "1",
                                reason="interpreter numerics: run with TRITON_INTERPRET=1")


def test_the_registry_declares_triton_variants():
    assert triton_variants(), "kdagen_kernels.VARIANTS has no Triton variant: nothing below would run"


@pytest.mark.parametrize(("entry", "pipeline"), triton_cases())
def test_variant_matches_reference(entry, pipeline, monkeypatch, pipelines_ran):
    log = spy_on_kernels(monkeypatch)
    # One head where K or V > 128 (the interpreter's time grows with the tile).
    heads = 1 if max(entry.head_dim_k, entry.head_dim_v) > 128 else 2
    run, ref = inputs(entry, PIPELINES[pipeline], "cpu", heads=heads)
    run_and_check(entry, pipeline, run, ref, log, "triton-interp")
    pipelines_ran[f"test_variants (interpreter): {pipeline} ({entry.name})"] += 1
