"""Exports of a bundle for other simulators: ``python -m moetables export BUNDLE --format F``.

Each format writes what it can express of the bundle and refuses the rest with a message
naming it (``ExportError.problems``); no row is ever invented. ``FORMATS`` maps each format to
its writer: ``write(bundle_dir, out_dir) -> ExportReport``.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from moetables.export.aiconfigurator import write_aiconfigurator
from moetables.export.common import ExportError, ExportReport
from moetables.export.llmservingsim import write_llmservingsim

__all__ = ["FORMATS", "ExportError", "ExportReport", "export_bundle"]

FORMATS: dict[str, Callable[[Path, Path], ExportReport]] = {
    "llmservingsim": write_llmservingsim,
    "aiconfigurator": write_aiconfigurator,
}


def export_bundle(bundle: str | Path, fmt: str, out: str | Path) -> ExportReport:
    """Write ``bundle`` in format ``fmt`` under ``out`` (created; must be empty or absent)."""
    if fmt not in FORMATS:
        raise ExportError([f"unknown format {fmt!r}; formats are {', '.join(FORMATS)}"])
    out = Path(out)
    if out.exists() and any(out.iterdir()):
        raise ExportError([f"{out} is not empty"])
    return FORMATS[fmt](Path(bundle), out)
