# SPDX-License-Identifier: Apache-2.0
"""Launches of generated Triton kernels from their declarations (kdagen/kernels, Note [Kernel ABI]).

A plan builds one `KernelLaunch` per kernel launch it will make: the grid, the constexprs, the launch options
and every argument that does not change between runs are fixed then. A run passes one list of per-run values
(the layer's tensors and strides, in an order the plan names once, `run_order`) to every launch; each picks
its arguments from that list and its own fixed ones with one itemgetter, in declaration order, so a kernel's
parameter list and the launch can never disagree, and binding costs one C call.

Note [Compiled launch]
    Triton's `JITFunction.run` binds and specialises every argument on every launch (about 40 us on the H200
    machine's host for our kernels). After a launch through it, a KernelLaunch keeps a launch of the compiled
    kernel it returned under the run's specialisation key:
    what Triton specialises a per-run value on (a tensor's dtype and 16-byte alignment; an int's == 1, % 16 and
    32-bit range; fixed arguments cannot change; a plan's Program computes it as `RunKey`, which costs less and
    determines it). A later run with the same key calls that launch directly;
    any other key goes through JITFunction.run again, which compiles or finds the right kernel. That launch is
    cuda_launch.DriverLaunch (Note [Driver launch]: one cuLaunchKernel through ctypes with a parameter array
    built once) where cuda_launch.why_not finds nothing it was not verified for, else the compiled kernel's own
    launcher (`CompiledKernel[grid]`, about 16 us a launch). Both get the run's stream (run_values "stream",
    read once per run) instead of looking the device and its current stream up per launch. `launcher` and
    `launchers` say which each key got. AMD targets
    always go through JITFunction.run: Triton also specialises their pointers on the 2 GiB buffer range, which
    nothing here can verify on a GPU. KDAGEN_TRITON_JIT_LAUNCH=1 turns the direct path off (every launch through
    JITFunction.run).
"""

from __future__ import annotations

import functools
import operator
from collections.abc import Callable, Mapping, Sequence
from types import ModuleType

import torch

from ..kernels.schema import ABIError, KernelABI
from . import cuda_launch
from .cuda_launch import getter
from .device import TRITON_COMPILE_OPTIONS

_I32 = range(-2**31, 2**31)


def spec_key(values: Sequence[object]) -> tuple:
    """What Triton specialises the run's values on (Note [Compiled launch])."""
    key = []
    for x in values:
        if type(x) is int:
            key.append((x == 1, x % 16 == 0, x in _I32))
        elif isinstance(x, torch.Tensor):
            key.append((x.dtype, x.data_ptr() % 16 == 0))
        else:
            key.append(type(x))
    return tuple(key)


_DATA_PTR = torch.Tensor.data_ptr  # the unbound method: half the cost of methodcaller("data_ptr")
_DTYPE = operator.attrgetter("dtype")


class RunKey:
    """spec_key's equivalent for a plan's runs, at about half its cost: a key that determines spec_key (equal keys
    have equal spec_keys), so a compiled launcher found under it is the one JITFunction.run would pick.

    It holds the values' types, the tensors' dtypes, whether every tensor is 16-byte aligned (else each one's
    alignment) and the ints' specialisation, recomputed only when an int differs from the last run's (a model's
    layers share their strides). Which positions hold tensors and ints is learnt from the types, which are part of
    the key and compared on every run."""

    __slots__ = ("_types", "_tensors", "_ints", "_last_ints", "_int_key")

    def __init__(self) -> None:
        self._types: tuple | None = None
        self._last_ints: tuple | None = None

    def __call__(self, values: Sequence[object]) -> tuple:
        return self.with_ptrs(values)[0]

    def with_ptrs(self, values: Sequence[object]) -> tuple[tuple, tuple]:
        """The key and the data pointers of the values' tensors in their order (the driver launches take them
        rather than reading each again: Note [Driver launch])."""
        types = tuple(map(type, values))
        if types != self._types:
            self._types = types
            self._tensors = getter([i for i, t in enumerate(types) if issubclass(t, torch.Tensor)])
            self._ints = getter([i for i, t in enumerate(types) if t is int])
            self._last_ints = None
        ints = self._ints(values)
        if ints != self._last_ints:
            self._last_ints, self._int_key = ints, tuple((x == 1, x % 16 == 0, x in _I32) for x in ints)
        tensors = self._tensors(values)
        ptrs = tuple(map(_DATA_PTR, tensors))
        aligned = True if functools.reduce(operator.or_, ptrs, 0) % 16 == 0 else tuple(p % 16 == 0 for p in ptrs)
        return (types, tuple(map(_DTYPE, tensors)), aligned, self._int_key), ptrs


