# SPDX-License-Identifier: Apache-2.0
"""The tolerance table and its checks: bounds come from measurements, and a check fails on what it names."""

from __future__ import annotations

import json

import pytest
import torch

from tests.tolerances import TOLERANCES, bound, check, summarize, within

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
