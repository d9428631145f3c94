# SPDX-License-Identifier: Apache-2.0
"""Load specs/*.yaml into frozen OpSpec/VariantSpec models, collecting every error with its line."""

from __future__ import annotations

import hashlib
import re
from collections.abc import Sequence
from dataclasses import asdict, replace
from pathlib import Path
from typing import Any

from kdagen.spec.errors import SpecError, format_error
from kdagen.launch_knobs import DENSE_KNOBS, dense_tuning
from kdagen.spec.model import OpSpec, TritonTuning, VariantSpec
from kdagen.targets import (
    BACKENDS, CHUNK_SIZES, DTYPES, MAX_HEAD_DIM, MIN_HEAD_DIM,
    SUB_CHUNK, TARGETS, estimate_triton_smem, hip_limits, next_pow2, triton_walk_smem,
)
from kdagen.spec.fields import int_value, names, one_of, take
from kdagen.spec.tuning import Overlay, parse_tuning, resolve_tuning
from kdagen.spec.yaml_nodes import INVALID, Report, YList, YMap, join, parse_yaml

_TOP_KEYS = ("op", "tuning", "variants")
_VARIANT_KEYS = ("label", "head_dim_k", "head_dim_v", "chunk_size", "dtype", "backends", "targets", "tuning")
_OPTIONAL = frozenset({"tuning"})  # the only optional key, at the top level and in a variant
_OP_RE = re.compile(r"[a-z][a-z0-9_]*")
# The ops templates/ implements: kda_chunk.py.j2 and kda_chunk.hip.j2 are the chunked forward.
TEMPLATED_OPS = ("kda_chunk_fwd",)
_TEMPLATED_OPS_REASON = "templates/ implements only the chunked forward (templates/triton/kda_chunk.py.j2)"
_LABEL_RE = re.compile(r"[A-Za-z0-9_]+")

CHUNK_SIZE_REASON = (
    f"the Triton templates split a chunk into {SUB_CHUNK}-row sub-chunks (tl.dot needs every dimension "
    ">= 16), tl.arange needs a power of two, and larger chunks are not templated"
)

_Error = tuple[str, int, str]  # (spec path, line, formatted message), sorted by the first two
# (spec path, index in `variants`, variant, the line of its backends if they lack triton, else None: the item's
# own triton variant is then declared or already reported)
_Declared = tuple[str, int, VariantSpec, int | None]


def load_specs(spec_dir: Path, root: Path) -> tuple[OpSpec, ...]:
    """Load every `*.yaml` in spec_dir (sorted by name); raise one SpecError listing all problems."""
    errors: list[_Error] = []
    declared: list[_Declared] = []
    files = sorted(Path(spec_dir).glob("*.yaml"))
    if not files:
        raise SpecError([f"{_rel(Path(spec_dir), root)}: no *.yaml spec files found"])
    specs = [_load_file(p, root, errors, declared) for p in files]
    _check_duplicates(declared, errors)
    _check_hip_has_triton(declared, errors)
    _raise_if_any(errors)
    return tuple(s for s in specs if s is not None)


def load_spec_file(path: Path, root: Path) -> OpSpec:
    """Load one spec file; raise one SpecError listing all its problems."""
    errors: list[_Error] = []
    declared: list[_Declared] = []
    spec = _load_file(Path(path), root, errors, declared)
    _check_duplicates(declared, errors)
    _check_hip_has_triton(declared, errors)
    _raise_if_any(errors)
    assert spec is not None
    return spec


def _raise_if_any(errors: list[_Error]) -> None:
    if errors:
        # Stable sort: by file, then line; same-line errors keep discovery order. Each error once: a
        # file-level tuning that every variant inherits is one mistake, reported at its own line.
        raise SpecError(dict.fromkeys(text for _, _, text in sorted(errors, key=lambda e: (e[0], e[1]))))


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
    top = take(doc, _TOP_KEYS, _OPTIONAL, "", report)
    op = _check_op(top, doc, report)
    file_tuning = parse_tuning(top["tuning"], "tuning", doc.key_lines.get("tuning", 1), report) \
        if "tuning" in top else {}
    variants: list[tuple[int, VariantSpec, int | None]] = []
    if "variants" in top:
        variants = _parse_variants(top["variants"], doc.key_lines["variants"], op, rel, file_tuning, report)
        declared.extend((rel, index, v, backends_line) for index, v, backends_line in variants)
    if len(errors) > n_before or op is None:
        return None
    return OpSpec(op=op, path=rel, sha256=hashlib.sha256(data).hexdigest(),
                  variants=tuple(v for _, v, _ in variants))


def _check_op(top: dict[str, Any], doc: YMap, report: Report) -> str | None:
    if "op" not in top:
        return None  # already reported: missing, or an unsupported YAML value
    value, line = top["op"], doc.key_lines["op"]
    if not isinstance(value, str) or not _OP_RE.fullmatch(value):
        report(line, "op", f"expected a snake_case op name like kda_chunk_fwd, got {value!r}")
        return None
    return one_of(value, TEMPLATED_OPS, line, "op", "op", report, _TEMPLATED_OPS_REASON)


