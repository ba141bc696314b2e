"""Publishing, reading and deleting routing profiles (issue 15 part 2).

An upload is read whole into memory (at most ``REGISTRY["MAX_PROFILE_BYTES"]``, 64 MiB by
default, unpacking to at most ``REGISTRY["MAX_PROFILE_UNPACKED_BYTES"]``, 512 MiB), validated by `moetables.profiles.read_profile` (schema, checksums, every count),
counted against the publisher's quota like bundle bytes, and stored as a content-addressed
blob; identical bytes answer the existing profile. Permissions come from
`registry.permissions` (the API and the pages ask the same functions).
"""

from __future__ import annotations

import hashlib
import tempfile
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from django.conf import settings
from django.db import IntegrityError, transaction
from django.db.models import Sum

from moetables.profiles import ProfileError, RoutingProfile, read_profile
from registry.bundles.services.publish import PublishError, QuotaExceeded, sweep_unreferenced
from registry.permissions import NotAllowed, can_delete_routing_profile, can_upload
from registry.profile_models import RoutingProfileRecord
from registry.storage import blob_name, bundle_storage, hash_blob, open_blob, put_blob

__all__ = [
    "ProfileUploadResult",
    "delete_profile",
    "import_profile_file",
    "load_profile",
    "publish_profile",
    "published_profile",
    "verify_profile_files",
]

DEFAULT_MAX_BYTES = 64 * 1024 * 1024
# Profiles compress well (counts of a skewed router are mostly small); what an upload may
# unpack to in memory is bounded separately.
DEFAULT_MAX_UNPACKED = 512 * 1024 * 1024
_cache: dict[str, RoutingProfile] = {}
_lock = threading.Lock()


@dataclass(slots=True)
class ProfileUploadResult:
    record: RoutingProfileRecord
    created: bool


def _max_bytes() -> int:
    return int(settings.REGISTRY.get("MAX_PROFILE_BYTES") or DEFAULT_MAX_BYTES)


def _max_unpacked() -> int:
    return int(settings.REGISTRY.get("MAX_PROFILE_UNPACKED_BYTES") or DEFAULT_MAX_UNPACKED)


def _check_quota(user: Any, adding: int) -> None:
    from registry.bundles.models import Bundle

    quota = settings.REGISTRY.get("USER_QUOTA_BYTES") or 0
    if not quota or not getattr(user, "pk", None) or getattr(user, "is_staff", False):
        return
    used = (Bundle.objects.filter(published_by=user).aggregate(t=Sum("size"))["t"] or 0) + (
        RoutingProfileRecord.objects.filter(published_by=user).aggregate(t=Sum("size"))["t"] or 0
    )
    if used + adding > quota:
        raise QuotaExceeded(
            [
                f"this profile ({adding} bytes) would bring your published bytes to "
                f"{used + adding}; your quota is {quota} (REGISTRY_USER_QUOTA_BYTES)"
            ]
        )


def publish_profile(upload: Any, *, published_by: Any) -> ProfileUploadResult:
    """Validate and store an uploaded profile file; `PublishError` lists what is wrong."""
    if not can_upload(published_by):
        raise NotAllowed("uploading a routing profile needs an active account's token")
    limit = _max_bytes()
    size = getattr(upload, "size", None)
    if size is not None and size > limit:
        raise PublishError([f"profile: {size} bytes; at most {limit} bytes are accepted"])
    data = upload.read(limit + 1)
    if len(data) > limit:
        raise PublishError([f"profile: more than {limit} bytes; at most {limit} are accepted"])
    name = str(getattr(upload, "name", "") or "")[:255]
    return _store(data, name.rsplit("/", 1)[-1], published_by)


def import_profile_file(path: Path) -> ProfileUploadResult:
    """Publish a profile file from disk with no publisher, as `import_bundle` does for the
    shipped bundles (the run command imports the shipped profiles on every start)."""
    limit = _max_bytes()
    if path.stat().st_size > limit:
        raise PublishError([f"{path}: {path.stat().st_size} bytes; at most {limit} are accepted"])
    return _store(path.read_bytes(), path.name[:255], None)


