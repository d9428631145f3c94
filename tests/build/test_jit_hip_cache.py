# SPDX-License-Identifier: Apache-2.0
"""The HIP JIT cache with a fake compiler (a Python script standing in for nvcc): hits across processes,
one compile under contention, killed builds, corruption, read-only cache dirs, entries someone else could
have written, compiler hangs, malformed settings, missing compilers and sources, and a key that changes
with the source, a header or the flags, and only then."""

from __future__ import annotations

import json
import logging
import os
import signal
import stat
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

import kdagen
from kdagen.runtime import build_settings, cache, cache_trust, jit_hip

ROOT = Path(__file__).resolve().parents[2]

FAKE_NVCC = textwrap.dedent("""\
    #!{python}
    # Fake nvcc: `--version` prints a version; otherwise copies the source into the -o file (prefixed),
    # appending one line per compile to $FAKE_NVCC_LOG. $FAKE_NVCC_SLEEP: seconds to wait half-way.
    import os, sys, time
    args = sys.argv[1:]
    if args == ["--version"]:
        print("fake nvcc " + os.environ.get("FAKE_NVCC_VERSION", "1.0"))
        sys.exit(0)
    out = args[args.index("-o") + 1]
    src = args[-1]
    data = open(src, "rb").read()
    if b"#error" in data:
        sys.stderr.write(src + ":1: error: boom\\n")
        sys.exit(1)
    with open(os.environ["FAKE_NVCC_LOG"], "a") as f:
        f.write("compile\\n")
    with open(out, "wb") as f:
        f.write(b"FAKE-SO\\n" + data[: len(data) // 2])
        f.flush()
        time.sleep(float(os.environ.get("FAKE_NVCC_SLEEP", "0")))
        f.write(data[len(data) // 2:])
    """)


@pytest.fixture
def env(tmp_path, monkeypatch):
    """A fake nvcc, a fresh cache dir and a generated-like source tree."""
    nvcc = tmp_path / "bin" / "nvcc"
    nvcc.parent.mkdir()
    nvcc.write_text(FAKE_NVCC.format(python=sys.executable))
    nvcc.chmod(0o755)
    log = tmp_path / "compiles.log"
    log.write_text("")
    src_dir = tmp_path / "gen" / "hip"
    (src_dir / "include").mkdir(parents=True)
    (src_dir / "include" / "kda_port.h").write_text("// header v1\n")
    src = src_dir / "kda_chunk_fwd__hip__bf16__k128_v128_c64__sm_90.hip"
    src.write_text('#include "kda_port.h"\nint x = 1;\n')
    monkeypatch.setenv("KDAGEN_NVCC", str(nvcc))
    monkeypatch.setenv("FAKE_NVCC_LOG", str(log))
    monkeypatch.setenv("KDAGEN_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.delenv("FAKE_NVCC_SLEEP", raising=False)
    for name in ("KDAGEN_LOCK_TIMEOUT_S", "KDAGEN_COMPILE_TIMEOUT_S"):
        monkeypatch.delenv(name, raising=False)
    jit_hip.compiler_version.cache_clear()
    monkeypatch.setattr(cache, "_fallback_root", None)
    monkeypatch.setattr(cache, "_warned", set())
    build_settings.build_settings.cache_clear()
    yield {"nvcc": nvcc, "log": log, "src": src, "cache": tmp_path / "cache", "tmp": tmp_path}
    build_settings.build_settings.cache_clear()


def setenv(monkeypatch, name: str, value: str) -> None:
    """Settings are read once per process: a test that changes one starts a new reading."""
    monkeypatch.setenv(name, value)
    build_settings.build_settings.cache_clear()


def warnings_of(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]


def fake_owner(monkeypatch, under: Path, uid: int = 4242) -> None:
    """Every path at or below `under` looks owned by `uid` to the trust check (works as root too)."""
    real = cache_trust.status

    def status(path, follow):
        st = real(path, follow)
        if Path(path) == under or Path(path).is_relative_to(under):
            fields = list(st[:10])
            fields[4] = uid  # st_uid
            return os.stat_result(fields)
        return st

    monkeypatch.setattr(cache_trust, "status", status)


def compiles(env) -> int:
    return len(env["log"].read_text().splitlines())


BUILD_SNIPPET = ("import sys; sys.path.insert(0, {root!r}); from kdagen.runtime import jit_hip; "
                 "print(jit_hip.build_library({src!r}, 'sm_90'))")


def build_in_subprocess(env, **popen) -> subprocess.Popen:
    code = BUILD_SNIPPET.format(root=str(ROOT), src=str(env["src"]))
    return subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, **popen)


