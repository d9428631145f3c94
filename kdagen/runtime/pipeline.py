# SPDX-License-Identifier: Apache-2.0
"""Which stages a plan runs: `choose_pipeline`, the one place every rule of that choice lives.

Note [Pipelines]
    A plan runs two stages on one workspace. The chunk stage writes, per walk chunk, the gated operands the
    walk reads: `triton_intra` (the Triton kda_intra on 16- or 32-row programs), `triton_intra_tb` (kda_intra_tb:
    the same programs, writing the [rows, rows] factor T diag(beta) in place of u and not reading v),
    `triton_pair` (the Triton kda_prologue + kda_wu on whole chunks, any gate) or `hip_intra` (the HIP
    kda_intra_kernel on 16-row walk chunks). The walk stage carries the state through the chunks and writes the
    output, the final state or the cache rows and the checkpoints: `triton_walk` (kda_recurrence, optionally cut
    into groups with kda_group_scan, Note [Group count]), `triton_walk_tb` (kda_recurrence_tb: the same walk,
    forming u = (T diag(beta)) v per chunk from triton_intra_tb's factor and v) or `hip_walk` (kda_walk_kernel,
    one group). A pipeline is named
    "<chunk>+<walk>"; the caller may name one (`pipeline=`, or KDAGEN_PIPELINE for experiments) or leave the
    choice to `choose_pipeline` ("auto").

    The kernels' limits (`stage_limits`):
    - triton_intra, triton_intra_tb and hip_intra form a chunk's factors relative to its middle row, so they need a gate
      bounded by lower_bound >= 125 ln 2 / 16 and q, k L2-normed in kernel (`intra_fits`); triton_pair takes
      every gate.
    - hip_walk reads the 16-row walk chunks hip_intra writes, has no group split, and is absent from a library
      built on the FMA fallback (walk_threads == 0).
    - triton_intra_tb and triton_walk_tb run only with each other (the factor replaces u in the workspace).
    - triton_* need a Triton variant of the batch's head dims, dtype and chunk size; hip_* a built library.
    An explicit pipeline that breaks one is a ValueError naming what is missing, never a substitute.

    Under "auto" (`_auto`): the Triton program (triton_intra where the gate allows, else triton_pair) unless
    the fused path was asked for and its library is built; then hip_intra where the gate allows and the walks
    fill enough of the GPU (RULES), followed by hip_walk where the library has it, no group split was asked
    for, the sequences are long enough for it and the cost model's split of the Triton walk is not under
    hip_walk_step of its unsplit time (RULES: otherwise the grouped triton_walk, where a Triton variant can
    follow hip_intra; kda_walk_kernel walks each sequence whole, so a long ragged batch waits on its longest).
    A fused request whose gate the HIP kernels cannot take runs the Triton pipeline. "auto" never picks triton_intra_tb+triton_walk_tb: it is an option until H200 timings say where it
    pays.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import triton

from ..launch_knobs import dense_tuning
from .group_scan import MAX_FORCED_GROUPS, busy_share, group_costs
from .launch import RunKey

CHUNK_STAGES = ("triton_intra", "triton_intra_tb", "triton_pair", "hip_intra")
WALK_STAGES = ("triton_walk", "triton_walk_tb", "hip_walk")
# What each stage is, for a plan's describe().
STAGE_NOTES = {
    "triton_intra": "kda_intra, one program per walk chunk, writes qg, kg, w, u, Aqk and the decay row",
    "triton_intra_tb": "kda_intra_tb, one program per walk chunk, writes qg, kg, w, T diag(beta), Aqk and the "
                       "decay row; reads no v and writes no u",
    "triton_pair": "kda_prologue + kda_wu on whole chunks (any gate)",
    "hip_intra": "the HIP kda_intra_kernel on 16-row walk chunks",
    "triton_walk": "kda_recurrence reads u (kda_group_scan when split)",
    "triton_walk_tb": "kda_recurrence_tb forms u = (T diag(beta)) v per chunk from v (kda_group_scan when split)",
    "hip_walk": "the HIP kda_walk_kernel, one group",
}
# The chunk stages whose walk chunks are kda_intra's programs (the factored gate of intra_fits).
INTRA_STAGES = ("triton_intra", "triton_intra_tb", "hip_intra")
TRITON_WALKS = ("triton_walk", "triton_walk_tb")
HIP_INTRA_ROWS = 16  # the HIP kda_intra_kernel's walk chunk (templates/hip/include/kda_intra.h)

# The gate bound kda_intra's factors need (Note [Chunk-parallel design] in triton_path.py): 16 rows of decay
# relative to the chunk's middle row stay a normal fp32, |lower_bound| <= 125 ln 2 / 16.
INTRA_MIN_LOWER_BOUND = -125.0 * math.log(2.0) / 16


@dataclass(frozen=True)
class Rules:
    """A target's parameters of the choice. Each comes from a measurement named where RULES sets it."""

    hip_intra_walks_per_sm: float  # hip_intra runs where (sequence, head) walks >= this x SMs
    hip_intra_long_walks_per_sm: float  # ... or where walks >= this x SMs and sequences are long (next field)
    hip_intra_long_seq_chunks: float  # ... averaging >= this many chunks
    triton_intra_max_head_dim_k: int  # the Triton chunk stage: triton_intra up to this K, triton_pair above
    hip_walk_min_seq_chunks: float  # after hip_intra, hip_walk where sequences average >= this many chunks
    walk_programs_per_sm: int  # the group cost model: walks resident per SM
    pass1_step: float  # the group cost model: a pass-1 step in units of a pass-2 step
    scan_step: float  # ... and a scan step (its launch included)
    split_max_fill: float  # no group split once the plain walk's busy programs exceed this x SMs
    split_step: float = 0.0  # the group cost model: a split's fixed cost (its two extra launches), in steps
    hip_walk_step: float = 1.0  # kda_walk_kernel's time over the unsplit triton_walk's after hip_intra


