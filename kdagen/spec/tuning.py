# SPDX-License-Identifier: Apache-2.0
"""The spec's `tuning` blocks: parsed per backend and target, checked per knob, and resolved for one variant
(built-in defaults <- file-level <- variant-level), each value remembering the line it came from."""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any

from kdagen.spec.fields import int_value, take
from kdagen.spec.model import TritonTuning
from kdagen.spec.yaml_nodes import Report, YMap, join
from kdagen.targets import BACKENDS, MAX_STAGES, TARGETS, WARPS, next_pow2

TUNING_FIELDS = tuple(f.name for f in fields(TritonTuning))
_TUNING_DEFAULTS = TritonTuning()


@dataclass(frozen=True)
class Src:
    """A tuning value and where it was written."""

    value: int
    line: int
    where: str


# backend -> target -> field -> value with its source
Overlay = dict[str, dict[str, dict[str, Src]]]


def _check_tuning_value(name: str, value: int) -> str | None:
    """Why a tuning value is out of range, or None. Keyed on the field-name suffix so that a new
    TritonTuning field without a rule fails the import below rather than going unchecked."""
    if name.startswith("dense_"):
        # 0: the knob it replaces, unchanged.
        why = _check_tuning_value(name.removeprefix("dense_"), value) if value else None
        return None if why is None else f"must be 0 (the same as {name.removeprefix('dense_')}) or {why.removeprefix('must be ')}"
    if name.endswith("_warps"):
        return None if value in WARPS else f"must be one of {', '.join(map(str, WARPS))}"
    if name.endswith(("_stages", "_stages_sparse")):
        return None if 1 <= value <= MAX_STAGES else f"must be 1..{MAX_STAGES}"
    if name in ("prologue_block_k", "wu_block_k"):
        ok = value >= 16 and value & (value - 1) == 0
        return None if ok else "must be a power of two >= 16 (and <= the padded head dims it slices)"
    if name == "intra_rows":
        return None if value in (16, 32) else "must be 16 or 32 (rows per kda_intra program and walk step)"
    if name in ("block_v", "intra_block_v"):
        ok = value >= 16 and value & (value - 1) == 0
        return None if ok else "must be a power of two >= 16 (and <= next_pow2(head_dim_v))"
    raise NotImplementedError(f"no validation rule for TritonTuning.{name}")


for _name in TUNING_FIELDS:
    _check_tuning_value(_name, getattr(_TUNING_DEFAULTS, _name))


def parse_tuning(node: Any, where: str, line: int, report: Report) -> Overlay:
    """tuning.<backend>.<target>.<field>; every level checked, unknown keys rejected."""
    out: Overlay = {}
    if not isinstance(node, YMap):
        report(line, where, f"expected a mapping like {{triton: {{sm_90: {{block_v: 64}}}}}}, got {node!r}")
        return out
    backends = take(node, BACKENDS, frozenset(BACKENDS), where, report)
    for backend, per_target in backends.items():
        b_where, b_line = join(where, backend), node.key_lines[backend]
        if backend != "triton":
            # Accepting it would be a silent no-op: nothing reads it.
            report(b_line, b_where, f"the {backend} backend has no spec tuning knobs (its V slice is per target "
                   "in kdagen/targets.py; the plan chooses its stages and group count, pipeline= and groups= "
                   f"pin them); remove tuning.{backend}")
            continue
        if not isinstance(per_target, YMap):
            report(b_line, b_where, f"expected a mapping of targets ({', '.join(TARGETS)}), got {per_target!r}")
            continue
        targets = take(per_target, tuple(TARGETS), frozenset(TARGETS), b_where, report)
        for target, knobs in targets.items():
            t_where, t_line = join(b_where, target), per_target.key_lines[target]
            if not isinstance(knobs, YMap):
                report(t_line, t_where, f"expected a mapping of {', '.join(TUNING_FIELDS)}, got {knobs!r}")
                continue
            vals = take(knobs, TUNING_FIELDS, frozenset(TUNING_FIELDS), t_where, report)
            srcs: dict[str, Src] = {}
            for name, value in vals.items():
                k_where, k_line = join(t_where, name), knobs.key_lines[name]
                if (ivalue := int_value(value, k_line, k_where, report)) is None:
                    continue
                if (why := _check_tuning_value(name, ivalue)) is not None:
                    report(k_line, k_where, f"{ivalue} is out of range: {why}")
                    continue
                srcs[name] = Src(ivalue, k_line, k_where)
            out.setdefault(backend, {})[target] = srcs
    return out


def resolve_tuning(backend: str, target: str, head_dim_k: int, head_dim_v: int, file_layer: Overlay,
                    variant_layer: Overlay, report: Report) -> TritonTuning | None:
    """Built-in defaults <- file-level tuning <- variant-level tuning, for one (backend, target)."""
    values = {name: getattr(_TUNING_DEFAULTS, name) for name in TUNING_FIELDS}
    for layer in (file_layer, variant_layer):
        values.update({n: src.value for n, src in layer.get(backend, {}).get(target, {}).items()})
    # block_v slices V, prologue_block_k K; wu_block_k slices both (kda_wu's u walk uses the same width).
    bounds = {"block_v": (next_pow2(head_dim_v), "next_pow2(head_dim_v)"),
              "dense_block_v": (next_pow2(head_dim_v), "next_pow2(head_dim_v)"),
              "intra_block_v": (next_pow2(head_dim_v), "next_pow2(head_dim_v)"),
              "prologue_block_k": (next_pow2(head_dim_k), "next_pow2(head_dim_k)"),
              "wu_block_k": (min(next_pow2(head_dim_k), next_pow2(head_dim_v)),
                             "min(next_pow2(head_dim_k), next_pow2(head_dim_v))")}
    for name, (bound, what) in bounds.items():
        if values[name] <= bound:  # dense_block_v 0 (block_v's) included
            continue
        own = variant_layer.get(backend, {}).get(target, {}).get(name)
        if own is not None:
            report(own.line, own.where, f"{own.value} exceeds {what} = {bound}; use {name} <= {bound}")
            return None
        # NOTE: an inherited value (built-in or file-level) is a default for every variant of the file;
        # a narrow variant takes its whole head dim instead of forcing the user to override it per target.
        values[name] = bound
    return TritonTuning(**values)
