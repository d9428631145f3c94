# SPDX-License-Identifier: Apache-2.0
"""A compiled Triton kernel's launch as one `cuLaunchKernel` call through ctypes (Note [Driver launch]).

Note [Driver launch]
    Triton's compiled launcher (`CompiledKernel[grid]`) costs about 16 us of host time per launch on the H200
    machine: it rebuilds launch metadata, looks the hooks and the scratch allocators up and converts every
    argument in C on each call. For a launch whose arguments keep their types, none of that changes between
    runs, so `DriverLaunch` builds the kernel's `void*[]` parameter array once, its slots pointing into one
    ctypes buffer, and per run packs the values that can change (the tensors' data pointers, the run's ints and
    floats) into that buffer with one `struct.pack_into` and makes one ctypes call to the driver.

    The parameter list is the one Triton's own launcher passes on triton 3.6, 3.7, 3.8 and 3.9 (read from
    each release's nvidia driver): the kernel's parameters in declaration order, less those its signature marks "constexpr"
    (the declared constexprs, and the ints and Nones Triton specialised into constants), each stored as its
    signature type says (a pointer as a 64-bit CUdeviceptr, i32 / i64 / u32 / u64 as such, fp32 as the 32-bit
    float, fp64 as the double), then two trailing pointers, the global and the profile scratch, both null when
    the kernel needs neither. The block is 32 * num_warps threads and the dynamic shared memory the metadata's
    `shared` (the loader has already raised the function's limit where it exceeds 48 KiB). Pointers are the
    tensors' data_ptr(): Triton asks the driver for the device address of each, which under unified addressing
    is the same number for the device tensors a plan checks it gets.

    `why_not` names what this was not verified for; any of it keeps Triton's launcher: another Triton release,
    a non-CUDA target, a signature type whose storage the releases disagree on (i1 / u1 are 1 byte in 3.6, 4
    later) or that needs conversion (fp16, bf16, tensor descriptors, tuples), scratch memory, clusters
    (num_ctas != 1, cluster dims), cooperative or PDL launches, instrumentation, shared memory beyond what
    triton 3.8 and 3.9 launch without an extra attribute, an empty grid, a value whose type the layout does not
    expect, or no libcuda.so.1. Launch hooks (triton.knobs.runtime.launch_enter_hook / launch_exit_hook with
    calls) are checked per launch: while any is installed the launch goes through Triton's launcher, which calls
    them.

    Thread safety: the parameter buffer is shared by every call of one DriverLaunch, so packing it and the
    driver call that reads it hold the launch's own lock (uncontended: ~0.1 us; cuLaunchKernel copies the
    parameters before it returns). Two plans never share a DriverLaunch. One plan run from two threads at once
    (which its shared workspace does not allow anyway: the wrapper keeps a plan per thread and stream)
    serialises only this step of each launch and never mixes two runs' parameters.

    The run's tensors' data pointers come from the caller where it has read them (Program.run reads every tensor's
    once, for the specialisation key, RunKey.with_ptrs): the launch picks its own from that tuple by position, the
    positions of the tensors among the values of the run that built it (equal keys, equal types, so the same
    positions). Without them it reads each tensor's data_ptr() itself.

    A launch in a thread without a current CUDA context (CUDA_ERROR_INVALID_CONTEXT) makes the context that was
    current when the launcher was built (the one Triton loaded the kernel in) current and retries once, as
    Triton's launcher makes a context current itself. Any other nonzero CUresult is a RuntimeError naming the
    kernel and the driver's error string.
"""

from __future__ import annotations

import ctypes
import operator
import struct
import threading
from collections.abc import Callable, Sequence

import torch
import triton
from triton import knobs

