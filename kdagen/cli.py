# SPDX-License-Identifier: Apache-2.0
"""`python -m kdagen <command>`: generate, check, list, and any command registered with add_command."""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from kdagen.spec.errors import SpecError

PROJECT_ROOT = Path(__file__).resolve().parent.parent
# Relative to the project root; render.emit holds the same path (a test checks they agree).
PACKAGE_DIR = Path("generated") / "kdagen_kernels"


def _generator():
    """kdagen.render.emit, imported on use: a runtime-only install (no `generate` extra) still runs bench,
    demo and the other commands, and generating without Jinja or PyYAML says how to get them."""
    try:
        emit = importlib.import_module("kdagen.render.emit")
        load = importlib.import_module("kdagen.spec.load")
    except ModuleNotFoundError as exc:
        if exc.name not in ("jinja2", "yaml"):
            raise
        raise SystemExit(f"kdagen: rendering specs needs {exc.name}, which is not installed; "
                         "install the generator's extra: pip install 'kdagen[generate]'") from None
    return emit, load

# Modules that call add_command() at import time. To add a command, write it in its own module
# (e.g. kdagen/bench.py with `add_command("bench", ...)` at module level) and list the module here.
COMMAND_MODULES: tuple[str, ...] = ("kdagen.bench", "kdagen.demo", "kdagen.autotune")

# Exit codes: 0 ok, 1 generated/ drifted (check), 2 invalid specs or templates.
EXIT_DRIFT, EXIT_INVALID = 1, 2


@dataclass(frozen=True)
class Command:
    name: str
    help: str
    configure: Callable[[argparse.ArgumentParser], None]  # adds the command's own arguments
    run: Callable[[argparse.Namespace], int]  # returns the exit code; args.root is a resolved Path


_COMMANDS: dict[str, Command] = {}


def add_command(name: str, help: str, configure: Callable[[argparse.ArgumentParser], None] | None,
                run: Callable[[argparse.Namespace], int]) -> None:
    """Register a subcommand. Every subcommand gets --root; SpecError/RenderError are handled by main."""
    if name in _COMMANDS:
        raise ValueError(f"kdagen command {name!r} is registered twice")
    _COMMANDS[name] = Command(name, help, configure or (lambda parser: None), run)


def _run_generate(args: argparse.Namespace) -> int:
    report = _generator()[0].emit(args.root)
    for path in report.written:
        print(f"wrote   {_shown(path, args.root)}")
    for path in report.deleted:
        print(f"deleted {_shown(path, args.root)}")
    if not report.written and not report.deleted:
        print(f"{PACKAGE_DIR.as_posix()}/ is up to date ({len(report.unchanged)} files)")
    return 0


def _run_check(args: argparse.Namespace) -> int:
    drift = _generator()[0].check(args.root)
    if not drift:
        print(f"{PACKAGE_DIR.as_posix()}/ is up to date")
        return 0
    for message in drift:
        print(message)
    print(f"\n{PACKAGE_DIR.as_posix()}/ differs from a fresh render of specs/ and templates/ "
          f"({len(drift)} file(s)); fix: run `nox -s generate` (or `python -m kdagen generate`) "
          "and commit the result; never edit generated files by hand")
    return EXIT_DRIFT


def _run_list(args: argparse.Namespace) -> int:
    rows = [("name", "targets", "spec")]
    for spec in _generator()[1].load_specs(args.root / "specs", args.root):
        for v in spec.variants:
            rows.append((v.name, ",".join(v.targets), f"{v.spec_path}:{v.line}"))
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]) - 1)]
    for row in rows:
        print("  ".join(cell.ljust(w) for cell, w in zip(row, widths)) + "  " + row[-1])
    return 0


def _shown(path: Path, root: Path) -> str:
    try:
        return path.resolve().relative_to(root).as_posix()
    except ValueError:
        return str(path)


add_command("generate", "render specs/ through templates/ into generated/ (writes only what changed)",
            None, _run_generate)
add_command("check", "fail (exit 1) if generated/ differs from a fresh render", None, _run_check)
add_command("list", "list the variants the specs declare", None, _run_list)


def build_parser() -> argparse.ArgumentParser:
    for module in COMMAND_MODULES:
        importlib.import_module(module)
    parser = argparse.ArgumentParser(prog="python -m kdagen", description="KDA kernel generator.")
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--root", type=Path, default=PROJECT_ROOT,
                        help=f"project root holding specs/, templates/, generated/ (default: {PROJECT_ROOT})")
    sub = parser.add_subparsers(dest="command", required=True, metavar="{" + ",".join(_COMMANDS) + "}")
    for cmd in _COMMANDS.values():
        p = sub.add_parser(cmd.name, help=cmd.help, description=cmd.help, parents=[common])
        cmd.configure(p)
        p.set_defaults(_run=cmd.run)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    args.root = args.root.resolve()
    try:
        return args._run(args)
    except SpecError as exc:
        print(f"kdagen: {len(exc.errors)} spec error(s):", file=sys.stderr)
        print(str(exc), file=sys.stderr)
        return EXIT_INVALID
    except Exception as exc:
        # A RenderError can only come from a loaded render.env, so looking it up never imports Jinja.
        env = sys.modules.get("kdagen.render.env")
        if env is None or not isinstance(exc, env.RenderError):
            raise
        print(f"kdagen: render error: {exc}", file=sys.stderr)
        return EXIT_INVALID
