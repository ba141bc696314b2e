"""YAML of a bundle, read with bounds: a few hundred hostile bytes must not cost a worker
minutes and gigabytes (issue 17, item 4).

PyYAML's safe loader still expands aliases (a 444-byte "billion laughs" document becomes
billions of nodes), follows any nesting, and its pure-Python scanner is quadratic in the depth
of flow collections (1,000 nested ``[`` take most of a second, 10,000 over a minute). So the
document's events are first read with libyaml (PyYAML's C parser, shipped in its wheels),
stopping at the first alias, at more than ``max_nodes`` nodes or past ``max_depth`` levels;
only a document within those bounds is then built, by the same C parser and PyYAML's safe
constructor. The bytes must be UTF-8 (PyYAML would also take UTF-16), at most ``max_bytes``.
"""

from __future__ import annotations

from typing import Any

import yaml

from moetables.errors import BundleError

__all__ = ["MAX_YAML_BYTES", "MAX_YAML_DEPTH", "MAX_YAML_NODES", "load_bounded_yaml"]

# The largest shipped meta.yaml: 51 KB, 2,192 nodes for 3 tables (about 730 nodes a table).
# These bounds fit about 130 tables (a TP 8 x DP 16 sweep); their worst-case cost is measured
# by bench/limits_cost.py (docs/benchmarks.md, "Reliability").
MAX_YAML_BYTES = 4 * 1024 * 1024
MAX_YAML_DEPTH = 64
MAX_YAML_NODES = 100_000

# libyaml when PyYAML was built with it (its wheels are), else the pure-Python classes.
_LOADER: Any = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
_OPEN = (yaml.SequenceStartEvent, yaml.MappingStartEvent)
_CLOSE = (yaml.SequenceEndEvent, yaml.MappingEndEvent)


class _Refused(Exception):
    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


def _flow_depth(text: str, max_depth: int) -> None:
    """Without libyaml: refuse deep flow nesting before the quadratic pure-Python scanner
    sees it (brackets inside quotes count too: conservative)."""
    depth = 0
    for line_number, line in enumerate(text.splitlines(), start=1):
        for ch in line:
            if ch in "[{":
                depth += 1
                if depth > max_depth:
                    raise _Refused(f"line {line_number}: nested deeper than {max_depth} levels")
            elif ch in "]}":
                depth = max(0, depth - 1)


def _check_events(text: str, max_depth: int, max_nodes: int) -> None:
    depth = nodes = 0
    for event in yaml.parse(text, Loader=_LOADER):
        mark = event.start_mark
        line = mark.line + 1 if mark is not None else 0
        if isinstance(event, yaml.AliasEvent):
            raise _Refused(f"line {line}: YAML aliases (*{event.anchor}) are not allowed")
        if isinstance(event, (yaml.ScalarEvent, *_OPEN)):
            nodes += 1
            if nodes > max_nodes:
                raise _Refused(f"line {line}: more than {max_nodes} YAML nodes")
        if isinstance(event, _OPEN):
            depth += 1
            if depth > max_depth:
                raise _Refused(f"line {line}: nested deeper than {max_depth} levels")
        elif isinstance(event, _CLOSE):
            depth -= 1


def load_bounded_yaml(
    data: bytes,
    *,
    name: str,
    max_bytes: int = MAX_YAML_BYTES,
    max_depth: int = MAX_YAML_DEPTH,
    max_nodes: int = MAX_YAML_NODES,
) -> Any:
    """Parse ``data`` (the file ``name``) or raise `BundleError` naming the file and why."""
    if len(data) > max_bytes:
        raise BundleError(name, f"is {len(data)} bytes; the limit for YAML is {max_bytes}")
    try:
        text = data.decode("utf-8").removeprefix("\ufeff")
    except UnicodeDecodeError as exc:
        raise BundleError(name, f"is not UTF-8 text ({exc.reason} at byte {exc.start})") from None
    try:
        if _LOADER is yaml.SafeLoader:
            _flow_depth(text, max_depth)
        _check_events(text, max_depth, max_nodes)
        return yaml.load(text, Loader=_LOADER)
    except _Refused as exc:
        raise BundleError(name, exc.message) from None
    except yaml.YAMLError as exc:
        raise BundleError(name, f"is not valid YAML ({exc})") from None
    except RecursionError:
        raise BundleError(name, f"is nested deeper than {max_depth} levels") from None
