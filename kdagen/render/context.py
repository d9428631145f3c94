# SPDX-License-Identifier: Apache-2.0
"""What each template sees: the render plan (template, output, context) built from the loaded specs."""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path, PurePosixPath
from typing import Any

import kdagen
from kdagen.kernels import hip as hip_kernels
from kdagen.kernels import kda as kda_kernels
from kdagen.kernels import metadata as metadata_kernels
from kdagen.kernels import op_schema
from kdagen.render.env import RenderError, torch_dtype, triton_dtype
from kdagen.spec.model import OpSpec, VariantSpec
from kdagen.targets import (
    AMD_MIN_WAVES_PER_SIMD, HIP_ABI, HIP_CUDA_INTRA_BLOCKS, HIP_CUDA_WALK_BLOCKS, SUB_CHUNK, TARGETS, hip_cuda_blocks,
    hip_intra_threads, next_pow2,
)

# backend -> (template, output path relative to generated/kdagen_kernels/ with {name} = VariantSpec.name)
VARIANT_TEMPLATES: dict[str, tuple[str, str]] = {
    "triton": ("triton/kda_chunk.py.j2", "triton/{name}.py"),
}

# The hand-written device code the Triton variant modules import (this kdagen's own, as for the kernel
# declarations in kdagen/kernels/): their stamps cover its files, so an edit there changes every Triton
# variant's stamp and shows in the manifest, named "kdagen/triton_kernels/<file>". Triton's own cache key
# covers it too: a wrapper's key hashes the source of every @triton.jit function it calls.
TRITON_DEVICE_DIR = Path(kdagen.__file__).resolve().parent / "triton_kernels"

# The fused HIP backend renders one source per (variant, target): (template, output pattern with {name}
# and {target}). Its headers in templates/hip/include/ are not rendered: they are copied verbatim (behind
# a stamp line) into hip/include/, next to the sources that #include them. The registry lists hip variants
# like the others; the dispatcher builds them on first use (runtime/fused_path.load_fused), never at import.
HIP_TEMPLATE: tuple[str, str] = ("hip/kda_chunk.hip.j2", "hip/{name}__{target}.hip")
HIP_INCLUDE_DIR = "hip/include"  # relative to templates/ and to generated/kdagen_kernels/
HIP_VERBATIM_TEMPLATE = "hip/verbatim.j2"

# Rendered once for the whole package: (template, output path relative to generated/kdagen_kernels/).
PACKAGE_TEMPLATES: list[tuple[str, str]] = [
    ("package/__init__.py.j2", "__init__.py"),
    ("package/_registry.py.j2", "_registry.py"),
    ("package/triton_init.py.j2", "triton/__init__.py"),
    ("triton/chunk_metadata.py.j2", "triton/chunk_metadata.py"),
]
# What of the specs a package file renders, for its stamp: every variant (the default), only the declared
# chunk sizes, or nothing. Adding a variant then rewrites the index files and leaves the others alone.
PACKAGE_INPUTS: dict[str, str] = {"triton/__init__.py": "nothing", "triton/chunk_metadata.py": "chunk_sizes"}
_INCLUDE_RE = re.compile(r'^\s*#\s*include\s+"([^"]+)"', re.M)


@dataclass(frozen=True)
class RenderJob:
    """One output file: which template renders it, with what, and from which inputs."""

    template: str  # relative to templates/
    output: str  # relative to generated/kdagen_kernels/
    context: dict[str, Any]
    specs: tuple[str, ...]  # spec paths relative to the root, for messages
    inputs: tuple[str, ...] = ()  # every template file the stamp covers (the template first), for the manifest
    digest: str = ""  # the stamp's hash
    sources: tuple[str, ...] = ()  # hand-written files (relative to the root) the stamp covers too


def _part(h: Any, tag: str, data: bytes) -> None:
    h.update(tag.encode() + b"\0" + len(data).to_bytes(8, "little") + data)


