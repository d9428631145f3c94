# SPDX-License-Identifier: Apache-2.0
"""Build a rendered .hip source into a small shared library (extern "C" launchers) and load it with ctypes.

nvcc on CUDA targets (sm_*), hipcc or clang (-x hip) on AMD targets (gfx*); no PyTorch C++ headers, so
a build takes seconds and works with any torch. Builds go through the content-keyed cache (cache.py).

Note [HIP cache key]
    sha256 over: the rendered source bytes; every file of the include dir (name + bytes, sorted); the
    compiler's resolved path and its `--version` output; the exact flags; the target; the kdagen version.
    Nothing else (no mtimes, no source path), so the same inputs hit the same entry from any checkout,
    and a change to any of them is a new entry. Tested in tests/build/test_jit_hip_cache.py.
"""

from __future__ import annotations

import ctypes
import functools
import hashlib
import logging
import operator
import os
import shutil
import signal
import subprocess
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import kdagen
from kdagen.kernels.hip import ENTRIES, KDA_INTRA_LAUNCH, KDA_PAIR_LAUNCH, KDA_WALK_LAUNCH, QUERIES
from kdagen.kernels.schema import ABIError, KernelABI
from kdagen.targets import HIP_ABI, vendor_of

from . import cache
from .build_settings import build_settings

log = logging.getLogger("kdagen")

LIB_NAME = "kernels.so"
# Rough first-build times, for the log line (nvcc on the H200: ~4 s per variant).
_EXPECTED_S = {"nvcc": 5, "hipcc": 10, "clang": 10}


class ToolchainUnavailableError(RuntimeError):
    """The fused path cannot be built here at all (no compiler, no installed source); callers that can
    run the Triton path instead catch this (runtime/fused_choice.py), unlike a failed compile."""


class CompilerNotFoundError(ToolchainUnavailableError):
    """The compiler a target needs is not installed / not on PATH; the message says how to get it."""


class HipSourceMissingError(ToolchainUnavailableError):
    """The generated .hip source or its include/ headers are not installed next to kdagen_kernels."""


class HipCompileError(RuntimeError):
    """The compiler failed; the message holds its stderr and the generated source's path."""


class HipCompileTimeoutError(HipCompileError):
    """The compiler ran longer than KDAGEN_COMPILE_TIMEOUT_S and was killed."""


@dataclass(frozen=True)
class Compiler:
    kind: str  # "nvcc" | "hipcc" | "clang"
    path: str


def is_cuda_target(target: str) -> bool:
    return vendor_of(target) == "nvidia"


def find_compiler(target: str) -> Compiler:
    """KDAGEN_NVCC / KDAGEN_HIPCC first, then PATH (and CUDA_HOME / ROCM_PATH)."""
    if is_cuda_target(target):
        env = os.environ.get("KDAGEN_NVCC")
        if env:
            if not (shutil.which(env) or Path(env).is_file()):
                raise CompilerNotFoundError(f"KDAGEN_NVCC={env!r} does not name an executable nvcc")
            return Compiler("nvcc", shutil.which(env) or env)
        found = shutil.which("nvcc")
        if not found:
            home = os.environ.get("CUDA_HOME") or os.environ.get("CUDA_PATH")
            cand = Path(home) / "bin" / "nvcc" if home else None
            found = str(cand) if cand is not None and cand.is_file() else None
        if not found:
            raise CompilerNotFoundError(
                f"kdagen's fused path for {target} needs nvcc (the CUDA compiler) and none was found: set "
                "KDAGEN_NVCC=/path/to/nvcc, put nvcc on PATH (CUDA toolkit, or `pip install nvidia-cuda-nvcc "
                "nvidia-cuda-runtime nvidia-cuda-crt nvidia-cuda-cccl nvidia-nvvm`), or set CUDA_HOME")
        return Compiler("nvcc", found)
    env = os.environ.get("KDAGEN_HIPCC")
    if env:
        found = shutil.which(env) or (env if Path(env).is_file() else None)
        if not found:
            raise CompilerNotFoundError(f"KDAGEN_HIPCC={env!r} does not name an executable hipcc or clang")
        return Compiler("clang" if "clang" in Path(found).name else "hipcc", found)
    found = shutil.which("hipcc")
    if not found:
        rocm = os.environ.get("ROCM_PATH", "/opt/rocm")
        cand = Path(rocm) / "bin" / "hipcc"
        found = str(cand) if cand.is_file() else None
    if not found:
        raise CompilerNotFoundError(
            f"kdagen's fused path for {target} needs hipcc (ROCm's HIP compiler) and none was found: install "
            "ROCm (hipcc is in /opt/rocm/bin), put hipcc on PATH, or set KDAGEN_HIPCC to hipcc or to a "
            "ROCm clang++ that knows the target")
    return Compiler("hipcc", found)


