# SPDX-License-Identifier: Apache-2.0
"""Load specs/*.yaml into frozen OpSpec/VariantSpec models, collecting every error with its line."""

from __future__ import annotations

import difflib
import hashlib
import re
from collections.abc import Sequence
from dataclasses import asdict, dataclass, fields, replace
from pathlib import Path
from typing import Any

from kdagen.spec.errors import SpecError, format_error
from kdagen.spec.model import OpSpec, TritonTuning, VariantSpec
from kdagen.targets import (
    BACKENDS, CHUNK_SIZES, DTYPES, HIP_CHUNK_SIZE, HIP_COLUMN_TILE, HIP_DTYPES, HIP_THREADS, MAX_HEAD_DIM, MAX_STAGES,
    MIN_HEAD_DIM, SUB_CHUNK, TARGETS, WARPS, estimate_triton_smem, next_pow2, refused_config,
)
from kdagen.spec.yaml_nodes import INVALID, Report, YList, YMap, join, parse_yaml

_TOP_KEYS = ("op", "tuning", "variants")
_VARIANT_KEYS = ("label", "head_dim_k", "head_dim_v", "chunk_size", "dtype", "backends", "targets", "tuning")
_OPTIONAL = frozenset({"tuning"})  # the only optional key, at the top level and in a variant
_TUNING_FIELDS = tuple(f.name for f in fields(TritonTuning))
_TUNING_DEFAULTS = TritonTuning()
_OP_RE = re.compile(r"[a-z][a-z0-9_]*")
_LABEL_RE = re.compile(r"[A-Za-z0-9_]+")

CHUNK_SIZE_REASON = (
    f"the Triton templates split a chunk into {SUB_CHUNK}-row sub-chunks (tl.dot needs every dimension "
    ">= 16), tl.arange needs a power of two, and larger chunks are not templated"
)


@dataclass(frozen=True)
class _Src:
    """A tuning value and where it was written."""

    value: int
    line: int
    where: str


# backend -> target -> field -> value with its source
_Overlay = dict[str, dict[str, dict[str, _Src]]]
_Error = tuple[str, int, str]  # (spec path, line, formatted message), sorted by the first two
_Declared = tuple[str, int, VariantSpec]  # (spec path, index in `variants`, variant)


def load_specs(spec_dir: Path, root: Path) -> tuple[OpSpec, ...]:
    """Load every `*.yaml` in spec_dir (sorted by name); raise one SpecError listing all problems."""
    errors: list[_Error] = []
    declared: list[_Declared] = []
    files = sorted(Path(spec_dir).glob("*.yaml"))
    if not files:
        raise SpecError([f"{_rel(Path(spec_dir), root)}: no *.yaml spec files found"])
    specs = [_load_file(p, root, errors, declared) for p in files]
    _check_duplicates(declared, errors)
    _raise_if_any(errors)
    return tuple(s for s in specs if s is not None)


def load_spec_file(path: Path, root: Path) -> OpSpec:
    """Load one spec file; raise one SpecError listing all its problems."""
    errors: list[_Error] = []
    declared: list[_Declared] = []
    spec = _load_file(Path(path), root, errors, declared)
    _check_duplicates(declared, errors)
    _raise_if_any(errors)
    assert spec is not None
    return spec


def _raise_if_any(errors: list[_Error]) -> None:
    if errors:
        # Stable sort: by file, then line; same-line errors keep discovery order.
        raise SpecError(text for _, _, text in sorted(errors, key=lambda e: (e[0], e[1])))


def _rel(path: Path, root: Path) -> str:
    try:
        return path.resolve().relative_to(Path(root).resolve()).as_posix()
    except ValueError:
        return path.as_posix()


