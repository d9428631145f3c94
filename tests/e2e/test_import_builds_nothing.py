# SPDX-License-Identifier: Apache-2.0
"""Importing kdagen_kernels in a fresh interpreter compiles no fused library and imports no kernel module."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path


def test_importing_the_package_builds_nothing(tmp_path):
    # A fresh interpreter: importing kdagen_kernels neither compiles a fused library nor imports a kernel module.
    code = ("from kdagen.runtime import jit_hip\n"
            "def boom(*a, **k): raise AssertionError('compiled at import')\n"
            "jit_hip.build_library = jit_hip.load_library = boom\n"
            "import sys, kdagen_kernels\n"
            "assert any(e.backend == 'hip' for e in kdagen_kernels.VARIANTS)\n"
            "assert not [m for m in sys.modules if m.startswith('kdagen_kernels.triton.')], sys.modules\n"
            "print('ok')\n")
    root = Path(__file__).resolve().parents[2]
    env = dict(os.environ, PYTHONPATH=f"{root}{os.pathsep}{root / 'generated'}", KDAGEN_CACHE_DIR=str(tmp_path))
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=300,
                       check=False)
    assert r.returncode == 0 and r.stdout.strip() == "ok", r.stderr
