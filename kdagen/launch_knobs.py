# SPDX-License-Identifier: Apache-2.0
"""The Triton tuning knobs that replace others for some batches: shared by the spec loader, which checks the
launches they make, and the runtime, which makes them. Dependency-free (the runtime imports no generator code)."""

from __future__ import annotations

from collections.abc import Mapping

# A batch whose kda_intra walks fill the GPU takes these from their dense_* counterparts
# (runtime/pipeline.choose_pipeline).
DENSE_KNOBS = {"intra_rows": "dense_intra_rows", "intra_warps": "dense_intra_warps", "block_v": "dense_block_v"}


def dense_tuning(tun: Mapping[str, int]) -> dict[str, int]:
    """`tun` with its dense_* knobs in place of the ones they replace (a dense_* knob of 0 replaces nothing)."""
    return {**tun, **{knob: tun[dense] for knob, dense in DENSE_KNOBS.items() if tun[dense]}}
