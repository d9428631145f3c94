# SPDX-License-Identifier: Apache-2.0
"""The wheel works outside the source tree: built from a copy of the tree, installed into a folder of its
own, then imported by a process that cannot see the checkout, jinja2 or PyYAML. That process runs a small
interpreter call against the float64 reference computed here, asks whether the fused path can run, and
lists the HIP sources and headers the fused path would compile."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import torch

from conftest import ROOT
from kdagen.reference import chunk_kda_prefill_reference
from tests.kda_cases import make_inputs
from tests.tolerances import check

SHIPPED = ("pyproject.toml", "kdagen", "generated")  # what the wheel is built from (pyproject's packages)

CHILD = textwrap.dedent("""
    import json, os, sys
    site, root = sys.argv[1], sys.argv[2]

    class NoGenerator:
        # The runtime must never need the generator's dependencies.
        def find_spec(self, name, path=None, target=None):
            if name.partition(".")[0] in ("jinja2", "yaml"):
                raise ImportError(f"{name} is blocked in this test")
            return None

    # Nothing may resolve to the checkout: not an editable install's finder, not a path inside it.
    sys.meta_path[:] = [NoGenerator()] + [f for f in sys.meta_path if "editable" not in repr(f)]
    # (A virtual environment may itself live inside the checkout, as nox's .nox/ does: keep site-packages.)
    sys.path[:] = [site] + [p for p in sys.path if "editable" not in p
                            and (not p.startswith(root) or "site-packages" in p)]
    import torch
    import kdagen, kdagen_kernels as kk
    from pathlib import Path
    args = torch.load(sys.argv[3])
    o, s = kk.chunk_kda_prefill(**args)
    torch.save({"o": o, "s": s}, sys.argv[4])
    hip = Path(kk.__file__).parent / "hip"
    print(json.dumps({
        "files": [kdagen.__file__, kk.__file__],
        "fused": kk.can_use_fused_kda_chunk(128, 128, torch.bfloat16, 64),
        "hip": sorted(p.relative_to(hip).as_posix() for p in hip.rglob("*") if p.is_file()),
        "generator_modules": sorted(m for m in sys.modules if m.startswith(("kdagen.spec", "kdagen.render"))),
    }))
""")


def _run(cmd: list[str], **kw) -> subprocess.CompletedProcess:
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=300, **kw)
    assert res.returncode == 0, f"{' '.join(cmd)}\n{res.stdout[-3000:]}\n{res.stderr[-3000:]}"
    return res


def test_the_installed_wheel_runs_without_the_source_tree(tmp_path):
    # Built from a copy: setuptools writes build/ and *.egg-info next to pyproject.toml, and a stale build/
    # in the checkout could put files in the wheel that the tree no longer has.
    src = tmp_path / "src"
    src.mkdir()
    for name in SHIPPED:
        if (ROOT / name).is_dir():
            shutil.copytree(ROOT / name, src / name, ignore=shutil.ignore_patterns("__pycache__"))
        else:
            shutil.copy2(ROOT / name, src / name)
    pip = [sys.executable, "-m", "pip", "--disable-pip-version-check", "--no-input", "-q"]
    _run([*pip, "wheel", "--no-deps", "--no-build-isolation", str(src), "-w", str(tmp_path / "dist")], cwd=src)
    (wheel,) = (tmp_path / "dist").glob("kdagen-*.whl")
    site = tmp_path / "site"
    _run([*pip, "install", "--no-deps", "--no-index", "--target", str(site), str(wheel)], cwd=tmp_path)

    args = make_inputs([13, 5], 1, 64, 64, torch.bfloat16, "cpu", seed=5)
    ref_o, ref_s = chunk_kda_prefill_reference(**args)
    torch.save(args, tmp_path / "args.pt")
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME")}
    env.update(TRITON_INTERPRET="1", KDAGEN_CACHE_DIR=str(tmp_path / "cache"))
    res = _run([sys.executable, "-I", "-c", CHILD, str(site), str(ROOT), str(tmp_path / "args.pt"),
                str(tmp_path / "got.pt")], cwd=run_dir, env=env)
    report = json.loads(res.stdout.strip().splitlines()[-1])

    assert all(Path(f).is_relative_to(site) for f in report["files"]), report["files"]
    got = torch.load(tmp_path / "got.pt")
    check("installed wheel output", got["o"], ref_o, ("triton-interp", "bf16", "output"))
    check("installed wheel final state", got["s"], ref_s, ("triton-interp", "bf16", "final_state"))
    assert report["fused"] is False  # no GPU here; asking builds nothing and needs no generator
    hip = ROOT / "generated" / "kdagen_kernels" / "hip"
    shipped = sorted(p.relative_to(hip).as_posix() for p in hip.rglob("*") if p.suffix in (".hip", ".h"))
    assert report["hip"] == shipped and any(n.startswith("include/") for n in shipped)
    assert report["generator_modules"] == []
