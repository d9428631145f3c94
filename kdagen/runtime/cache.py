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
Before any of that, every path from the root down to the entry's files must pass Note [Trusted cache
paths] (cache_trust.py); one that fails is never loaded. A hit writes nothing, so a read-only cache that
holds the entry is used as it is; a miss that cannot write falls back to a private temp dir.
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
import stat
import tempfile
import time
import uuid
from collections.abc import Callable
from pathlib import Path

import kdagen

from .build_settings import build_settings
from .cache_trust import first_untrusted

log = logging.getLogger("kdagen")

MANIFEST = "manifest.json"
STAGING = ".staging"
DIR_MODE = 0o755  # never group/other-writable whatever the umask: see Note [Trusted cache paths]

_fallback_root: Path | None = None
_warned: set[str] = set()


class CacheError(RuntimeError):
    """The cache could not produce a trusted entry (lock timeout, build output missing, ...)."""


def configured_root() -> Path:
    """${KDAGEN_CACHE_DIR:-~/.cache/kdagen} as read once per process (not created)."""
    return build_settings().cache_dir


def _warn_once(message: str) -> None:
    if message not in _warned:
        _warned.add(message)
        log.warning("%s", message)


def _make_dirs(root: Path, path: Path) -> None:
    """mkdir -p root/.../path with DIR_MODE for root and every folder below it (umask can only clear bits)."""
    root.parent.mkdir(parents=True, exist_ok=True)
    current = root
    for part in ("", *path.relative_to(root).parts):
        current = current / part
        try:
            os.mkdir(current, DIR_MODE)
        except FileExistsError:
            if not current.is_dir():
                raise NotADirectoryError(errno.ENOTDIR, "not a directory", str(current)) from None


def _writable_dir(path: Path) -> bool:
    try:
        probe = path / f".probe-{os.getpid()}-{uuid.uuid4().hex[:8]}"
        probe.write_bytes(b"")
        probe.unlink()
        return True
    except OSError:
        return False


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
            f.chmod(stat.S_IMODE(f.stat().st_mode) & ~0o022)  # a umask of 002 must not make it untrusted
            with open(f, "rb") as fh:
                os.fsync(fh.fileno())
            files[f.name] = {"size": f.stat().st_size, "sha256": sha256_file(f)}
    if not files:
        raise CacheError(f"the build in {staging} produced no files")
    data = {"key": key, "kdagen_version": kdagen.__version__, "files": files, **info}
    fd = os.open(staging / MANIFEST, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    with open(fd, "w", encoding="utf-8") as fh:
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


def get_or_build(key: str, target: str, build: Callable[[Path], dict], *,
                 on_miss: Callable[[Path], None] | None = None, root: Path | None = None) -> Path:
    """The trusted entry folder for `key`, building it first if needed.

    build(staging_dir) must write the artifact files into staging_dir and return extra manifest info
    (a JSON-able dict). on_miss(entry_path) is called once, under the lock, right before a build (the
    place for the "compiling ..." log line). Exceptions from build propagate; nothing is published then.
    An entry or folder that fails Note [Trusted cache paths] is never returned: the build then goes to a
    private temp dir, as it does when the configured root cannot be written (one warning each).
    """
    root = Path(root) if root is not None else configured_root()
    path = entry_dir(root, target, key)
    why = first_untrusted(root, path)
    if why is None and verify_entry(path, key):
        return path  # a read-only cache is fine: nothing is written on a hit
    if why is not None:
        return _elsewhere(root, key, target, build, on_miss,
                          f"kdagen: refusing the cache entry {path} (never loaded): {why}")
    try:
        _make_dirs(root, path.parent)
        writable = _writable_dir(path.parent)
    except OSError:
        writable = False
    if not writable:
        return _elsewhere(root, key, target, build, on_miss,
                          f"kdagen: cache dir {path.parent} is not writable")
    if (why := first_untrusted(root, path.parent)) is not None:  # created by someone else meanwhile
        return _elsewhere(root, key, target, build, on_miss,
                          f"kdagen: refusing the cache dir {path.parent} (never loaded from): {why}")
    with _KeyLock(path.parent / f"{path.name}.lock", build_settings().lock_timeout_s):
        if verify_entry(path, key):  # another process published it while we waited
            _check_published(root, path)
            return path
        if path.exists():
            log.warning("kdagen: cache entry %s is corrupt or incomplete (manifest mismatch); rebuilding it", path)
            aside = path.parent / STAGING / f"corrupt-{path.name}-{os.getpid()}-{uuid.uuid4().hex[:8]}"
            _make_dirs(root, aside.parent)
            os.rename(path, aside)
            shutil.rmtree(aside, ignore_errors=True)
        if on_miss is not None:
            on_miss(path)
        staging = path.parent / STAGING / f"{path.name}-{os.getpid()}-{uuid.uuid4().hex[:8]}"
        _make_dirs(root, staging)
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
    _check_published(root, path)
    return path


def _check_published(root: Path, path: Path) -> None:
    if (why := first_untrusted(root, path)) is not None:
        raise CacheError(f"kdagen: refusing the cache entry {path} (never loaded): {why}")


def _elsewhere(root: Path, key: str, target: str, build: Callable[[Path], dict],
               on_miss: Callable[[Path], None] | None, reason: str) -> Path:
    """The entry built in this process's private temp dir, after warning (once per reason) why."""
    if _fallback_root is not None and root == _fallback_root:
        raise CacheError(f"{reason}, and it is this process's private temp dir")
    fallback = _private_fallback()
    _warn_once(f"{reason}; building in the private temp dir {fallback} for this process instead (set "
               "KDAGEN_CACHE_DIR to a folder of your own, writable by you alone, to keep builds between runs)")
    return get_or_build(key, target, build, on_miss=on_miss, root=fallback)


def _private_fallback() -> Path:
    global _fallback_root
    if _fallback_root is None:
        _fallback_root = Path(tempfile.mkdtemp(prefix="kdagen-cache-"))
    return _fallback_root
