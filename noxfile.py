# SPDX-License-Identifier: Apache-2.0
"""nox sessions: generate, check, quick (a fast local gate), tests and tests_triton_edge (CPU CI), gpu (the
H200), demo, bench, autotune."""

from __future__ import annotations

import nox

# uv ignores the machine's pip.conf (constraints, on-disk wheels) and would fetch a CUDA torch.
nox.options.default_venv_backend = "venv"
nox.options.sessions = ["check", "tests", "tests_triton_edge"]

# Tested pins (docs/reference.md, "Triton releases"): the CPU torch wheel does not pin triton itself, and an
# unpinned triton resolves to a release without tl.make_block_ptr.
TORCH = "torch==2.13.0"
PINS = (TORCH, "triton==3.7.1")
# The other ends of the triton range pyproject allows: their interpreters each need a patch
# (kdagen/runtime/interpreter_compat.py), so CI runs every kernel through the interpreter under both, each
# in its own venv (the `tests` venv keeps the pinned release).
EDGE_TRITONS = ("3.6.0", "3.9.0")
# A handful of interpreter numerics for `quick` and the edge tritons: the smallest variant end to end,
# caller metadata, the state cache and the grouped walk: every Triton kernel (kda_intra on the bounded gate;
# the pair, the grouped walk and the group scan on the softplus gate).
QUICK_NUMERICS = (
    "tests/interp/test_triton_numerics.py::test_adversarial_regime_small",
    "tests/interp/test_triton_numerics.py::test_caller_built_chunk_metadata_is_used",
    "tests/interp/test_triton_numerics.py::test_state_cache_gather_run_scatter_in_place",
    "tests/interp/test_triton_numerics.py::test_group_scan_matches_reference[2]",
)
GENERATOR_DEPS = ("jinja2", "pyyaml")  # pyproject's `generate` extra: the runtime never imports them


def _install(session: nox.Session, *extras: str, pins: tuple[str, ...] = PINS) -> None:
    """Install the pinned stack and kdagen (editable, so kdagen_kernels is importable) in one resolve.

    The test sessions take the `generate` extra too: the spec and render tests load specs and templates.

    Skipped without a venv (`--no-venv` or venv_backend="none"): then the current environment is
    used as it is, e.g. on a GPU machine whose CUDA torch must not be replaced.
    """
    if session.venv_backend == "none":
        return
    target = f".[{','.join(extras)}]" if extras else "."
    session.install(*pins, "-e", target)


def _pytest(session: nox.Session, *args: str, interpret: bool) -> None:
    # The interpreter flag is read when triton is imported, so each setting is its own process. nox fails
    # the session on any non-zero exit, so a run that collects no tests (pytest's exit 5) fails it too.
    session.run("pytest", *args, *session.posargs, env={"TRITON_INTERPRET": "1" if interpret else None})


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
def quick(session: nox.Session) -> None:
    """Unit tests and a few interpreter numerics (under two minutes on two cores)."""
    _install(session, "test", "generate")
    _pytest(session, "tests/unit", *QUICK_NUMERICS, interpret=True)


@nox.session
def tests(session: nox.Session) -> None:
    """The CPU CI under the pinned triton: unit, interp, e2e and build tests, then the AOT compiles.

    tests/e2e spawns processes, tests/build runs g++ (the HIP emulation, fake libraries); both under
    TRITON_INTERPRET=1 with the unit and interpreter tests. tests/aot needs the real Triton compiler.
    """
    _install(session, "test", "generate")
    # pytest-xdist: one worker per core (the interpreter and the emulation's g++ builds are single-threaded);
    # serially this session took 28 of CI's 30 minutes on 2 cores.
    workers = ("-n", "auto")
    _pytest(session, *workers, "tests/unit", "tests/interp", "tests/e2e", "tests/build", interpret=True)
    _pytest(session, *workers, "tests/aot", interpret=False)


@nox.session
@nox.parametrize("triton", EDGE_TRITONS, ids=[f"triton{v}" for v in EDGE_TRITONS])
def tests_triton_edge(session: nox.Session, triton: str) -> None:
    """Every kernel through the interpreter, and the metadata, under the oldest and the newest supported
    triton: what their interpreter patches (kdagen/runtime/interpreter_compat.py) must keep working. The
    whole numerics suite runs once, in `tests` (the pinned triton); repeating it here cost CI about 5 of its
    30 minutes."""
    _install(session, "test", "generate", pins=(TORCH, f"triton=={triton}"))
    _pytest(session, *QUICK_NUMERICS, "tests/interp/test_metadata.py", interpret=True)


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
    _install(session, "generate")
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
