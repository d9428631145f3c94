# SPDX-License-Identifier: Apache-2.0
"""nox sessions: generate, check, tests (CPU CI), gpu (the H200), demo, bench, autotune."""

from __future__ import annotations

import nox

# uv ignores the machine's pip.conf (constraints, on-disk wheels) and would fetch a CUDA torch.
nox.options.default_venv_backend = "venv"
nox.options.sessions = ["check", "tests"]

# Tested pins (design/toolchain.md section 0): the CPU torch wheel does not pin triton itself, and an
# unpinned triton resolves to a release without tl.make_block_ptr.
PINS = ("torch==2.13.0", "triton==3.7.1")
# The other ends of the triton range pyproject allows: their interpreters each need a patch
# (kdagen/runtime/interpreter_compat.py), so CI runs the interpreter numerics under both.
EDGE_TRITONS = ("triton==3.6.0", "triton==3.9.0")
GENERATOR_DEPS = ("jinja2", "pyyaml")


def _install(session: nox.Session, *extras: str) -> None:
    """Install the pinned stack and kdagen (editable, so kdagen_kernels is importable) in one resolve.

    Skipped without a venv (`--no-venv` or venv_backend="none"): then the current environment is
    used as it is, e.g. on a GPU machine whose CUDA torch must not be replaced.
    """
    if session.venv_backend == "none":
        return
    target = f".[{','.join(extras)}]" if extras else "."
    session.install(*PINS, "-e", target)


@nox.session
def generate(session: nox.Session) -> None:
    """Render specs/ through templates/ into generated/ (writes only what changed)."""
    # Generating needs only Jinja and PyYAML; `python -m kdagen` runs from the checkout.
    session.install(*GENERATOR_DEPS)
    session.run("python", "-m", "kdagen", "generate", *session.posargs)


@nox.session
def check(session: nox.Session) -> None:
    """Fail if generated/ differs from a fresh render."""
    session.install(*GENERATOR_DEPS)
    session.run("python", "-m", "kdagen", "check", *session.posargs)


@nox.session
def tests(session: nox.Session) -> None:
    """The CPU CI: unit + interpreter numerics + e2e under TRITON_INTERPRET=1, AOT compiles, then the
    interpreter numerics under the oldest and newest supported triton."""
    _install(session, "test")
    # Two processes: the interpreter flag is read when triton is imported, and the AOT tests need
    # the real compiler. A failing run, or one that collects no tests (exit 5), fails the session.
    session.run("pytest", "tests/unit", "tests/interp", "tests/e2e", *session.posargs,
                env={"TRITON_INTERPRET": "1"})
    session.run("pytest", "tests/aot", *session.posargs, env={"TRITON_INTERPRET": None})
    # The interpreter numerics and metadata again under the oldest and newest supported triton; last, so
    # the AOT tests above compile with the pinned release.
    if session.venv_backend != "none":
        for triton in EDGE_TRITONS:
            session.install(triton)
            session.run("pytest", "tests/interp/test_triton_numerics.py", "tests/interp/test_metadata.py",
                        *session.posargs, env={"TRITON_INTERPRET": "1"})


@nox.session(venv_backend="none")
def gpu(session: nox.Session) -> None:
    """GPU numerics and features (run on the H200).

    NOTE: no venv: the GPU machine cannot download wheels, and its CUDA torch must not be replaced
    by the CPU pin, so this uses the current python, which must already have kdagen installed.
    """
    session.run("python", "-m", "pytest", "tests/gpu", *session.posargs, env={"TRITON_INTERPRET": None})


@nox.session
def demo(session: nox.Session) -> None:
    """Regenerate, then run the demo."""
    _install(session)
    session.run("python", "-m", "kdagen", "generate")
    session.run("python", "-m", "kdagen", "demo", *session.posargs)


@nox.session(venv_backend="none")
def bench(session: nox.Session) -> None:
    """The benchmark table (GPU; same no-venv rule as `gpu`)."""
    session.run("python", "-m", "kdagen", "bench", *session.posargs)


@nox.session(venv_backend="none")
def autotune(session: nox.Session) -> None:
    """Time Triton launch configs on this GPU; with `-- --write`, store the best in the spec (same rule as `gpu`)."""
    session.run("python", "-m", "kdagen", "autotune", *session.posargs)
