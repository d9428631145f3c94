# SPDX-License-Identifier: Apache-2.0
"""Render every output in memory, write generated/kdagen_kernels/ (only what changed), and check drift."""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath

import kdagen
from kdagen.render.context import RenderJob, plan, source_bytes
from kdagen.render.env import RenderError, loaded_templates, make_env, render_template
from kdagen.spec.load import load_specs
from kdagen.spec.model import OpSpec

PACKAGE_DIR = Path("generated") / "kdagen_kernels"  # relative to the project root
MANIFEST = "_manifest.json"
GENERATED_MARK = "@generated"


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


@dataclass
class EmitReport:
    written: list[Path] = field(default_factory=list)
    deleted: list[Path] = field(default_factory=list)
    unchanged: list[Path] = field(default_factory=list)


class FileManager:
    """The outputs of one run, keyed by path relative to generated/kdagen_kernels/.

    It refuses two outputs with the same path, writes only files whose bytes changed (so mtimes and
    editors stay quiet), and deletes files that the previous manifest owned and this run no longer
    produces. Files the manifest never listed are never deleted.
    """

    def __init__(self) -> None:
        self._files: dict[str, str] = {}
        self._origin: dict[str, str] = {}

    def add(self, relpath: str, text: str, origin: str) -> None:
        p = PurePosixPath(relpath)
        if p.is_absolute() or ".." in p.parts or str(p) != relpath:
            raise RenderError(f"{origin}: output path {relpath!r} must be a normalised relative path")
        if relpath in self._files:
            raise RenderError(f"two outputs want {PACKAGE_DIR.as_posix()}/{relpath}: "
                              f"{self._origin[relpath]} and {origin}")
        self._files[relpath] = text
        self._origin[relpath] = origin

    def files(self) -> dict[str, str]:
        return dict(sorted(self._files.items()))

    def write(self, out_dir: Path) -> EmitReport:
        report = EmitReport()
        previous = _read_manifest(out_dir).get("outputs", {})
        for rel, text in self.files().items():
            target = out_dir / rel
            data = text.encode("utf-8")
            if target.is_file() and target.read_bytes() == data:
                if target.stat().st_mode & 0o044 != 0o044:  # early emits wrote 0600; keep sources readable
                    target.chmod(0o644)
                report.unchanged.append(target)
                continue
            _atomic_write(target, data)
            report.written.append(target)
        for rel in sorted(set(previous) - set(self._files) - {MANIFEST}):
            target = out_dir / rel
            if target.is_file():
                target.unlink()
                report.deleted.append(target)
                _prune_empty_dirs(target.parent, out_dir)
        return report


def _atomic_write(target: Path, data: bytes) -> None:
    # A crash mid-write must not leave a half file that the drift check would call "hand-edited".
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.", suffix=".tmp")
    try:
        os.fchmod(fd, 0o644)  # mkstemp makes 0600; generated sources are ordinary readable files
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.replace(tmp, target)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def _prune_empty_dirs(d: Path, stop: Path) -> None:
    while d != stop and d.is_dir() and not any(d.iterdir()):
        d.rmdir()
        d = d.parent


def _read_manifest(out_dir: Path) -> dict:
    try:
        data = json.loads((out_dir / MANIFEST).read_text("utf-8"))
    except (OSError, ValueError):
        return {}  # no or unreadable manifest: nothing is known to be ours, so nothing gets deleted
    return data if isinstance(data, dict) else {}


def _normalise(text: str) -> str:
    # Exactly one trailing newline, whatever the template's last line does.
    return text.rstrip("\n") + "\n"


def _build(root: Path) -> FileManager:
    root = Path(root)
    specs = load_specs(root / "specs", root)
    env = make_env(root)
    fm = FileManager()
    jobs = plan(root, specs)
    for job in jobs:
        text = _normalise(render_template(env, job.template, job.context, job.output))
        if GENERATED_MARK not in text.split("\n", 1)[0]:
            raise RenderError(f"templates/{job.template}: the first line of {job.output} must be "
                              "`{{ stamp }}` (every generated file starts with an @generated stamp)")
        fm.add(job.output, text, f"templates/{job.template} for {', '.join(job.specs) or 'no spec'}")
    templates = sorted(set(loaded_templates(env)).union(*(job.inputs for job in jobs)))
    fm.add(MANIFEST, _manifest(root, specs, templates, jobs, fm.files()), "the manifest")
    return fm


