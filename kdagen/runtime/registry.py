# SPDX-License-Identifier: Apache-2.0
"""Registry entries of the generated package and variant selection."""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING

import torch

from .device import INTERPRETER
from .errors import NoVariantError

if TYPE_CHECKING:
    from .jit_hip import HipLibrary

TORCH_DTYPES: dict[str, torch.dtype] = {"bf16": torch.bfloat16, "fp16": torch.float16}
DTYPE_NAMES: dict[torch.dtype, str] = {v: k for k, v in TORCH_DTYPES.items()}

# The chunk size vLLM's callers build chunk_indices / chunk_offsets for (FLA_CHUNK_SIZE).
PREFERRED_CHUNK = 64


@dataclass(frozen=True)
class VariantEntry:
    """One generated variant, as the generated `_registry.py` lists it."""

    name: str
    op: str
    backend: str
    dtype: str
    head_dim_k: int
    head_dim_v: int
    chunk_size: int
    targets: tuple[str, ...]
    # triton: the importable module holding the kernels; hip: the generated package whose hip/ folder
    # holds the rendered sources (<name>__<target>.hip), built by fused_path.load_fused.
    module: str
    spec: str  # "specs/kda_chunk_fwd.yaml:42", where to edit it

    def load(self, target: str | None = None) -> ModuleType | HipLibrary:
        """The kernels of this variant: the Triton module, or the fused library built for `target`.

        Triton: importing the generated module compiles nothing; Triton compiles on the first launch.
        hip: JIT build on first use per (source, target), then the on-disk cache (jit_hip.py); may raise
        jit_hip.CompilerNotFoundError or jit_hip.HipCompileError.
        """
        if self.backend != "hip":
            return importlib.import_module(self.module)
        if target is None or target not in self.targets:
            raise ValueError(f"{self.name} is a fused (hip) variant built per target; load it with one of its "
                             f"targets {', '.join(self.targets)}, got target={target!r}")
        # Imported here, not at module import: the registry is data; building is the dispatcher's business.
        from . import fused_path

        package = importlib.import_module(self.module)
        return fused_path.load_fused(Path(package.__file__).parent, self.head_dim_k, self.head_dim_v, target,
                                     self.dtype)


def _describe(entries: tuple[VariantEntry, ...]) -> str:
    return "\n".join(
        f"  - {e.name}: K={e.head_dim_k} V={e.head_dim_v} chunk={e.chunk_size} dtype={e.dtype} "
        f"targets={','.join(e.targets)} ({e.spec})" for e in entries) or "  (none)"


def chunk_order(chunk: int) -> tuple[bool, int]:
    """Sort key of chunk sizes: PREFERRED_CHUNK first (vLLM's metadata), then larger before smaller."""
    return chunk != PREFERRED_CHUNK, -chunk


def chunk_sizes(entries: tuple[VariantEntry, ...], *, head_dim_k: int, head_dim_v: int, dtype: torch.dtype,
                target: str) -> list[int]:
    """The chunk sizes the registry serves (K, V, dtype) in on `target`, any backend, in preference order."""
    dname = DTYPE_NAMES.get(dtype)
    sizes = {e.chunk_size for e in entries if e.head_dim_k == head_dim_k and e.head_dim_v == head_dim_v
             and e.dtype == dname and (target == INTERPRETER or target in e.targets)}
    return sorted(sizes, key=chunk_order)


def select_variant(entries: tuple[VariantEntry, ...], *, backend: str, head_dim_k: int, head_dim_v: int,
                   dtype: torch.dtype, target: str, chunk_size: int | None = None) -> VariantEntry:
    """The variant for (backend, K, V, dtype) on `target`, of `chunk_size` when given; else chunk 64 first, as
    vLLM's metadata assumes."""
    dname = DTYPE_NAMES.get(dtype)
    fits = [e for e in entries if e.backend == backend and e.head_dim_k == head_dim_k
            and e.head_dim_v == head_dim_v and e.dtype == dname]
    if not fits:
        spec = entries[0].spec.split(":")[0] if entries else "specs/kda_chunk_fwd.yaml"
        raise NoVariantError(
            f"no generated {backend} variant for head_dim_k={head_dim_k}, head_dim_v={head_dim_v}, "
            f"dtype={dname or dtype}. Generated variants:\n{_describe(entries)}\n"
            f"To add it: append a variant with head_dim_k: {head_dim_k}, head_dim_v: {head_dim_v}, "
            f"dtype: {dname or 'bf16'} to {spec}, then run `nox -s generate`.")
    if target != INTERPRETER:
        on_target = [e for e in fits if target in e.targets]
        if not on_target:
            raise NoVariantError(
                f"{fits[0].name} is not generated for this device's target {target!r} (it declares "
                f"{', '.join(fits[0].targets)}). Add {target!r} to its targets in {fits[0].spec} if kdagen "
                f"knows that target, or set KDAGEN_TARGET to one it declares to run that tuning here.")
        fits = on_target
    if chunk_size is not None:
        sized = [e for e in fits if e.chunk_size == chunk_size]
        if not sized:
            raise NoVariantError(
                f"no generated {backend} variant for head_dim_k={head_dim_k}, head_dim_v={head_dim_v}, "
                f"dtype={dname or dtype} with chunk_size={chunk_size} (there are chunk sizes "
                f"{', '.join(str(c) for c in sorted({e.chunk_size for e in fits}, key=chunk_order))}). Generated "
                f"variants:\n{_describe(entries)}\nTo add it: append a variant with chunk_size: {chunk_size} to "
                f"{fits[0].spec.split(':')[0]}, then run `nox -s generate`; or build the metadata for one of those.")
        fits = sized
    fits.sort(key=lambda e: chunk_order(e.chunk_size))
    return fits[0]
