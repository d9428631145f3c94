# SPDX-License-Identifier: Apache-2.0
"""SpecError: every problem found in the spec files, reported together as `specs/x.yaml:<line>: ...`."""

from __future__ import annotations

from collections.abc import Iterable


class SpecError(Exception):
    """Raised once per load with *all* problems, so a user fixes a spec in one round trip.

    Each entry of `errors` is one line, formatted `specs/<file>.yaml:<line>: <dotted path>: <message>`
    (1-based lines; list indices in the dotted path are 0-based, e.g. `variants[2].chunk_size`).
    """

    def __init__(self, errors: Iterable[str]) -> None:
        self.errors: list[str] = list(errors)
        super().__init__(str(self))

    def __str__(self) -> str:
        return "\n".join(self.errors)


def format_error(path: str, line: int, where: str, message: str) -> str:
    """The one place that fixes the error-line format."""
    return f"{path}:{line}: {where}: {message}" if where else f"{path}:{line}: {message}"