# H200 (sm_90), docs/performance-model.md, "The pipeline choice, fitted": `tools/pipeline_fit.py fit` on a sweep of
# 60 random batches (2026-12-03, triton 3.6, every candidate timed by graph replay; four 42/18 fit/held-out splits).
# hip_walk_min_seq_chunks = 1.5 is the fitted value (1.25 in three splits and 2.0 in one; the geomean is flat from
# 1.25 to 2.0): sequences of one or two chunks walk faster on triton_walk after hip_intra (1.2-1.55x). It takes the
# choice from 1.072x the fastest measured candidate (geomean over the 60, worst 1.55x) to 1.014x (worst 1.34x, a
# ragged batch the group model sizes by its mean sequence). The other parameters are the earlier hand fits
# (hip_intra where walks fill half the SMs; the group model: two walks per SM, pass-1 steps 0.5, scan steps 2.5,
# no split past half the SMs, fitted to 11 whole-call shapes); the sweep's splits did not agree on other values.
# hip_intra_long_*: a second sweep of 60 batches aimed at the band 16 <= N x H <= 132 (seed 2, same day,
# docs/data/pipeline-sweep-h200-walks-2026-12-03.jsonl.gz). All four splits fit 0.25 and 8: hip_intra also where
# walks fill a quarter of the SMs and sequences average 8 chunks or more (the HIP pair 0.8-0.9x the Triton
# pipeline's time there). Geomean over that sweep 1.058 -> 1.048 of the fastest, over the first 1.014 -> 1.012;
# the worst rises 1.34 -> 1.41 (H=6 N=8, long ragged sequences whose fastest walk is a split one, which
# hip_walk cannot do). Lowered to 0.2 (27 walks on 132 SMs) once kda_intra_kernel's wave design made the HIP
# intra faster than the sweeps saw: one sequence of 32 heads (32 walks, just under a quarter) ran 6-8% faster on
# hip_intra + the grouped triton_walk than on the Triton pipeline (H100, 2026-12-07, 4096 / 16384 / 65536
# tokens: 0.426 / 1.528 / 5.875 ms against 0.455 / 1.638 / 6.355), and replayed on both sweeps 0.2 scores
# 1.0167 of the fastest against 0.25's 1.0173 (worst 1.23x at both; of the two batches it moves, H=15 N=2 over
# 131-chunk sequences gains 8% and H=31 N=1 over 98 chunks loses 1%, both timed with the older kernel). Below 0.2
# the sweeps lose (0.175: 1.019, worst 1.38x).
# The ragged terms (split_max_fill on busy programs, split_step, hip_walk_step, and the cost model's busy blocks):
# `tools/pipeline_fit.py fit` on both sweeps together (120 batches, 2026-12-04): three of four 84/36 splits agree on
# split_step 4 and hip_walk_step 0.7 (the fourth on 0 and 0.8). They also preferred split_max_fill 1.0, which
# scores the same over the 120 (1.0169 against 1.0173) and contradicts the graph timings of equal sequences (96
# programs lose 2.5-3% at G=2), so it stays 0.5, now of busy programs. Over the 120 the choice goes from 1.030x
# the fastest measured candidate (worst 1.41x, 15 batches past 1.1x) to 1.017x (worst 1.23x, 9): long ragged
# batches split the Triton walk after hip_intra where kda_walk_kernel, which cannot split, walked the longest
# sequence alone (H=6 N=8, longest 13,732 tokens: 1.26 -> 0.90 ms as measured).
H200_RULES = Rules(hip_intra_walks_per_sm=0.5, hip_intra_long_walks_per_sm=0.2, hip_intra_long_seq_chunks=8.0,
                   triton_intra_max_head_dim_k=128, hip_walk_min_seq_chunks=1.5,
                   walk_programs_per_sm=2, pass1_step=0.5, scan_step=2.5, split_max_fill=0.5, split_step=4.0,
                   hip_walk_step=0.7)
