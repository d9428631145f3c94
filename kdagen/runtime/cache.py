# SPDX-License-Identifier: Apache-2.0
"""The on-disk build cache: content-keyed entries, staged builds, atomic publish, one lock per key.

Note [Cache layout]
    ${KDAGEN_CACHE_DIR:-~/.cache/kdagen}/<kdagen version>/<target>/<key[:16]>/   a published entry:
        the build's files plus manifest.json (key, and size + sha256 of every file)
    .../<target>/<key[:16]>.lock        one flock per key; the OS drops it when its holder dies;
                                        never unlinked (unlinking would let two holders exist)
    .../<target>/.staging/<key[:16]>-<pid>-<random>/   where a build runs; published with os.rename
An entry is trusted only when its manifest matches the key and every file's size and sha256. A corrupt
or half-written entry is moved aside and rebuilt, never loaded. A build that dies half-way leaves only
a staging folder (never looked at again) and its lock is released by the OS.
The key is computed by the caller (see Note [HIP cache key] in jit_hip.py).
"""

from __future__ import annotations

import errno
import fcntl
import hashlib
import json
import logging
import os
import shutil
import tempfile
import time
import uuid
from collections.abc import Callable
from pathlib import Path

import kdagen

log = logging.getLogger("kdagen")

MANIFEST = "manifest.json"
STAGING = ".staging"
DEFAULT_LOCK_TIMEOUT_S = 900.0

_fallback_root: Path | None = None


class CacheError(RuntimeError):
    """The cache could not produce a trusted entry (lock timeout, build output missing, ...)."""


def configured_root() -> Path:
    """${KDAGEN_CACHE_DIR:-~/.cache/kdagen} (not created)."""
    env = os.environ.get("KDAGEN_CACHE_DIR")
    return Path(env).expanduser() if env else Path.home() / ".cache" / "kdagen"


def _writable_dir(path: Path) -> bool:
    try:
        path.mkdir(parents=True, exist_ok=True)
        probe = path / f".probe-{os.getpid()}-{uuid.uuid4().hex[:8]}"
        probe.write_bytes(b"")
        probe.unlink()
        return True
    except OSError:
        return False


def cache_root() -> Path:
    """The configured root if it is usable, else one private temp dir per process (warned about once)."""
    root = configured_root()
    return root if _writable_dir(root) else _private_fallback(root)


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def entry_dir(root: Path, target: str, key: str) -> Path:
    return root / kdagen.__version__ / target / key[:16]


def verify_entry(path: Path, key: str) -> bool:
    """True only if `path` holds a manifest for `key` and every listed file matches it (size, sha256)."""
    try:
        manifest = json.loads((path / MANIFEST).read_text("utf-8"))
        files = manifest["files"]
        if manifest.get("key") != key or not isinstance(files, dict) or not files:
            return False
        for name, meta in files.items():
            f = path / name
            if Path(name).name != name or not f.is_file() or f.stat().st_size != meta["size"]:
                return False
            if sha256_file(f) != meta["sha256"]:
                return False
        return True
    except (OSError, ValueError, KeyError, TypeError):
        return False


def _fsync_dir(path: Path) -> None:
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def _write_manifest(staging: Path, key: str, info: dict) -> None:
    files = {}
    for f in sorted(staging.iterdir()):
        if f.is_file() and f.name != MANIFEST:
            with open(f, "rb") as fh:
                os.fsync(fh.fileno())
            files[f.name] = {"size": f.stat().st_size, "sha256": sha256_file(f)}
    if not files:
        raise CacheError(f"the build in {staging} produced no files")
    data = {"key": key, "kdagen_version": kdagen.__version__, "files": files, **info}
    with open(staging / MANIFEST, "w", encoding="utf-8") as fh:
        json.dump(data, fh, indent=1, sort_keys=True)
        fh.flush()
        os.fsync(fh.fileno())
    _fsync_dir(staging)


