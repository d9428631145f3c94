# SPDX-License-Identifier: Apache-2.0
"""The plain-Python chunk metadata construction the interpreter and GPU tests compare against."""

from __future__ import annotations

import torch

# Chunk sizes the tests declare to the runtime helpers (independent of the shipped specs).
DECLARED = (16, 32, 64)


def plain_metadata(cu: list[int], bt: int) -> tuple[list[list[int]], list[int]]:
    """(chunk_indices rows, chunk_offsets) built one sequence at a time (docs/semantics.md, "The chunk metadata
    helpers")."""
    indices, offsets = [], [0]
    for n in range(len(cu) - 1):
        count = -(-(cu[n + 1] - cu[n]) // bt)
        indices += [[n, i] for i in range(count)]
        offsets.append(offsets[-1] + count)
    return indices, offsets


def cu_from_lens(lens, dtype) -> torch.Tensor:
    lens = torch.as_tensor(lens, dtype=torch.int64)
    return torch.cat([torch.zeros(1, dtype=torch.int64), lens.cumsum(0)]).to(dtype)
