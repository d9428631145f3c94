# SPDX-License-Identifier: Apache-2.0
"""Launches of generated Triton kernels from their declarations (kdagen/kernels, Note [Kernel ABI]).

A plan builds one `KernelLaunch` per kernel launch it will make: the grid, the constexprs, the launch options
and every argument that does not change between runs are fixed then. A run passes one list of per-run values
(the layer's tensors and strides, in an order the plan names once, `run_order`) to every launch; each picks
its arguments from that list and its own fixed ones with one itemgetter, in declaration order, so a kernel's
parameter list and the launch can never disagree, and binding costs one C call.
"""

from __future__ import annotations

import operator
from collections.abc import Mapping, Sequence
from types import ModuleType

from ..kernels.schema import ABIError, KernelABI
from .device import TRITON_COMPILE_OPTIONS


class KernelLaunch:
    """One launch of `abi`'s kernel from module `mod` with fixed grid, constexprs, options and static args."""

    __slots__ = ("abi", "grid", "_call", "_kw", "_static", "_pick", "_constexprs")

    def __init__(self, mod: ModuleType, abi: KernelABI, grid: tuple[int, ...], *, constexprs: Mapping[str, object],
                 options: Mapping[str, int], static: Mapping[str, object], run_order: Sequence[str]):
        abi.check_constexprs(constexprs)
        names = abi.runtime_names
        dynamic = [n for n in names if n not in static]
        missing = [n for n in dynamic if n not in run_order]
        unknown = set(static) - set(names)
        if missing or unknown:
            raise ABIError(f"{abi.name}: no value for {sorted(missing)}; not parameters: {sorted(unknown)}")
        self.abi = abi
        self.grid = grid
        # fn[grid] is Triton's own launcher bound to the grid; binding it once saves a closure per run.
        self._call = getattr(mod, abi.name)[grid]
        self._kw = {**options, **TRITON_COMPILE_OPTIONS}
        # Fixed values (static arguments, then the constexprs, passed positionally at their declared place)
        # follow the run's values in the list the itemgetter reads.
        const_names = [p.name for p in abi.params if p.kind == "constexpr"]
        fixed = [n for n in names if n in static]
        self._static = [static[n] for n in fixed] + [constexprs[n] for n in const_names]
        base = len(run_order)
        where = {n: base + i for i, n in enumerate(fixed + const_names)}
        where.update({n: run_order.index(n) for n in dynamic})
        self._pick = operator.itemgetter(*(where[p.name] for p in abi.params))
        self._constexprs = dict(constexprs)

    def __call__(self, values: list) -> None:
        """values: the run's values in `run_order`."""
        self._call(*self._pick(values + self._static), **self._kw)

    @property
    def constexprs(self) -> dict[str, object]:
        return dict(self._constexprs)

    @property
    def options(self) -> dict[str, object]:
        return dict(self._kw)
