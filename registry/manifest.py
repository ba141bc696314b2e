"""The canonical manifest of a bundle and its content hash.

A bundle's identity is the sha256 of its manifest: one line ``<sha256> <size> <path>\\n`` per
file, sorted by the UTF-8 bytes of the path. It depends only on relative paths and bytes, so a
directory, its .tar.gz and its .zip (and a download re-uploaded) all have the same identity.
"""

from __future__ import annotations

import hashlib
import os
import stat
from dataclasses import dataclass
from fnmatch import fnmatchcase
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from collections.abc import Iterable

__all__ = [
    "LEFT_OUT_PATTERNS",
    "FileRecord",
    "Manifest",
    "ManifestError",
    "check_member_path",
    "is_left_out",
    "left_out_reason",
    "scan_tree",
]

# Acquisition artifacts that a published bundle leaves out (R36, R37) and lock files of the
# writer: they are dropped at publication and reported, never stored.
LEFT_OUT_PATTERNS = (
    "samples.jsonl",
    "samples.jsonl.*",
    "failures.jsonl",
    "*.lock",
    "*trace*.json",
    "*trace*.json.gz",
)
# The files a bundle is made of (docs/bundle-format.md): YAML and JSON metadata, CSV tables,
# and plain-text notes. Anything else (HTML, SVG, scripts, binaries) is never stored, so the
# registry cannot be made to host content a browser would run (issue 17, item 1).
FORMAT_SUFFIXES = (".yaml", ".yml", ".json", ".csv", ".md", ".txt")
MAX_PATH_CHARS = 1024
MAX_PART_CHARS = 255


class ManifestError(ValueError):
    """A path or file that a bundle cannot hold."""


def left_out_reason(path: str) -> str | None:
    """Why publication leaves ``path`` out, or None when the bundle keeps it."""
    name = path.rsplit("/", 1)[-1]
    if any(fnmatchcase(name, pattern) for pattern in LEFT_OUT_PATTERNS):
        return "an acquisition artifact, never published"
    if not name.lower().endswith(FORMAT_SUFFIXES):
        return "not a file of the bundle format (only " + ", ".join(FORMAT_SUFFIXES) + ")"
    return None


def is_left_out(path: str) -> bool:
    return left_out_reason(path) is not None


def check_member_path(raw: str) -> str:
    """Return the normalized relative POSIX path, or raise `ManifestError` saying why not.

    Refuses absolute paths, ``..``, backslashes, drive letters and control characters: a
    member must name a place inside the bundle, spelled the same on every system.
    """
    if not raw:
        raise ManifestError("an entry has an empty name")
    if any(ord(ch) < 32 or ord(ch) == 127 for ch in raw):
        raise ManifestError(f"{raw!r}: control characters are not allowed in names")
    try:
        raw.encode("utf-8")
    except UnicodeEncodeError:
        raise ManifestError(f"{raw!r}: a name must be valid UTF-8 text") from None
    if "\\" in raw:
        raise ManifestError(f"{raw!r}: backslashes are not allowed in names")
    if raw.startswith("/") or (len(raw) > 1 and raw[1] == ":"):
        raise ManifestError(f"{raw!r}: absolute paths are not allowed")
    parts = [part for part in raw.split("/") if part not in ("", ".")]
    if any(part == ".." for part in parts):
        raise ManifestError(f"{raw!r}: '..' is not allowed in names")
    if not parts:
        raise ManifestError(f"{raw!r}: names the archive root")
    path = "/".join(parts)
    if len(path) > MAX_PATH_CHARS or any(len(part) > MAX_PART_CHARS for part in parts):
        raise ManifestError(f"{raw[:80]!r}...: name too long")
    return path


@dataclass(frozen=True, slots=True)
class FileRecord:
    path: str
    size: int
    sha256: str

    def line(self) -> bytes:
        return f"{self.sha256} {self.size} {self.path}\n".encode()

    def as_dict(self) -> dict[str, object]:
        return {"path": self.path, "size": self.size, "sha256": self.sha256}


@dataclass(frozen=True, slots=True)
class Manifest:
    files: tuple[FileRecord, ...]

    @classmethod
    def of(cls, records: Iterable[FileRecord]) -> Manifest:
        return cls(files=tuple(sorted(records, key=lambda r: r.path.encode())))

    @classmethod
    def from_dicts(cls, raw: Iterable[dict[str, Any]]) -> Manifest:
        return cls.of(
            FileRecord(path=str(r["path"]), size=int(r["size"]), sha256=str(r["sha256"]))
            for r in raw
        )

    def canonical_bytes(self) -> bytes:
        return b"".join(record.line() for record in self.files)

    @property
    def sha256(self) -> str:
        return hashlib.sha256(self.canonical_bytes()).hexdigest()

    @property
    def size(self) -> int:
        return sum(record.size for record in self.files)

    def as_list(self) -> list[dict[str, object]]:
        return [record.as_dict() for record in self.files]


def hash_file(path: Path) -> tuple[int, str]:
    digest = hashlib.sha256()
    size = 0
    with path.open("rb") as handle:
        while block := handle.read(1 << 20):
            size += len(block)
            digest.update(block)
    return size, digest.hexdigest()


def scan_tree(root: Path) -> list[str]:
    """Relative paths of every regular file under ``root``; links and special files refused.

    A bundle on disk may only hold plain files and folders: a link could point anywhere, and
    a device or FIFO has no bytes to publish.
    """
    found: list[str] = []
    for dirpath, dirnames, filenames in os.walk(root, followlinks=False):
        base = Path(dirpath)
        for name in [*dirnames, *filenames]:
            full = base / name
            mode = full.lstat().st_mode
            rel = full.relative_to(root).as_posix()
            if stat.S_ISLNK(mode):
                raise ManifestError(f"{rel!r}: links are not allowed in a bundle")
            if stat.S_ISDIR(mode):
                continue
            if not stat.S_ISREG(mode):
                raise ManifestError(f"{rel!r}: only regular files are allowed in a bundle")
            found.append(check_member_path(rel))
    return sorted(found)