def _load_file(path: Path, root: Path, errors: list[_Error], declared: list[_Declared]) -> OpSpec | None:
    rel = _rel(path, root)
    n_before = len(errors)

    def report(line: int, where: str, message: str) -> None:
        errors.append((rel, line, format_error(rel, line, where, message)))

    data = path.read_bytes()
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = data[: exc.start].count(b"\n") + 1
        report(line, "", f"not UTF-8 text ({exc.reason} at byte {exc.start})")
        return None
    doc = parse_yaml(text, report)
    if doc is None:
        if len(errors) == n_before:
            report(1, "", "empty spec file; see the schema comment in specs/kda_chunk_fwd.yaml")
        return None
    if doc is INVALID:
        return None
    if not isinstance(doc, YMap):
        report(1, "", f"the top level must be a mapping with keys {', '.join(_TOP_KEYS)}")
        return None
    top = _take(doc, _TOP_KEYS, _OPTIONAL, "", report)
    op = _check_op(top, doc, report)
    file_tuning = _parse_tuning(top["tuning"], "tuning", doc.key_lines.get("tuning", 1), report) \
        if "tuning" in top else {}
    variants: list[tuple[int, VariantSpec]] = []
    if "variants" in top:
        variants = _parse_variants(top["variants"], doc.key_lines["variants"], op, rel, file_tuning, report)
        declared.extend((rel, index, v) for index, v in variants)
    if len(errors) > n_before or op is None:
        return None
    return OpSpec(op=op, path=rel, sha256=hashlib.sha256(data).hexdigest(),
                  variants=tuple(v for _, v in variants))


def _check_op(top: dict[str, Any], doc: YMap, report: Report) -> str | None:
    if "op" not in top:
        return None  # already reported: missing, or an unsupported YAML value
    value, line = top["op"], doc.key_lines["op"]
    if not isinstance(value, str) or not _OP_RE.fullmatch(value):
        report(line, "op", f"expected a snake_case op name like kda_chunk_fwd, got {value!r}")
        return None
    return value


# ---------------------------------------------------------------------------------------------- helpers

def _suggest(word: str, allowed: Sequence[str]) -> str:
    close = difflib.get_close_matches(word, list(allowed), n=1, cutoff=0.6)
    return f"; did you mean {close[0]!r}?" if close else ""


def _take(node: YMap, allowed: Sequence[str], optional: frozenset[str], where: str,
          report: Report) -> dict[str, Any]:
    """Pop the known keys of a mapping, report unknown ones (with a did-you-mean) and missing ones.

    A value that was already reported (INVALID) is present but left out of the result.
    """
    out: dict[str, Any] = {}
    for key, value in node.items():  # in source order, so that same-line errors read left to right
        if key in allowed:
            out[key] = value
        else:
            hint = _suggest(key, allowed) or f"; expected one of: {', '.join(allowed)}"
            report(node.key_lines[key], join(where, key), f"unknown key{hint}")
    for key in allowed:
        if key not in out and key not in optional:
            report(node.line, join(where, key), "missing required key")
    return {k: v for k, v in out.items() if v is not INVALID}


def _type_name(value: Any) -> str:
    return "null" if value is None else type(value).__name__


def _int(value: Any, line: int, where: str, report: Report) -> int | None:
    # bool is an int in Python; `true` is never a head dim.
    if isinstance(value, bool) or not isinstance(value, int):
        report(line, where, f"expected an integer, got {value!r} ({_type_name(value)})")
        return None
    return value


def _one_of(value: Any, allowed: Sequence[Any], line: int, where: str, what: str, report: Report,
            reason: str = "") -> Any:
    if value in allowed and not isinstance(value, bool):
        return value
    shown = ", ".join(str(a) for a in allowed)
    hint = _suggest(value, [str(a) for a in allowed]) if isinstance(value, str) else ""
    why = f": {reason}" if reason else ""
    report(line, where, f"{value!r} is not a supported {what}{hint} (supported: {shown}){why}")
    return None


def _names(value: Any, line: int, where: str, allowed: Sequence[str], what: str,
           report: Report) -> tuple[str, ...] | None:
    """A non-empty list of distinct names out of `allowed`."""
    if not isinstance(value, YList):
        report(line, where, f"expected a list of {what}s like [{allowed[0]}], got {value!r}")
        return None
    if not value:
        report(line, where, f"must list at least one {what} (supported: {', '.join(allowed)})")
        return None
    out: list[str] = []
    ok = True
    for i, (item, item_line) in enumerate(zip(value, value.item_lines)):
        if item is INVALID:
            ok = False
        elif item in out:
            report(item_line, join(where, i), f"{item!r} is listed twice")
            ok = False
        elif _one_of(item, allowed, item_line, join(where, i), what, report) is None:
            ok = False
        else:
            out.append(item)
    return tuple(out) if ok else None


