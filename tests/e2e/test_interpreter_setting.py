# SPDX-License-Identifier: Apache-2.0
"""Note [Interpreter setting] (tests/conftest.py): interpreter tests are never silently skipped. Each case is a
pytest process of its own, since Triton reads TRITON_INTERPRET at import."""

from __future__ import annotations

import os
import subprocess
import sys
from types import SimpleNamespace

import pytest
import torch

from tests.conftest import ROOT, _selected_folders

FUZZ = "tests/interp/test_fuzz.py"


def _pytest(*args: str, interpret: str | None) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    if interpret is not None:
        env["TRITON_INTERPRET"] = interpret
    env["PYTHONPATH"] = f"{ROOT}{os.pathsep}{ROOT / 'generated'}"
    return subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *args], cwd=ROOT,
                          env=env, capture_output=True, text=True, timeout=300)


@pytest.mark.skipif(torch.cuda.is_available(), reason="the setting is made only on a machine without a GPU")
def test_unset_without_a_gpu_runs_the_interpreter_tests():
    # metadata's first test asserts the variable is 1 (it would fail, not skip, without it).
    r = _pytest("tests/interp/test_metadata.py", "-k", "interpreter_is_on", interpret=None)
    assert r.returncode == 0 and " passed" in r.stdout and "skipped" not in r.stdout, r.stdout + r.stderr


def test_interpreter_tests_that_would_skip_fail_the_session():
    r = _pytest(FUZZ, "--collect-only", interpret="0")
    assert r.returncode == pytest.ExitCode.USAGE_ERROR, r.stdout + r.stderr
    assert "interpreter tests would be skipped" in r.stdout + r.stderr and "TRITON_INTERPRET=1" in r.stdout + r.stderr


@pytest.mark.parametrize(("args", "folders"), [
    (["tests/interp/test_fuzz.py::test_x", "tests/unit"], {"interp", "unit"}),
    (["tests/aot/test_aot_hip.py"], {"aot"}),  # left compiled: tests/aot needs the real compiler
    (["tests"], {"*"}), ([str(ROOT)], {"*"}),
])
def test_the_selected_folders_decide_the_setting(args, folders):
    config = SimpleNamespace(args=args, invocation_params=SimpleNamespace(dir=ROOT))
    assert _selected_folders(config) == folders
