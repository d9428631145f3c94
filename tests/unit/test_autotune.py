# SPDX-License-Identifier: Apache-2.0
"""`python -m kdagen autotune` without a GPU: candidate sets, the choice, and the spec rewrite."""

from __future__ import annotations

import shutil
import textwrap
from pathlib import Path

import pytest

from kdagen import autotune
from kdagen.autotune import (RewriteError, Trial, VariantDims, flow_mapping, prologue_candidates, wu_candidates,
                             recurrence_candidates, rewrite_target_tuning, tune)
from kdagen.spec.load import load_spec_file
from kdagen.targets import TARGETS, estimate_triton_smem

ROOT = Path(__file__).resolve().parents[2]
KIMI = VariantDims("kimi", 128, 128, 64, "bf16")
KNOBS = dict(prologue_warps=2, prologue_stages=1, prologue_block_k=16, wu_warps=8, wu_stages=2, wu_block_k=32,
             intra_warps=8, intra_stages=2, intra_block_v=32, recurrence_warps=8, recurrence_stages=1,
             recurrence_stages_sparse=1, block_v=32, intra_rows=32, dense_intra_rows=16,
             dense_intra_warps=1, dense_block_v=32)
SPEC = textwrap.dedent("""\
    op: kda_chunk_fwd
    # file comment
    tuning:
      triton:
        sm_90:  {prologue_warps: 1, prologue_block_k: 32}  # measured on an H200
        gfx950: {prologue_warps: 4}
    variants:
      - label: kimi
        head_dim_k: 128
        head_dim_v: 128
        chunk_size: 64
        dtype: bf16
        backends: [triton]
        targets: [gfx950, sm_90]
    """)


def _load(tmp_path: Path, text: str):
    (tmp_path / "specs").mkdir(exist_ok=True)
    path = tmp_path / "specs" / "k.yaml"
    path.write_text(text)
    return load_spec_file(path, tmp_path).variants[0]


def test_rewrite_in_place_keeps_comments_and_other_targets(tmp_path):
    new = rewrite_target_tuning(SPEC, "sm_90", KNOBS)
    changed = [(a, b) for a, b in zip(SPEC.splitlines(), new.splitlines()) if a != b]
    assert changed == [("    sm_90:  {prologue_warps: 1, prologue_block_k: 32}  # measured on an H200",
                        f"    sm_90:  {flow_mapping(KNOBS)}  # measured on an H200")]
    v = _load(tmp_path, new)
    assert v.tuning_for("sm_90").prologue_block_k == 16 and v.tuning_for("sm_90").block_v == 32
    assert v.tuning_for("sm_90").wu_warps == 8
    assert v.tuning_for("gfx950").prologue_warps == 4


def test_rewrite_adds_a_missing_target_and_a_missing_tuning_block(tmp_path):
    without_target = SPEC.replace("    gfx950: {prologue_warps: 4}\n", "")
    v = _load(tmp_path, rewrite_target_tuning(without_target, "gfx950", KNOBS))
    assert v.tuning_for("gfx950").recurrence_warps == 8
    without_tuning = "\n".join(ln for ln in SPEC.splitlines() if not ln.startswith(("tuning", "  triton", "    sm_90",
                                                                                      "    gfx950"))) + "\n"
    v = _load(tmp_path, rewrite_target_tuning(without_tuning, "sm_90", KNOBS))
    assert v.tuning_for("sm_90").prologue_warps == 2


def test_rewrite_refuses_a_block_mapping_and_says_what_to_write():
    block = SPEC.replace("    gfx950: {prologue_warps: 4}\n", "    gfx950:\n      prologue_warps: 4\n")
    with pytest.raises(RewriteError, match=r"tuning.triton.gfx950 \(line 6\) is not a one-line .* by hand"):
        rewrite_target_tuning(block, "gfx950", KNOBS)


def test_the_project_spec_round_trips(tmp_path):
    # The real spec's current tuning written back through the rewrite loads to the same values.
    text = (ROOT / "specs" / "kda_chunk_fwd.yaml").read_text()
    shutil.copytree(ROOT / "specs", tmp_path / "specs")
    before = load_spec_file(tmp_path / "specs" / "kda_chunk_fwd.yaml", tmp_path).variants[0]
    current = {f: getattr(before.tuning_for("sm_90"), f) for f in KNOBS}
    (tmp_path / "specs" / "kda_chunk_fwd.yaml").write_text(rewrite_target_tuning(text, "sm_90", current))
    after = load_spec_file(tmp_path / "specs" / "kda_chunk_fwd.yaml", tmp_path).variants[0]
    assert after.tuning == before.tuning