# Triton releases whose nvidia launcher was read for the layout above: (major, minor) -> trailing pointers.
VERIFIED_TRITON = {(3, 6): 2, (3, 7): 2, (3, 8): 2, (3, 9): 2}
# Signature type -> struct code of its 8-byte slot (little-endian, padded to 8).
SLOT = {"i32": "i4x", "i64": "q", "u32": "I4x", "u64": "Q", "fp32": "f4x", "f32": "f4x", "fp64": "d"}
POINTER_SLOT = "Q"
# triton 3.8 and 3.9 add a launch attribute above this much dynamic shared memory; 3.6 and 3.7 do not.
MAX_SHARED = 228 * 1024
CUDA_ERROR_INVALID_CONTEXT = 201

_DATA_PTR = torch.Tensor.data_ptr  # the unbound method: half the cost of methodcaller("data_ptr")


def getter(positions: Sequence[int]) -> Callable[[Sequence], tuple]:
    """values -> the values at `positions`, always as a tuple."""
    if not positions:
        return lambda values: ()
    if len(positions) == 1:
        (i,) = positions
        return lambda values: (values[i],)
    return operator.itemgetter(*positions)


class Driver:
    """The four libcuda entry points a launch uses, with their C signatures."""

    def __init__(self, lib: ctypes.CDLL):
        self.lib = lib
        # cuLaunchKernel(CUfunction, 3 x grid, 3 x block, shared bytes: unsigned, CUstream, void**, void**).
        # Without argtypes a call costs a third (on this machine 0.45 against 1.4 us), so DriverLaunch passes
        # ready ctypes objects for the pointers and Python ints only for the unsigned dimensions (< 2**31).
        self.launch = lib["cuLaunchKernel"]
        self.launch.restype = ctypes.c_int
        self.error_string = lib.cuGetErrorString
        self.error_string.argtypes = [ctypes.c_int, ctypes.POINTER(ctypes.c_char_p)]
        self.error_string.restype = ctypes.c_int
        self.ctx_get = lib.cuCtxGetCurrent
        self.ctx_get.argtypes = [ctypes.POINTER(ctypes.c_void_p)]
        self.ctx_get.restype = ctypes.c_int
        self.ctx_set = lib.cuCtxSetCurrent
        self.ctx_set.argtypes = [ctypes.c_void_p]
        self.ctx_set.restype = ctypes.c_int

    def describe(self, code: int) -> str:
        text = ctypes.c_char_p()
        if self.error_string(code, ctypes.byref(text)) != 0 or not text.value:
            return f"CUresult {code}"
        return f"CUresult {code}: {text.value.decode(errors='replace')}"

    def current_context(self) -> int | None:
        ctx = ctypes.c_void_p()
        return ctx.value if self.ctx_get(ctypes.byref(ctx)) == 0 else None


_driver: Driver | None = None
_driver_error: str | None = None
_driver_lock = threading.Lock()


def driver() -> Driver | None:
    """The process's libcuda.so.1 (the one Triton and torch loaded), or None with `_driver_error` saying why."""
    global _driver, _driver_error
    with _driver_lock:
        if _driver is None and _driver_error is None:
            try:
                _driver = Driver(ctypes.CDLL("libcuda.so.1"))
            except (OSError, AttributeError) as exc:
                _driver_error = f"libcuda.so.1 not usable ({exc})"
        return _driver


def _triton_version() -> tuple[int, int] | None:
    try:
        major, minor = (int(x) for x in triton.__version__.split(".")[:2])
    except ValueError:
        return None
    return major, minor


def hooks_installed() -> bool:
    """Whether Triton launch hooks are installed (its launcher would call them)."""
    rt = knobs.runtime
    enter, leave = rt.launch_enter_hook, rt.launch_exit_hook
    return bool((enter is not None and getattr(enter, "calls", True))
                or (leave is not None and getattr(leave, "calls", True)))


