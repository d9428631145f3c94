# SPDX-License-Identifier: Apache-2.0
"""`python -m kdagen`: exit codes and messages of generate, check, list; SpecError -> exit 2."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from kdagen import cli

ROOT = Path(__file__).resolve().parents[2]
FIXTURE_TEMPLATES = Path(__file__).resolve().parent / "fixtures" / "templates"


@pytest.fixture
def root(tmp_path: Path) -> Path:
    root = tmp_path / "project"
    shutil.copytree(ROOT / "specs", root / "specs")
    shutil.copytree(FIXTURE_TEMPLATES, root / "templates")
    return root


def test_generate_check_list(root, capsys):
    assert cli.main(["check", "--root", str(root)]) == 1
    out = capsys.readouterr().out
    assert "generated/kdagen_kernels/_registry.py: missing" in out
    assert "run `nox -s generate`" in out

    assert cli.main(["generate", "--root", str(root)]) == 0
    assert "wrote   generated/kdagen_kernels/_registry.py" in capsys.readouterr().out
    assert cli.main(["generate", "--root", str(root)]) == 0
    assert "generated/kdagen_kernels/ is up to date" in capsys.readouterr().out
    assert cli.main(["check", "--root", str(root)]) == 0
    assert capsys.readouterr().out == "generated/kdagen_kernels/ is up to date\n"

    assert cli.main(["list", "--root", str(root)]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].split() == ["name", "targets", "spec"]
    assert "kda_chunk_fwd__triton__bf16__k128_v128_c64  gfx942,gfx950,sm_90  specs/kda_chunk_fwd.yaml:" in lines[1]


def test_spec_errors_exit_2_with_all_errors(root, capsys):
    spec = root / "specs" / "kda_chunk_fwd.yaml"
    spec.write_text(spec.read_text().replace("chunk_size: 64", "chunk_size: 65").replace("dtype: fp16", "dtype: f16"))
    assert cli.main(["generate", "--root", str(root)]) == 2
    err = capsys.readouterr().err.splitlines()
    assert err[0] == f"kdagen: {len(err) - 1} spec error(s):"
    assert len(err) - 1 == 5  # four chunk sizes and one dtype
    assert all(line.startswith("specs/kda_chunk_fwd.yaml:") for line in err[1:])
    assert not (root / "generated").exists()


def test_render_errors_exit_2(root, capsys):
    (root / "templates" / "package" / "triton_init.py.j2").write_text("{{ stamp }}\n{{ oops }}\n")
    assert cli.main(["check", "--root", str(root)]) == 2
    assert capsys.readouterr().err.startswith("kdagen: render error: templates/package/triton_init.py.j2:2: ")


def test_add_command(monkeypatch, capsys):
    monkeypatch.setattr(cli, "_COMMANDS", dict(cli._COMMANDS))
    cli.add_command("hello", "say hello", lambda p: p.add_argument("--who", default="you"),
                    lambda args: print(f"hello {args.who} from {args.root.name}") or 0)
    assert cli.main(["hello", "--who", "kda", "--root", str(ROOT)]) == 0
    assert capsys.readouterr().out == f"hello kda from {ROOT.name}\n"
    with pytest.raises(ValueError, match="registered twice"):
        cli.add_command("hello", "again", None, lambda args: 0)


# Runs `python -m kdagen ARGS` with jinja2 and yaml unimportable: a runtime-only install (no `generate` extra).
_WITHOUT_GENERATOR = """
import importlib.abc, runpy, sys
class Block(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name.partition(".")[0] in ("jinja2", "yaml"):
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
sys.meta_path.insert(0, Block())
sys.argv = ["kdagen", *sys.argv[1:]]
runpy.run_module("kdagen", run_name="__main__")
"""


def _without_generator(*args: str):
    import os
    import subprocess
    import sys
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), str(ROOT / "generated")]))
    return subprocess.run([sys.executable, "-c", _WITHOUT_GENERATOR, *args], env=env, capture_output=True,
                          text=True, timeout=120)


def test_commands_run_without_the_generate_extra():
    for command in ("bench", "demo", "autotune"):
        r = _without_generator(command, "--help")
        assert r.returncode == 0, (command, r.stderr)
    r = _without_generator("generate")
    assert r.returncode != 0
    assert "pip install 'kdagen[generate]'" in r.stderr and "Traceback" not in r.stderr


def test_package_dir_is_the_emitters():
    from kdagen.render.emit import PACKAGE_DIR
    assert cli.PACKAGE_DIR == PACKAGE_DIR
