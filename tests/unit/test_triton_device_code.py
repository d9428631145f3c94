# SPDX-License-Identifier: Apache-2.0
"""The generated Triton variants are thin wrappers over kdagen/triton_kernels/: every kernel forwards its
whole ABI to its body, and an edit of the bodies changes the Triton variants' stamps (and only theirs).
Triton's own cache key of a wrapper following its body is tests/aot/test_triton_cache_key.py (it needs the
compiler's JITFunction, not the interpreter's)."""

from __future__ import annotations

import inspect
import shutil
from pathlib import Path

import pytest

import kdagen_kernels
from kdagen.kernels.kda import KERNELS
from kdagen.render import context
from kdagen.render.emit import render_all
from kdagen.triton_kernels import intra, pair, walk

ROOT = Path(__file__).resolve().parents[2]
TRITON = [e for e in kdagen_kernels.VARIANTS if e.backend == "triton"]
BODIES = {"kda_prologue": pair.prologue, "kda_wu": pair.wu, "kda_intra": intra.intra, "kda_intra_tb": intra.intra_tb,
          "kda_recurrence": walk.recurrence, "kda_recurrence_tb": walk.recurrence_tb, "kda_group_scan": walk.group_scan}
VARIANT_CONSTANTS = {"K", "V", "BK", "BV", "BT", "BC", "IO"}


@pytest.mark.parametrize("e", TRITON, ids=lambda e: e.name)
def test_each_wrapper_forwards_its_abi_to_its_body(e):
    mod = e.load()
    for name, abi in KERNELS.items():
        names = [p.name for p in abi.params]
        assert getattr(mod, name).arg_names == names, name
        body = list(inspect.signature(BODIES[name].fn).parameters)
        assert body[:len(names)] == names, f"{name}: the body's leading parameters are not the ABI's"
        assert set(body[len(names):]) <= VARIANT_CONSTANTS, f"{name}: {body[len(names):]}"
        src = inspect.getsource(getattr(mod, name).fn)
        assert all(f"{n}={n}" in src for n in names), f"{name} does not forward every parameter"


def test_a_device_code_edit_changes_the_triton_stamps_only(tmp_path, monkeypatch):
    device = tmp_path / "triton_kernels"
    shutil.copytree(context.TRITON_DEVICE_DIR, device, ignore=shutil.ignore_patterns("__pycache__"))
    monkeypatch.setattr(context, "TRITON_DEVICE_DIR", device)

    def stamps() -> dict[str, str]:
        return {rel: text.split("\n", 1)[0] for rel, text in render_all(ROOT).items() if rel != "_manifest.json"}

    before = stamps()
    src = device / "walk.py"
    src.write_text(src.read_text() + "\n# touched\n")
    after = stamps()
    changed = sorted(rel for rel in before if before[rel] != after[rel])
    assert changed == sorted(f"triton/{e.name}.py" for e in TRITON)

