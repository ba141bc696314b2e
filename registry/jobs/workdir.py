"""A job's work folder as the registry shows it: the log's tail and the listed artifacts.

Read by the runner while it runs the job and by the orphan sweep when it fails one whose worker
is gone, so both attach the same evidence.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

__all__ = ["LOG_TAIL_BYTES", "artifacts", "log_tail"]

LOG_TAIL_BYTES = 8192


def log_tail(path: Path, size: int = LOG_TAIL_BYTES) -> str:
    """The last ``size`` bytes of a log, from a line start; empty when it cannot be read."""
    try:
        with path.open("rb") as handle:
            handle.seek(0, os.SEEK_END)
            end = handle.tell()
            handle.seek(max(0, end - size))
            data = handle.read()
    except OSError:
        return ""
    text = data.decode("utf-8", errors="replace")
    return text if end <= size else text.split("\n", 1)[-1]


def artifacts(work: Path, failed: bool) -> list[dict[str, Any]]:
    """``[{name, path, size}]`` of the log, the progress events and, after a failure, its
    evidence (``failures.jsonl`` and Chrome traces); paths relative to ``work``."""
    found: list[Path] = [work / "acquisition.log", work / "progress.jsonl"]
    if failed:
        evidence = work / "out" / "_acquisition"
        if evidence.is_dir():
            found += sorted(evidence.rglob("failures.jsonl"))
            found += sorted(p for p in evidence.rglob("*trace*.json*") if p.is_file())
    return [
        {"name": p.name, "path": p.relative_to(work).as_posix(), "size": p.stat().st_size}
        for p in found
        if p.is_file()
    ]
