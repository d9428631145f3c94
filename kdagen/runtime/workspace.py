# SPDX-License-Identifier: Apache-2.0
"""The Triton path's workspace: every intermediate buffer of one call as views of one allocation.

A plan sizes it once (`WorkspaceLayout`) and allocates it once, or carves it from a caller's uint8 buffer
(FlashInfer's float workspace buffer): the layers of one step then reuse it, one after another on one
stream, as each call's intermediates are dead once its last kernel has run.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

ALIGN = 256  # bytes between views' starts
BASE_ALIGN = 16  # a caller's buffer: Triton specialises pointers on 16-byte alignment (CUDA allocations have 256)


@dataclass(frozen=True)
class Buffer:
    name: str
    shape: tuple[int, ...]
    dtype: torch.dtype
    offset: int  # bytes from the workspace's start

    @property
    def nbytes(self) -> int:
        n = 1
        for d in self.shape:
            n *= d
        return n * torch.empty((), dtype=self.dtype).element_size()


@dataclass(frozen=True)
class WorkspaceLayout:
    buffers: tuple[Buffer, ...]
    nbytes: int

    @staticmethod
    def of(specs: list[tuple[str, tuple[int, ...], torch.dtype]]) -> WorkspaceLayout:
        bufs, off = [], 0
        for name, shape, dtype in specs:
            b = Buffer(name, tuple(shape), dtype, off)
            bufs.append(b)
            off += -(-b.nbytes // ALIGN) * ALIGN
        return WorkspaceLayout(tuple(bufs), max(off, ALIGN))

    def views(self, storage: torch.Tensor) -> dict[str, torch.Tensor]:
        """name -> view of `storage` (a uint8 tensor of at least nbytes bytes, BASE_ALIGN-aligned)."""
        out = {}
        for b in self.buffers:
            raw = storage[b.offset:b.offset + b.nbytes]
            out[b.name] = raw.view(b.dtype).view(b.shape)
        return out


def check_workspace(buf: object, nbytes: int, device: torch.device, op: str) -> torch.Tensor:
    """A caller's workspace: a contiguous uint8 tensor on the plan's device, aligned, large enough."""
    if not isinstance(buf, torch.Tensor):
        raise TypeError(f"{op}: workspace must be a uint8 torch.Tensor, got {type(buf).__name__}")
    problems = []
    if buf.dtype != torch.uint8:
        problems.append(f"dtype {buf.dtype} (expected torch.uint8)")
    if buf.device != device:
        problems.append(f"device {buf.device} (expected {device}, the batch's)")
    if not buf.is_contiguous():
        problems.append("not contiguous")
    if buf.numel() * buf.element_size() < nbytes:
        problems.append(f"{buf.numel() * buf.element_size()} bytes (this plan needs {nbytes})")
    if buf.numel() and buf.data_ptr() % BASE_ALIGN:
        problems.append(f"data_ptr not {BASE_ALIGN}-byte aligned")
    if problems:
        raise ValueError(f"{op}: workspace: {'; '.join(problems)}. Pass torch.empty(plan.workspace_bytes, "
                         f"dtype=torch.uint8, device=...) or None to let the plan allocate it")
    return buf.reshape(-1)
