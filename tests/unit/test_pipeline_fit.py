# SPDX-License-Identifier: Apache-2.0
"""tools/pipeline_fit.py's fit: on timings made by a known rule, the fitted Rules choose the fastest candidate
where today's rule does not, and the replay scores an unmeasured choice as a loss."""

from __future__ import annotations

import importlib.util
import json
import random
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
spec = importlib.util.spec_from_file_location("pipeline_fit", ROOT / "tools" / "pipeline_fit.py")
pipeline_fit = importlib.util.module_from_spec(spec)
sys.modules["pipeline_fit"] = pipeline_fit
spec.loader.exec_module(pipeline_fit)

from kdagen.runtime.pipeline import H200_RULES as TODAY  # noqa: E402

# The synthetic timings below know one walk per chunk stage and one walk threshold: the hip_walk / triton_walk
# rules (short sequences; a split that beats kda_walk_kernel) and the long-sequence hip_intra rule stay out of them.
H200_RULES = pipeline_fit.Rules(**{**TODAY.__dict__, "hip_walk_min_seq_chunks": 0.0, "hip_intra_long_seq_chunks": 1e9,
                                   "hip_walk_step": 0.0})

SMS = 132


def _target() -> dict:
    from kdagen_kernels.triton import kda_chunk_fwd__triton__bf16__k128_v128_c64 as mod
    return dict(name="sm_90", sms=SMS, hip_walk_threads=256, tuning=dict(mod.TUNING["sm_90"]),
                HEAD_DIM_K=128, HEAD_DIM_V=128, BK=128, BV=128)


def _sweep(path: Path, n: int, seed: int, cut: float) -> None:
    """Synthetic sweep rows: the HIP pair is the fastest exactly where walks >= cut x SMs; groups never help."""
    rng = random.Random(seed)
    rows = []
    for i in range(n):
        H, lens = pipeline_fit.draw_shape(rng)
        n_chunks = sum(-(-x // 64) for x in lens)
        work = dict(n_seq=len(lens), H=H, n_chunks=n_chunks, lower_bound=-5.0, use_l2norm=True, checkpoints=False)
        hip_fast = len(lens) * H >= cut * SMS
        per_seq = max(-(-x // 64) for x in lens)
        for pipeline, groups in pipeline_fit.candidates(per_seq, hip=True):
            if pipeline == "auto":
                chosen, g, ms = "hip_intra+hip_walk", 1, 1.0
            else:
                chosen, g = pipeline, groups
                ms = (0.8 if hip_fast else 1.2) if pipeline == "hip_intra+hip_walk" else 1.0 + 0.01 * (groups - 1)
            rows.append(dict(shape=i, max_len=max(lens), pipeline=pipeline, groups=groups, ms=ms, chosen=chosen,
                             chosen_groups=g, work=work, target=_target()))
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))


def test_fit_finds_the_rule_that_made_the_timings(tmp_path, capsys):
    path = tmp_path / "sweep.jsonl"
    _sweep(path, 60, seed=3, cut=1.5)
    data = [f for f in (pipeline_fit._facts(r) for r in pipeline_fit.load(path).values()) if f]
    fitted = pipeline_fit.Rules(**{**H200_RULES.__dict__, "hip_intra_walks_per_sm": 1.5,
                                   "split_max_fill": 0.25, "scan_step": 5.0})
    # Today's 0.5 x SMs rule takes the HIP pair between 0.5 and 1.5 x SMs, where it loses here.
    assert pipeline_fit.score(data, H200_RULES) > pipeline_fit.score(data, fitted)
    args = type("A", (), dict(sweep=path, holdout=0.3, seed=0, free="hip_intra_walks_per_sm,hip_walk_min_seq_chunks"))()
    assert pipeline_fit.fit(args) == 0
    out = capsys.readouterr().out
    assert "hip_intra_walks_per_sm=1.5" in out or "hip_intra_walks_per_sm=1.0" in out, out
    assert "hip_walk_min_seq_chunks=0.0" in out, out


def test_a_choice_that_was_not_timed_scores_as_a_loss(tmp_path):
    path = tmp_path / "sweep.jsonl"
    _sweep(path, 10, seed=5, cut=0.0)
    rows = [json.loads(x) for x in path.read_text().splitlines()]
    kept = [r for r in rows if r["pipeline"] != "hip_intra+hip_walk"]
    path.write_text("".join(json.dumps(r) + "\n" for r in kept))
    data = [f for f in (pipeline_fit._facts(r) for r in pipeline_fit.load(path).values()) if f]
    hip_always = pipeline_fit.Rules(**{**H200_RULES.__dict__, "hip_intra_walks_per_sm": 0.0})
    assert pipeline_fit.score(data, hip_always) == pytest.approx(pipeline_fit.UNMEASURED)


def test_a_sweep_aimed_at_a_band_of_walks_draws_only_there():
    rng = random.Random(0)
    for _ in range(50):
        H, lens = pipeline_fit.draw_shape(rng, walks=(16, 132))
        assert 16 <= H * len(lens) <= 132 and all(n >= 1 for n in lens)
    with pytest.raises(Exception, match="LO:HI"):
        pipeline_fit._band("16-132")