# ----------------------------------------------------------------------------------------------- tuning

def _check_tuning_value(name: str, value: int) -> str | None:
    """Why a tuning value is out of range, or None. Keyed on the field-name suffix so that a new
    TritonTuning field without a rule fails the import below rather than going unchecked."""
    if name.endswith("_warps"):
        return None if value in WARPS else f"must be one of {', '.join(map(str, WARPS))}"
    if name.endswith(("_stages", "_stages_sparse")):
        return None if 1 <= value <= MAX_STAGES else f"must be 1..{MAX_STAGES}"
    if name in ("prologue_block_k", "wu_block_k"):
        ok = value >= 16 and value & (value - 1) == 0
        return None if ok else "must be a power of two >= 16 (and <= the padded head dims it slices)"
    if name == "block_v":
        ok = value >= 16 and value & (value - 1) == 0
        return None if ok else "must be a power of two >= 16 (and <= next_pow2(head_dim_v))"
    raise NotImplementedError(f"no validation rule for TritonTuning.{name}")


for _name in _TUNING_FIELDS:
    _check_tuning_value(_name, getattr(_TUNING_DEFAULTS, _name))


def _parse_tuning(node: Any, where: str, line: int, report: Report) -> _Overlay:
    """tuning.<backend>.<target>.<field>; every level checked, unknown keys rejected."""
    out: _Overlay = {}
    if not isinstance(node, YMap):
        report(line, where, f"expected a mapping like {{triton: {{sm_90: {{block_v: 64}}}}}}, got {node!r}")
        return out
    backends = _take(node, BACKENDS, frozenset(BACKENDS), where, report)
    for backend, per_target in backends.items():
        b_where, b_line = join(where, backend), node.key_lines[backend]
        if backend != "triton":
            # Accepting it would be a silent no-op: nothing reads it.
            report(b_line, b_where, f"the {backend} backend has no spec tuning knobs (its V slice is per target "
                   "in kdagen/targets.py, its group count is chosen per call and KDAGEN_FUSED_GROUPS pins "
                   f"it); remove tuning.{backend}")
            continue
        if not isinstance(per_target, YMap):
            report(b_line, b_where, f"expected a mapping of targets ({', '.join(TARGETS)}), got {per_target!r}")
            continue
        targets = _take(per_target, tuple(TARGETS), frozenset(TARGETS), b_where, report)
        for target, knobs in targets.items():
            t_where, t_line = join(b_where, target), per_target.key_lines[target]
            if not isinstance(knobs, YMap):
                report(t_line, t_where, f"expected a mapping of {', '.join(_TUNING_FIELDS)}, got {knobs!r}")
                continue
            vals = _take(knobs, _TUNING_FIELDS, frozenset(_TUNING_FIELDS), t_where, report)
            srcs: dict[str, _Src] = {}
            for name, value in vals.items():
                k_where, k_line = join(t_where, name), knobs.key_lines[name]
                if (ivalue := _int(value, k_line, k_where, report)) is None:
                    continue
                if (why := _check_tuning_value(name, ivalue)) is not None:
                    report(k_line, k_where, f"{ivalue} is out of range: {why}")
                    continue
                srcs[name] = _Src(ivalue, k_line, k_where)
            out.setdefault(backend, {})[target] = srcs
    return out


def _resolve_tuning(backend: str, target: str, head_dim_k: int, head_dim_v: int, file_layer: _Overlay,
                    variant_layer: _Overlay, report: Report) -> TritonTuning | None:
    """Built-in defaults <- file-level tuning <- variant-level tuning, for one (backend, target)."""
    values = {name: getattr(_TUNING_DEFAULTS, name) for name in _TUNING_FIELDS}
    for layer in (file_layer, variant_layer):
        values.update({n: src.value for n, src in layer.get(backend, {}).get(target, {}).items()})
    # block_v slices V, prologue_block_k K; wu_block_k slices both (kda_wu's u walk uses the same width).
    bounds = {"block_v": (next_pow2(head_dim_v), "next_pow2(head_dim_v)"),
              "prologue_block_k": (next_pow2(head_dim_k), "next_pow2(head_dim_k)"),
              "wu_block_k": (min(next_pow2(head_dim_k), next_pow2(head_dim_v)),
                             "min(next_pow2(head_dim_k), next_pow2(head_dim_v))")}
    for name, (bound, what) in bounds.items():
        if values[name] <= bound:
            continue
        own = variant_layer.get(backend, {}).get(target, {}).get(name)
        if own is not None:
            report(own.line, own.where, f"{own.value} exceeds {what} = {bound}; use {name} <= {bound}")
            return None
        # NOTE: an inherited value (built-in or file-level) is a default for every variant of the file;
        # a narrow variant takes its whole head dim instead of forcing the user to override it per target.
        values[name] = bound
    return TritonTuning(**values)