# AMD targets were compile-verified only (no AMD timings): they take the H200's parameters until measured.
RULES: Mapping[str, Rules] = {"sm_90": H200_RULES}


def rules_for(target: str) -> Rules:
    return RULES.get(target, H200_RULES)


@dataclass(frozen=True)
class Work:
    """What the choice sees of a batch."""

    n_seq: int
    H: int
    n_chunks: int  # metadata chunks (of the variant's chunk size)
    lower_bound: float | None
    use_l2norm: bool
    checkpoints: bool
    max_seq_chunks: int = 0  # the longest sequence's metadata chunks; 0: unknown (the mean stands in)

    @property
    def n_walks(self) -> int:
        return self.n_seq * self.H


@dataclass(frozen=True)
class Target:
    """What the choice sees of the device and the registry."""

    name: str
    sms: int | None  # None: no GPU (the interpreter), nothing to fill
    triton: Any  # the Triton variant's module (read: HEAD_DIM_K, HEAD_DIM_V, BK, BV), or None
    tuning: Mapping[str, int] | None  # the Triton variant's knobs on this target
    hip_walk_threads: int | None  # the built HIP library's walk threads (0: FMA fallback); None: no library
    hip_missing: str = "no HIP library"  # why there is none, for an explicit pipeline's error
    triton_missing: str = "no Triton variant"
    fused: bool = False  # use_fused_chunk=True and the fused path's preconditions held
    fused_why_not: tuple[str, ...] = ()


@dataclass(frozen=True)
class Pipeline:
    stages: tuple[str, str]  # (chunk stage, walk stage)
    groups: int
    knobs: dict[str, int] = field(compare=False)  # the Triton launches' knobs ({} without a Triton variant)
    reason: str = ""

    @property
    def chunk(self) -> str:
        return self.stages[0]

    @property
    def walk(self) -> str:
        return self.stages[1]

    @property
    def name(self) -> str:
        return "+".join(self.stages)

    @property
    def what(self) -> str:
        """What the two stages are (STAGE_NOTES)."""
        return f"{STAGE_NOTES[self.chunk]}; {STAGE_NOTES[self.walk]}"


def intra_fits(lower_bound: float | None, use_l2norm: bool) -> str | None:
    """Why triton_intra / hip_intra cannot run a batch's gate, or None."""
    if lower_bound is None or lower_bound < INTRA_MIN_LOWER_BOUND:
        return (f"the gate is not bounded by lower_bound >= {INTRA_MIN_LOWER_BOUND:.4f} "
                f"(got {lower_bound})")
    if not use_l2norm:
        return "q and k are not L2-normed in kernel"
    return None


def parse_pipeline(pipeline: object, source: str = "pipeline") -> tuple[str, str] | None:
    """(chunk, walk) of a named pipeline; None for None / "auto"."""
    if pipeline is None or pipeline == "auto":
        return None
    parts = pipeline.split("+") if isinstance(pipeline, str) else []
    if len(parts) != 2 or parts[0] not in CHUNK_STAGES or parts[1] not in WALK_STAGES:
        raise ValueError(f"{source}={pipeline!r}: expected 'auto' or '<chunk>+<walk>' with chunk one of "
                         f"{', '.join(CHUNK_STAGES)} and walk one of {', '.join(WALK_STAGES)}, e.g. "
                         "'hip_intra+hip_walk'")
    return parts[0], parts[1]