# --------------------------------------------------------------------------------------------- variants

def _parse_variants(node: Any, line: int, op: str | None, rel: str, file_tuning: Overlay,
                    report: Report) -> list[tuple[int, VariantSpec, int | None]]:
    """(item index, variant, _Declared's backends line) for every item that validated; an item expands
    into one per backend."""
    if not isinstance(node, YList) or not node:
        report(line, "variants", f"expected a non-empty list of variant mappings, got {node!r}")
        return []
    labels: dict[str, int] = {}
    out: list[tuple[int, VariantSpec, int | None]] = []
    for i, (item, item_line) in enumerate(zip(node, node.item_lines)):
        where = join("variants", i)
        if not isinstance(item, YMap):
            report(item_line, where, f"expected a mapping with keys {', '.join(_VARIANT_KEYS)}, got {item!r}")
            continue
        parsed = _parse_variant(item, where, op, rel, file_tuning, labels, report)
        no_triton = bool(parsed) and "triton" not in item["backends"]  # parsed: backends is a valid list
        line = item.key_lines.get("backends", item_line) if no_triton else None
        out.extend((i, v, line) for v in parsed)
    return out


def _parse_variant(item: YMap, where: str, op: str | None, rel: str, file_tuning: Overlay,
                   labels: dict[str, int], report: Report) -> list[VariantSpec]:
    f = take(item, _VARIANT_KEYS, _OPTIONAL, where, report)
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
        if key in f and (value := int_value(f[key], *at(key), report)) is not None:
            if not MIN_HEAD_DIM <= value <= MAX_HEAD_DIM:
                report(*at(key), f"{value} is out of range: must be {MIN_HEAD_DIM}..{MAX_HEAD_DIM}")
                value = None
            dims[key] = value
    chunk = None
    if "chunk_size" in f and (chunk := int_value(f["chunk_size"], *at("chunk_size"), report)) is not None:
        chunk = one_of(chunk, CHUNK_SIZES, *at("chunk_size"), "chunk_size", report, CHUNK_SIZE_REASON)
    dtype = one_of(f["dtype"], tuple(DTYPES), *at("dtype"), "dtype", report) if "dtype" in f else None
    backends = names(f["backends"], *at("backends"), BACKENDS, "backend", report) if "backends" in f else None
    targets = names(f["targets"], *at("targets"), tuple(TARGETS), "target", report) if "targets" in f else None
    own_tuning: Overlay = {}
    if "tuning" in f:
        own_tuning = parse_tuning(f["tuning"], join(where, "tuning"), kl["tuning"], report)
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
            tun = resolve_tuning(backend, target, k, v, file_tuning, own_tuning, report)
            if tun is None:
                continue
            if backend == "triton":  # the HIP kernels' LDS is checked by their offline compiles (tests/aot)
                # Batches whose walks fill the GPU launch with the dense_* knobs: they must fit and compile too.
                _check_smem(where, item.line, k, v, chunk, dtype, target, tun, report)
                if _check_refused(where, item.line, target, tun, (own_tuning, file_tuning), report):
                    continue
            tuning.append((target, tun))
        if len(tuning) == len(targets):
            out.append(VariantSpec(op=op, label=label, backend=backend, dtype=dtype, head_dim_k=k,
                                   head_dim_v=v, chunk_size=chunk, targets=targets, tuning=tuple(tuning),
                                   spec_path=rel, line=item.line))
    return out


def _check_hip(where: str, line: int, k: int, v: int, chunk: int, dtype: str, targets: tuple[str, ...],
               report: Report) -> bool:
    """What the fused HIP kernels (templates/hip/) can take on each target (kdagen.targets.hip_limits names the
    limit and by how much); False, with one error per limit, otherwise."""
    why = list(dict.fromkeys(w for t in targets for w in hip_limits(k, v, chunk, dtype, t)))
    for w in why:
        report(line, join(where, "backends"), f"the hip backend cannot take this variant: {w}; drop hip from "
                                              "backends or drop that target")
    return not why


def _kib(n: int) -> str:
    return f"{n / 1024:.1f}".removesuffix(".0") + " KiB"


