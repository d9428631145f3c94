# SPDX-License-Identifier: Apache-2.0
"""Shared test helpers: the project root and a throw-away copy of the project tree.

TRITON_INTERPRET is set by the noxfile (per pytest process), never here: triton reads it at import.
GPU tests skip themselves in their own module when torch.cuda is unavailable.
"""

from __future__ import annotations

import shutil
from collections.abc import Callable, Iterable
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
TREE = ("kdagen", "templates", "specs", "generated", "pyproject.toml")
_IGNORE = shutil.ignore_patterns("__pycache__", "*.pyc", "*.egg-info")


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