def test_build_publishes_a_verified_entry_and_logs_once(env, caplog):
    with caplog.at_level(logging.INFO, logger="kdagen"):
        so = jit_hip.build_library(env["src"], "sm_90")
    assert so.read_bytes().startswith(b"FAKE-SO\n")
    entry = so.parent
    assert entry.parent.parent.parent == env["cache"] and entry.parent.name == "sm_90"
    manifest = json.loads((entry / cache.MANIFEST).read_text())
    assert manifest["files"][jit_hip.LIB_NAME]["size"] == so.stat().st_size
    lines = [r.getMessage() for r in caplog.records if "compiling" in r.getMessage()]
    assert len(lines) == 1 and "kda_chunk_fwd__hip__bf16__k128_v128_c64__sm_90" in lines[0] \
        and "sm_90" in lines[0] and str(entry) in lines[0]
    assert compiles(env) == 1
    with caplog.at_level(logging.INFO, logger="kdagen"):
        caplog.clear()
        assert jit_hip.build_library(env["src"], "sm_90") == so
    assert compiles(env) == 1 and not [r for r in caplog.records if "compiling" in r.getMessage()]


def test_cache_hit_in_a_new_process(env):
    so = jit_hip.build_library(env["src"], "sm_90")
    p = build_in_subprocess(env)
    out, err = p.communicate(timeout=60)
    assert p.returncode == 0, err
    assert Path(out.strip()) == so
    assert compiles(env) == 1


def test_two_processes_compile_the_same_key_once(env, monkeypatch):
    monkeypatch.setenv("FAKE_NVCC_SLEEP", "1.0")
    procs = [build_in_subprocess(env) for _ in range(2)]
    outs = [p.communicate(timeout=60) for p in procs]
    assert all(p.returncode == 0 for p in procs), [o[1] for o in outs]
    assert outs[0][0] == outs[1][0]
    assert compiles(env) == 1


def test_a_build_killed_half_way_leaves_nothing_trusted(env, monkeypatch):
    monkeypatch.setenv("FAKE_NVCC_SLEEP", "30")
    p = build_in_subprocess(env, start_new_session=True)
    deadline = time.time() + 30
    while compiles(env) == 0 and time.time() < deadline:  # the compiler has started writing
        time.sleep(0.05)
    assert compiles(env) == 1
    time.sleep(0.2)
    os.killpg(p.pid, signal.SIGKILL)  # the build process and the compiler it started
    p.communicate(timeout=30)
    target_dir = env["cache"] / kdagen.__version__ / "sm_90" if (env["cache"] / kdagen.__version__).exists() else None
    assert target_dir is not None
    published = [d for d in target_dir.iterdir() if d.is_dir() and not d.name.startswith(".")]
    assert published == []  # only .staging/ and the lock file
    monkeypatch.setenv("FAKE_NVCC_SLEEP", "0")
    so = jit_hip.build_library(env["src"], "sm_90")  # the lock was released by the OS; a fresh build
    assert so.read_bytes() == b"FAKE-SO\n" + env["src"].read_bytes()
    assert compiles(env) == 2


