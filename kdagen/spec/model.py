# SPDX-License-Identifier: Apache-2.0
"""Frozen, validated spec models. Nothing here reads files; `load.py` builds these."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field


@dataclass(frozen=True)
class TritonTuning:
    """Launch knobs of the three Triton kernels for one target."""

    prologue_warps: int = 4
    prologue_stages: int = 1
    prologue_block_k: int = 32
    wu_warps: int = 4
    wu_stages: int = 1
    wu_block_k: int = 64
    # kda_intra (the pair's work in one program per walk chunk, where the plan picks it): warps, stages and
    # the width of u's column slices.
    intra_warps: int = 4
    intra_stages: int = 1
    intra_block_v: int = 64
    # Rows per kda_intra program, the walk's step on that design (16 or 32; the chunk's half or quarter).
    intra_rows: int = 32
    recurrence_warps: int = 4
    recurrence_stages: int = 2
    # Stages of a walk launch with no more programs than the GPU has SMs: each program has an SM to itself,
    # so shared memory no longer limits how many run at once and a deeper pipeline only hides latency.
    recurrence_stages_sparse: int = 2
    block_v: int = 64
    # What a batch takes instead when its walks fill the GPU (a plain walk, G = 1, with a program per SM at
    # dense_block_v; runtime/pipeline.choose_pipeline): there the chunk-parallel kernel dominates and shorter
    # programs pay for the walk's extra steps, and wider V slices re-read the K-side workspace fewer times.
    # 0: the same as intra_rows, intra_warps, block_v.
    dense_intra_rows: int = 0
    dense_intra_warps: int = 0
    dense_block_v: int = 0


@dataclass(frozen=True)
class VariantSpec:
    """One generated kernel variant: a backend at fixed head dims, chunk size and dtype, for some targets."""

    op: str
    label: str
    backend: str
    dtype: str
    head_dim_k: int
    head_dim_v: int
    chunk_size: int
    targets: tuple[str, ...]
    tuning: tuple[tuple[str, TritonTuning], ...]  # one (target, tuning) per target, in `targets` order
    spec_path: str = field(compare=False)  # "specs/kda_chunk_fwd.yaml", for messages and stamps
    line: int = field(compare=False)

    @property
    def name(self) -> str:
        # Fixed field order, "__" separators; never parsed back (the registry holds the fields).
        return (f"{self.op}__{self.backend}__{self.dtype}"
                f"__k{self.head_dim_k}_v{self.head_dim_v}_c{self.chunk_size}")

    def tuning_for(self, target: str) -> TritonTuning:
        for t, tun in self.tuning:
            if t == target:
                return tun
        raise KeyError(f"{self.name} declares no target {target!r} (it has {', '.join(self.targets)})")

    def canonical_json(self) -> str:
        d = asdict(self)
        d.pop("spec_path")
        d.pop("line")
        return json.dumps(d, sort_keys=True)


@dataclass(frozen=True)
class OpSpec:
    """One spec file."""

    op: str
    path: str  # relative to the project root, e.g. "specs/kda_chunk_fwd.yaml"
    sha256: str
    variants: tuple[VariantSpec, ...]