def why_not(kernel, grid: Sequence[int], names: Sequence[str], values: Sequence[object]) -> str | None:
    """Why `kernel` (a CompiledKernel) launched on `grid` with `values` (its parameters `names`, in order) must
    keep Triton's launcher, or None when DriverLaunch passes exactly what that launcher would."""
    version = _triton_version()
    if version not in VERIFIED_TRITON:
        verified = ", ".join(f"{a}.{b}" for a, b in VERIFIED_TRITON)
        return f"triton {triton.__version__} is not a verified release ({verified})"
    if torch.version.hip is not None:
        return "a ROCm build of torch"
    meta = getattr(kernel, "metadata", None)
    signature = getattr(getattr(kernel, "src", None), "signature", None)
    if meta is None or not isinstance(signature, dict) or not hasattr(kernel, "function"):
        return "not a CompiledKernel with metadata, src.signature and function"
    backend = getattr(getattr(meta, "target", None), "backend", None)
    if backend != "cuda":
        return f"backend {backend!r}, not cuda"
    if getattr(meta, "num_ctas", 1) != 1:
        return f"num_ctas={meta.num_ctas} (a cluster launch)"
    if tuple(getattr(meta, "cluster_dims", None) or (1, 1, 1)) not in ((1, 1, 1), (1,), (1, 1)):
        return f"cluster_dims={tuple(meta.cluster_dims)}"
    for flag in ("launch_cooperative_grid", "launch_pdl"):
        if getattr(meta, flag, False):
            return f"{flag} is set"
    for size in ("global_scratch_size", "profile_scratch_size"):
        if getattr(meta, size, 0):
            return f"{size}={getattr(meta, size)} (Triton allocates scratch per launch)"
    if getattr(meta, "instrumentation_mode", ""):
        return f"instrumentation_mode={meta.instrumentation_mode!r}"
    if getattr(meta, "tensordesc_meta", None):
        return "tensor descriptors"
    if not isinstance(getattr(meta, "shared", None), int) or not 0 <= meta.shared <= MAX_SHARED:
        return f"shared={getattr(meta, 'shared', None)!r} (expected 0..{MAX_SHARED} bytes)"
    if not isinstance(getattr(meta, "num_warps", None), int) or meta.num_warps < 1:
        return f"num_warps={getattr(meta, 'num_warps', None)!r}"
    if len(grid) != 3 or min(grid) < 1:
        return f"grid {tuple(grid)} (Triton skips empty launches)"
    if list(signature) != list(names) or len(values) != len(names):
        return f"the kernel's signature {list(signature)} is not the declaration's {list(names)}"
    for name, ty, value in zip(names, signature.values(), values):
        if ty == "constexpr":
            continue
        if not isinstance(ty, str):
            return f"{name}: signature type {ty!r}"
        if ty.startswith("*"):
            if not isinstance(value, torch.Tensor):
                return f"{name}: a {type(value).__name__} for pointer type {ty}"
        elif ty in SLOT:
            expected = float if ty.startswith("f") else int
            if type(value) is not expected:
                return f"{name}: a {type(value).__name__} for {ty}"
        else:
            return f"{name}: signature type {ty!r} (not verified)"
    if driver() is None:
        return _driver_error
    return None


