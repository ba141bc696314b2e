"""Paths named inside a bundle: relative, POSIX, and never leaving the bundle."""

from __future__ import annotations

import hashlib
from pathlib import Path, PurePosixPath

from moetables.errors import BundleError

__all__ = ["resolve_inside", "sha256_file"]


def resolve_inside(root: Path, base: str, relative: object, *, where: str) -> tuple[str, Path]:
    """Resolve ``relative`` (found at ``where``) against ``base`` inside ``root``.

    Returns the bundle-relative POSIX path and the filesystem path. Absolute paths, ``..``
    that climbs out, backslashes and links pointing outside are all refused: a bundle can
    name only its own files.
    """
    if not isinstance(relative, str) or not relative:
        raise BundleError(where, f"must be a non-empty relative path, got {relative!r}")
    if "\\" in relative or "\x00" in relative:
        raise BundleError(where, f"path {relative!r} must use '/' separators only")
    rel = PurePosixPath(relative)
    if rel.is_absolute():
        raise BundleError(where, f"path {relative!r} is absolute; paths stay inside the bundle")
    parts: list[str] = [p for p in PurePosixPath(base).parts if p not in ("", ".")]
    for part in rel.parts:
        if part == ".":
            continue
        if part == "..":
            if not parts:
                raise BundleError(where, f"path {relative!r} leaves the bundle")
            parts.pop()
            continue
        parts.append(part)
    if not parts:
        raise BundleError(where, f"path {relative!r} names the bundle root itself")
    inside = "/".join(parts)
    path = root.joinpath(*parts)
    real_root = root.resolve()
    try:
        path.resolve().relative_to(real_root)
    except ValueError:
        raise BundleError(where, f"path {relative!r} resolves outside the bundle") from None
    return inside, path


def sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()
