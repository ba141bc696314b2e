"""YAML of a bundle, read with bounds: a few hundred hostile bytes must not cost a worker
minutes and gigabytes (issue 17, item 4).

PyYAML's safe loader still expands aliases (a 444-byte "billion laughs" document becomes
billions of nodes) and follows any nesting. Bundle metadata never needs aliases, so they are
refused outright; the size, the nesting depth and the number of nodes are capped, and the
bytes must be UTF-8 (PyYAML would also take UTF-16).
"""

from __future__ import annotations

from typing import Any

import yaml

from moetables.errors import BundleError

__all__ = ["MAX_YAML_BYTES", "MAX_YAML_DEPTH", "MAX_YAML_NODES", "load_bounded_yaml"]

# The largest shipped meta.yaml is 51 KB and 2,192 nodes (0.3 s to read): 20 times its size,
# 9 times its nodes (each node costs tens of microseconds in the pure-Python composer).
MAX_YAML_BYTES = 1024 * 1024
MAX_YAML_DEPTH = 64
MAX_YAML_NODES = 20_000


class _Refused(Exception):
    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


class _BoundedLoader(yaml.SafeLoader):
    """SafeLoader that refuses aliases and counts nesting depth and nodes while composing."""

    max_depth = MAX_YAML_DEPTH
    max_nodes = MAX_YAML_NODES

    def __init__(self, stream: str) -> None:
        super().__init__(stream)
        self._depth = 0
        self._nodes = 0

    def compose_node(self, parent: Any, index: Any) -> Any:
        event = self.peek_event()  # type: ignore[no-untyped-call]
        line = event.start_mark.line + 1 if event.start_mark is not None else 0
        if isinstance(event, yaml.AliasEvent):
            raise _Refused(f"line {line}: YAML aliases (*{event.anchor}) are not allowed")
        self._nodes += 1
        if self._nodes > self.max_nodes:
            raise _Refused(f"line {line}: more than {self.max_nodes} YAML nodes")
        self._depth += 1
        if self._depth > self.max_depth:
            raise _Refused(f"line {line}: nested deeper than {self.max_depth} levels")
        try:
            return super().compose_node(parent, index)
        finally:
            self._depth -= 1


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
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise BundleError(name, f"is not UTF-8 text ({exc.reason} at byte {exc.start})") from None
    loader = _BoundedLoader(text.removeprefix("\ufeff"))
    loader.max_depth, loader.max_nodes = max_depth, max_nodes
    try:
        return loader.get_single_data()
    except _Refused as exc:
        raise BundleError(name, exc.message) from None
    except yaml.YAMLError as exc:
        raise BundleError(name, f"is not valid YAML ({exc})") from None
    except RecursionError:
        raise BundleError(name, f"is nested deeper than {max_depth} levels") from None
    finally:
        loader.dispose()
