# SPDX-License-Identifier: Apache-2.0
"""cuda_launch.DriverLaunch against a fake libcuda (Note [Driver launch]).

The fake, built here with cc, exports the four driver entry points a DriverLaunch calls; its cuLaunchKernel
records the function, grid, block, shared memory and stream of each call and copies every parameter's 8-byte
slot out, so the tests read exactly what the kernel would have been passed. The compiled kernel is a stand-in
with Triton's CompiledKernel attributes (src.signature, metadata, function, _init_handles, [grid])."""

from __future__ import annotations

import ctypes
import struct
import subprocess
import threading
import types

import pytest
import torch
import triton.language as tl

from kdagen.kernels.schema import KernelABI, constexpr, f32, i32, i64, ptr
from kdagen.runtime import cuda_launch
from kdagen.runtime.launch import KernelLaunch, spec_key

FAKE_LIBCUDA = r"""
#include <stdint.h>
#include <string.h>
#include <unistd.h>

#define MAX_CALLS 4096
typedef struct { void *fn; unsigned grid[3], block[3], shared; void *stream; uint64_t slot[32]; } Call;
static Call calls[MAX_CALLS];
static int n_calls, n_slots, fail_code, delay_us;
static void *current, *home = (void *)0x5eed0;

void fake_reset(int slots, int code, int delay) {
    n_calls = 0; n_slots = slots; fail_code = code; delay_us = delay; current = home;
}
void fake_drop_context(void) { current = 0; }
int fake_calls(void) { return n_calls; }
Call *fake_call(int i) { return &calls[i]; }

int cuCtxGetCurrent(void **ctx) { *ctx = current; return 0; }
int cuCtxSetCurrent(void *ctx) { current = ctx; return 0; }
int cuGetErrorString(int code, const char **text) { *text = "fake driver error"; return 0; }
int cuLaunchKernel(void *fn, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by, unsigned bz,
                   unsigned shared, void *stream, void **params, void **extra) {
    if (current == 0) return 201; /* CUDA_ERROR_INVALID_CONTEXT */
    if (fail_code) return fail_code;
    if (delay_us) usleep(delay_us); /* the window in which another thread could repack the parameters */
    Call *c = &calls[__sync_fetch_and_add(&n_calls, 1) % MAX_CALLS];
    c->fn = fn; c->grid[0] = gx; c->grid[1] = gy; c->grid[2] = gz; c->block[0] = bx; c->block[1] = by;
    c->block[2] = bz; c->shared = shared; c->stream = stream;
    for (int i = 0; i < n_slots; i++) memcpy(&c->slot[i], params[i], 8);
    return 0;
}
"""


class Call(ctypes.Structure):
    _fields_ = [("fn", ctypes.c_void_p), ("grid", ctypes.c_uint * 3), ("block", ctypes.c_uint * 3),
                ("shared", ctypes.c_uint), ("stream", ctypes.c_void_p), ("slot", ctypes.c_uint64 * 32)]


@pytest.fixture(scope="module")
def fake_lib(tmp_path_factory):
    where = tmp_path_factory.mktemp("fake-libcuda")
    (where / "fake.c").write_text(FAKE_LIBCUDA)
    subprocess.run(["cc", "-O1", "-shared", "-fPIC", "-o", str(where / "fake.so"), str(where / "fake.c")],
                   check=True)
    lib = ctypes.CDLL(str(where / "fake.so"))
    lib.fake_call.restype = ctypes.POINTER(Call)
    return lib


@pytest.fixture
def fake(fake_lib, monkeypatch):
    """The fake as the process's driver, expecting this file's kernel (6 parameters + 2 scratch slots)."""
    fake_lib.fake_reset(8, 0, 0)
    monkeypatch.setattr(cuda_launch, "_driver", cuda_launch.Driver(fake_lib))
    monkeypatch.setattr(cuda_launch, "_driver_error", None)
    return fake_lib


def calls(lib) -> list[Call]:
    return [lib.fake_call(i).contents for i in range(lib.fake_calls())]


# x, n and scale come from the run; stride and y are fixed; B is a declared constexpr and `one` an int Triton
# specialised into a constant (== 1): neither is passed.
ABI = KernelABI("kern", (ptr("x", "fp32"), i32("n"), i64("stride"), f32("scale"), i32("one"),
                         ptr("y", "fp32", writes=True), ptr("w", "bf16"), constexpr("B")))
SIGNATURE = {"x": "*fp32", "n": "i32", "stride": "i64", "scale": "fp32", "one": "constexpr", "y": "*fp32",
             "w": "*bf16", "B": "constexpr"}
RUN_ORDER = ("x", "n", "scale", "one", "w", "stream")


