# SPDX-License-Identifier: Apache-2.0
"""Checks of single YAML values and mappings for the spec loader: each reports what is wrong with its line."""

from __future__ import annotations

import difflib
from collections.abc import Sequence
from typing import Any

from kdagen.spec.yaml_nodes import INVALID, Report, YList, YMap, join


def suggest(word: str, allowed: Sequence[str]) -> str:
    close = difflib.get_close_matches(word, list(allowed), n=1, cutoff=0.6)
    return f"; did you mean {close[0]!r}?" if close else ""


def take(node: YMap, allowed: Sequence[str], optional: frozenset[str], where: str,
          report: Report) -> dict[str, Any]:
    """Pop the known keys of a mapping, report unknown ones (with a did-you-mean) and missing ones.

    A value that was already reported (INVALID) is present but left out of the result.
    """
    out: dict[str, Any] = {}
    for key, value in node.items():  # in source order, so that same-line errors read left to right
        if key in allowed:
            out[key] = value
        else:
            hint = suggest(key, allowed) or f"; expected one of: {', '.join(allowed)}"
            report(node.key_lines[key], join(where, key), f"unknown key{hint}")
    for key in allowed:
        if key not in out and key not in optional:
            report(node.line, join(where, key), "missing required key")
    return {k: v for k, v in out.items() if v is not INVALID}


def type_name(value: Any) -> str:
    return "null" if value is None else type(value).__name__


def int_value(value: Any, line: int, where: str, report: Report) -> int | None:
    # bool is an int in Python; `true` is never a head dim.
    if isinstance(value, bool) or not isinstance(value, int):
        report(line, where, f"expected an integer, got {value!r} ({type_name(value)})")
        return None
    return value


def one_of(value: Any, allowed: Sequence[Any], line: int, where: str, what: str, report: Report,
            reason: str = "") -> Any:
    if value in allowed and not isinstance(value, bool):
        return value
    shown = ", ".join(str(a) for a in allowed)
    hint = suggest(value, [str(a) for a in allowed]) if isinstance(value, str) else ""
    why = f": {reason}" if reason else ""
    report(line, where, f"{value!r} is not a supported {what}{hint} (supported: {shown}){why}")
    return None


def names(value: Any, line: int, where: str, allowed: Sequence[str], what: str,
           report: Report) -> tuple[str, ...] | None:
    """A non-empty list of distinct names out of `allowed`."""
    if not isinstance(value, YList):
        report(line, where, f"expected a list of {what}s like [{allowed[0]}], got {value!r}")
        return None
    if not value:
        report(line, where, f"must list at least one {what} (supported: {', '.join(allowed)})")
        return None
    out: list[str] = []
    ok = True
    for i, (item, item_line) in enumerate(zip(value, value.item_lines)):
        if item is INVALID:
            ok = False
        elif item in out:
            report(item_line, join(where, i), f"{item!r} is listed twice")
            ok = False
        elif one_of(item, allowed, item_line, join(where, i), what, report) is None:
            ok = False
        else:
            out.append(item)
    return tuple(out) if ok else None
