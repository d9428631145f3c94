# SPDX-License-Identifier: Apache-2.0
"""The drift check: the checked-in generated/ matches a fresh render, and edits to it are caught."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from kdagen.render import PACKAGE_DIR, check, generate

ROOT = Path(__file__).resolve().parents[2]
FIXTURE_TEMPLATES = Path(__file__).resolve().parent / "fixtures" / "templates"
FIX = "run `nox -s generate`"


def test_repo_has_no_drift():
    drift = check(ROOT)
    assert drift == [], "generated/ is stale; " + FIX + ":\n" + "\n".join(drift)


@pytest.fixture
def generated_root(tmp_path: Path) -> Path:
    root = tmp_path / "project"
    shutil.copytree(ROOT / "specs", root / "specs")
    shutil.copytree(FIXTURE_TEMPLATES, root / "templates")
    generate(root)
    assert check(root) == []
    return root


def test_edited_deleted_and_extra_files_are_reported(generated_root):
    out = generated_root / PACKAGE_DIR
    registry = out / "_registry.py"
    registry.write_text(registry.read_text().replace("CHUNK_SIZES", "CHUNK_SIZES_EDITED"))
    (out / "triton" / "__init__.py").unlink()
    (out / "triton" / "stray.py").write_text("x = 1\n")
    (out / "__pycache__").mkdir()
    (out / "__pycache__" / "_registry.cpython-311.pyc").write_bytes(b"\0")  # caches are not drift
    edited_line = registry.read_text().split("\n").index(
        next(line for line in registry.read_text().split("\n") if "CHUNK_SIZES_EDITED" in line)) + 1
    assert check(generated_root) == [
        f"generated/kdagen_kernels/_registry.py: changed: differs from a fresh render from line {edited_line}; "
        "edited by hand (its sha256 no longer matches _manifest.json)",
        "generated/kdagen_kernels/triton/__init__.py: missing",
        "generated/kdagen_kernels/triton/stray.py: extra file: no spec or template produces it",
    ]
    generate(generated_root)
    assert check(generated_root) == ["generated/kdagen_kernels/triton/stray.py: extra file: no spec or "
                                     "template produces it"]


def test_stale_render_names_the_changed_input(generated_root):
    tpl = generated_root / "templates" / "package" / "triton_init.py.j2"
    tpl.write_text(tpl.read_text() + "# new line\n")
    hint = "inputs changed since the last generate: templates/package/triton_init.py.j2"
    drift = check(generated_root)
    assert [m.split(": ")[0] for m in drift] == [
        "generated/kdagen_kernels/_manifest.json", "generated/kdagen_kernels/triton/__init__.py"]
    assert drift[1] == ("generated/kdagen_kernels/triton/__init__.py: changed: differs from a fresh render "
                        f"from line 1; {hint}")
    assert drift[0].endswith(hint)


def test_missing_generated_dir_is_all_missing(generated_root):
    shutil.rmtree(generated_root / "generated")
    drift = check(generated_root)
    assert drift and all(m.endswith(": missing") for m in drift)