def stage_limits(chunk: str, walk: str, work: Work, target: Target, groups: int | None) -> list[str]:
    """What keeps the pipeline (chunk, walk) from running this batch on this target; empty if nothing."""
    why = []
    gate = intra_fits(work.lower_bound, work.use_l2norm)
    if chunk in INTRA_STAGES and gate is not None:
        why.append(f"{chunk} cannot take this batch: {gate} (triton_pair takes every gate)")
    if "hip" in chunk + walk and target.hip_walk_threads is None:
        why.append(f"{'hip_intra' if chunk == 'hip_intra' else 'hip_walk'} needs the HIP library: "
                   f"{target.hip_missing}")
    if (chunk == "triton_intra_tb") != (walk == "triton_walk_tb"):
        why.append(f"triton_intra_tb and triton_walk_tb run only together (the walk forms u from the chunk "
                   f"stage's T diag(beta)), got {chunk}+{walk}")
    if ("triton" in chunk or walk in TRITON_WALKS) and target.triton is None:
        why.append(f"{chunk if 'triton' in chunk else walk} needs a Triton variant: {target.triton_missing}")
    if walk == "hip_walk":
        if chunk != "hip_intra":
            why.append(f"hip_walk reads the {HIP_INTRA_ROWS}-row walk chunks hip_intra writes, not {chunk}'s")
        if target.hip_walk_threads == 0:
            why.append("the HIP library was built on the FMA fallback, which has no kda_walk_kernel")
        if groups is not None and groups != 1:
            why.append(f"hip_walk walks each sequence as one group, got groups={groups} (triton_walk splits)")
    if chunk == "hip_intra" and walk == "triton_walk" and target.triton is not None and (
            target.triton.BK, target.triton.BV) != (target.triton.HEAD_DIM_K, target.triton.HEAD_DIM_V):
        why.append("triton_walk after hip_intra needs a Triton variant whose blocks equal its head dims")
    return why


def choose_pipeline(work: Work, target: Target, *, pipeline: str | None = None,
                    groups: int | None = None, rules: Rules | None = None) -> Pipeline:
    """The stages, group count and launch knobs of a plan, and why (Note [Pipelines]). `pipeline`: None /
    "auto" or "<chunk>+<walk>"; `groups`: a forced group count of the walk, None for the cost model's; `rules`:
    the target's RULES unless given (tools/pipeline_fit.py replays the choice under candidate parameters)."""
    if groups is not None and not (isinstance(groups, int) and not isinstance(groups, bool)
                                   and 1 <= groups <= MAX_FORCED_GROUPS):
        raise ValueError(f"groups must be an int in 1..{MAX_FORCED_GROUPS} (1 = the plain walk; more groups "
                         f"than chunks only adds empty ones) or None, got {groups!r}")
    rules = rules if rules is not None else rules_for(target.name)
    asked = parse_pipeline(pipeline)
    if asked is not None:
        chunk, walk = asked
        why = stage_limits(chunk, walk, work, target, groups)
        if why:
            raise ValueError(f"pipeline={chunk}+{walk!s} cannot run this batch: {'; '.join(why)}. Pass "
                             "pipeline='auto' (or leave it unset) for the plan's choice")
        reason = f"pipeline={chunk}+{walk} was asked for"
    else:
        chunk, walk, reason = _auto(work, target, groups, rules)
    g, why_g, _ = _groups(walk, work, target, groups, rules)
    return Pipeline((chunk, walk), g, _knobs(chunk, g, work, target), f"{reason}; {why_g}")


