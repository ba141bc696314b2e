"""Content-addressed bundle storage behind Django's ``STORAGES["bundles"]``.

Every file of every bundle is stored once, under its sha256 (``sha256/ab/cd/abcd...``); two
bundles sharing a table share its blob. Only this module knows the naming, so moving to an
object store means another backend in settings, not other code.
"""

from __future__ import annotations

import hashlib
import os
import tempfile
from pathlib import Path
from typing import IO, Any

from django.core.files import File
from django.core.files.storage import FileSystemStorage, Storage, storages

__all__ = [
    "ContentAddressedStorage",
    "blob_name",
    "bundle_storage",
    "hash_blob",
    "open_blob",
    "put_blob",
]


class ContentAddressedStorage(FileSystemStorage):
    """Local files where a name is a digest: writes are atomic and never renamed.

    Django's FileSystemStorage writes in place, so a crash could leave a partial file under
    a digest name that later passes an existence check. Here a blob appears only complete,
    by rename from a temporary file beside it.
    """

    def get_available_name(self, name: str, max_length: int | None = None) -> str:
        return name

    def _save(self, name: str, content: Any) -> str:
        full_path = Path(self.path(name))
        full_path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=".incoming-", dir=full_path.parent)
        try:
            with os.fdopen(fd, "wb") as out:
                for chunk in content.chunks():
                    out.write(chunk)
                out.flush()
                os.fsync(out.fileno())
            Path(tmp).chmod(0o444)
            Path(tmp).replace(full_path)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise
        return name


def bundle_storage() -> Storage:
    return storages["bundles"]


def blob_name(sha256: str) -> str:
    return f"sha256/{sha256[:2]}/{sha256[2:4]}/{sha256}"


def put_blob(storage: Storage, source: Path, sha256: str, size: int) -> bool:
    """Store ``source`` as the blob ``sha256``; False if an intact-looking blob is there already."""
    name = blob_name(sha256)
    if storage.exists(name) and storage.size(name) == size:
        return False
    if storage.exists(name):
        storage.delete(name)  # a truncated blob under this digest: replace it
    with source.open("rb") as handle:
        storage.save(name, File(handle, name=name))
    return True


def open_blob(storage: Storage, sha256: str) -> IO[bytes]:
    handle: IO[bytes] = storage.open(blob_name(sha256), "rb")
    return handle


def hash_blob(storage: Storage, sha256: str) -> tuple[int, str] | None:
    """Size and sha256 of the stored bytes, or None if the blob is missing."""
    name = blob_name(sha256)
    if not storage.exists(name):
        return None
    digest = hashlib.sha256()
    size = 0
    with storage.open(name, "rb") as handle:
        while block := handle.read(1 << 20):
            size += len(block)
            digest.update(block)
    return size, digest.hexdigest()
