# SPDX-License-Identifier: Apache-2.0
"""tests/interp/test_variants.py on the H200: every Triton variant of the registry through each Triton pipeline
against the float64 reference, with the spy proving the variant's own kernels ran (tests/variant_cases.py), at
four times the interpreter's lengths and four heads. Tolerances: tests/tolerances.py (triton-gpu)."""

from __future__ import annotations

import os

import pytest
import torch

from tests.variant_cases import PIPELINES, inputs, run_and_check, spy_on_kernels, triton_cases

pytestmark = pytest.mark.skipif(not torch.cuda.is_available() or os.environ.get("TRITON_INTERPRET") == "1",
                                reason="needs a GPU (and not the interpreter)")


@pytest.mark.parametrize(("entry", "pipeline"), triton_cases())
def test_variant_matches_reference_on_the_gpu(entry, pipeline, monkeypatch, pipelines_ran):
    log = spy_on_kernels(monkeypatch)
    run, ref = inputs(entry, PIPELINES[pipeline], "cuda", heads=4, scale=4)
    run_and_check(entry, pipeline, run, ref, log, "triton-gpu")
    pipelines_ran[f"test_variants_gpu: {pipeline} ({entry.name})"] += 1