def _auto(work: Work, target: Target, groups: int | None, rules: Rules) -> tuple[str, str, str]:
    gate = intra_fits(work.lower_bound, work.use_l2norm)
    triton_chunk, chunk_why = _triton_chunk(gate, target, rules)
    if not target.fused or target.hip_walk_threads is None:
        why = "; ".join(target.fused_why_not) or "use_fused_chunk is False"
        if target.fused and target.hip_walk_threads is None:
            why = f"use_fused_chunk=True, but {target.hip_missing}"
        return triton_chunk, "triton_walk", f"the Triton pipeline ({why}); {chunk_why}"
    if gate is not None:
        if target.triton is None:
            raise ValueError(f"use_fused_chunk=True: the HIP kernels cannot take this batch ({gate}) and there is "
                             f"no Triton pipeline for it: {target.triton_missing}")
        return "triton_pair", "triton_walk", f"the Triton pipeline: the HIP intra cannot take this batch ({gate})"
    fill = _fills_for_hip_intra(work, target, rules)
    if fill is None and target.triton is not None:
        return (triton_chunk, "triton_walk",
                f"the Triton program: {work.n_walks} (sequence, head) walks fill less than "
                f"{rules.hip_intra_walks_per_sm:g} x {target.sms} SMs (or {rules.hip_intra_long_walks_per_sm:g} x over "
                f"sequences of {rules.hip_intra_long_seq_chunks:g} chunks or more), where the HIP intra's 16-row "
                f"steps do not pay; {chunk_why}")
    reason = (f"hip_intra: {fill}" if fill is not None else
              f"hip_intra: the walks fill little of the GPU, but there is no Triton pipeline ({target.triton_missing})")
    split_asked = groups is not None and groups > 1
    triton_after = not stage_limits("hip_intra", "triton_walk", work, target, groups)
    short = _short_for_hip_walk(work, rules)
    # kda_walk_kernel walks each sequence whole, at hip_walk_step of the Triton walk's step: a split pays
    # where the cost model puts it under that.
    split, _, gain = (_groups("triton_walk", work, target, groups, rules) if triton_after and not split_asked
                      else (1, "", 1.0))
    splits = split > 1 and gain < rules.hip_walk_step
    if target.hip_walk_threads > 0 and not split_asked and ((short is None and not splits) or not triton_after):
        return "hip_intra", "hip_walk", f"{reason}; hip_walk: the library has kda_walk_kernel"
    walk_why = (f"groups={groups} asked for (hip_walk has no split)" if split_asked
                else "the library is on the FMA fallback (no kda_walk_kernel)" if target.hip_walk_threads == 0
                else short or (f"the cost model cuts the walk into {split} groups at {gain:.2f} of its unsplit time, "
                               f"under kda_walk_kernel's {rules.hip_walk_step:g}, which has no split"))
    if triton_after:
        return "hip_intra", "triton_walk", f"{reason}; triton_walk: {walk_why}"
    raise ValueError(f"use_fused_chunk=True: {walk_why}, and triton_walk cannot follow hip_intra here: "
                     f"{'; '.join(stage_limits('hip_intra', 'triton_walk', work, target, groups))}")


def _triton_chunk(gate: str | None, target: Target, rules: Rules) -> tuple[str, str]:
    """The Triton chunk stage (RULES) and why: triton_intra where its gate bound holds and K is within the
    head dims its one-program-per-walk-chunk tiles were measured fast at, else triton_pair."""
    if gate is not None:
        return "triton_pair", f"triton_pair: {gate}"
    K = target.triton.HEAD_DIM_K if target.triton is not None else 0
    if K > rules.triton_intra_max_head_dim_k:
        return "triton_pair", (f"triton_pair: K={K} is past the {rules.triton_intra_max_head_dim_k} up to which "
                               "kda_intra's per-program tiles stay in registers")
    return "triton_intra", "triton_intra: the gate and norm fit kda_intra"


def _fills_for_hip_intra(work: Work, target: Target, rules: Rules) -> str | None:
    """Why the walks give hip_intra's 16-row chunk steps enough of the GPU to pay (RULES: half the SMs, or fewer
    walks over long sequences, whose walk's saving outweighs the chunk stage's idle SMs), or None."""
    if target.sms is None:
        return "no GPU to fill"
    walks = f"{work.n_walks} (sequence, head) walks on {target.sms} SMs"
    if work.n_walks >= rules.hip_intra_walks_per_sm * target.sms:
        return walks
    per_seq = work.n_chunks / max(work.n_seq, 1)
    if work.n_walks >= rules.hip_intra_long_walks_per_sm * target.sms and per_seq >= rules.hip_intra_long_seq_chunks:
        return f"{walks}, sequences averaging {per_seq:.1f} chunks (at least {rules.hip_intra_long_seq_chunks:g})"
    return None


def _short_for_hip_walk(work: Work, rules: Rules) -> str | None:
    """Why the grouped triton_walk should follow hip_intra rather than hip_walk (RULES), or None."""
    per_seq = work.n_chunks / max(work.n_seq, 1)
    if per_seq < rules.hip_walk_min_seq_chunks:
        return (f"sequences average {per_seq:.2f} chunks, under {rules.hip_walk_min_seq_chunks:g}, where "
                "triton_walk's shorter per-walk start pays")
    return None


