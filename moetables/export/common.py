"""What every export shares: its report and its refusal."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

__all__ = ["ExportError", "ExportReport"]


class ExportError(ValueError):
    """The format cannot express the bundle (or what was asked); ``problems`` names each part."""

    def __init__(self, problems: list[str]) -> None:
        super().__init__("; ".join(problems))
        self.problems = problems


@dataclass
class ExportReport:
    """What was written, and what the format could not express (left out, named)."""

    format: str
    out: Path
    files: list[str] = field(default_factory=list)
    rows: int = 0
    left_out: list[str] = field(default_factory=list)