def test_corrupted_binary_is_rebuilt(env, caplog):
    so = jit_hip.build_library(env["src"], "sm_90")
    good = so.read_bytes()
    so.write_bytes(good[:-3] + b"XYZ")  # same size, different bytes
    with caplog.at_level(logging.WARNING, logger="kdagen"):
        so2 = jit_hip.build_library(env["src"], "sm_90")
    assert so2 == so and so2.read_bytes() == good
    assert compiles(env) == 2
    assert any("corrupt" in r.getMessage() for r in caplog.records)
    (so.parent / cache.MANIFEST).write_text("{not json")
    jit_hip.build_library(env["src"], "sm_90")
    assert compiles(env) == 3


@pytest.mark.skipif(os.geteuid() == 0, reason="root ignores directory permissions")
def test_read_only_cache_dir_falls_back_to_a_private_temp_dir(env, caplog):
    env["cache"].mkdir()
    env["cache"].chmod(stat.S_IRUSR | stat.S_IXUSR)
    try:
        with caplog.at_level(logging.WARNING, logger="kdagen"):
            so = jit_hip.build_library(env["src"], "sm_90")
            jit_hip.build_library(env["src"], "sm_90")
    finally:
        env["cache"].chmod(0o755)
    assert not so.is_relative_to(env["cache"])
    assert len([r for r in caplog.records if "not writable" in r.getMessage()]) == 1


def test_unwritable_cache_dir_falls_back_to_a_private_temp_dir(env, caplog, monkeypatch):
    # Works as root too: a regular file where the cache dir should be cannot hold entries.
    blocker = env["tmp"] / "not-a-dir"
    blocker.write_text("")
    setenv(monkeypatch, "KDAGEN_CACHE_DIR", str(blocker / "cache"))
    with caplog.at_level(logging.WARNING, logger="kdagen"):
        so = jit_hip.build_library(env["src"], "sm_90")
        jit_hip.build_library(env["src"], "sm_90")
    assert so.is_file() and not so.is_relative_to(blocker)
    assert len([r for r in caplog.records if "not writable" in r.getMessage()]) == 1
    assert compiles(env) == 1


def test_missing_compiler_error_names_it_and_the_fix(env, monkeypatch):
    monkeypatch.delenv("KDAGEN_NVCC")
    monkeypatch.delenv("CUDA_HOME", raising=False)
    monkeypatch.delenv("CUDA_PATH", raising=False)
    monkeypatch.setenv("PATH", str(env["tmp"] / "empty"))
    with pytest.raises(jit_hip.CompilerNotFoundError, match=r"needs nvcc.*KDAGEN_NVCC.*pip install nvidia-cuda-nvcc"):
        jit_hip.build_library(env["src"], "sm_90")
    monkeypatch.delenv("KDAGEN_HIPCC", raising=False)
    monkeypatch.setenv("ROCM_PATH", str(env["tmp"] / "no-rocm"))
    with pytest.raises(jit_hip.CompilerNotFoundError, match=r"needs hipcc.*KDAGEN_HIPCC"):
        jit_hip.find_compiler("gfx942")
    monkeypatch.setenv("KDAGEN_NVCC", str(env["tmp"] / "nope"))
    with pytest.raises(jit_hip.CompilerNotFoundError, match="KDAGEN_NVCC"):
        jit_hip.find_compiler("sm_90")


def test_compile_error_carries_stderr_and_the_generated_path(env):
    env["src"].write_text("#error nope\n")
    with pytest.raises(jit_hip.HipCompileError) as info:
        jit_hip.build_library(env["src"], "sm_90")
    msg = str(info.value)
    assert "error: boom" in msg and str(env["src"]) in msg
    assert not any(d.is_dir() and not d.name.startswith(".") for d in (env["cache"] / kdagen.__version__ / "sm_90").iterdir())


