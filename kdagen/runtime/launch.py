# SPDX-License-Identifier: Apache-2.0
"""Launches of generated Triton kernels from their declarations (kdagen/kernels, Note [Kernel ABI]).

A plan builds one `KernelLaunch` per kernel launch it will make: the grid, the constexprs, the launch options
and every argument that does not change between runs are fixed then; a run fills in the rest (the layer's
tensors and strides) by name and launches. Arguments go to Triton positionally in declaration order, so a
kernel's parameter list and the launch can never disagree.
"""

from __future__ import annotations

from collections.abc import Mapping
from types import ModuleType

from ..kernels.schema import ABIError, KernelABI
from .device import TRITON_COMPILE_OPTIONS


class KernelLaunch:
    """One launch of `abi`'s kernel from module `mod` with fixed grid, constexprs, options and static args."""

    __slots__ = ("abi", "grid", "_call", "_kw", "_args", "_dynamic", "_constexprs")

    def __init__(self, mod: ModuleType, abi: KernelABI, grid: tuple[int, ...], *, constexprs: Mapping[str, object],
                 options: Mapping[str, int], static: Mapping[str, object], dynamic: tuple[str, ...]):
        abi.check_constexprs(constexprs)
        names = abi.runtime_names
        missing = set(names) - set(static) - set(dynamic)
        both = set(static) & set(dynamic)
        unknown = (set(static) | set(dynamic)) - set(names)
        if missing or both or unknown:
            raise ABIError(f"{abi.name}: arguments missing {sorted(missing)}, both static and per run "
                           f"{sorted(both)}, not parameters {sorted(unknown)}")
        self.abi = abi
        self.grid = grid
        # fn[grid] is Triton's own launcher bound to the grid; binding it once saves a closure per run.
        self._call = getattr(mod, abi.name)[grid]
        # Constexprs go positionally after the runtime arguments (their declared place), so a launch passes
        # only the few launch options by keyword.
        const_names = [p.name for p in abi.params if p.kind == "constexpr"]
        self._kw = {**options, **TRITON_COMPILE_OPTIONS}
        self._args = [static.get(n) for n in names] + [constexprs[n] for n in const_names]
        self._dynamic = tuple((names.index(n), n) for n in dynamic)
        self._constexprs = dict(constexprs)

    def __call__(self, values: Mapping[str, object]) -> None:
        args = self._args.copy()
        for i, n in self._dynamic:
            args[i] = values[n]
        self._call(*args, **self._kw)

    @property
    def constexprs(self) -> dict[str, object]:
        return dict(self._constexprs)

    @property
    def options(self) -> dict[str, object]:
        return dict(self._kw)
