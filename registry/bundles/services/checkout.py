"""Checked-out bundle trees: what `moetables` reads for lookups, rebuilt from the blobs.

A checkout is a cache keyed by the bundle's content hash, so it is never stale: a different
content is a different folder. It appears whole by rename and every byte copied into it is
hashed against the manifest on the way.
"""

from __future__ import annotations

import hashlib
import shutil
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING

from django.conf import settings

from registry.storage import bundle_storage, open_blob

if TYPE_CHECKING:
    from registry.bundles.models import Bundle

__all__ = [
    "BlobDriftError",
    "BlobMissingError",
    "checkout_bundle",
    "checkout_file",
    "checkout_path",
]


class BlobDriftError(RuntimeError):
    """A stored blob no longer has the bytes its digest names; run manage.py verify_bundles."""


class BlobMissingError(BlobDriftError):
    """A blob the manifest names is gone from storage (issue 17, item 6)."""


def checkout_path(sha256: str) -> Path:
    return Path(settings.REGISTRY["CHECKOUT_DIR"]) / sha256


def checkout_file(bundle: Bundle, record: dict[str, object]) -> Path:
    """The verified checkout's copy of one manifest file; rebuilt once if it went missing.

    Files are served from checkouts, whose every byte was hashed against the manifest when
    they were made (issue 17, item 6), never straight from a blob that may have drifted.
    """
    rel = str(record["path"]).split("/")
    for attempt in range(2):
        path = checkout_bundle(bundle).joinpath(*rel)
        try:
            if path.stat().st_size == record["size"]:
                return path
        except FileNotFoundError:
            pass
        if attempt == 0:  # a damaged or half-discarded checkout: rebuild it from the blobs
            shutil.rmtree(checkout_path(bundle.sha256), ignore_errors=True)
    raise BlobDriftError(
        f"bundle {bundle.pk} file {record['path']}: the checkout cannot be rebuilt intact"
    )


def checkout_bundle(bundle: Bundle) -> Path:
    final = checkout_path(bundle.sha256)
    if final.is_dir():
        return final
    final.parent.mkdir(parents=True, exist_ok=True)
    stage = Path(tempfile.mkdtemp(prefix=f".{bundle.sha256[:12]}-", dir=final.parent))
    try:
        storage = bundle_storage()
        for record in bundle.manifest:
            out = stage.joinpath(*record["path"].split("/"))
            out.parent.mkdir(parents=True, exist_ok=True)
            digest = hashlib.sha256()
            try:
                src = open_blob(storage, record["sha256"])
            except FileNotFoundError:
                raise BlobMissingError(
                    f"bundle {bundle.pk} file {record['path']}: its blob {record['sha256']} "
                    "is missing from storage; run manage.py verify_bundles"
                ) from None
            with src, out.open("wb") as dst:
                while block := src.read(1 << 20):
                    digest.update(block)
                    dst.write(block)
            if digest.hexdigest() != record["sha256"]:
                raise BlobDriftError(
                    f"bundle {bundle.pk} file {record['path']}: stored bytes hash to "
                    f"{digest.hexdigest()}, the manifest says {record['sha256']}"
                )
        try:
            stage.rename(final)
        except OSError:
            if not final.is_dir():
                raise
            shutil.rmtree(stage, ignore_errors=True)  # another process checked it out first
    except BaseException:
        shutil.rmtree(stage, ignore_errors=True)
        raise
    return final