class FakeCompiled:
    """What JITFunction.run returns, as far as a launch reads it."""

    def __init__(self, log: list, signature: dict | None = None, **meta):
        self.log = log
        self.src = types.SimpleNamespace(signature=dict(SIGNATURE if signature is None else signature),
                                         constants={})
        fields = dict(target=types.SimpleNamespace(backend="cuda", arch=90, warp_size=32), num_warps=4, num_ctas=1,
                      shared=2048, global_scratch_size=0, global_scratch_align=1, profile_scratch_size=0,
                      profile_scratch_align=1, launch_cooperative_grid=False, launch_pdl=False, tensordesc_meta=None,
                      name="kern")
        fields.update(meta)
        self.metadata = types.SimpleNamespace(**fields)
        self.name = "kern"
        self.function = 0xF00D
        self.handles = 0

    def _init_handles(self):
        self.handles += 1

    def __getitem__(self, grid):
        return lambda *args, stream=None: self.log.append(("triton", grid, args, stream))


def make_launch(log: list, compiled: FakeCompiled, y: torch.Tensor, grid=(6, 2)) -> KernelLaunch:
    class Jit:
        def __getitem__(self, g):
            return lambda *args, **kw: (log.append(("jit", g, args, None)), compiled)[1]

    return KernelLaunch(types.SimpleNamespace(kern=Jit()), ABI, grid, constexprs={"B": 16}, options={"num_warps": 4},
                        static={"stride": 1 << 40, "y": y}, run_order=RUN_ORDER, direct=True)


def run(launch: KernelLaunch, values: list) -> None:
    launch(values, spec_key(values[:-1]))


def test_the_parameter_array_is_triton_s_less_the_constexprs_then_two_null_scratch_pointers(fake):
    log: list = []
    y, w = torch.zeros(64), torch.zeros(64, dtype=torch.bfloat16)
    compiled = FakeCompiled(log)
    launch = make_launch(log, compiled, y)
    x0, x1, x2 = torch.zeros(64), torch.zeros(64), torch.zeros(128)
    run(launch, [x0, 32, 0.25, 1, w, 7])  # the JIT launch; later runs with this key go to the driver
    assert [how for how, *_ in log] == ["jit"] and fake.fake_calls() == 0
    assert launch.launcher == "driver"
    run(launch, [x1, 48, 0.125, 1, w, 9])
    run(launch, [x2, -32, 3.0e38, 1, w, 0])
    assert [how for how, *_ in log] == ["jit"]  # Triton's launcher was not called again
    first, second = calls(fake)
    for call, x, n, scale, stream in ((first, x1, 48, 0.125, 9), (second, x2, -32, 3.0e38, None)):
        assert (call.fn, tuple(call.grid), tuple(call.block), call.shared, call.stream) == (
            0xF00D, (6, 2, 1), (128, 1, 1), 2048, stream)
        slot = list(call.slot[:8])
        assert slot[0] == x.data_ptr()
        assert struct.unpack("<i", struct.pack("<Q", slot[1])[:4])[0] == n  # i32 in its first 4 bytes
        assert slot[2] == 1 << 40  # the fixed i64
        as_f32 = struct.unpack("<f", struct.pack("<f", scale))[0]
        assert struct.unpack("<f", struct.pack("<Q", slot[3])[:4])[0] == as_f32  # fp32 in its first 4 bytes
        assert slot[4:8] == [y.data_ptr(), w.data_ptr(), 0, 0]  # B and one dropped; global, profile scratch null
    assert compiled.handles == 1


def test_the_run_s_pointers_read_once_by_the_caller_are_picked_by_position(fake):
    # Program.run reads every tensor's data pointer once (RunKey.with_ptrs) and hands them to each launch: the launch
    # takes its own from that tuple by the tensors' positions among the run's values, and the fixed ones it reads.
    from kdagen.runtime.launch import RunKey

    log: list = []
    y, w = torch.zeros(64), torch.zeros(64, dtype=torch.bfloat16)
    launch = make_launch(log, FakeCompiled(log), y)
    x0, x1 = torch.zeros(64), torch.zeros(64)
    run(launch, [x0, 32, 0.25, 1, w, 7])  # the JIT launch builds the driver launch
    values = [x1, 48, 0.125, 1, w, 9]
    key, ptrs = RunKey().with_ptrs(values)
    assert ptrs == (x1.data_ptr(), w.data_ptr())
    launch(values, spec_key(values[:-1]), ptrs)
    launch(values, spec_key(values[:-1]), (0x1000, 0x2000))  # the tuple is what is passed, not re-read
    launch(values, spec_key(values[:-1]))  # without it, each pointer is read
    got = [list(c.slot[:8]) for c in calls(fake)]
    assert [(g[0], g[4], g[5]) for g in got] == [(x1.data_ptr(), y.data_ptr(), w.data_ptr()),
                                                 (0x1000, y.data_ptr(), 0x2000),
                                                 (x1.data_ptr(), y.data_ptr(), w.data_ptr())]