class KernelLaunch:
    """One launch of `abi`'s kernel from module `mod` with fixed grid, constexprs, options and static args."""

    __slots__ = ("abi", "grid", "_call", "_kw", "_static", "_pick", "_constexprs", "_compiled", "_stream",
                 "launchers")

    def __init__(self, mod: ModuleType, abi: KernelABI, grid: tuple[int, ...], *, constexprs: Mapping[str, object],
                 options: Mapping[str, int], static: Mapping[str, object], run_order: Sequence[str],
                 direct: bool = False):
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
        # spec_key -> the compiled kernel's launcher; None: always JITFunction.run (Note [Compiled launch]).
        self._compiled: dict[tuple, Callable[[list], None]] | None = {} if direct else None
        self.launchers: dict[tuple, str] = {}  # spec_key -> which launcher (debugging; see `launcher`)
        # Where the run's values hold the current stream (run_values "stream"): the compiled launcher takes it
        # instead of asking the driver for the device and its stream on every launch.
        self._stream = list(run_order).index("stream") if "stream" in run_order else None

    def __call__(self, values: list, key: tuple | None = None, ptrs: tuple | None = None) -> None:
        """values: the run's values in `run_order`; key: their spec_key, when direct launches are on; ptrs: the
        data pointers of the values' tensors in their order, where the caller read them (RunKey.with_ptrs)."""
        compiled = self._compiled
        if compiled is not None and key is not None:
            runner = compiled.get(key)
            if runner is not None:
                runner(values, ptrs)
                return
            kernel = self._call(*self._pick(values + self._static), **self._kw)
            if kernel is not None and hasattr(kernel, "__getitem__"):
                compiled[key], self.launchers[key] = self._direct(kernel, values)
            return
        self._call(*self._pick(values + self._static), **self._kw)

    def _direct(self, kernel, values: list) -> tuple[Callable[[list, tuple | None], None], str]:
        """The launch for later runs with this run's key, and which it is (Note [Compiled launch])."""
        grid = tuple(self.grid) + (1,) * (3 - len(self.grid))  # the compiled launcher indexes three dimensions
        runner = kernel[grid]
        pick, static, stream = self._pick, self._static, self._stream
        if stream is None:
            return (lambda values, ptrs=None: runner(*pick(values + static))), "triton: no stream among the run's values"

        def triton_launch(values: list, ptrs: tuple | None = None) -> None:
            runner(*pick(values + static), stream=values[stream])

        args = pick(values + static)
        why = cuda_launch.why_not(kernel, grid, [p.name for p in self.abi.params], args)
        if why is not None:
            return triton_launch, f"triton: {why}"
        base = len(values)
        where = self._pick(list(range(base + len(static))))
        dynamic = [w if w < base else None for w in where]
        fixed = [static[w - base] if w >= base else None for w in where]
        drv = cuda_launch.driver()
        assert drv is not None  # why_not checked it
        return cuda_launch.DriverLaunch(kernel, grid, dynamic, fixed, stream, triton_launch, drv, values), "driver"

    @property
    def launcher(self) -> str:
        """Which launcher the runs use: "jit" (JITFunction.run on every launch), or per specialisation key seen
        so far "driver" (cuda_launch.DriverLaunch) or "triton: <why not the driver launch>"."""
        if self._compiled is None:
            return "jit"
        return "; ".join(sorted(set(self.launchers.values()))) or "jit (no run yet)"

    @property
    def constexprs(self) -> dict[str, object]:
        return dict(self._constexprs)

    @property
    def options(self) -> dict[str, object]:
        return dict(self._kw)