def stamp_digest(root: Path, templates: Sequence[str], entries: Any, sources: Sequence[str] = ()) -> str:
    """sha256 (12 hex digits) over the template files' names and bytes, those of the hand-written `sources`
    the file's code calls, and the canonical JSON of the spec entries a file is rendered from: nothing else,
    so an edit elsewhere in a spec leaves it alone."""
    h = hashlib.sha256()
    for template in templates:
        path = Path(root) / "templates" / template
        if not path.is_file():
            raise RenderError(f"templates/{template}: template not found")
        _part(h, "template:" + template, path.read_bytes())
    for source in sources:
        _part(h, "source:" + source, source_bytes(source))
    _part(h, "spec", json.dumps(entries, sort_keys=True, separators=(",", ":")).encode())
    return h.hexdigest()[:12]


def make_stamp(source: str, spec_refs: Sequence[str], digest: str, comment: str = "#") -> str:
    """The first line of every generated file: its template (`source`, relative to templates/), the spec
    entries it came from and the hash of all its inputs (stamp_digest), so a reviewer can tell which
    inputs a file came from without running anything."""
    what = " + ".join([f"templates/{source}", *spec_refs])
    return f"{comment} @generated by kdagen {kdagen.__version__} from {what} (sha {digest}) - DO NOT EDIT"


def includes_of(root: Path, template: str) -> list[str]:
    """The headers under templates/hip/include/ that `template` #includes, transitively, sorted."""
    inc = Path(root) / "templates" / HIP_INCLUDE_DIR
    seen: set[str] = set()
    todo = [Path(root) / "templates" / template]
    while todo:
        for name in _INCLUDE_RE.findall(todo.pop().read_text("utf-8")):
            if name not in seen and (inc / name).is_file():
                seen.add(name)
                todo.append(inc / name)
    return sorted(f"{HIP_INCLUDE_DIR}/{name}" for name in seen)


def device_sources() -> list[str]:
    """The files of TRITON_DEVICE_DIR by their names in the manifest, sorted."""
    return sorted(f"kdagen/triton_kernels/{p.name}" for p in TRITON_DEVICE_DIR.glob("*.py"))


def source_bytes(source: str) -> bytes:
    """The bytes of a device_sources() file."""
    return (TRITON_DEVICE_DIR / PurePosixPath(source).name).read_bytes()


def variant_entry(v: VariantSpec, target: str | None = None, tuning: bool = True) -> dict[str, Any]:
    """A variant's spec entry as a file rendered from it sees it: its fields (`tuning` with the file-level
    tuning merged in) and where it is declared. A HIP source (one `target`) reads neither the tuning nor
    the other targets nor the line; the package index files read no tuning."""
    d = json.loads(v.canonical_json())
    d["spec"] = v.spec_path
    if target is None:
        d["line"] = v.line
    else:
        del d["targets"]
        d["target"] = target
    if target is not None or not tuning:
        del d["tuning"]
    return d


def _package_entries(output: str, specs: Sequence[OpSpec]) -> Any:
    variants = sorted((v for s in specs for v in s.variants), key=lambda v: v.name)
    uses = PACKAGE_INPUTS.get(output, "variants")
    if uses == "nothing":
        return None
    if uses == "chunk_sizes":
        return sorted({v.chunk_size for v in variants})
    return [variant_entry(v, tuning=False) for v in variants]


def variant_context(v: VariantSpec, stamp: str) -> dict[str, Any]:
    return {
        "v": v,
        "BK": next_pow2(v.head_dim_k),
        "BV": next_pow2(v.head_dim_v),
        "BT": v.chunk_size,
        "BC": SUB_CHUNK,
        "NB": v.chunk_size // SUB_CHUNK,
        "tl_dtype": triton_dtype(v.dtype),
        "torch_dtype": torch_dtype(v.dtype),
        "tuning": {target: asdict(tun) for target, tun in v.tuning},  # in `targets` order
        "abi": kda_kernels.KERNELS,
        "stamp": stamp,
        "kdagen_version": kdagen.__version__,
    }