# --------------------------------------------------------------------------------------------- variants

def _parse_variants(node: Any, line: int, op: str | None, rel: str, file_tuning: _Overlay,
                    report: Report) -> list[tuple[int, VariantSpec]]:
    """(item index, variant) for every item that validated; an item expands into one per backend."""
    if not isinstance(node, YList) or not node:
        report(line, "variants", f"expected a non-empty list of variant mappings, got {node!r}")
        return []
    labels: dict[str, int] = {}
    out: list[tuple[int, VariantSpec]] = []
    for i, (item, item_line) in enumerate(zip(node, node.item_lines)):
        where = join("variants", i)
        if not isinstance(item, YMap):
            report(item_line, where, f"expected a mapping with keys {', '.join(_VARIANT_KEYS)}, got {item!r}")
            continue
        out.extend((i, v) for v in _parse_variant(item, where, op, rel, file_tuning, labels, report))
    return out


def _parse_variant(item: YMap, where: str, op: str | None, rel: str, file_tuning: _Overlay,
                   labels: dict[str, int], report: Report) -> list[VariantSpec]:
    f = _take(item, _VARIANT_KEYS, _OPTIONAL, where, report)
    kl = item.key_lines

    def at(key: str) -> tuple[int, str]:
        return kl.get(key, item.line), join(where, key)

    label = f.get("label")
    if "label" in f:
        if not isinstance(label, str) or not _LABEL_RE.fullmatch(label):
            report(*at("label"), f"expected a short name of letters, digits and _, got {label!r}")
            label = None
        elif label in labels:
            report(*at("label"), f"duplicate label {label!r} (first at line {labels[label]})")
        else:
            labels[label] = kl["label"]
    dims: dict[str, int | None] = {}
    for key in ("head_dim_k", "head_dim_v"):
        if key in f and (value := _int(f[key], *at(key), report)) is not None:
            if not MIN_HEAD_DIM <= value <= MAX_HEAD_DIM:
                report(*at(key), f"{value} is out of range: must be {MIN_HEAD_DIM}..{MAX_HEAD_DIM}")
                value = None
            dims[key] = value
    chunk = None
    if "chunk_size" in f and (chunk := _int(f["chunk_size"], *at("chunk_size"), report)) is not None:
        chunk = _one_of(chunk, CHUNK_SIZES, *at("chunk_size"), "chunk_size", report, CHUNK_SIZE_REASON)
    dtype = _one_of(f["dtype"], tuple(DTYPES), *at("dtype"), "dtype", report) if "dtype" in f else None
    backends = _names(f["backends"], *at("backends"), BACKENDS, "backend", report) if "backends" in f else None
    targets = _names(f["targets"], *at("targets"), tuple(TARGETS), "target", report) if "targets" in f else None
    own_tuning: _Overlay = {}
    if "tuning" in f:
        own_tuning = _parse_tuning(f["tuning"], join(where, "tuning"), kl["tuning"], report)
    for backend, per_target in own_tuning.items():
        if backends is not None and backend not in backends:
            report(kl["tuning"], join(join(where, "tuning"), backend), f"the variant has no backend {backend!r}")
        for target in per_target:
            if targets is not None and target not in targets:
                report(kl["tuning"], join(join(join(where, "tuning"), backend), target),
                       f"the variant does not list target {target!r} in targets")

    k, v = dims.get("head_dim_k"), dims.get("head_dim_v")
    if None in (op, label, k, v, chunk, dtype, backends, targets):
        return []
    assert op and label and k and v and chunk and dtype and backends and targets
    out: list[VariantSpec] = []
    for backend in backends:
        if backend == "hip" and not _check_hip(where, at("backends")[0], k, v, chunk, dtype, targets, report):
            continue
        tuning: list[tuple[str, TritonTuning]] = []
        for target in targets:
            tun = _resolve_tuning(backend, target, k, v, file_tuning, own_tuning, report)
            if tun is None:
                continue
            if backend == "triton":  # the HIP kernels' LDS is checked by their offline compiles (tests/aot)
                _check_smem(where, item.line, k, v, chunk, dtype, target, tun, report)
                if (why := refused_config(target, asdict(tun))) is not None:
                    report(item.line, where, f"tuning.triton.{target}: {why}")
                    continue
            tuning.append((target, tun))
        if len(tuning) == len(targets):
            out.append(VariantSpec(op=op, label=label, backend=backend, dtype=dtype, head_dim_k=k,
                                   head_dim_v=v, chunk_size=chunk, targets=targets, tuning=tuple(tuning),
                                   spec_path=rel, line=item.line))
    return out