def test_key_changes_with_source_header_flags_and_only_then(env, monkeypatch):
    inc = env["src"].parent / "include"
    comp = jit_hip.find_compiler("sm_90")
    flags = jit_hip.compile_flags(comp, "sm_90", inc)

    def key(src=None, fl=None, target="sm_90", include=inc):
        return jit_hip.cache_key(src if src is not None else env["src"].read_bytes(), include, comp,
                                 fl if fl is not None else jit_hip.compile_flags(comp, target, include), target)

    base = key()
    assert key() == base
    # Same contents elsewhere (another checkout) and a touched mtime: same key.
    other = env["tmp"] / "elsewhere" / "include"
    other.mkdir(parents=True)
    (other / "kda_port.h").write_bytes((inc / "kda_port.h").read_bytes())
    assert key(include=other) == base
    os.utime(inc / "kda_port.h", (1, 1))
    assert key() == base
    assert key(src=env["src"].read_bytes() + b"\n") != base
    assert key(fl=flags + ["-DX"]) != base
    assert key(target="sm_100") != base
    (inc / "kda_port.h").write_text("// header v2\n")
    assert key() != base
    (inc / "kda_port.h").write_text("// header v1\n")
    assert key() == base
    monkeypatch.setenv("FAKE_NVCC_VERSION", "2.0")
    jit_hip.compiler_version.cache_clear()
    assert key() != base


# ----------------------------------------------------------------------- who may have written an entry

def test_an_entry_owned_by_someone_else_is_refused_and_rebuilt_privately(env, monkeypatch, caplog):
    so = jit_hip.build_library(env["src"], "sm_90")
    fake_owner(monkeypatch, so.parent)
    with caplog.at_level(logging.WARNING, logger="kdagen"):
        so2 = jit_hip.build_library(env["src"], "sm_90")
        assert jit_hip.build_library(env["src"], "sm_90") == so2
    assert not so2.is_relative_to(env["cache"]) and compiles(env) == 2
    (msg,) = warnings_of(caplog)
    assert msg.startswith(f"kdagen: refusing the cache entry {so.parent} (never loaded): {so.parent} is owned "
                          f"by uid 4242, not by you (uid {os.geteuid()}) or root; remove it, or point "
                          "KDAGEN_CACHE_DIR at a folder of your own; building in the private temp dir ")


def test_a_foreign_target_dir_is_refused_even_for_a_new_entry(env, monkeypatch, caplog):
    jit_hip.build_library(env["src"], "sm_90")
    target_dir = env["cache"] / kdagen.__version__ / "sm_90"
    fake_owner(monkeypatch, target_dir)
    env["src"].write_text("int y = 2;\n")  # a new key: nothing published yet, but the folder is not ours
    with caplog.at_level(logging.WARNING, logger="kdagen"):
        so = jit_hip.build_library(env["src"], "sm_90")
    assert not so.is_relative_to(env["cache"])
    (msg,) = warnings_of(caplog)
    assert f"{target_dir} is owned by uid 4242" in msg


@pytest.mark.parametrize("what", ["library", "entry", "target dir", "root"])
def test_group_or_other_writable_paths_are_refused(env, caplog, what):
    so = jit_hip.build_library(env["src"], "sm_90")
    path = {"library": so, "entry": so.parent, "target dir": so.parent.parent, "root": env["cache"]}[what]
    path.chmod(stat.S_IMODE(path.stat().st_mode) | stat.S_IWGRP)
    with caplog.at_level(logging.WARNING, logger="kdagen"):
        so2 = jit_hip.build_library(env["src"], "sm_90")
    assert not so2.is_relative_to(env["cache"]) and compiles(env) == 2
    (msg,) = warnings_of(caplog)
    mode = stat.S_IMODE(path.stat().st_mode)
    assert f": {path} is writable by group (mode {mode:o}); run `chmod go-w {path}`; building in" in msg


def test_a_sticky_world_writable_root_is_fine_and_entries_ignore_the_umask(env, caplog):
    env["cache"].mkdir(mode=0o777)
    env["cache"].chmod(0o1777)  # a /tmp-like shared root
    old = os.umask(0o002)  # a umask that would make new folders and files group-writable
    try:
        so = jit_hip.build_library(env["src"], "sm_90")
    finally:
        os.umask(old)
    assert so.is_relative_to(env["cache"]) and not warnings_of(caplog)
    for p in [so, so.parent / cache.MANIFEST, so.parent, so.parent.parent, so.parent.parent.parent]:
        assert not p.stat().st_mode & 0o022, p
    assert jit_hip.build_library(env["src"], "sm_90") == so and compiles(env) == 1