def compile_flags(compiler: Compiler, target: str, include_dir: Path) -> list[str]:
    """Flags before `-o <lib> <source>`. The include dir is passed by name only in the key (see Note)."""
    if compiler.kind == "nvcc":
        arch = target.replace("sm_", "")
        return ["-O3", "-std=c++17", f"-arch=sm_{arch}", "-shared", "-Xcompiler", "-fPIC", "-x", "cu",
                "-I", str(include_dir)]
    if compiler.kind == "hipcc":
        return ["-O3", "-std=c++17", f"--offload-arch={target}", "-shared", "-fPIC", "-x", "hip",
                "-I", str(include_dir)]
    return ["-x", "hip", f"--offload-arch={target}", "-O3", "-std=c++17", "-shared", "-fPIC",
            "-I", str(include_dir)]


@functools.lru_cache(maxsize=None)
def compiler_version(path: str) -> str:
    try:
        r = subprocess.run([path, "--version"], capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise CompilerNotFoundError(f"could not run `{path} --version`: {exc}") from exc
    return (r.stdout + r.stderr).strip()


def _flags_for_key(flags: list[str], include_dir: Path) -> list[str]:
    # The include dir's location is not part of the key; its contents are.
    return ["<include>" if f == str(include_dir) else f for f in flags]


def cache_key(source: bytes, include_dir: Path, compiler: Compiler, flags: list[str], target: str) -> str:
    """See Note [HIP cache key]."""
    h = hashlib.sha256()

    def part(tag: str, data: bytes) -> None:
        h.update(tag.encode() + b"\0" + len(data).to_bytes(8, "little") + data)

    part("kdagen", kdagen.__version__.encode())
    part("target", target.encode())
    part("source", source)
    for f in sorted(p for p in Path(include_dir).rglob("*") if p.is_file()):
        part("include:" + f.relative_to(include_dir).as_posix(), f.read_bytes())
    part("compiler", os.path.realpath(compiler.path).encode())
    part("compiler_version", compiler_version(compiler.path).encode())
    part("flags", "\0".join(_flags_for_key(flags, include_dir)).encode())
    return h.hexdigest()


def _run_compiler(cmd: list[str], variant: str, target: str) -> tuple[int, str, str]:
    """(exit code, stdout, stderr); past KDAGEN_COMPILE_TIMEOUT_S the compiler and every process it
    started (nvcc runs cicc and ptxas) are killed, so that a hang never holds the entry's lock for good."""
    timeout_s = build_settings().compile_timeout_s
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)
    try:
        stdout, stderr = proc.communicate(timeout=timeout_s)
    except BaseException as exc:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        proc.wait()
        if isinstance(exc, subprocess.TimeoutExpired):
            raise HipCompileTimeoutError(
                f"compiling {variant} for {target} with {cmd[0]} did not finish within KDAGEN_COMPILE_TIMEOUT_S="
                f"{timeout_s:g} s and was killed; check that the compiler works (`{cmd[0]} --version`), or set "
                "KDAGEN_COMPILE_TIMEOUT_S higher if this machine is just slow") from None
        raise
    return proc.returncode, stdout, stderr


