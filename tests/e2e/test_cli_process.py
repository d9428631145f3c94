# SPDX-License-Identifier: Apache-2.0
"""The CLI in a fresh interpreter: `python -m kdagen` and the generator commands' import path without torch."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from kdagen import cli

ROOT = Path(__file__).resolve().parents[2]
FIXTURE_TEMPLATES = ROOT / "tests" / "unit" / "fixtures" / "templates"


@pytest.fixture
def root(tmp_path: Path) -> Path:
    root = tmp_path / "project"
    shutil.copytree(ROOT / "specs", root / "specs")
    shutil.copytree(FIXTURE_TEMPLATES, root / "templates")
    return root


def test_python_dash_m(root):
    proc = subprocess.run([sys.executable, "-m", "kdagen", "list", "--root", str(root)], cwd=ROOT,
                          capture_output=True, text=True, check=False)
    assert proc.returncode == 0, proc.stderr
    assert "kda_chunk_fwd__triton__" in proc.stdout
    assert cli.PROJECT_ROOT == ROOT


def test_generator_commands_do_not_need_torch(root):
    # `nox -s generate` / `nox -s check` install only jinja2 and pyyaml: keep torch/triton out of the
    # import path of the CLI and of every module in COMMAND_MODULES (they must import torch lazily).
    code = ("import sys; sys.modules['torch'] = None; sys.modules['triton'] = None; "
            "from kdagen.cli import main; sys.exit(main(['generate', '--root', sys.argv[1]]))")
    proc = subprocess.run([sys.executable, "-c", code, str(root)], cwd=ROOT, capture_output=True, text=True,
                          check=False)
    assert proc.returncode == 0, proc.stderr
