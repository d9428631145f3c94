# SPDX-License-Identifier: Apache-2.0
"""Parse YAML into plain values that remember their 1-based source lines (data only, nothing executed)."""

from __future__ import annotations

from typing import Any, Callable

import yaml

# Called as report(line, dotted_path, message); the caller formats and collects.
Report = Callable[[int, str, str], None]

_MERGE_TAG = "tag:yaml.org,2002:merge"
_PLAIN_TAGS = {yaml.MappingNode: "tag:yaml.org,2002:map", yaml.SequenceNode: "tag:yaml.org,2002:seq"}


class _Invalid:
    """Stands for a value that was already reported (a refused tag), so it is not reported twice."""

    def __repr__(self) -> str:
        return "<invalid>"


INVALID = _Invalid()


class YMap(dict):
    """A mapping that remembers its own line and the line of each key."""

    line: int
    key_lines: dict[str, int]


class YList(list):
    """A sequence that remembers its own line and the line of each item."""

    line: int
    item_lines: list[int]


def join(prefix: str, key: str | int) -> str:
    """Dotted path: join("variants", 2) -> "variants[2]", join("variants[2]", "dtype") -> "variants[2].dtype"."""
    if isinstance(key, int):
        return f"{prefix}[{key}]"
    return f"{prefix}.{key}" if prefix else key


def parse_yaml(text: str, report: Report) -> Any:
    """Return the document as YMap/YList/scalars, or None after reporting why it could not be parsed.

    NOTE: PyYAML's composer gives nodes with marks; we construct scalars with SafeLoader's own rules
    (so `0x10`, `1_000`, `yes` mean what YAML 1.1 says) but build containers ourselves to keep lines
    and to reject duplicate keys, which PyYAML would silently collapse.
    """
    loader = yaml.SafeLoader(text)
    try:
        node = loader.get_single_node()
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        line = mark.line + 1 if mark is not None else 1
        extra = [exc.context] if exc.context else []
        if mark is not None:
            extra.append(f"column {mark.column + 1}")
        detail = f" ({', '.join(extra)})" if extra else ""
        report(line, "", f"invalid YAML: {exc.problem or exc.context}{detail}")
        return None
    except yaml.YAMLError as exc:  # reader errors (bad characters) carry no mark
        report(1, "", f"invalid YAML: {exc}")
        return None
    finally:
        loader.dispose()
    if node is None:
        return None
    return _convert(loader, node, "", report)


def _convert(loader: yaml.SafeLoader, node: yaml.Node, where: str, report: Report) -> Any:
    line = node.start_mark.line + 1
    plain_tag = _PLAIN_TAGS.get(type(node))
    if plain_tag is not None and node.tag != plain_tag:
        # e.g. `!!python/object/apply:os.system [...]`: never constructed, and never silently dropped.
        report(line, where, f"unsupported YAML value: tag {node.tag!r} is not allowed (specs are plain data)")
        return INVALID
    if isinstance(node, yaml.MappingNode):
        out = YMap()
        out.line, out.key_lines = line, {}
        for key_node, value_node in node.value:
            key_line = key_node.start_mark.line + 1
            if key_node.tag == _MERGE_TAG:
                report(key_line, where or "<<", "merge keys (<<) are not supported; write the values out")
                continue
            if not isinstance(key_node, yaml.ScalarNode):
                report(key_line, where, "mapping keys must be plain strings")
                continue
            key = _scalar(loader, key_node, where, report)
            if key is INVALID:
                continue
            if not isinstance(key, str):
                report(key_line, where, f"mapping keys must be strings, got {key!r}")
                continue
            if key in out.key_lines:
                report(key_line, join(where, key), f"duplicate key (first at line {out.key_lines[key]})")
                continue
            out.key_lines[key] = key_line
            out[key] = _convert(loader, value_node, join(where, key), report)
        return out
    if isinstance(node, yaml.SequenceNode):
        seq = YList()
        seq.line, seq.item_lines = line, []
        for i, item in enumerate(node.value):
            seq.item_lines.append(item.start_mark.line + 1)
            seq.append(_convert(loader, item, join(where, i), report))
        return seq
    return _scalar(loader, node, where, report)


def _scalar(loader: yaml.SafeLoader, node: yaml.Node, where: str, report: Report) -> Any:
    try:
        return loader.construct_object(node, deep=True)
    except yaml.constructor.ConstructorError as exc:
        # e.g. `!!python/object`: SafeLoader refuses it, and so do we, with the line.
        report(node.start_mark.line + 1, where, f"unsupported YAML value: {exc.problem}")
        return INVALID
