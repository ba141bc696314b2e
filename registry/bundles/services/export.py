"""A bundle as a deterministic .tar.gz (downloads, manage.py export_bundle) or a folder."""

from __future__ import annotations

import shutil
from functools import partial
from typing import IO, TYPE_CHECKING, cast

from registry.archives import iter_tar_gz
from registry.bundles.services.checkout import checkout_bundle, checkout_file

if TYPE_CHECKING:
    from collections.abc import Callable, Iterator
    from pathlib import Path

    from registry.bundles.models import Bundle

__all__ = ["bundle_archive_chunks", "export_bundle", "format_archive"]


def bundle_archive_chunks(bundle: Bundle) -> Iterator[bytes]:
    """The bundle's files under the folder ``bundle.archive_stem``, gzip-compressed tar.

    Same content, same bytes: re-uploading a download gives back the same bundle.
    """
    # Checked out (every byte hashed against the manifest) before the first byte is sent: a
    # missing or drifted blob is a clean error (BlobDriftError), not a cut connection.
    paths = [checkout_file(bundle, record) for record in bundle.manifest]
    files = (
        (
            str(record["path"]),
            int(record["size"]),
            cast("Callable[[], IO[bytes]]", partial(path.open, "rb")),
        )
        for record, path in zip(bundle.manifest, paths, strict=True)
    )
    return iter_tar_gz(bundle.archive_stem, files)


def export_bundle(bundle: Bundle, dest: Path, *, as_folder: bool = False) -> Path:
    """Write the bundle to ``dest`` (a .tar.gz file, or with ``as_folder`` a new folder)."""
    if as_folder:
        if dest.exists():
            raise FileExistsError(f"{dest} already exists")
        shutil.copytree(checkout_bundle(bundle), dest)
        return dest
    dest.parent.mkdir(parents=True, exist_ok=True)
    partial_path = dest.with_name(dest.name + ".partial")
    with partial_path.open("wb") as out:
        for chunk in bundle_archive_chunks(bundle):
            out.write(chunk)
    partial_path.replace(dest)
    return dest


def _opener(path: Path) -> Callable[[], IO[bytes]]:
    return lambda: path.open("rb")


def format_archive(bundle: Bundle, fmt: str) -> tuple[str, bytes]:
    """The bundle written for another simulator (``moetables.export``) as a .tar.gz: its
    file name and bytes. Raises ``moetables.export.ExportError`` naming what the format
    cannot express."""
    import tempfile
    from pathlib import Path

    from moetables.export import export_bundle as write_format

    with tempfile.TemporaryDirectory(prefix="format-") as work:
        out = Path(work) / "out"
        write_format(checkout_bundle(bundle), fmt, out)
        files = sorted(p for p in out.rglob("*") if p.is_file())
        stem = f"{bundle.archive_stem}_{fmt}"
        chunks = iter_tar_gz(
            stem, ((p.relative_to(out).as_posix(), p.stat().st_size, _opener(p)) for p in files)
        )
        return f"{stem}.tar.gz", b"".join(chunks)
