"""What the registry does, as plain functions the API, commands and tasks all call."""

from __future__ import annotations

from registry.bundles.services.checkout import checkout_bundle
from registry.bundles.services.export import bundle_archive_chunks, export_bundle
from registry.bundles.services.publish import (
    PublishError,
    PublishResult,
    publish_bundle,
    publish_upload,
)
from registry.bundles.services.verify import Drift, VerifyReport, verify_bundles

__all__ = [
    "Drift",
    "PublishError",
    "PublishResult",
    "VerifyReport",
    "bundle_archive_chunks",
    "checkout_bundle",
    "export_bundle",
    "publish_bundle",
    "publish_upload",
    "verify_bundles",
]