def build_library(source_path: Path, target: str, *, variant: str | None = None,
                  include_dir: Path | None = None) -> Path:
    """The cached shared library for one rendered source (compiled on a miss). Returns the .so path."""
    source_path = Path(source_path)
    include_dir = Path(include_dir) if include_dir is not None else source_path.parent / "include"
    variant = variant or source_path.stem
    for path, ok in ((source_path, source_path.is_file()), (include_dir, include_dir.is_dir())):
        if not ok:
            raise HipSourceMissingError(
                f"the generated HIP source of {variant} is not installed ({path} is missing): reinstall kdagen "
                "from a wheel or checkout that ships kdagen_kernels/hip/*.hip and hip/include/*.h, or run "
                "`nox -s generate` in a checkout")
    compiler = find_compiler(target)
    flags = compile_flags(compiler, target, include_dir)
    source = source_path.read_bytes()
    key = cache_key(source, include_dir, compiler, flags, target)

    def on_miss(entry: Path) -> None:
        log.info("kdagen: compiling %s for %s with %s (first use, may take ~%d s); cache entry %s",
                 variant, target, compiler.kind, _EXPECTED_S.get(compiler.kind, 10), entry)

    def build(staging: Path) -> dict:
        # Compile a copy of the source so the compiler's messages and the .so never point at a
        # file that may change under us; the error names the generated file the user can open.
        src = staging / ("source.cu" if compiler.kind == "nvcc" else "source.hip")
        src.write_bytes(source)
        out = staging / LIB_NAME
        cmd = [compiler.path, *flags, "-o", str(out), str(src)]
        returncode, stdout, stderr = _run_compiler(cmd, variant, target)
        if returncode != 0 or not out.is_file():
            raise HipCompileError(
                f"compiling {variant} for {target} failed (exit {returncode}).\n"
                f"generated source: {source_path}\ncommand: {' '.join(cmd)}\n"
                f"compiler stderr:\n{stderr.strip()}\n{stdout.strip()}".rstrip())
        return {"variant": variant, "target": target, "compiler": compiler.path, "flags": flags,
                "source": str(source_path)}

    entry = cache.get_or_build(key, target, build, on_miss=on_miss)
    return entry / LIB_NAME


# ---------------------------------------------------------------------------------------------- loading

class TargetMismatchError(RuntimeError):
    """A library built for one target was asked to run on another (a stale or copied cache entry)."""


