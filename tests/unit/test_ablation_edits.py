# SPDX-License-Identifier: Apache-2.0
"""tools/ablate_prologue.py edits the generated Triton source with string and regex replacements: every
edit must still apply to every generated variant, or the GPU run reports "edit did not apply" rows."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

import kdagen_kernels

TOOL = Path(__file__).resolve().parents[2] / "tools" / "ablate_prologue.py"
TRITON = [e for e in kdagen_kernels.VARIANTS if e.backend == "triton"]


def _tool():
    spec = importlib.util.spec_from_file_location("ablate_prologue", TOOL)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.mark.parametrize("e", TRITON, ids=lambda e: e.name)
def test_every_edit_applies_and_compiles_to_python(e):
    tool = _tool()
    src = Path(e.load().__file__).read_text()
    for name, edit in tool.EDITS.items():
        new = edit(src)
        assert name == "base" or new != src, f"{name!r} did not apply to {e.name}"
        compile(new, f"<{name}>", "exec")  # still Python
