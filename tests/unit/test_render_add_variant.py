# SPDX-License-Identifier: Apache-2.0
"""Adding a variant to the spec rewrites that variant's files and the package index files, nothing else:
every other generated file keeps its bytes (so the fused sources' HIP cache keys stay valid, see
Note [HIP cache key] in kdagen/runtime/jit_hip.py). Runs `emit` on a tmp copy of the real tree."""

from __future__ import annotations

import json
from pathlib import Path

from conftest import copy_tree  # tests/ is on sys.path (rootdir conftest)

from kdagen.render import PACKAGE_DIR, emit

# The README's example ("Adding a head-dim variant").
D96 = ("  - {label: d96, head_dim_k: 96, head_dim_v: 96, chunk_size: 64, dtype: bf16, backends: [triton], "
       "targets: [sm_90, gfx950]}\n")
INDEX = ["__init__.py", "_manifest.json", "_registry.py"]


def _snapshot(out: Path) -> dict[str, bytes]:
    return {p.relative_to(out).as_posix(): p.read_bytes() for p in out.rglob("*")
            if p.is_file() and "__pycache__" not in p.parts}


def test_adding_a_variant_changes_only_its_files_and_the_index(tmp_path):
    root = copy_tree(tmp_path / "project", ("templates", "specs", "generated"))
    out = root / PACKAGE_DIR
    assert emit(root).written == []  # the checked-in tree is current
    before = _snapshot(out)
    spec = root / "specs" / "kda_chunk_fwd.yaml"
    spec.write_text(spec.read_text().rstrip("\n") + "\n\n" + D96)

    report = emit(root)
    new = "triton/kda_chunk_fwd__triton__bf16__k96_v96_c64.py"
    assert sorted(p.relative_to(out).as_posix() for p in report.written) == sorted([new, *INDEX])
    assert report.deleted == []
    after = _snapshot(out)
    assert set(after) == set(before) | {new}
    same = sorted(rel for rel in before if rel not in INDEX)
    assert [rel for rel in same if after[rel] != before[rel]] == []
    # Among them every fused source and header, byte for byte.
    assert any(rel.startswith("hip/include/") for rel in same) and any(rel.endswith(".hip") for rel in same)
    # The manifest records the same inputs for every file that kept its bytes.
    old_inputs = json.loads(before["_manifest.json"])["inputs"]
    new_inputs = json.loads(after["_manifest.json"])["inputs"]
    assert {rel: new_inputs[rel] for rel in same} == {rel: old_inputs[rel] for rel in same}
    assert new_inputs[new]["templates"] == ["templates/triton/kda_chunk.py.j2"]
