# SPDX-License-Identifier: Apache-2.0
"""Host-side cost of a chunk_kda_prefill call and of a plan's run, as multiples of one `a.add_(b)`.

Usage: TRITON_INTERPRET=1 PYTHONPATH=.:generated python tools/host_path_cost.py [H:T:N] [--pipeline P] [--fused]
                                                                               [--pieces] [--profile]
                                                                               [--triton-launcher]
       PYTHONPATH=.:generated python tools/host_path_cost.py --cuda [H:T:N] [...]    (on a GPU)

vLLM's common case on CPU tensors: bf16, K = V = 128, cu_seqlens with caller-built chunk metadata, the
safe gate with g_bias, L2 norm in kernel, a paged state cache, `out` given. Triton's interpreter launch
entry (InterpretedFunction.run) is replaced by a no-op and torch runs on one thread, so what is timed is
kdagen's Python path plus Triton's own launch closure: the per-layer checks, the argument binding and the
plan cache's lookup. The figure is the median of interleaved rounds of each, reported as a ratio to one
`add_` of two 16-float tensors timed in the same rounds, so that a slower or busier machine moves both.

--pipeline names the plan's stages (KDAGEN_PIPELINE for the call, pipeline= for the plan), --fused passes
use_fused_chunk=True; the pipeline each measured plan runs is printed. On the CPU a pipeline with a HIP stage
runs against a library of no-op extern "C" launchers with the generated launchers' C signatures (built here
with cc), so the ctypes calls and their argument conversion are timed as on a GPU; the CUDA stream lookup,
which a CPU tensor has not, is not. --pieces times plan.run's parts (the per-layer checks, the binding, the
launches) and the wrapper's share (the cached call less plan.run of its plan), and names the launcher each of
its plan's launches used.

With --cuda the tensors are on the GPU and the launches are real: each sample drains the device first, so
the figure is the host time of one call on an idle device (the bench's host column), and `add_` is one
launch of torch's add kernel. A second figure, "back to back", times 20 calls in a row after one drain (the
host of a serving loop runs ahead of the device), per call, against 20 `add_` timed the same way.
--triton-launcher keeps Triton's compiled launcher where the driver launch (Note [Driver launch]) would be
used, for an A/B of the two in one process.
"""

from __future__ import annotations

import ctypes
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from types import SimpleNamespace

import torch

_C_TYPES = {ctypes.c_void_p: "void*", ctypes.c_char_p: "const void*", ctypes.c_int32: "int32_t", ctypes.c_int64: "int64_t", ctypes.c_float: "float"}


def _median_us(fn, n: int, sync=None) -> float:
    samples = []
    for _ in range(n):
        if sync is not None:
            sync()
        t = time.perf_counter()
        fn()
        samples.append(time.perf_counter() - t)
    return statistics.median(samples) * 1e6


def _noop_library(K: int, V: int, target: str):
    """A HipLibrary whose launchers return 0 at once: the generated launchers' C signatures (from their
    declarations, kdagen/kernels/hip.py) and queries answering for a (K, V) bf16 variant on `target`."""
    from kdagen.kernels.hip import ENTRIES, QUERIES
    from kdagen.runtime.jit_hip import HipLibrary
    from kdagen.targets import HIP_ABI

    answers = {"kda_abi_version": HIP_ABI, "kda_target": f'"{target}"', "kda_variant": '"noop"',
               "kda_head_dim_k": K, "kda_head_dim_v": V, "kda_chunk_size": 64, "kda_v_slice": 64,
               "kda_intra_smem_bytes": 0, "kda_walk_smem_bytes": 0, "kda_walk_threads": 256}
    lines = ["#include <stdint.h>", 'const char* kda_error_string(int code) { return "no-op"; }']
    for fn, restype in QUERIES.items():
        lines.append(f"{'const char*' if restype is ctypes.c_char_p else 'int'} {fn}(void) {{ return {answers[fn]}; }}")
    for abi in ENTRIES:
        params = ", ".join(f"{_C_TYPES[t]} a{i}" for i, t in enumerate(abi.ctypes_types()))
        lines.append(f"int {abi.name}({params}) {{ return 0; }}")
    where = Path(tempfile.mkdtemp(prefix="kdagen-noop-"))
    (where / "noop.c").write_text("\n".join(lines) + "\n")
    subprocess.run(["cc", "-O2", "-shared", "-fPIC", "-o", str(where / "noop.so"), str(where / "noop.c")], check=True)
    return HipLibrary(where / "noop.so", f"no-op launchers for K={K}, V={V}", target)