def _groups(walk: str, work: Work, target: Target, forced: int | None, rules: Rules) -> tuple[int, str, float]:
    """The walk's group count (Note [Group count]), why, and the cost model's time at that count over its time
    unsplit (1.0 where it did not choose)."""
    if walk == "hip_walk":
        return 1, "one group (kda_walk_kernel walks each sequence whole)", 1.0
    if forced is not None:
        return forced, f"groups={forced} asked for", 1.0
    if work.checkpoints:
        # At G = 1 a snapshot is bit-identical to the final state of a prefill cut at its offset (what a
        # prefix cache resumes from); under a split it differs by rounding (H200: 6.5e-4 at G = 2, 1.3e-3 at
        # G = 8, K = 128, V = 256, past vLLM's 1e-3 bound for its fused path; docs/performance-model.md,
        # "Checkpoints and the group split").
        return 1, "one group (checkpoints are written)", 1.0
    if target.sms is None:
        return 1, "one group (no GPU to fill)", 1.0
    mod, tun = target.triton, target.tuning
    v_slice = min(tun["block_v"], mod.BV)
    programs = work.n_walks * triton.cdiv(mod.HEAD_DIM_V, v_slice)
    busy = programs * busy_share(work.n_seq, work.n_chunks, work.max_seq_chunks)  # a ragged batch's short walks end early
    if busy > rules.split_max_fill * target.sms:
        # A split's programs would double up on SMs and share their throughput, which the wave model does not
        # see (H200: 96 programs lose 2.5-3% at G=2, 64 gain 10% at G=3).
        return 1, f"one group ({programs} walk programs, {busy:.0f} busy on average, fill the {target.sms} SMs)", 1.0
    costs = group_costs(work.n_seq, work.H, work.n_chunks, mod.HEAD_DIM_K, mod.HEAD_DIM_V, v_slice, target.sms,
                        rules.walk_programs_per_sm, pass1_step=rules.pass1_step, scan_step=rules.scan_step,
                        split_step=rules.split_step, longest=work.max_seq_chunks)
    g = min(costs, key=lambda n: (costs[n], n))
    gain = costs[g] / costs[1] if costs[1] > 0 else 1.0
    return g, (f"{g} group{'s' if g > 1 else ''} (the cost model, {programs} walk programs, {busy:.0f} busy on "
               f"average, on {target.sms} SMs)"), gain


def _knobs(chunk: str, groups: int, work: Work, target: Target) -> dict[str, int]:
    """The Triton launches' knobs: the target's, or its dense_* ones for kda_intra / the HIP intra's walk when
    a plain walk has a program per SM at dense_block_v. On the H200 16-row programs on one warp and 128-row V
    slices made the call 10% faster at H=96 T=16384 N=16, 4% at H=12 (N = 16); with fewer walks the doubled
    steps cost more (H=96 T=4096 N=1 +4%, H=12 T=65536 N=1 +6%; docs/performance-model.md, "The dense-knob
    rule")."""
    if target.triton is None or target.tuning is None:
        return {"intra_rows": HIP_INTRA_ROWS} if chunk == "hip_intra" else {}
    tun = dict(target.tuning)
    if chunk in INTRA_STAGES and groups == 1 and target.sms is not None:
        dense = dense_tuning(tun)
        if work.n_walks * triton.cdiv(target.triton.HEAD_DIM_V, min(dense["block_v"], target.triton.BV)) >= target.sms:
            tun = dense
    if chunk == "hip_intra":
        tun["intra_rows"] = HIP_INTRA_ROWS
    return tun


class Program:
    """A plan's launches, built once: the chunk stage's (in order), then the walk stage's for the run's
    state_in (0 zeros, 1 a dense initial_state, 2 the paged cache). Each launch picks its values from the run's
    list by name (run_values.RUN_ORDER)."""

    __slots__ = ("pipeline", "intra", "prologue", "wu", "walks", "direct", "groups", "_chunk", "_key")

    def __init__(self, pipeline: Pipeline, chunk: Mapping[str, Any], walks: Mapping[int, tuple], direct: bool):
        self.pipeline = pipeline
        self.intra, self.prologue, self.wu = chunk.get("intra"), chunk.get("prologue"), chunk.get("wu")
        self._chunk = tuple(x for x in (self.intra, self.prologue, self.wu) if x is not None)
        self.walks = dict(walks)
        self.direct = direct  # Note [Compiled launch]: the Triton launches take a specialisation key
        self._key = RunKey() if direct else None
        self.groups = pipeline.groups

    def launches(self, state_in: int) -> tuple:
        return self._chunk + self.walks.get(state_in, ())

    def run(self, values: list, state_in: int) -> None:
        key, ptrs = self._key.with_ptrs(values) if self._key is not None else (None, None)
        for launch in self._chunk:
            launch(values, key, ptrs)
        for launch in self.walks.get(state_in, ()):
            launch(values, key, ptrs)