def hip_context(v: VariantSpec, target: str, stamp: str) -> dict[str, Any]:
    return {
        "v": v,
        "target": TARGETS[target],
        "K": v.head_dim_k,
        "V": v.head_dim_v,
        "BT": v.chunk_size,
        # the block design's workgroup, whichever design the target takes (a -D flag can pick the other)
        "THREADS": hip_intra_threads(v.head_dim_k, v.head_dim_v, target, wave=False),
        # Rendered only where they differ from the headers' defaults (every other source keeps its bytes).
        "cuda_blocks": [(name, n) for name, n, default in zip(
            ("INTRA_BLOCKS_PER_SM", "WALK_BLOCKS_PER_SM"), hip_cuda_blocks(v.head_dim_k, v.head_dim_v),
            (HIP_CUDA_INTRA_BLOCKS, HIP_CUDA_WALK_BLOCKS)) if n != default and TARGETS[target].vendor == "nvidia"],
        "amd_min_waves": AMD_MIN_WAVES_PER_SIMD,
        "abi_version": HIP_ABI,
        "abi": hip_kernels.LAUNCHERS,
        "structs": hip_kernels.STRUCTS,
        "pair": hip_kernels.KDA_PAIR_LAUNCH,
        "stamp": stamp,
        "kdagen_version": kdagen.__version__,
    }


def hip_includes(root: Path) -> list[str]:
    """Header names under templates/hip/include/, sorted."""
    d = Path(root) / "templates" / HIP_INCLUDE_DIR
    return sorted(p.name for p in d.iterdir() if p.is_file()) if d.is_dir() else []


def package_context(specs: Sequence[OpSpec], stamp: str) -> dict[str, Any]:
    # Triton variants first (the default path), then the fused hip ones; by name within a backend.
    variants = sorted((v for s in specs for v in s.variants), key=lambda v: (v.backend != "triton", v.name))
    return {
        "variants": variants,
        "triton_variants": [v for v in variants if v.backend == "triton"],
        "hip_variants": [v for v in variants if v.backend == "hip"],
        "chunk_sizes": sorted({v.chunk_size for v in variants}),
        "specs": list(specs),
        "targets": TARGETS,
        "abi": metadata_kernels.KERNELS,
        "op": op_schema,
        "stamp": stamp,
        "kdagen_version": kdagen.__version__,
    }


def plan(root: Path, specs: Sequence[OpSpec]) -> list[RenderJob]:
    """Every output of one generate run, package files first, then variants sorted by name."""
    specs = sorted(specs, key=lambda s: s.path)
    all_paths = tuple(s.path for s in specs)
    jobs = []

    def add(template: str, output: str, inputs: Sequence[str], spec_refs: Sequence[str], entries: Any,
            context: Callable[[str], dict[str, Any]], spec_paths: tuple[str, ...], comment: str = "#",
            sources: Sequence[str] = ()) -> None:
        digest = stamp_digest(root, inputs, entries, sources)
        stamp = make_stamp(inputs[0], spec_refs, digest, comment)
        jobs.append(RenderJob(template, output, context(stamp), spec_paths, tuple(inputs), digest, tuple(sources)))

    for template, output in PACKAGE_TEMPLATES:
        entries = _package_entries(output, specs)
        add(template, output, [template], all_paths if entries is not None else (), entries,
            lambda stamp: package_context(specs, stamp), all_paths)
    every = sorted((v for s in specs for v in s.variants), key=lambda v: v.name)
    device = device_sources()
    hip = [v for v in every if v.backend == "hip"]
    if hip:
        for header in hip_includes(root):
            src = f"{HIP_INCLUDE_DIR}/{header}"
            body = (Path(root) / "templates" / src).read_text("utf-8")
            add(HIP_VERBATIM_TEMPLATE, src, [src, HIP_VERBATIM_TEMPLATE], (), None,
                lambda stamp, body=body: {"stamp": stamp, "body": body}, (), comment="//")
    template, pattern = HIP_TEMPLATE
    hip_inputs = [template, *includes_of(root, template)] if hip else []
    for v in hip:
        for target in v.targets:
            add(template, pattern.format(name=v.name, target=target), hip_inputs, (f"{v.spec_path}:{v.label}",),
                variant_entry(v, target), lambda stamp, v=v, target=target: hip_context(v, target, stamp),
                (v.spec_path,), comment="//")
    for v in every:
        if v.backend == "hip":
            continue
        template, pattern = VARIANT_TEMPLATES[v.backend]
        add(template, pattern.format(name=v.name), [template], (f"{v.spec_path}:{v.label}",), variant_entry(v),
            lambda stamp, v=v: variant_context(v, stamp), (v.spec_path,), sources=device)
    return jobs
