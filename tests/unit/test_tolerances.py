# SPDX-License-Identifier: Apache-2.0
"""The tolerance table and its checks: bounds come from measurements, and a check fails on what it names."""

from __future__ import annotations

import json

import pytest
import torch

from kdagen.reference import chunk_kda_prefill_reference, l2norm_reference, rel_l2
from tests.kda_cases import make_inputs
from tests.tolerances import TOLERANCES, bound, check, check_output, output_error, output_terms, summarize, within

KEY = ("triton-interp", "bf16", "output")


@pytest.mark.parametrize("key", sorted(TOLERANCES), ids="/".join)
def test_every_bound_is_a_measurement_with_a_stated_margin(key):
    t = TOLERANCES[key]
    assert t.measured > 0 and t.source
    # Under 1.5x a rounding change fails CI; over 20x the bound no longer tracks the kernels.
    assert 1.5 <= t.margin <= 20, f"{key}: margin {t.margin}"


def test_an_unknown_key_is_an_error_naming_it():
    with pytest.raises(KeyError, match=r"no tolerance for \('nowhere', 'bf16', 'output'\)"):
        bound(("nowhere", "bf16", "output"))


def test_check_fails_on_an_unwritten_element_shape_or_error_over_the_bound():
    ref = torch.randn(4, 8, dtype=torch.float64)
    assert check("exact", ref.float(), ref, KEY) < 1e-6
    poisoned = ref.float().clone()
    poisoned[1, 2] = float("nan")
    with pytest.raises(AssertionError, match="1 non-finite"):
        check("poisoned", poisoned, ref, KEY)
    with pytest.raises(AssertionError, match="shape"):
        check("shape", ref[:2].float(), ref, KEY)
    with pytest.raises(AssertionError, match="error"):
        check("off", (ref * (1 + 2 * bound(KEY))).float(), ref, KEY)
    with pytest.raises(AssertionError):
        within("nan error", float("nan"), KEY)


def test_errors_are_logged_and_summarized(tmp_path, monkeypatch):
    log = tmp_path / "errs.jsonl"
    monkeypatch.setenv("KDAGEN_TOLERANCE_LOG", str(log))
    within("a", 1e-6, KEY)
    within("b", 2e-6, KEY)
    rows = [json.loads(line) for line in log.read_text().splitlines()]
    assert [r["err"] for r in rows] == [1e-6, 2e-6] and rows[0]["key"] == list(KEY)
    assert "worst 2.00e-06" in summarize(log.read_text().splitlines())
    monkeypatch.delenv("KDAGEN_TOLERANCE_LOG")
    within("c", 3e-6, KEY)
    assert len(log.read_text().splitlines()) == 2


# ---- Note [Conditioned output error] --------------------------------------------------------------------------
GPU = ("triton-gpu", "bf16", "output")


def _ragged(K: int = 128) -> dict:
    return make_inputs([5, 1, 40, 0], 2, K, K, torch.bfloat16, "cpu", seed=3)


def _h200_case() -> dict:
    """The H200 fuzz case that relative L2 failed: one token, one head, no state, cos(q, k) = -8.9e-4."""
    return make_inputs([1], 1, 128, 128, torch.bfloat16, "cpu", seed=38, h0=False, strided=True)


def _with_bf16_qk(args: dict) -> dict:
    """The inputs with q and k L2-normed and rounded to bf16: the operands of the GPU's q . k products."""
    return dict(args, q=l2norm_reference(args["q"]).to(torch.bfloat16),
                k=l2norm_reference(args["k"]).to(torch.bfloat16), use_qk_l2norm_in_kernel=False)


def test_output_terms_are_the_reference_outputs_terms():
    args = _ragged()
    o, final, terms = output_terms(**args)
    ref_o, ref_final = chunk_kda_prefill_reference(**args)
    assert torch.equal(o, ref_o) and torch.equal(final, ref_final)
    assert bool((o.abs() <= terms * (1 + 1e-12)).all()), "an output exceeds the sum of its terms' magnitudes"
    # One token from a zero state: P = beta v k^T, so the terms are beta |v| scale sum_k |q_k k_k|.
    one = _h200_case()
    _, _, t1 = output_terms(**one)
    q, k = l2norm_reference(one["q"]), l2norm_reference(one["k"])
    beta = torch.sigmoid(one["raw_beta"].double())
    want = beta[..., None] * one["v"].double().abs() * 128**-0.5 * (q * k).abs().sum(-1, keepdim=True)
    assert torch.allclose(t1, want, rtol=1e-12, atol=0)


def test_conditioned_error_is_the_relative_error_of_a_well_conditioned_output():
    args = _ragged()
    o, _, terms = output_terms(**args)
    got = (o * (1 + 1e-2 * torch.randn(o.shape, generator=torch.Generator().manual_seed(0)))).float()
    assert output_error(got, o, terms, 128) == rel_l2(got, o)


def test_the_h200_cancellation_fails_relative_l2_and_passes_the_conditioned_error():
    args = _h200_case()
    o, _, terms = output_terms(**args)
    gpu_like, _ = chunk_kda_prefill_reference(**_with_bf16_qk(args))
    gpu_like = gpu_like.to(torch.bfloat16)
    assert rel_l2(gpu_like, o) > 0.15 > bound(GPU)  # what the H200 saw: 0.16
    assert output_error(gpu_like, o, terms, 128) < bound(GPU) / 3
    check_output("H200 cancellation", gpu_like, o, terms, 128, GPU)


def _bug(name: str, args: dict) -> dict:
    """The inputs a kernel with the named bug would in effect have computed on."""
    if name == "wrong gate":  # A_log off by 0.2
        return dict(args, A_log=args["A_log"] + 0.2)
    if name == "dropped token":  # the last token of the longest sequence (or the only token) never updates the state
        beta = args["raw_beta"].clone()
        beta[0, int(args["cu_seqlens"][-1]) - 1] = -200.0
        return dict(args, raw_beta=beta)
    if name == "wrong v":  # v negated
        return dict(args, v=-args["v"])
    raise AssertionError(name)


# Not on the cancellation: a 2% perturbation of an output 685x smaller than its terms is rounding, and one token
# from a zero state has no gate to get wrong.
BUGS = [(case, bug) for case in ("ragged", "h200 cancellation")
        for bug in ("perturbed output", "wrong gate", "dropped token", "wrong v")
        if case == "ragged" or bug in ("dropped token", "wrong v")]


@pytest.mark.parametrize(("case", "bug"), BUGS)
def test_a_real_bug_fails_the_conditioned_error(case, bug):
    args = _ragged() if case == "ragged" else _h200_case()
    o, _, terms = output_terms(**args)
    got = o * (1 + 2 * bound(GPU)) if bug == "perturbed output" else chunk_kda_prefill_reference(**_bug(bug, args))[0]
    with pytest.raises(AssertionError, match="error"):
        check_output(f"{bug} on {case}", got.to(torch.bfloat16), o, terms, 128, GPU)
