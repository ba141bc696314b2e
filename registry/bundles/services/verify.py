"""verify_bundles: re-hash every stored file and report any drift from the manifests.

Blobs are the record of what was published; a blob whose bytes changed, shrank or vanished
is drift. Checkouts are caches of blobs: a drifted checkout is reported and discarded, and
the next lookup rebuilds it from the (verified) blobs.
"""

from __future__ import annotations

import hashlib
import shutil
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from registry.manifest import Manifest
from registry.bundles.models import Bundle
from registry.bundles.services.checkout import checkout_path
from registry.storage import blob_name, bundle_storage, hash_blob

if TYPE_CHECKING:
    from collections.abc import Iterable

__all__ = ["Drift", "VerifyReport", "verify_bundles"]


@dataclass(frozen=True, slots=True)
class Drift:
    bundle_id: int
    bundle_sha256: str
    path: str
    problem: str

    def __str__(self) -> str:
        return f"bundle {self.bundle_id} ({self.bundle_sha256[:12]}) {self.path}: {self.problem}"


@dataclass(slots=True)
class VerifyReport:
    bundles: int = 0
    files: int = 0
    drifts: list[Drift] = field(default_factory=list)
    discarded_checkouts: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.drifts


def _file_sha256(path: object) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:  # type: ignore[call-overload]
        while block := handle.read(1 << 20):
            digest.update(block)
    return digest.hexdigest()


def verify_bundles(bundles: Iterable[Bundle] | None = None) -> VerifyReport:
    storage = bundle_storage()
    report = VerifyReport()
    hashed: dict[str, tuple[int, str] | None] = {}
    for bundle in bundles if bundles is not None else Bundle.objects.order_by("id").iterator():
        report.bundles += 1

        def drift(path: str, problem: str, bundle: Bundle = bundle) -> None:
            report.drifts.append(Drift(bundle.pk, bundle.sha256, path, problem))

        manifest = Manifest.from_dicts(bundle.manifest)
        if manifest.sha256 != bundle.sha256:
            drift("(manifest)", f"the manifest rows hash to {manifest.sha256}, not the bundle's id")
        for record in manifest.files:
            report.files += 1
            if record.sha256 not in hashed:
                hashed[record.sha256] = hash_blob(storage, record.sha256)
            found = hashed[record.sha256]
            if found is None:
                drift(record.path, f"blob {blob_name(record.sha256)} is missing from storage")
            elif found[0] != record.size:
                drift(record.path, f"stored {found[0]} bytes, published {record.size}")
            elif found[1] != record.sha256:
                drift(record.path, f"stored bytes hash to {found[1]}, published {record.sha256}")
        checkout = checkout_path(bundle.sha256)
        if checkout.is_dir():
            for record in manifest.files:
                local = checkout.joinpath(*record.path.split("/"))
                if not local.is_file() or _file_sha256(local) != record.sha256:
                    drift(record.path, f"checkout {checkout} differs from the blob; discarded")
                    shutil.rmtree(checkout, ignore_errors=True)
                    report.discarded_checkouts.append(str(checkout))
                    break
    return report