class HipLibrary:
    """A loaded variant library with typed launchers. Launch errors raise with the runtime's message."""

    def __init__(self, path: Path, name: str, target: str):
        self.path = Path(path)
        self.name = name
        self.target = target
        self._lib = ctypes.CDLL(str(path))
        lib = self._lib
        for fn, restype in QUERIES.items():
            getattr(lib, fn).restype = restype
        self.abi = lib.kda_abi_version()
        if self.abi != HIP_ABI:
            raise RuntimeError(f"kdagen: {path} has launcher ABI {self.abi}, this kdagen expects {HIP_ABI}; "
                               "regenerate (`nox -s generate`) so the source and kdagen agree")
        built_for = lib.kda_target().decode()
        if built_for != target:
            raise TargetMismatchError(
                f"kdagen: {path} was built for {built_for}, not {target}; refusing to launch it. Remove the "
                f"cache entry ({Path(path).parent}) or set KDAGEN_TARGET to the device's real target")
        lib.kda_error_string.restype = ctypes.c_char_p
        lib.kda_error_string.argtypes = [ctypes.c_int]
        for abi in ENTRIES:
            fn = getattr(lib, abi.name)
            fn.argtypes = abi.ctypes_types()
            fn.restype = ctypes.c_int
        self.head_dim_k = lib.kda_head_dim_k()
        self.head_dim_v = lib.kda_head_dim_v()
        self.chunk_size = lib.kda_chunk_size()
        self.v_slice = lib.kda_v_slice()
        # kda_walk_kernel's workgroup size; 0 where the library has no walk (the FMA fallback).
        self.walk_threads = lib.kda_walk_threads()

    def check(self, code: int, what: str) -> None:
        if code != 0:
            msg = self._lib.kda_error_string(code).decode(errors="replace")
            raise RuntimeError(f"kdagen: {what} launch of {self.name} ({self.target}) failed: {msg} (code {code})")

    def intra(self, args: Mapping[str, object]) -> None:
        """kda_intra_launch with its arguments by name: the workspace on 16-row walk chunks."""
        self.check(self._lib.kda_intra_launch(*KDA_INTRA_LAUNCH.bind(args)), "intra")

    def walk(self, args: Mapping[str, object]) -> None:
        """kda_walk_launch with its arguments by name: the plain walk on kda_intra_launch's workspace."""
        self.check(self._lib.kda_walk_launch(*KDA_WALK_LAUNCH.bind(args)), "walk")

    def launcher(self, abi: KernelABI, static: Mapping[str, object],
                 dynamic: Sequence[str]) -> Callable[[list], None]:
        """`abi`'s launcher with the `static` arguments converted to their C types once (a plan's workspace and
        metadata pointers, its counts): the returned function takes the `dynamic` ones' values, in that order,
        as a list, and raises on a launch error as intra / walk do. Every parameter is in exactly one of the two.
        A per-layer launch then costs one itemgetter and the C call (ctypes converts only the dynamic values)."""
        fn = getattr(self._lib, abi.name)
        names = [p.name for p in abi.params]
        both, unknown = set(static) & set(dynamic), (set(static) | set(dynamic)) - set(names)
        missing = [n for n in names if n not in static and n not in dynamic]
        if both or unknown or missing or len(set(dynamic)) != len(dynamic):
            raise ABIError(f"{abi.name}: parameters {missing} have no value; {sorted(both)} are both static and "
                           f"dynamic; {sorted(unknown)} are not parameters (or a dynamic name repeats)")
        types = dict(zip(names, fn.argtypes))
        fixed_names = [n for n in names if n in static]
        fixed = [types[n](static[n]) for n in fixed_names]
        where = {n: i for i, n in enumerate(dynamic)}
        where.update({n: len(dynamic) + i for i, n in enumerate(fixed_names)})
        pick = operator.itemgetter(*(where[n] for n in names))
        check, what = self.check, abi.name.removeprefix("kda_").removesuffix("_launch")

        def launch(values: list) -> None:
            code = fn(*pick(values + fixed))
            if code != 0:
                check(code, what)

        return launch

    def pair_launcher(self, plan: Mapping[str, object]) -> Callable[[bytes], None]:
        """kda_pair_launch with its plan record packed once from `plan` (kernels/hip.py KDA_PAIR_LAUNCH.plan, values by
        field name): the returned function takes a run record (KDA_PAIR_LAUNCH.run.packer's bytes) and raises on a
        launch error as intra / walk do. The plan record lives as long as the function (Note [Pair record])."""
        fn = self._lib.kda_pair_launch
        record = ctypes.create_string_buffer(KDA_PAIR_LAUNCH.plan.pack(plan))
        address = ctypes.c_void_p(ctypes.addressof(record))
        check = self.check

        def launch(run: bytes) -> None:
            code = fn(run, address)
            if code != 0:
                check(code, "pair")

        launch.plan_record = record  # type: ignore[attr-defined]  # its owner, beside `address`
        return launch

    def smem_bytes(self) -> tuple[int, int]:
        """Shared memory per block of kda_intra_kernel and kda_walk_kernel."""
        return self._lib.kda_intra_smem_bytes(), self._lib.kda_walk_smem_bytes()


_loaded: dict[tuple[str, str], HipLibrary] = {}
_load_lock = threading.Lock()


def load_library(source_path: Path, target: str, *, variant: str | None = None,
                 include_dir: Path | None = None) -> HipLibrary:
    """Build (or hit the cache) and dlopen once per process per (source, target)."""
    key = (str(Path(source_path).resolve()), target)
    with _load_lock:
        lib = _loaded.get(key)
        if lib is None:
            so = build_library(source_path, target, variant=variant, include_dir=include_dir)
            lib = _loaded[key] = HipLibrary(so, variant or Path(source_path).stem, target)
        return lib