def test_a_symlinked_entry_is_refused(env, caplog):
    so = jit_hip.build_library(env["src"], "sm_90")
    elsewhere = env["tmp"] / "planted"
    so.parent.rename(elsewhere)
    so.parent.symlink_to(elsewhere)
    with caplog.at_level(logging.WARNING, logger="kdagen"):
        so2 = jit_hip.build_library(env["src"], "sm_90")
    assert not so2.is_relative_to(env["cache"])
    (msg,) = warnings_of(caplog)
    assert f": {so.parent} is a symbolic link; remove it; building in" in msg


# --------------------------------------------------------------------------- read-only and unwritable

def test_a_read_only_cache_holding_the_entry_is_used_as_is(env, monkeypatch, caplog):
    so = jit_hip.build_library(env["src"], "sm_90")

    def no_write(*args, **kwargs):
        raise AssertionError("a cache hit must write nothing")

    # Root ignores permissions, so the hit is also checked to reach none of the writing steps.
    monkeypatch.setattr(cache, "_make_dirs", no_write)
    monkeypatch.setattr(cache, "_KeyLock", no_write)
    tree = sorted(p for p in env["cache"].rglob("*"))
    for p in reversed(tree):
        p.chmod(stat.S_IMODE(p.stat().st_mode) & ~0o222)
    env["cache"].chmod(0o555)
    try:
        with caplog.at_level(logging.WARNING, logger="kdagen"):
            assert jit_hip.build_library(env["src"], "sm_90") == so
    finally:
        for p in [env["cache"], *tree]:
            p.chmod(stat.S_IMODE(p.stat().st_mode) | stat.S_IWUSR)
    assert compiles(env) == 1 and not warnings_of(caplog)
    assert sorted(env["cache"].rglob("*")) == tree


def test_a_read_only_cache_hit_in_a_new_process(env):
    so = jit_hip.build_library(env["src"], "sm_90")
    tree = sorted(env["cache"].rglob("*"))
    for p in [*reversed(tree), env["cache"]]:
        p.chmod(stat.S_IMODE(p.stat().st_mode) & ~0o222)
    try:
        p = build_in_subprocess(env)
        out, err = p.communicate(timeout=60)
    finally:
        for p in [env["cache"], *tree]:
            p.chmod(stat.S_IMODE(p.stat().st_mode) | stat.S_IWUSR)
    assert Path(out.strip()) == so, err
    assert compiles(env) == 1 and "not writable" not in err


@pytest.mark.skipif(os.geteuid() == 0, reason="root ignores directory permissions")
def test_an_unwritable_target_dir_under_a_writable_root_falls_back(env, caplog):
    jit_hip.build_library(env["src"], "sm_90")
    target_dir = env["cache"] / kdagen.__version__ / "sm_90"
    target_dir.chmod(0o555)
    env["src"].write_text("int y = 2;\n")
    try:
        with caplog.at_level(logging.WARNING, logger="kdagen"):
            so = jit_hip.build_library(env["src"], "sm_90")
    finally:
        target_dir.chmod(0o755)
    assert not so.is_relative_to(env["cache"])
    (msg,) = warnings_of(caplog)
    assert msg.startswith(f"kdagen: cache dir {target_dir} is not writable; building in the private temp dir ")