def _check_smem(where: str, line: int, k: int, v: int, chunk: int, dtype: str, target: str,
                tun: TritonTuning, report: Report) -> None:
    """One error per variant and target if a walk launch may not fit its shared memory: both stage counts are
    launched (runtime/triton_path.recurrence_stages) at block_v, and a batch whose walks fill the GPU launches the
    plain walk at dense_block_v on dense_intra_rows steps where they are set. The error names the knobs of the
    launches that miss, each once."""
    budget = TARGETS[target].smem_per_block
    launches = [(("block_v", s), estimate_triton_smem(k, v, chunk, dtype, tun.block_v, getattr(tun, s), target,
                                                      tun.intra_rows))
                for s in dict.fromkeys(("recurrence_stages", "recurrence_stages_sparse"))]
    if tun.dense_block_v or tun.dense_intra_rows:
        width = "dense_block_v" if tun.dense_block_v else "block_v"
        rows = min(chunk, tun.dense_intra_rows or tun.intra_rows)
        block = min(getattr(tun, width), next_pow2(v))
        launches.append(((width, "recurrence_stages"),
                         triton_walk_smem(target, k, v, dtype, rows, block, tun.recurrence_stages)))
    over = [(knobs, est) for knobs, est in launches if est > budget]
    if not over:
        return
    est = max(e for _, e in over)
    names = list(dict.fromkeys(n for knobs, _ in over for n in knobs))
    widths = [n for n in names if "block_v" in n]
    stages = [n for n in names if "stages" in n]
    report(line, where,
           f"shared memory estimate {_kib(est)} on {target} exceeds its {_kib(budget)} per block "
           f"(head_dim_k={k}, head_dim_v={v}, chunk_size={chunk}, {dtype}, "
           + ", ".join(f"{n}={getattr(tun, n)}" for n in names)
           + f"); lower {' and '.join(widths)} or {' and '.join(stages)} in tuning.triton.{target}, or chunk_size")


def _check_refused(where: str, line: int, target: str, tun: TritonTuning, layers: tuple[Overlay, ...],
                   report: Report) -> bool:
    """Whether a launch of this tuning (as is, or with its dense_* knobs) is one kdagen/targets.py refuses;
    reported at the line of the most specific tuning that set its knobs (the variant's, else the file's,
    once for every variant inheriting it), or at the variant when built-in defaults make it."""
    dense = dense_tuning(asdict(tun))
    known = TARGETS.get(target)
    for bad in known.triton_refused if known is not None else ():
        for launch, is_dense in ((asdict(tun), False), (dense, True)):
            if not bad.matches(launch):
                continue
            knobs = [DENSE_KNOBS[knob] if is_dense and knob in DENSE_KNOBS and getattr(tun, DENSE_KNOBS[knob])
                     else knob for knob, _ in bad.knobs]
            at = next((src for layer in layers for knob in knobs
                       if (src := layer.get("triton", {}).get(target, {}).get(knob)) is not None), None)
            what = ", ".join(f"{knob} {getattr(tun, knob)}" for knob in knobs)
            text = f"a batch whose walks fill the GPU launches {what}: {bad.why}" if is_dense else bad.why
            report(at.line if at else line, at.where.rpartition(".")[0] if at else where, text)
            return True
    return False


def _check_duplicates(declared: Sequence[_Declared], errors: list[_Error]) -> None:
    """One declaration per variant name (op, backend, dtype, K, V, chunk) across all spec files.

    NOTE: this also sees the valid items of files that have other errors, so that one run reports all.
    """
    seen: dict[str, VariantSpec] = {}
    for rel, index, v, _ in declared:
        first = seen.setdefault(v.name, v)
        if first is v:
            continue
        what = "duplicates" if replace(v, label=first.label) == first else "conflicts with"
        text = (f"variant {v.name} (label {v.label!r}) {what} the one declared at "
                f"{first.spec_path}:{first.line} (label {first.label!r}); declare each "
                "(backend, dtype, head_dim_k, head_dim_v, chunk_size) once and list all its targets there")
        errors.append((rel, v.line, format_error(rel, v.line, join("variants", index), text)))


def _check_hip_has_triton(declared: Sequence[_Declared], errors: list[_Error]) -> None:
    """Every hip variant has a triton variant of the same dtype, head dims and chunk size on all its targets.

    The fused plans run that variant's walk after the HIP kda_intra_kernel, and run it whole wherever a call
    cannot take the HIP kernels (no compiler or sources, a gate they do not take, use_fused_chunk=False);
    without it those calls fail with NoVariantError (runtime/planning.py).
    """
    triton = {(v.dtype, v.head_dim_k, v.head_dim_v, v.chunk_size): v for _, _, v, _ in declared
              if v.backend == "triton"}
    for rel, index, v, line in declared:
        if v.backend != "hip" or line is None:
            continue
        where = join(join("variants", index), "backends")
        twin = triton.get((v.dtype, v.head_dim_k, v.head_dim_v, v.chunk_size))
        if twin is None:
            text = (f"hip needs triton in the same variant's backends (or a triton variant of dtype {v.dtype}, "
                    f"head_dim_k={v.head_dim_k}, head_dim_v={v.head_dim_v}, chunk_size={v.chunk_size}): the fused "
                    "plans run the Triton walk after the HIP kda_intra_kernel, and the whole Triton path for "
                    "calls the HIP kernels cannot take; use backends: [triton, hip]")
        elif missing := [t for t in v.targets if t not in twin.targets]:
            text = (f"hip lists target(s) {', '.join(missing)} that the triton variant {twin.name} "
                    f"({twin.spec_path}:{twin.line}) does not; the fused plans need it on every target of the "
                    "hip variant: list the same targets in both")
        else:
            continue
        errors.append((rel, line, format_error(rel, line, where, text)))
