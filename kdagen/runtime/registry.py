# SPDX-License-Identifier: Apache-2.0
"""Registry entries of the generated package and variant selection."""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from types import ModuleType

import torch

from .device import INTERPRETER
from .errors import NoVariantError

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
    module: str  # importable module holding the kernels
    spec: str  # "specs/kda_chunk_fwd.yaml:42", where to edit it

    def load(self) -> ModuleType:
        # Importing the generated module compiles nothing; Triton compiles on the first launch.
        return importlib.import_module(self.module)


def _describe(entries: tuple[VariantEntry, ...]) -> str:
    return "\n".join(
        f"  - {e.name}: K={e.head_dim_k} V={e.head_dim_v} chunk={e.chunk_size} dtype={e.dtype} "
        f"targets={','.join(e.targets)} ({e.spec})" for e in entries) or "  (none)"


def select_variant(entries: tuple[VariantEntry, ...], *, backend: str, head_dim_k: int, head_dim_v: int,
                   dtype: torch.dtype, target: str) -> VariantEntry:
    """The variant for (backend, K, V, dtype) on `target`; chunk 64 first, as vLLM's metadata assumes."""
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
    fits.sort(key=lambda e: (e.chunk_size != PREFERRED_CHUNK, -e.chunk_size))
    return fits[0]
