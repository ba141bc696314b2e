"""The two ways a lookup can fail, as in the method: a bad bundle, or a question it cannot answer."""

from __future__ import annotations

__all__ = ["BundleError", "CoverageError", "QueryError"]


class BundleError(Exception):
    """A corrupt or inconsistent bundle. ``where`` names the file and field at fault."""

    def __init__(self, where: str, message: str) -> None:
        super().__init__(f"{where}: {message}")
        self.where = where
        self.message = message


class CoverageError(LookupError):
    """The bundle is sound but holds no measurement for this deployment or query."""


class QueryError(ValueError):
    """A malformed query: unknown component or mode, or coordinates no routing can produce."""
