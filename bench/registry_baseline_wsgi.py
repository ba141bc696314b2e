"""The smallest WSGI app, served like the registry, to show what the machine itself allows.

The registry benchmarks report it beside their numbers: no Django request on the same
gunicorn settings can be faster than this.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any


def app(environ: dict[str, Any], start_response: Callable[..., Any]) -> Iterable[bytes]:
    start_response("200 OK", [("Content-Type", "application/json"), ("Content-Length", "2")])
    return [b"{}"]
