# SPDX-License-Identifier: Apache-2.0
"""The metadata and routing tensors a plan owns. See Note [Plan metadata].

Note [Plan metadata]
    A plan checks its metadata (cu_seqlens, chunk_indices, chunk_offsets) and routing (state_indices,
    has_initial_state, checkpoint_offsets, checkpoint_state_indices) once, and its launches bake in their
    pointers. So that nothing a caller does to its own tensors afterwards can make a kernel read or write out
    of bounds, the plan keeps copies: uploaded from the CPU values it validated where it has them (CPU
    tensors, cu_seqlens_cpu), else copied device-to-device when it is made. Launches that take another dtype
    (the HIP kernels' int32 / int64 / byte flags) read derived copies, refreshed with the owned ones.
    `refresh` copies a caller's new tensors (same shapes and dtypes as planned) into those buffers on the
    current stream: asynchronous, graph-capturable, and value-checked where the values are free to read (CPU
    tensors, or KDAGEN_DEBUG=1). A serving engine that rebuilds its metadata in place each step calls it
    before the layers run.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

import torch

from .validate import OP

META_NAMES = ("cu_seqlens", "chunk_indices", "chunk_offsets", "state_indices", "has_initial_state",
              "checkpoint_offsets", "checkpoint_state_indices")


class PlanMetadata:
    """name -> the plan's own tensor (None where the plan has none); see Note [Plan metadata]."""

    __slots__ = ("device", "tensors", "given", "_derived")

    def __init__(self, device: torch.device, caller: Mapping[str, torch.Tensor | None],
                 built: Mapping[str, torch.Tensor], host: Mapping[str, torch.Tensor]):
        """caller: the tensors the caller passed (validated); built: what the plan made itself (already its
        own); host: validated CPU copies of caller tensors, uploaded in their place."""
        self.device = device
        if device.type == "cuda" and torch.cuda.is_current_stream_capturing():
            host = {}  # a plan made under graph capture copies device to device (no pageable upload)
        self.given = frozenset(n for n, t in caller.items() if t is not None)
        self.tensors: dict[str, torch.Tensor | None] = {}
        for name in META_NAMES:
            t = caller.get(name)
            if name in built:
                self.tensors[name] = built[name]
            elif t is None:
                self.tensors[name] = None
            else:
                own = torch.empty(t.shape, dtype=t.dtype, device=device)
                own.copy_(host.get(name, t))
                self.tensors[name] = own
        self._derived: list[tuple[torch.Tensor, torch.Tensor]] = []

    @property
    def refreshable(self) -> bool:
        """Whether `refresh` can take every tensor the plan was made with: not when the plan built
        chunk_indices / chunk_offsets from the caller's cu_seqlens (a new cu_seqlens would leave them stale)."""
        return "cu_seqlens" not in self.given or {"chunk_indices", "chunk_offsets"} <= self.given

    def __getitem__(self, name: str) -> torch.Tensor | None:
        return self.tensors[name]

    def converted(self, name: str, dtype: torch.dtype) -> torch.Tensor | None:
        """The owned tensor in `dtype`, flat and contiguous: itself where it already is, else a derived copy
        that `refresh` keeps current."""
        t = self.tensors[name]
        if t is None:
            return None
        flat = t.reshape(-1) if t.dim() == 1 or name != "chunk_indices" else t
        if flat.dtype == dtype and flat.is_contiguous() and flat.data_ptr() == t.data_ptr():
            return flat
        out = torch.empty(flat.shape, dtype=dtype, device=t.device)
        out.copy_(flat)
        self._derived.append((out, flat))
        return out

    def refresh(self, new: Mapping[str, torch.Tensor | None],
                check: Callable[[Mapping[str, torch.Tensor | None]], None] | None = None) -> None:
        """Copy the caller's new tensors into the plan's buffers; `check` validates their values first (it
        raises before anything is copied)."""
        for name in META_NAMES:
            t, own = new.get(name), self.tensors[name]
            if t is None:
                if name in self.given:
                    raise ValueError(f"{OP}: refresh_metadata: {name} is None, but the plan was made with it; pass "
                                     f"the new {name} (same shape and dtype)")
                continue
            if own is None:
                raise ValueError(f"{OP}: refresh_metadata: {name} was given, but the plan was made without it; make "
                                 "a new plan to use it")
            if not isinstance(t, torch.Tensor) or t.shape != own.shape or t.dtype != own.dtype \
                    or t.device != own.device:
                got = (f"{t.dtype} {tuple(t.shape)} on {t.device}" if isinstance(t, torch.Tensor)
                       else type(t).__name__)
                raise ValueError(f"{OP}: refresh_metadata: {name} must be {own.dtype} {tuple(own.shape)} on "
                                 f"{own.device} (as planned), got {got}; make a new plan for a new batch shape")
        if "cu_seqlens" in self.given:
            for name in ("chunk_indices", "chunk_offsets"):
                if name not in self.given and new.get("cu_seqlens") is not None and new.get(name) is None:
                    raise ValueError(f"{OP}: refresh_metadata: the plan built {name} from cu_seqlens itself, so a "
                                     f"new cu_seqlens needs the new {name} too (pass it, or make a new plan)")
        if check is not None:
            check({n: new.get(n) if new.get(n) is not None else self.tensors[n] for n in META_NAMES})
        for name in META_NAMES:
            t = new.get(name)
            if t is not None:
                self.tensors[name].copy_(t, non_blocking=True)  # type: ignore[union-attr]
        for out, src in self._derived:
            out.copy_(src, non_blocking=True)
