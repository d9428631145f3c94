# SPDX-License-Identifier: Apache-2.0
"""Whether a cache path may be trusted to hold a library we dlopen: the rule ssh applies to its keys.

Note [Trusted cache paths]
    Loading a .so runs its constructors in our process, and a manifest only proves that the files match
    each other, not who wrote them. So the cache root, every folder below it down to the entry, and every
    file of the entry must be owned by the current user (or root, who can replace our files anyway) and
    writable by nobody else; below the root, nothing may be a symbolic link. The root alone may be
    writable by others when its sticky bit is set (a /tmp-like shared folder), since then nobody can move
    or replace the folders we own inside it. A path that breaks the rule is refused, never loaded, and
    the message says how to fix it.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path


def trusted_uids() -> frozenset[int]:
    """The owners whose cache files we load."""
    return frozenset({os.geteuid(), 0})


def status(path: Path, follow: bool) -> os.stat_result:
    """os.stat / os.lstat (tests replace this to fake another owner, which works as root too)."""
    return os.stat(path) if follow else os.lstat(path)


def untrusted_reason(path: Path, *, is_root: bool = False) -> str | None:
    """Why `path` must not be trusted, or None. A missing path is not a reason (the caller creates it)."""
    try:
        st = status(path, follow=is_root)
    except (FileNotFoundError, NotADirectoryError):
        return None
    except OSError as exc:
        return f"{path} cannot be inspected ({exc.strerror})"
    if stat.S_ISLNK(st.st_mode):
        return f"{path} is a symbolic link; remove it"
    if st.st_uid not in trusted_uids():
        return (f"{path} is owned by uid {st.st_uid}, not by you (uid {os.geteuid()}) or root; remove it, "
                "or point KDAGEN_CACHE_DIR at a folder of your own")
    loose = st.st_mode & (stat.S_IWGRP | stat.S_IWOTH)
    if loose and not (is_root and stat.S_ISDIR(st.st_mode) and st.st_mode & stat.S_ISVTX):
        who = " and ".join(w for w, bit in (("group", stat.S_IWGRP), ("others", stat.S_IWOTH)) if loose & bit)
        return f"{path} is writable by {who} (mode {stat.S_IMODE(st.st_mode):o}); run `chmod go-w {path}`"
    return None


def first_untrusted(root: Path, path: Path) -> str | None:
    """The first reason not to trust `path` or a folder between `root` and it, or its files; None if none."""
    if (why := untrusted_reason(root, is_root=True)) is not None:
        return why
    current = root
    for part in path.relative_to(root).parts:
        current = current / part
        if (why := untrusted_reason(current)) is not None:
            return why
    if path.is_dir() and not path.is_symlink():
        for child in sorted(path.iterdir()):
            if (why := untrusted_reason(child)) is not None:
                return why
    return None