def test_a_thread_without_a_context_gets_the_kernel_s_and_other_errors_name_the_kernel(fake):
    log: list = []
    x, y, w = torch.zeros(64), torch.zeros(64), torch.zeros(64, dtype=torch.bfloat16)
    launch = make_launch(log, FakeCompiled(log), y)
    run(launch, [x, 32, 0.5, 1, w, 7])
    fake.fake_drop_context()
    run(launch, [x, 32, 0.5, 1, w, 7])  # 201 once, then the context current when the launch was built
    assert fake.fake_calls() == 1
    fake.fake_reset(8, 700, 0)
    with pytest.raises(RuntimeError, match=r"Triton kernel kern .*CUresult 700: fake driver error"):
        run(launch, [x, 32, 0.5, 1, w, 7])


def test_one_launch_run_from_two_threads_passes_each_call_its_own_values(fake):
    # The fake waits inside cuLaunchKernel before reading the parameters, with the GIL released: without the
    # launch's lock the other thread's values would be packed into the shared array meanwhile. Each thread
    # launches on its own stream, which the driver call takes directly.
    fake.fake_reset(8, 0, 300)
    log: list = []
    y, w = torch.zeros(64), torch.zeros(64, dtype=torch.bfloat16)
    launch = make_launch(log, FakeCompiled(log), y)
    xs = [torch.zeros(64) for _ in range(2)]
    run(launch, [xs[0], 16, 0.5, 1, w, 7])

    def worker(t: int) -> None:
        for _ in range(40):
            run(launch, [xs[t], 16 * (t + 2), 0.5, 1, w, 10 + t])

    threads = [threading.Thread(target=worker, args=(t,)) for t in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    seen = [(c.stream, c.slot[0], c.slot[1] & 0xFFFFFFFF) for c in calls(fake)]
    assert len(seen) == 80
    assert set(seen) == {(10, xs[0].data_ptr(), 32), (11, xs[1].data_ptr(), 48)}  # the stream is the caller's


def _no_driver(monkeypatch):
    monkeypatch.setattr(cuda_launch, "driver", lambda: None)
    monkeypatch.setattr(cuda_launch, "_driver_error", "libcuda.so.1 not usable (test)")


# (what is changed, how, the reason's words)
FALLBACKS = [
    ("triton 3.5", lambda mp: mp.setattr(cuda_launch, "_triton_version", lambda: (3, 5)), "not a verified release"),
    ("ROCm torch", lambda mp: mp.setattr(torch.version, "hip", "6.4"), "ROCm"),
    ("no libcuda", _no_driver, "libcuda.so.1 not usable"),
    ("backend", {"target": types.SimpleNamespace(backend="hip")}, "backend 'hip'"),
    ("clusters", {"num_ctas": 2}, "num_ctas=2"),
    ("cluster dims", {"cluster_dims": (2, 1, 1)}, "cluster_dims"),
    ("cooperative", {"launch_cooperative_grid": True}, "launch_cooperative_grid"),
    ("pdl", {"launch_pdl": True}, "launch_pdl"),
    ("global scratch", {"global_scratch_size": 256}, "global_scratch_size=256"),
    ("profile scratch", {"profile_scratch_size": 64}, "profile_scratch_size=64"),
    ("instrumented", {"instrumentation_mode": "gsan"}, "instrumentation_mode"),
    ("tensor descriptors", {"tensordesc_meta": [{"swizzle": 0}]}, "tensor descriptors"),
    ("huge shared", {"shared": 229 * 1024}, "shared="),
    ("i1", {"signature": {**SIGNATURE, "n": "i1"}}, "'i1' (not verified)"),
    ("bf16 scalar", {"signature": {**SIGNATURE, "scale": "bf16"}}, "'bf16' (not verified)"),
    ("tuple", {"signature": {**SIGNATURE, "n": ("i32", "i32")}}, "signature type ('i32', 'i32')"),
    ("tensor descriptor arg", {"signature": {**SIGNATURE, "x": "tensordesc<fp32[16, 16]>"}}, "tensordesc"),
    ("other parameters", {"signature": {k if k != "w" else "v": t for k, t in SIGNATURE.items()}},
     "not the declaration"),
    ("empty grid", {"grid": (0, 2)}, "grid (0, 2, 1)"),
]


@pytest.mark.parametrize("what,change,words", FALLBACKS, ids=[f[0] for f in FALLBACKS])
def test_whatever_was_not_verified_keeps_triton_s_launcher(fake, monkeypatch, what, change, words):
    log: list = []
    grid = (6, 2)
    if callable(change):
        change(monkeypatch)
        change = {}
    change = dict(change)
    grid = change.pop("grid", grid)
    compiled = FakeCompiled(log, **change)
    x, y, w = torch.zeros(64), torch.zeros(64), torch.zeros(64, dtype=torch.bfloat16)
    launch = make_launch(log, compiled, y, grid=grid)
    run(launch, [x, 32, 0.5, 1, w, 7])
    run(launch, [x, 48, 0.5, 1, w, 9])
    assert [how for how, *_ in log] == ["jit", "triton"]
    _, g, args, stream = log[1]
    assert g == tuple(grid) + (1,) and stream == 9 and args[:2] == (x, 48) and args[5] is y
    assert fake.fake_calls() == 0
    assert launch.launcher.startswith("triton: ") and words in launch.launcher, launch.launcher


def test_launch_hooks_send_the_launch_through_triton_s_launcher_while_installed(fake):
    from triton import knobs

    log: list = []
    x, y, w = torch.zeros(64), torch.zeros(64), torch.zeros(64, dtype=torch.bfloat16)
    launch = make_launch(log, FakeCompiled(log), y)
    run(launch, [x, 32, 0.5, 1, w, 7])
    hook = lambda metadata: None  # noqa: E731
    knobs.runtime.launch_enter_hook.add(hook)
    try:
        run(launch, [x, 32, 0.5, 1, w, 7])
    finally:
        knobs.runtime.launch_enter_hook.remove(hook)
    run(launch, [x, 32, 0.5, 1, w, 7])
    assert [how for how, *_ in log] == ["jit", "triton"] and fake.fake_calls() == 1


def test_without_direct_launches_every_launch_is_the_jit_s(fake):
    # KDAGEN_TRITON_JIT_LAUNCH=1 (and AMD targets, the interpreter) make plans with direct=False.
    log: list = []
    compiled = FakeCompiled(log)

    class Jit:
        def __getitem__(self, g):
            return lambda *args, **kw: (log.append(("jit", g, args, None)), compiled)[1]

    launch = KernelLaunch(types.SimpleNamespace(kern=Jit()), ABI, (6, 2), constexprs={"B": 16}, options={},
                          static={"stride": 3, "y": torch.zeros(4)}, run_order=RUN_ORDER)
    values = [torch.zeros(64), 32, 0.5, 1, torch.zeros(4, dtype=torch.bfloat16), 7]
    launch(values, None)
    launch(values, None)
    assert [how for how, *_ in log] == ["jit", "jit"] and fake.fake_calls() == 0 and launch.launcher == "jit"


def _body(x, n, stride, scale, one, y, w, B: tl.constexpr):
    i = tl.arange(0, B)
    v = tl.load(x + i * stride) * scale + n + one
    tl.store(y + i, v + tl.load(w + i).to(tl.float32))


PTX_SIZES = {"u64": 8, "b64": 8, "s64": 8, "f64": 8, "u32": 4, "b32": 4, "s32": 4, "f32": 4}


def test_the_slots_are_the_ptx_entry_s_parameters_on_the_installed_triton(fake):
    # The installed Triton compiles a kernel of this file's signature for sm_90 (no GPU needed); the .entry's
    # parameters, Triton's trailing scratch pointers included, are the slots a DriverLaunch passes, with the
    # sizes the driver copies from them.
    import re

    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource
    from triton.runtime.jit import JITFunction

    fn = JITFunction(_body)
    signature = {**SIGNATURE, "stride": "i64"}
    try:
        kernel = triton.compile(ASTSource(fn, signature, constexprs={"B": 16, "one": 1}),
                                target=GPUTarget("cuda", 90, 32), options={"num_warps": 4})
    except RuntimeError as exc:
        if "ptxas" not in str(exc):
            raise
        pytest.skip(f"no ptxas for sm_90 here: {exc}")
    ptx = kernel.asm["ptx"]
    entry = ptx[ptx.index(".entry"):]
    params = re.findall(r"\.param\s+\.(\w+)", entry[:entry.index(")")])
    passed = [ty for ty in signature.values() if ty != "constexpr"]
    trailing = cuda_launch.VERIFIED_TRITON[cuda_launch._triton_version()]
    ours = [8 if ty.startswith("*") else struct.calcsize("<" + cuda_launch.SLOT[ty][0]) for ty in passed]
    assert [PTX_SIZES[p] for p in params] == ours + [8] * trailing
    assert cuda_launch.why_not(kernel, (6, 2, 1), [p.name for p in ABI.params],
                               [torch.zeros(4), 3, 5, 0.5, 1, torch.zeros(4), torch.zeros(4), 16]) is None