class _KeyLock:
    """An exclusive flock on <entry>.lock. Waiters poll so that they can log and time out."""

    def __init__(self, path: Path, timeout_s: float):
        self.path = path
        self.timeout_s = timeout_s
        self.fd: int | None = None

    def __enter__(self) -> _KeyLock:
        self.fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        start = time.monotonic()
        logged = False
        while True:
            try:
                fcntl.flock(self.fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                return self
            except OSError as exc:
                if exc.errno not in (errno.EAGAIN, errno.EACCES, errno.EWOULDBLOCK):
                    raise
            if not logged:
                log.info("kdagen: waiting for another process building into the same cache entry (lock %s)",
                         self.path)
                logged = True
            if time.monotonic() - start > self.timeout_s:
                os.close(self.fd)
                self.fd = None
                raise CacheError(f"timed out after {self.timeout_s:.0f} s waiting for the build lock {self.path}; "
                                 "another process holds it (a compile that hangs?). Set KDAGEN_LOCK_TIMEOUT_S "
                                 "to wait longer")
            time.sleep(0.05)

    def __exit__(self, *exc) -> None:
        if self.fd is not None:
            fcntl.flock(self.fd, fcntl.LOCK_UN)
            os.close(self.fd)
            self.fd = None


def lock_timeout_s() -> float:
    try:
        return float(os.environ.get("KDAGEN_LOCK_TIMEOUT_S", DEFAULT_LOCK_TIMEOUT_S))
    except ValueError:
        return DEFAULT_LOCK_TIMEOUT_S


def get_or_build(key: str, target: str, build: Callable[[Path], dict], *,
                 on_miss: Callable[[Path], None] | None = None, root: Path | None = None) -> Path:
    """The trusted entry folder for `key`, building it first if needed.

    build(staging_dir) must write the artifact files into staging_dir and return extra manifest info
    (a JSON-able dict). on_miss(entry_path) is called once, under the lock, right before a build (the
    place for the "compiling ..." log line). Exceptions from build propagate; nothing is published then.
    """
    root = Path(root) if root is not None else cache_root()
    path = entry_dir(root, target, key)
    if verify_entry(path, key):
        return path
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
    except OSError:
        if root != configured_root():
            raise
        return get_or_build(key, target, build, on_miss=on_miss, root=_private_fallback(root))
    with _KeyLock(path.parent / f"{path.name}.lock", lock_timeout_s()):
        if verify_entry(path, key):  # another process published it while we waited
            return path
        if path.exists():
            log.warning("kdagen: cache entry %s is corrupt or incomplete (manifest mismatch); rebuilding it", path)
            aside = path.parent / STAGING / f"corrupt-{path.name}-{os.getpid()}-{uuid.uuid4().hex[:8]}"
            aside.parent.mkdir(parents=True, exist_ok=True)
            os.rename(path, aside)
            shutil.rmtree(aside, ignore_errors=True)
        if on_miss is not None:
            on_miss(path)
        staging = path.parent / STAGING / f"{path.name}-{os.getpid()}-{uuid.uuid4().hex[:8]}"
        staging.mkdir(parents=True)
        try:
            info = build(staging) or {}
            _write_manifest(staging, key, info)
            os.rename(staging, path)
            _fsync_dir(path.parent)
        except BaseException:
            shutil.rmtree(staging, ignore_errors=True)
            raise
    if not verify_entry(path, key):
        raise CacheError(f"the freshly published cache entry {path} does not verify")
    return path


def _private_fallback(root: Path) -> Path:
    global _fallback_root
    if _fallback_root is None:
        _fallback_root = Path(tempfile.mkdtemp(prefix="kdagen-cache-"))
        log.warning("kdagen: cache dir %s is not writable; using the private temp dir %s for this process "
                    "(set KDAGEN_CACHE_DIR to a writable folder to keep builds between runs)", root, _fallback_root)
    return _fallback_root