def _manifest(root: Path, specs: Sequence[OpSpec], templates: list[str], jobs: Sequence[RenderJob],
              files: Mapping[str, str]) -> str:
    """What produced generated/: kdagen version, the sha256 of every input and output, and per output
    the template files (and hand-written sources) its stamp covers and the stamp's hash (render/context.py
    stamp_digest)."""
    data = {
        GENERATED_MARK: f"by kdagen {kdagen.__version__} - DO NOT EDIT; `nox -s generate` rewrites it",
        "kdagen_version": kdagen.__version__,
        "specs": {s.path: s.sha256 for s in specs},
        "templates": {f"templates/{t}": _sha((root / "templates" / t).read_bytes()) for t in templates},
        "outputs": {rel: _sha(text.encode("utf-8")) for rel, text in files.items()},
        "sources": {src: _sha(source_bytes(src)) for src in sorted({s for job in jobs for s in job.sources})},
        "inputs": {job.output: {"stamp": job.digest, "templates": [f"templates/{t}" for t in job.inputs],
                                **({"sources": list(job.sources)} if job.sources else {})}
                   for job in sorted(jobs, key=lambda j: j.output)},
    }
    return json.dumps(data, sort_keys=True, indent=1) + "\n"


def render_all(root: Path) -> dict[str, str]:
    """Every generated file, path relative to generated/kdagen_kernels/ -> text. Writes nothing.

    Raises SpecError for invalid specs and RenderError for template problems.
    """
    return _build(root).files()


def emit(root: Path, out_dir: Path | None = None) -> EmitReport:
    """Render and write; the report says what was written, deleted and left alone."""
    root = Path(root)
    return _build(root).write(Path(out_dir) if out_dir is not None else root / PACKAGE_DIR)


def generate(root: Path, out_dir: Path | None = None) -> list[Path]:
    """Render and write; return the paths whose bytes changed."""
    return emit(root, out_dir).written


def check(root: Path) -> list[str]:
    """One message per generated file that differs from a fresh render (changed, missing or extra).

    Also tells a hand edit (the file no longer matches the hash the manifest recorded for it) from a
    stale render (a spec or template changed since the last `generate`).
    """
    root = Path(root)
    fresh = render_all(root)
    out_dir = root / PACKAGE_DIR
    old = _read_manifest(out_dir)
    new = json.loads(fresh[MANIFEST])
    changed_inputs = [p for kind in ("specs", "templates") for p, h in new[kind].items()
                      if old.get(kind, {}).get(p) != h]
    changed_inputs += [f"{p} (removed)" for kind in ("specs", "templates")
                       for p in old.get(kind, {}) if p not in new[kind]]
    stale_hint = (f"inputs changed since the last generate: {', '.join(changed_inputs)}"
                  if changed_inputs else "")
    messages: list[str] = []
    for rel, text in fresh.items():
        shown = (PACKAGE_DIR / rel).as_posix()
        path = out_dir / rel
        if not path.is_file():
            messages.append(f"{shown}: missing")
            continue
        on_disk = path.read_bytes()
        if on_disk == text.encode("utf-8"):
            continue
        why = [f"differs from a fresh render from line {_first_diff_line(on_disk, text)}"]
        recorded = old.get("outputs", {}).get(rel)
        if rel != MANIFEST and recorded is not None and recorded != _sha(on_disk):
            why.append(f"edited by hand (its sha256 no longer matches {MANIFEST})")
        elif stale_hint:
            why.append(stale_hint)
        messages.append(f"{shown}: changed: {'; '.join(why)}")
    for rel in sorted(_files_on_disk(out_dir) - set(fresh)):
        messages.append(f"{(PACKAGE_DIR / rel).as_posix()}: extra file: no spec or template produces it")
    return messages


def _first_diff_line(on_disk: bytes, text: str) -> int:
    a = on_disk.decode("utf-8", errors="replace").split("\n")
    b = text.split("\n")
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return i + 1
    return min(len(a), len(b)) + 1


def _files_on_disk(out_dir: Path) -> set[str]:
    if not out_dir.is_dir():
        return set()
    return {
        p.relative_to(out_dir).as_posix()
        for p in out_dir.rglob("*")
        if p.is_file() and "__pycache__" not in p.relative_to(out_dir).parts
    }
