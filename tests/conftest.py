# SPDX-License-Identifier: Apache-2.0
"""Shared test helpers: the project root, a throw-away copy of the project tree, the interpreter setting, and
the count of which pipeline each numerics case ran (printed at the end of the session).

Note [Interpreter setting]
    Triton reads TRITON_INTERPRET once, when it is imported (at the first test module's import), and the
    interpreter tests skip themselves without it, so a run that forgot it would pass having tested nothing.
    The noxfile sets it per pytest process (on for tests/unit, interp, e2e and build; off for tests/aot and
    tests/gpu, which need the real compiler). Run by hand with it unset on a machine without a GPU, this sets
    it to 1 before Triton is imported, unless the command line selects tests/aot or tests/gpu; and whatever
    the setting, a collected test that would skip for want of the interpreter fails the session at collection,
    with what to run instead.
"""

from __future__ import annotations

import os
import shutil
import sys
from collections import Counter
from collections.abc import Callable, Iterable
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
TREE = ("kdagen", "templates", "specs", "generated", "pyproject.toml")
_IGNORE = shutil.ignore_patterns("__pycache__", "*.pyc", "*.egg-info")
# tests/ folders whose tests need the real Triton compiler (TRITON_INTERPRET unset).
COMPILED_ONLY = ("aot", "gpu")
# The interpreter tests' skip reason says this (tests/interp/*, tests/unit/test_fused_dispatch.py).
INTERPRETER_SKIP = "TRITON_INTERPRET=1"


def _selected_folders(config: pytest.Config) -> set[str]:
    """The tests/ folders the command line selects; "*" for tests/ itself or anything above it."""
    out = set()
    for arg in config.args:
        path = (config.invocation_params.dir / arg.split("::")[0]).resolve()
        try:
            parts = path.relative_to(ROOT / "tests").parts
        except ValueError:
            parts = ()
        out.add(parts[0] if parts else "*")
    return out


def pytest_configure(config: pytest.Config) -> None:
    """Note [Interpreter setting]: TRITON_INTERPRET=1 for a hand run without a GPU, before Triton is imported."""
    if "TRITON_INTERPRET" in os.environ:
        return
    selected = _selected_folders(config)
    if "*" in selected or selected & set(COMPILED_ONLY):
        return
    import torch

    if torch.cuda.is_available():
        return
    if "triton" in sys.modules:
        raise pytest.UsageError("tests: TRITON_INTERPRET is unset and there is no GPU, but triton was imported "
                                "before the tests' conftest could set it (Triton reads it at import); run "
                                "`TRITON_INTERPRET=1 pytest ...`")
    os.environ["TRITON_INTERPRET"] = "1"


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Note [Interpreter setting]: an interpreter test that would skip fails the session here instead."""
    would_skip = [item.nodeid for item in items for mark in item.iter_markers("skipif")
                  if mark.args and mark.args[0] is True and INTERPRETER_SKIP in mark.kwargs.get("reason", "")]
    if would_skip:
        raise pytest.UsageError(
            f"{len(would_skip)} interpreter tests would be skipped (e.g. {would_skip[0]}): TRITON_INTERPRET="
            f"{os.environ.get('TRITON_INTERPRET', '(unset)')}, and Triton reads it at import. Run them with "
            "TRITON_INTERPRET=1 (nox -s tests does), in a process apart from tests/aot and tests/gpu, which need "
            "it unset")


@pytest.fixture
def one_launch_at_a_time(monkeypatch):
    """Triton's interpreter is not thread-safe (a launch patches triton.language's globals while it runs): for
    tests of concurrent calls on the CPU, one interpreted launch at a time, with a switch to the other thread
    after each, so that two calls still interleave between their launches (where a shared workspace would be
    overwritten)."""
    import threading
    import time

    from triton.runtime.interpreter import InterpretedFunction

    launch, lock = InterpretedFunction.run, threading.Lock()

    def one_at_a_time(self, *args, **kwargs):
        with lock:
            result = launch(self, *args, **kwargs)
        time.sleep(0.001)
        return result

    monkeypatch.setattr(InterpretedFunction, "run", one_at_a_time)


# Numerics cases per pipeline that ran ("<test file>: <pipeline> (<variant>)" -> count), for the summary.
_PIPELINES_RAN: Counter = Counter()


@pytest.fixture(scope="session")
def pipelines_ran() -> Counter:
    """A session-wide Counter: a test adds 1 under a label naming the pipeline a case ran; the counts are
    printed at the end of the session (how many cases took each path)."""
    return _PIPELINES_RAN


def pytest_terminal_summary(terminalreporter) -> None:
    if _PIPELINES_RAN:
        terminalreporter.section("pipelines run (cases)")
        for label, n in sorted(_PIPELINES_RAN.items()):
            terminalreporter.write_line(f"{n:6d}  {label}")


def copy_tree(dst: Path, parts: Iterable[str] = TREE) -> Path:
    """Copy the named parts of the project into dst (missing ones are skipped); return dst."""
    dst.mkdir(parents=True, exist_ok=True)
    for part in parts:
        src = ROOT / part
        if src.is_dir():
            shutil.copytree(src, dst / part, ignore=_IGNORE)
        elif src.is_file():
            shutil.copy2(src, dst / part)
    return dst


@pytest.fixture
def project_copy(tmp_path: Path) -> Callable[..., Path]:
    """project_copy(*parts) -> a tmp copy of the project (default: kdagen, templates, specs, generated,
    pyproject.toml)."""

    def make(*parts: str) -> Path:
        return copy_tree(tmp_path / "project", parts or TREE)

    return make


@pytest.fixture
def set_interpreting(monkeypatch) -> Callable[[bool], None]:
    """set_interpreting(on): what kdagen reads of TRITON_INTERPRET (once, at import) and the variable itself,
    for tests of decisions that depend on it (no kernel runs differently: triton read it at its import)."""
    from kdagen.runtime import device

    def set_(on: bool) -> None:
        monkeypatch.setenv("TRITON_INTERPRET", "1" if on else "0")
        monkeypatch.setattr(device, "_INTERPRETING", on)

    return set_


@pytest.fixture(autouse=True)
def _fresh_plan_cache():
    """chunk_kda_prefill reuses the plan of its last batch (Note [Plan cache]); tests that patch the
    environment or the dispatch's collaborators must not see another test's plan."""
    import sys

    dispatch = sys.modules.get("kdagen.runtime.dispatch")
    if dispatch is not None:
        dispatch.clear_plans()
    yield
    if dispatch is not None:
        dispatch.clear_plans()


@pytest.fixture(scope="session")
def libs():
    """For the fused path's GPU tests (tests/gpu/test_fused_path.py, test_fused_intra.py): its two libraries for
    this GPU's target, (K, V) -> HipLibrary, built (or taken from the cache) once per session; skips without
    CUDA, without a hip variant for the target, or without its compiler."""
    import torch

    if not torch.cuda.is_available():
        pytest.skip("no GPU")
    import kdagen_kernels
    from kdagen.runtime import fused_path, jit_hip
    from kdagen.runtime.device import target_of

    target = target_of(torch.device("cuda", torch.cuda.current_device()))
    if not any(e.backend == "hip" and target in e.targets for e in kdagen_kernels.VARIANTS):
        pytest.skip(f"no generated hip variant declares this device's target {target}")
    pkg = Path(kdagen_kernels.__file__).resolve().parent
    try:
        return {(K, V): fused_path.load_fused(pkg, K, V, target) for K, V in ((128, 128), (128, 256))}
    except jit_hip.CompilerNotFoundError as exc:
        pytest.skip(f"no compiler for the fused path: {exc}")
