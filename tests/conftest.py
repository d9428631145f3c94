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