def test_an_unwritable_target_dir_falls_back_once_as_root_too(env, monkeypatch, caplog):
    jit_hip.build_library(env["src"], "sm_90")
    target_dir = env["cache"] / kdagen.__version__ / "sm_90"
    real = cache._writable_dir
    monkeypatch.setattr(cache, "_writable_dir", lambda p: p != target_dir and real(p))
    with caplog.at_level(logging.WARNING, logger="kdagen"):
        for body in ("int y = 2;\n", "int y = 3;\n"):
            env["src"].write_text(body)
            assert not jit_hip.build_library(env["src"], "sm_90").is_relative_to(env["cache"])
    (msg,) = warnings_of(caplog)
    assert msg.startswith(f"kdagen: cache dir {target_dir} is not writable; building in the private temp dir ")


# ------------------------------------------------------------------------------- settings and timeouts

@pytest.mark.parametrize("name, default", [("KDAGEN_LOCK_TIMEOUT_S", "900"), ("KDAGEN_COMPILE_TIMEOUT_S", "600")])
@pytest.mark.parametrize("value", ["abc", "0", "-5", "nan", "inf"])
def test_malformed_timeouts_name_the_variable_value_and_form(env, monkeypatch, name, default, value):
    setenv(monkeypatch, name, value)
    with pytest.raises(build_settings.SettingError) as info:
        jit_hip.build_library(env["src"], "sm_90")
    assert str(info.value) == (f"{name}={value!r} is not a usable timeout: expected a positive number of "
                               f"seconds such as {default}; fix or unset it (unset means {default})")
    assert compiles(env) == 0


def test_settings_are_read_once(env, monkeypatch):
    setenv(monkeypatch, "KDAGEN_LOCK_TIMEOUT_S", "12.5")
    first = build_settings.build_settings()
    monkeypatch.setenv("KDAGEN_LOCK_TIMEOUT_S", "abc")
    monkeypatch.setenv("KDAGEN_CACHE_DIR", str(env["tmp"] / "other"))
    assert build_settings.build_settings() is first and first.lock_timeout_s == 12.5
    assert jit_hip.build_library(env["src"], "sm_90").is_relative_to(env["cache"])


def test_a_hanging_compiler_is_killed_and_named(env, monkeypatch):
    setenv(monkeypatch, "KDAGEN_COMPILE_TIMEOUT_S", "1")
    monkeypatch.setenv("FAKE_NVCC_SLEEP", "60")
    start = time.monotonic()
    with pytest.raises(jit_hip.HipCompileTimeoutError) as info:
        jit_hip.build_library(env["src"], "sm_90")
    assert time.monotonic() - start < 20
    assert str(info.value).startswith(
        f"compiling kda_chunk_fwd__hip__bf16__k128_v128_c64__sm_90 for sm_90 with {env['nvcc']} did not finish "
        f"within KDAGEN_COMPILE_TIMEOUT_S=1 s and was killed; check that the compiler works")
    target_dir = env["cache"] / kdagen.__version__ / "sm_90"
    assert not [d for d in target_dir.iterdir() if d.is_dir() and not d.name.startswith(".")]
    monkeypatch.setenv("FAKE_NVCC_SLEEP", "0")  # the lock was released: the next build goes ahead
    assert jit_hip.build_library(env["src"], "sm_90").is_file()


# ------------------------------------------------------------------------------ missing HIP sources

@pytest.mark.parametrize("missing", ["source", "include"])
def test_a_missing_source_is_a_toolchain_gap_not_a_spec_error(env, missing):
    import shutil

    path = env["src"] if missing == "source" else env["src"].parent / "include"
    shutil.rmtree(path) if path.is_dir() else path.unlink()
    with pytest.raises(jit_hip.HipSourceMissingError) as info:
        jit_hip.build_library(env["src"], "sm_90", variant="kda_chunk_fwd__hip__bf16__k128_v128_c64")
    assert isinstance(info.value, jit_hip.ToolchainUnavailableError)
    assert str(info.value) == (
        f"the generated HIP source of kda_chunk_fwd__hip__bf16__k128_v128_c64 is not installed ({path} is "
        "missing): reinstall kdagen from a wheel or checkout that ships kdagen_kernels/hip/*.hip and "
        "hip/include/*.h, or run `nox -s generate` in a checkout")
    assert compiles(env) == 0