class DriverLaunch:
    """One compiled kernel launched on a fixed grid by cuLaunchKernel (Note [Driver launch]).

    A call takes the run's values; `dynamic[i]` says where parameter i's value is in them (an index), None for a
    fixed value taken from `fixed[i]`. Tensors' data pointers are read on every call, fixed ones too."""

    __slots__ = ("name", "_drv", "_grid", "_block", "_shared", "_head", "_stream", "_last_stream", "_ctx",
                 "_params", "_buf", "_pack", "_tensors", "_run_ptrs", "_fixed_tensors", "_scalars", "_fallback",
                 "_lock")

    def __init__(self, kernel, grid: Sequence[int], dynamic: Sequence[int | None], fixed: Sequence[object],
                 stream: int, fallback: Callable[[list], None], drv: Driver, values: Sequence[object] = ()):
        """`values`: the run the launch is built for; where given, later calls may pass the data pointers of a run's
        tensors in their order (positions learnt from it) instead of having each read again."""
        kernel._init_handles()
        meta = kernel.metadata
        self.name = kernel.name if isinstance(getattr(kernel, "name", None), str) else "triton kernel"
        self._drv = drv
        self._grid = tuple(grid)
        self._block = 32 * meta.num_warps
        self._shared = meta.shared
        self._head = (ctypes.c_void_p(kernel.function), *self._grid, self._block, 1, 1, self._shared)
        self._stream = stream
        self._last_stream: tuple[int, ctypes.c_void_p | None] = (0, None)
        self._ctx = drv.current_context()
        self._fallback = fallback
        self._lock = threading.Lock()
        # Storage, 8 bytes a slot: the run's tensors' pointers, the fixed tensors' pointers and the run's scalars
        # (one pack per call), then the fixed scalars and the trailing null scratch pointers (packed here, once).
        passed = [(i, ty) for i, ty in enumerate(kernel.src.signature.values()) if ty != "constexpr"]
        ptr = [(i, ty) for i, ty in passed if ty.startswith("*")]
        run_ptrs = [(i, ty) for i, ty in ptr if dynamic[i] is not None]
        fixed_ptrs = [(i, ty) for i, ty in ptr if dynamic[i] is None]
        scalars = [(i, ty) for i, ty in passed if not ty.startswith("*") and dynamic[i] is not None]
        constants = [(i, ty) for i, ty in passed if not ty.startswith("*") and dynamic[i] is None]
        order = run_ptrs + fixed_ptrs + scalars + constants
        trailing = VERIFIED_TRITON[_triton_version()]
        n = len(order) + trailing
        self._buf = ctypes.create_string_buffer(8 * n)
        base = ctypes.addressof(self._buf)
        slot = {i: k for k, (i, _) in enumerate(order)}
        self._params = (ctypes.c_void_p * n)(*(base + 8 * slot[i] for i, _ in passed),
                                             *(base + 8 * (len(order) + k) for k in range(trailing)))
        per_run = POINTER_SLOT * len(ptr) + "".join(SLOT[ty] for _, ty in scalars)
        self._pack = struct.Struct("<" + per_run).pack_into
        struct.pack_into("<" + "".join(SLOT[ty] for _, ty in constants) + "Q" * trailing, self._buf,
                         8 * (len(ptr) + len(scalars)), *(fixed[i] for i, _ in constants), *(0,) * trailing)
        self._tensors = getter([dynamic[i] for i, _ in run_ptrs])
        at = {v: j for j, v in enumerate(i for i, x in enumerate(values) if isinstance(x, torch.Tensor))}
        self._run_ptrs = (getter([at[dynamic[i]] for i, _ in run_ptrs])
                          if values and all(dynamic[i] in at for i, _ in run_ptrs) else None)
        self._fixed_tensors = tuple(fixed[i] for i, _ in fixed_ptrs)
        self._scalars = getter([dynamic[i] for i, _ in scalars])

    def __call__(self, values: list, run_ptrs: tuple | None = None) -> None:
        if hooks_installed():
            self._fallback(values)
            return
        if run_ptrs is not None and self._run_ptrs is not None:
            ptrs = (*self._run_ptrs(run_ptrs), *map(_DATA_PTR, self._fixed_tensors))
        else:
            ptrs = (*map(_DATA_PTR, self._tensors(values)), *map(_DATA_PTR, self._fixed_tensors))
        stream = values[self._stream]
        with self._lock:
            last, handle = self._last_stream
            if stream != last:
                handle = ctypes.c_void_p(stream) if stream else None
                self._last_stream = (stream, handle)
            self._pack(self._buf, 0, *ptrs, *self._scalars(values))
            code = self._drv.launch(*self._head, handle, self._params, None)
            if code == CUDA_ERROR_INVALID_CONTEXT and self._ctx and self._drv.ctx_set(self._ctx) == 0:
                code = self._drv.launch(*self._head, handle, self._params, None)
        if code:
            raise RuntimeError(f"kdagen: launching Triton kernel {self.name} (grid {self._grid}, block "
                               f"{self._block}, {self._shared} bytes shared) failed: cuLaunchKernel returned "
                               f"{self._drv.describe(code)}")