def _store(data: bytes, filename: str, published_by: Any) -> ProfileUploadResult:
    try:
        profile = read_profile(data, max_unpacked=_max_unpacked())
    except ProfileError as exc:
        # The reader names the whole file "profile" already; a member's problem gets the field.
        where = str(exc)
        raise PublishError(
            [where if where.startswith("profile:") else f"profile: {where}"]
        ) from None
    sha256 = hashlib.sha256(data).hexdigest()
    existing = RoutingProfileRecord.objects.filter(sha256=sha256).first()
    if existing is not None:
        return ProfileUploadResult(existing, False)
    _check_quota(published_by, len(data))
    with tempfile.NamedTemporaryFile(suffix=".npz") as tmp:
        tmp.write(data)
        tmp.flush()
        put_blob(bundle_storage(), Path(tmp.name), sha256, len(data))
    summary = profile.summary()
    try:
        with transaction.atomic():
            record = RoutingProfileRecord.objects.create(
                sha256=sha256,
                size=len(data),
                model=profile.meta["model"]["name"][:200],
                router=str(profile.meta["router"])[:200],
                source=str(profile.meta["source"])[:64],
                global_experts=profile.global_experts,
                top_k=profile.top_k,
                layers=len(profile.layers),
                steps=profile.steps,
                tokens=summary["tokens"],
                captured_at=str(profile.meta["captured_at"])[:64],
                summary=summary,
                filename=filename,
                published_by=published_by,
            )
    except IntegrityError:  # the same bytes published at the same moment by someone else
        return ProfileUploadResult(RoutingProfileRecord.objects.get(sha256=sha256), False)
    with _lock:
        _cache[sha256] = profile
    return ProfileUploadResult(record, True)


def load_profile(record: RoutingProfileRecord) -> RoutingProfile:
    """The stored profile, read and re-validated once per process (its sha256 checked)."""
    with _lock:
        found = _cache.get(record.sha256)
    if found is not None:
        return found
    with open_blob(bundle_storage(), record.sha256) as handle:
        data = handle.read()
    if hashlib.sha256(data).hexdigest() != record.sha256:
        raise ProfileError(f"routing profile {record.pk}", "stored bytes do not match sha256")
    profile = read_profile(data, max_unpacked=_max_unpacked())
    with _lock:
        _cache[record.sha256] = profile
    return profile


def delete_profile(user: Any, record: RoutingProfileRecord) -> None:
    if not can_delete_routing_profile(user, record):
        raise NotAllowed("only the profile's publisher or staff may delete it")
    sha256 = record.sha256
    record.delete()
    with _lock:
        _cache.pop(sha256, None)
    # The store is content-addressed and shared with bundle files: the bytes stay if a
    # bundle names them too.
    sweep_unreferenced([sha256])


def verify_profile_files(pks: list[int] | None = None) -> tuple[int, list[str]]:
    """Re-hash every stored profile file (or those of ``pks``): how many were checked, and
    one line per profile whose bytes are missing or no longer match its sha256."""
    storage = bundle_storage()
    records = RoutingProfileRecord.objects.order_by("id")
    if pks is not None:
        records = records.filter(pk__in=pks)
    checked, drifts = 0, []
    for record in records.iterator():
        checked += 1
        found = hash_blob(storage, record.sha256)
        where = f"routing profile {record.pk} ({blob_name(record.sha256)})"
        if found is None:
            drifts.append(f"{where}: missing from storage")
        elif found[0] != record.size:
            drifts.append(f"{where}: stored {found[0]} bytes, published {record.size}")
        elif found[1] != record.sha256:
            drifts.append(f"{where}: stored bytes hash to {found[1]}, published {record.sha256}")
    return checked, drifts


def published_profile(pk: int) -> RoutingProfile | str:
    """A published profile by id for an estimate, or the problem to report (named)."""
    record = RoutingProfileRecord.objects.filter(pk=pk).first()
    if record is None:
        return f"profile: no published routing profile {pk}"
    try:
        return load_profile(record)
    except (ProfileError, OSError) as exc:
        return f"profile: routing profile {pk} cannot be read ({exc})"
