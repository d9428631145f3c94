# SPDX-License-Identifier: Apache-2.0
"""The environment settings of the HIP build cache, read and checked once per process.

    KDAGEN_CACHE_DIR          where builds are kept (default ~/.cache/kdagen)
    KDAGEN_LOCK_TIMEOUT_S     how long to wait for another process's build of the same entry (default 900)
    KDAGEN_COMPILE_TIMEOUT_S  how long one compiler run may take before it is killed (default 600)

The lock wait outlasts a compile, so a waiter sees the holder's build finish or time out before it gives up.
A malformed value is an error naming the variable, never a silent default.
"""

from __future__ import annotations

import functools
import math
import os
from dataclasses import dataclass
from pathlib import Path

DEFAULT_LOCK_TIMEOUT_S = 900.0
DEFAULT_COMPILE_TIMEOUT_S = 600.0


class SettingError(ValueError):
    """An environment setting has a value kdagen cannot use; the message names it and the expected form."""


@dataclass(frozen=True)
class BuildSettings:
    cache_dir: Path
    lock_timeout_s: float
    compile_timeout_s: float


def _seconds(name: str, default: float) -> float:
    raw = os.environ.get(name)
    if raw is None or raw.strip() == "":
        return default
    try:
        value = float(raw)
    except ValueError:
        value = math.nan
    if not (math.isfinite(value) and value > 0):
        raise SettingError(f"{name}={raw!r} is not a usable timeout: expected a positive number of seconds "
                           f"such as {default:.0f}; fix or unset it (unset means {default:.0f})")
    return value


def _cache_dir() -> Path:
    raw = os.environ.get("KDAGEN_CACHE_DIR")
    # Absolute now, so that a later chdir does not move the cache.
    return Path(raw).expanduser().absolute() if raw else Path.home() / ".cache" / "kdagen"


@functools.cache
def build_settings() -> BuildSettings:
    """The settings as the environment held them at the first call (tests: build_settings.cache_clear())."""
    return BuildSettings(cache_dir=_cache_dir(),
                         lock_timeout_s=_seconds("KDAGEN_LOCK_TIMEOUT_S", DEFAULT_LOCK_TIMEOUT_S),
                         compile_timeout_s=_seconds("KDAGEN_COMPILE_TIMEOUT_S", DEFAULT_COMPILE_TIMEOUT_S))
