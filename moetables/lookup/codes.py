"""Per-row outcome codes of batch lookups, and their names on the wire."""

from __future__ import annotations

__all__ = ["CODE_NAMES", "INVALID", "OK", "OUT_OF_SUPPORT"]

OK = 0
OUT_OF_SUPPORT = 1  # a sound question the measurements do not cover: never extrapolated
INVALID = 2  # a question no deployment can ask: unknown component, infeasible N/A/M, ...

CODE_NAMES = {OUT_OF_SUPPORT: "out_of_support", INVALID: "invalid"}