def _check_hip(where: str, line: int, k: int, v: int, chunk: int, dtype: str, targets: tuple[str, ...],
               report: Report) -> bool:
    """What the fused HIP templates (templates/hip/) support; False (with errors reported) otherwise."""
    why = []
    if dtype not in HIP_DTYPES:
        why.append(f"dtype {dtype} (supported: {', '.join(HIP_DTYPES)})")
    if chunk != HIP_CHUNK_SIZE:
        why.append(f"chunk_size {chunk} (supported: {HIP_CHUNK_SIZE})")
    for name, dim in (("head_dim_k", k), ("head_dim_v", v)):
        if dim % HIP_COLUMN_TILE:
            why.append(f"{name} {dim} (must be a multiple of {HIP_COLUMN_TILE})")
        for t in targets:  # the recurrence's V slices also tile the K transfer rows of the group scan
            sl = TARGETS[t].hip_v_slice if t in TARGETS else 1
            if dim % sl:
                why.append(f"{name} {dim} on {t} (must be a multiple of its V slice, {sl})")
    if HIP_THREADS % k:
        why.append(f"head_dim_k {k} (must divide {HIP_THREADS}: the group scan maps threads to K columns)")
    for w in why:
        report(line, join(where, "backends"), f"the hip backend does not support {w}; drop hip from backends")
    return not why


def _kib(n: int) -> str:
    return f"{n / 1024:.1f}".removesuffix(".0") + " KiB"


def _check_smem(where: str, line: int, k: int, v: int, chunk: int, dtype: str, target: str,
                tun: TritonTuning, report: Report) -> None:
    # Both stage counts are launched (runtime/triton_path.recurrence_stages), so both must fit.
    budget = TARGETS[target].smem_per_block
    over = [knob for knob in ("recurrence_stages", "recurrence_stages_sparse")
            if estimate_triton_smem(k, v, chunk, dtype, tun.block_v, getattr(tun, knob)) > budget]
    if over:
        est = estimate_triton_smem(k, v, chunk, dtype, tun.block_v, getattr(tun, over[0]))
        report(line, where,
               f"shared memory estimate {_kib(est)} on {target} exceeds its {_kib(budget)} per block "
               f"(head_dim_k={k}, head_dim_v={v}, chunk_size={chunk}, {dtype}, block_v={tun.block_v}, "
               + ", ".join(f"{knob}={getattr(tun, knob)}" for knob in over)
               + f"); lower block_v or {' and '.join(over)} in tuning.triton.{target}, or chunk_size")


def _check_duplicates(declared: Sequence[_Declared], errors: list[_Error]) -> None:
    """One declaration per variant name (op, backend, dtype, K, V, chunk) across all spec files.

    NOTE: this also sees the valid items of files that have other errors, so that one run reports all.
    """
    seen: dict[str, VariantSpec] = {}
    for rel, index, v in declared:
        first = seen.setdefault(v.name, v)
        if first is v:
            continue
        what = "duplicates" if replace(v, label=first.label) == first else "conflicts with"
        text = (f"variant {v.name} (label {v.label!r}) {what} the one declared at "
                f"{first.spec_path}:{first.line} (label {first.label!r}); declare each "
                "(backend, dtype, head_dim_k, head_dim_v, chunk_size) once and list all its targets there")
        errors.append((rel, v.line, format_error(rel, v.line, join("variants", index), text)))