def test_candidates_respect_the_head_dims_and_shared_memory():
    small = VariantDims("d64", 64, 32, 64, "bf16")
    assert {c["prologue_block_k"] for c in prologue_candidates(small)} == {16, 32, 64}
    assert {c["wu_block_k"] for c in wu_candidates(small)} == {32}
    assert {c["block_v"] for c in recurrence_candidates(small, "sm_90")} == {16, 32}
    for c in recurrence_candidates(KIMI, "gfx942"):
        for stages in (c["recurrence_stages"], c["recurrence_stages_sparse"]):
            assert estimate_triton_smem(128, 128, 64, "bf16", c["block_v"], stages,
                                        "gfx942") <= TARGETS["gfx942"].smem_per_block
    assert len(recurrence_candidates(KIMI, "gfx942")) < len(recurrence_candidates(KIMI, "sm_90"))


def test_tune_picks_the_geometric_mean_best_and_skips_failures():
    current = dict(KNOBS)

    def fake(variant, target, kernel, knobs, shapes):
        if kernel == "recurrence":
            if knobs["block_v"] == 128:
                return Trial(knobs, error="illegal address")
            # 2x faster on one shape, 1.5x slower on the other: geometric mean 0.87 -> chosen.
            fast = knobs == dict(recurrence_warps=4, recurrence_stages=2, recurrence_stages_sparse=2, block_v=64)
            return Trial(knobs, ms=[0.5, 1.5] if fast else [1.0, 1.0])
        return Trial(knobs, ms=[1.0, 1.0])  # nothing beats the current prologue config

    logs = []
    best = tune(KIMI, "sm_90", current, [(12, 4096, 1), (96, 16384, 16)], measure=fake, log=logs.append)
    assert best == {**current, "recurrence_warps": 4, "recurrence_stages": 2, "recurrence_stages_sparse": 2,
                    "block_v": 64}
    assert any("skipped: illegal address" in ln for ln in logs)


def test_ties_keep_the_current_knobs():
    # On shapes that launch no sparse walk, recurrence_stages_sparse does not change the time: a candidate
    # that differs only there (and is faster by noise) must not flip it. A real 5% gain still wins.
    current = dict(KNOBS)

    def fake(variant, target, kernel, knobs, shapes):
        if kernel != "recurrence":
            return Trial(knobs, ms=[1.0])
        if knobs["recurrence_warps"] == 4 and knobs["block_v"] == 16:
            return Trial(knobs, ms=[0.95 if knobs["recurrence_stages_sparse"] == 1 else 0.945])
        return Trial(knobs, ms=[1.0])

    best = tune(KIMI, "sm_90", current, [(96, 16384, 16)], measure=fake, log=lambda _: None)
    assert (best["recurrence_warps"], best["recurrence_stages_sparse"]) == (4, current["recurrence_stages_sparse"])


def test_tune_stops_when_the_current_config_fails():
    def fake(variant, target, kernel, knobs, shapes):
        return Trial(knobs, error="disagrees with the float64 reference")

    with pytest.raises(RuntimeError, match="current prologue config .* failed .* fix the spec's tuning by hand"):
        tune(KIMI, "sm_90", dict(KNOBS), [(12, 4096, 1)], measure=fake, kernels=("prologue",), log=lambda s: None)


def test_subprocess_failure_is_a_skipped_candidate(monkeypatch):
    class Done:
        returncode, stdout, stderr = 1, "", "Traceback ...\nRuntimeError: CUDA error: an illegal memory access"

    monkeypatch.setattr(autotune.subprocess, "run", lambda *a, **k: Done())
    t = autotune.measure_in_subprocess("v", "sm_90", "recurrence", {"block_v": 16}, [(1, 64, 1)])
    assert t.ms is None and "illegal memory access" in t.error


def test_command_without_a_gpu_says_so(capsys):
    from kdagen.cli import main
    assert main(["autotune"]) == 2
    assert "needs a GPU" in capsys.readouterr().err


def test_knob_filters_narrow_the_search_and_bad_ones_are_named():
    seen = []

    def fake(variant, target, kernel, knobs, shapes):
        seen.append(knobs)
        return Trial(knobs, ms=[1.0])

    only = autotune.parse_knob_filters(["prologue_warps=1,2", "prologue_block_k=32"])
    tune(KIMI, "sm_90", dict(KNOBS), [(1, 64, 1)], measure=fake, kernels=("prologue",), log=lambda s: None,
         only=only)
    # The current config first (always, as the baseline), then only the allowed values.
    assert seen[0] == {k: KNOBS[k] for k in autotune.PROLOGUE_KNOBS}
    assert all(c["prologue_warps"] in (1, 2) and c["prologue_block_k"] == 32 for c in seen[1:]) and len(seen) == 5
    with pytest.raises(ValueError, match="NAME one of prologue_warps"):
        autotune.parse_knob_filters(["warps=1"])


def test_autotune_skips_configs_triton_miscompiles():
    from kdagen.autotune import candidates

    sm90 = candidates("recurrence", KIMI, "sm_90")
    assert sm90 and not any(c["recurrence_warps"] == 4 and c["block_v"] == 32 for c in sm90)
    assert any(c["recurrence_warps"] == 4 and c["block_v"] == 32 for c in candidates("recurrence", KIMI, "gfx942"))
