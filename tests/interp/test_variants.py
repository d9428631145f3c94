# SPDX-License-Identifier: Apache-2.0
"""Every Triton variant the registry declares, through each Triton pipeline, in the interpreter against the
float64 reference, with a spy proving the variant's own kernels ran (tests/variant_cases.py): a variant added
to the spec is tested here the moment `generate` renders it. Tolerances: tests/tolerances.py."""

from __future__ import annotations

import os

import pytest

import torch

from kdagen.runtime import dispatch, planning, triton_path
from kdagen.runtime.registry import VariantEntry
from kdagen_kernels import prepare_chunk_indices, prepare_chunk_offsets
from tests.kda_cases import make_inputs, poisoned_out
from tests.tolerances import check, check_output, output_terms
from tests.variant_cases import (
    PIPELINES, all_targets_spec, inputs, render_triton_variants, run_and_check, spy_on_kernels, triton_cases, triton_variants,
)

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


LABEL_DIMS = {"d64": "bf16__k64_v64_c64", "d96": "bf16__k96_v96_c64", "k64_v128": "bf16__k64_v128_c64",
              "d256": "bf16__k256_v256_c64", "kimi_fp16": "fp16__k128_v128_c64"}


# A chunk-32 variant beside a chunk-64 one of the same head dims (K != V; the shipped spec declares chunk 64
# only): a call reaches each by the chunk size it asks for.
C32_SPEC = """\
op: kda_chunk_fwd
variants:
  - {label: c32, head_dim_k: 32, head_dim_v: 64, chunk_size: 32, dtype: bf16, backends: [triton], targets: [sm_90]}
  - {label: c64, head_dim_k: 32, head_dim_v: 64, chunk_size: 64, dtype: bf16, backends: [triton], targets: [sm_90]}
"""


@pytest.fixture(scope="module")
def chunk_32_registry(tmp_path_factory) -> tuple[VariantEntry, ...]:
    return tuple(render_triton_variants(tmp_path_factory.mktemp("c32"), C32_SPEC))


def _ran(log: list[tuple[str, str]]) -> set[str]:
    return {module.rsplit(".", 1)[1] for module, _ in log}


# Ragged with T = 1 and T = 0 sequences and T off the 32 grid; a batch of one token.
@pytest.mark.parametrize("lens", [[37, 0, 1, 63], [1]], ids=["ragged", "one_token"])
@pytest.mark.parametrize("pipeline", list(PIPELINES))
def test_chunk_32_plan_runs_the_chunk_32_kernels(chunk_32_registry, lens, pipeline, monkeypatch):
    c32, c64 = chunk_32_registry
    assert (c32.chunk_size, c64.chunk_size) == (32, 64)
    for e in (c32, c64):  # chunk_size= picks each; the spy proves whose kernels ran
        log = spy_on_kernels(monkeypatch, chunk_32_registry)
        run, ref = inputs(e, PIPELINES[pipeline], "cpu", heads=2, lens=lens)
        run_and_check(e, pipeline, run, ref, log, "triton-interp", variants=chunk_32_registry)
        assert _ran(log) == {e.name}, (e.name, sorted(_ran(log)))
        monkeypatch.undo()


def test_chunk_32_metadata_reaches_the_chunk_32_kernels(chunk_32_registry, monkeypatch):
    """The vLLM signature with chunk-32 metadata runs the chunk-32 variant (and its output is the reference's);
    without metadata the registry's preference, chunk 64, serves the call."""
    c32, c64 = chunk_32_registry
    args = make_inputs([37, 1, 63], 2, 32, 64, torch.bfloat16, "cpu", lower_bound=-5.0, g_bias=True, h0=True)
    cu = args["cu_seqlens"]
    ref_o, ref_state, terms = output_terms(**args)
    for meta, want in ((dict(chunk_indices=prepare_chunk_indices(cu, 32),
                             chunk_offsets=prepare_chunk_offsets(cu, 32)), c32), ({}, c64)):
        log = spy_on_kernels(monkeypatch, chunk_32_registry)
        dispatch.clear_plans()
        out = poisoned_out(args["v"])
        o, state = dispatch.chunk_kda_prefill(chunk_32_registry, **args, **meta, out=out)
        dispatch.clear_plans()
        assert _ran(log) == {want.name}, (want.name, sorted(_ran(log)))
        assert o is out
        check_output(f"output of {want.name} from the wrapper", o, ref_o, terms, 32, ("triton-interp", "bf16", "output"))
        check(f"final state of {want.name} from the wrapper", state, ref_state, ("triton-interp", "bf16", "final_state"))
        monkeypatch.undo()


@pytest.fixture(scope="module")
def all_targets_registry(tmp_path_factory) -> tuple[VariantEntry, ...]:
    return tuple(render_triton_variants(tmp_path_factory.mktemp("all_targets"), all_targets_spec()))


@pytest.mark.parametrize("label", ["d64", "d96", "k64_v128", "d256", "kimi_fp16"])
@pytest.mark.parametrize("pipeline", list(PIPELINES))
def test_all_targets_spec_variant_matches_reference(all_targets_registry, label, pipeline, monkeypatch):
    """Each Triton variant of the spec tests/build/test_all_targets_spec.py generates, in the interpreter."""
    (entry,) = [e for e in all_targets_registry if e.name.endswith(LABEL_DIMS[label])]
    # The plans' module cache is keyed by variant name, which d64 and kimi_fp16 share with the registry's.
    monkeypatch.setattr(planning, "_loaded", {})
    log = spy_on_kernels(monkeypatch, all_targets_registry)
    heads = 1 if max(entry.head_dim_k, entry.head_dim_v) > 128 else 2
    run, ref = inputs(entry, PIPELINES[pipeline], "cpu", heads=heads)
    run_and_check(entry, pipeline, run, ref, log, "triton-interp", variants=all_targets_registry)
    assert _ran(log) == {entry.name}


@pytest.mark.parametrize("entry", triton_variants(), ids=lambda e: e.name)
def test_tb_column_slices_match_reference(entry, monkeypatch, pipelines_ran):
    # kda_intra_tb on 16-column slices (the GPU's 16-row programs take them; the interpreter's 32-row ones keep
    # whole rows, which test_variant_matches_reference runs).
    monkeypatch.setattr(triton_path, "tb_block_k", lambda tun, bk: 16)
    log = spy_on_kernels(monkeypatch)
    heads = 1 if max(entry.head_dim_k, entry.head_dim_v) > 128 else 2
    pipeline = "triton_intra_tb+triton_walk_tb"
    run, ref = inputs(entry, PIPELINES[pipeline], "cpu", heads=heads)
    run_and_check(entry, pipeline, run, ref, log, "triton-interp")
    pipelines_ran[f"test_variants (interpreter): {pipeline}, 16-column slices ({entry.name})"] += 1