def _fake_gpu_library(K: int, V: int) -> None:
    """CPU tensors count as sitting on an sm_90 GPU for the fused path, whose library is the no-op one."""
    from kdagen.runtime import fused_choice, fused_path

    lib = _noop_library(K, V, "sm_90")
    fused_choice.fused_target = lambda device: "sm_90"
    fused_path.load_fused = lambda *a, **kw: lib
    torch.cuda.current_stream = lambda device=None: SimpleNamespace(cuda_stream=0)  # a CPU tensor's: none


def main() -> None:
    torch.set_num_threads(1)
    argv = sys.argv[1:]
    pipeline = argv[argv.index("--pipeline") + 1] if "--pipeline" in argv else None
    fused = "--fused" in argv
    if "--triton-launcher" in argv:
        from kdagen.runtime import cuda_launch

        cuda_launch.why_not = lambda *a, **kw: "host_path_cost.py --triton-launcher"
    cuda = "--cuda" in argv
    if pipeline is not None:
        os.environ["KDAGEN_PIPELINE"] = pipeline  # the wrapper's plan reads it when it is made
    import kdagen_kernels as kk
    from kdagen.bench import make_inputs

    dev = "cuda" if cuda else "cpu"
    sync = torch.cuda.synchronize if cuda else None
    shape = [a for i, a in enumerate(argv) if not a.startswith("--") and (i == 0 or argv[i - 1] != "--pipeline")]
    H, T, N = (int(x) for x in (shape[0] if shape else ("12:4096:1" if cuda else "12:1024:4")).split(":"))
    if not cuda and (fused or (pipeline is not None and "hip" in pipeline)):
        _fake_gpu_library(128, 128)
    args, ci, co = make_inputs(H, [T // N] * N, K=128, V=128, seed=1, device=dev)
    cache = torch.randn(N + 4, H, 128, 128, device=dev)
    slots = torch.arange(N, dtype=torch.int32, device=dev)
    has_init = torch.ones(N, dtype=torch.bool, device=dev)
    out = torch.empty_like(args["v"])
    q, k, v, g, beta, A_log, g_bias = (args[n] for n in ("q", "k", "v", "raw_g", "raw_beta", "A_log", "g_bias"))
    cu = args["cu_seqlens"]
    plan = kk.plan_kda_prefill(cu, cu.cpu(), num_heads=H, head_dim_k=128, head_dim_v=128, lower_bound=args["lower_bound"],
                               has_g_bias=True, use_qk_l2norm_in_kernel=True, chunk_indices=ci, chunk_offsets=co,
                               state_indices=slots, has_initial_state=has_init, use_fused_chunk=fused,
                               pipeline=pipeline)
    if not cuda:
        from triton.runtime.interpreter import InterpretedFunction

        InterpretedFunction.run = lambda self, *a, **kw: None  # the launches themselves: no-ops from here on

    def call():
        kk.chunk_kda_prefill(q, k, v, g, beta, A_log, g_bias, lower_bound=args["lower_bound"],
                             use_qk_l2norm_in_kernel=True, cu_seqlens=cu, chunk_indices=ci, chunk_offsets=co,
                             use_fused_chunk=fused, out=out, state_cache=cache, state_indices=slots,
                             has_initial_state=has_init)

    def run():
        plan.run(q, k, v, g, beta, A_log, g_bias, out=out, state_cache=cache)

    a, b = torch.randn(16, device=dev), torch.randn(16, device=dev)

    def add():
        a.add_(b)

    call()
    from kdagen.runtime import dispatch

    call_plan = next(c.plan for c in dispatch._last.values())  # the plan the wrapper cached (one thread, stream)
    timed = {"add": add, "call": call, "run": run}
    if "--pieces" in argv:
        timed.update(_pieces(call_plan, q, k, v, g, beta, A_log, g_bias, out, cache))
    n = 40 if cuda else 400
    for f in timed.values():
        _median_us(f, n, sync)
    rounds: dict[str, list[float]] = {name: [] for name in timed}
    for _ in range(15):
        for name, f in timed.items():
            rounds[name].append(_median_us(f, n, sync))
    us = {name: statistics.median(r) for name, r in rounds.items()}
    add_us, call_us, run_us = us["add"], us["call"], us["run"]
    if cuda:
        burst = {name: [] for name in ("add", "call", "run")}
        for _ in range(15):
            for name in burst:
                burst[name].append(_median_us(lambda f=timed[name]: [f() for _ in range(20)], 10, sync) / 20)
        b2b = {name: statistics.median(r) for name, r in burst.items()}
    how = "on the GPU, idle device per sample" if cuda else "launches no-ops, one torch thread"
    print(f"H={H} T={T} N={N}, {how} (median of 15 rounds x {n}):")
    print(f"  pipeline: call {call_plan.pipeline.name}, plan {plan.pipeline.name}"
          + (" (HIP launchers: no-op library)" if not cuda and "hip" in call_plan.pipeline.name + plan.pipeline.name
             else ""))
    print(f"  a.add_(b), 16 floats      {add_us:7.2f} us")
    print(f"  chunk_kda_prefill (cached) {call_us:7.1f} us = {call_us / add_us:5.1f}x add_")
    print(f"  plan.run                   {run_us:7.1f} us = {run_us / add_us:5.1f}x add_")
    if cuda:
        print(f"  back to back (20 in a row, per call): add_ {b2b['add']:.2f} us, chunk_kda_prefill "
              f"{b2b['call']:.1f} us = {b2b['call'] / b2b['add']:.1f}x, plan.run {b2b['run']:.1f} us = "
              f"{b2b['run'] / b2b['add']:.1f}x")
    if "--pieces" in argv:
        wrapper = call_us - us["call plan.run"]
        print("  pieces of the cached call (its plan):")
        print(f"    wrapper (call - its plan.run) {wrapper:7.1f} us = {wrapper / add_us:5.1f}x add_")
        for name in ("call plan.run", "checks (_fast_ok)", "binding (bind)", "launches (program.run)"):
            print(f"    {name:29s} {us[name]:7.1f} us = {us[name] / add_us:5.1f}x add_")
        launchers = sorted({getattr(x, "launcher", type(x).__name__) for s in (0, 1, 2)
                            for x in call_plan.program.launches(s)})
        print(f"    launchers (Note [Compiled launch]): {'; '.join(launchers)}")
    if "--profile" in argv:
        import cProfile
        import pstats

        pr = cProfile.Profile()
        pr.enable()
        for _ in range(2000):
            call()
        pr.disable()
        pstats.Stats(pr).sort_stats("tottime").print_stats(30)


def _pieces(plan, q, k, v, g, beta, A_log, g_bias, out, cache) -> dict:
    """plan.run of the wrapper's plan and its parts, each called as run calls it."""
    scale = q.shape[-1] ** -0.5
    checks = (q, k, v, g, beta, A_log, g_bias, None, out, cache, None, scale)
    strides = plan._fast_ok(*checks)
    assert strides is not None, "the measured call must pass the plan's fast checks"
    bound = plan.bind(q, k, v, g, beta, A_log, g_bias, scale, None, out, cache, strides, None)
    values, state_in = bound[0], bound[1]
    return {"call plan.run": lambda: plan.run(q, k, v, g, beta, A_log, g_bias, out=out, state_cache=cache),
            "checks (_fast_ok)": lambda: plan._fast_ok(*checks),
            "binding (bind)": lambda: plan.bind(q, k, v, g, beta, A_log, g_bias, scale, None, out, cache, strides,
                                                None),
            "launches (program.run)": lambda: plan.program.run(values, state_in)}


if __name__ == "__main__":
    main()
