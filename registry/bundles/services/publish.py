"""publish_bundle: validate with moetables, then store content-addressed, then index, atomically.

Order matters: nothing is written to storage or the database until the whole bundle has been
unpacked into a private staging folder and validated there, so a rejected upload leaves no
trace. Blobs are written before the rows that name them; rows appear in one transaction.
"""

from __future__ import annotations

import logging
import shutil
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from django.conf import settings
from django.db import IntegrityError, transaction
from django.db.models import Sum

from moetables.bundle import ValidationReport, validate_bundle
from registry.archives import ArchiveError, ArchiveLimits, find_bundle_root, unpack_archive
from registry.audit import record_change
from registry.checks import check_row
from registry.choices import BundleSource
from registry.manifest import (
    FileRecord,
    Manifest,
    ManifestError,
    hash_file,
    is_left_out,
    left_out_reason,
    scan_tree,
)
from registry.models import Bundle, DeploymentTable, Namespace
from registry.permissions import NotAllowed, can_publish_under, can_upload
from registry.bundles.services.describe import (
    jsonable,
    measured_at_of,
    measured_at_problems,
    table_fields,
    vllm_version_of,
)
from registry.storage import blob_name, bundle_storage, put_blob

if TYPE_CHECKING:
    from django.contrib.auth.models import AbstractBaseUser
    from django.core.files.uploadedfile import UploadedFile

__all__ = [
    "PublishError",
    "PublishResult",
    "QuotaExceeded",
    "check_quota",
    "publish_bundle",
    "publish_upload",
]

log = logging.getLogger(__name__)
META = "meta.yaml"


class PublishError(Exception):
    """The bundle was refused; ``problems`` lists every reason, each naming its file."""

    def __init__(self, problems: list[str]) -> None:
        super().__init__("; ".join(problems))
        self.problems = problems


class QuotaExceeded(PublishError):
    """The publisher's stored bytes would pass REGISTRY["USER_QUOTA_BYTES"] (HTTP 413)."""


def check_quota(user: Any, adding: int) -> None:
    """Raise `QuotaExceeded` if ``user`` publishing ``adding`` more bytes passes the quota."""
    quota = settings.REGISTRY.get("USER_QUOTA_BYTES") or 0
    if not quota or not getattr(user, "pk", None) or getattr(user, "is_staff", False):
        return
    used = Bundle.objects.filter(published_by=user).aggregate(total=Sum("size"))["total"] or 0
    if used + adding > quota:
        raise QuotaExceeded(
            [
                f"this bundle ({adding} bytes) would bring your published bytes to "
                f"{used + adding}; your quota is {quota} (REGISTRY_USER_QUOTA_BYTES)"
            ]
        )


@dataclass(slots=True)
class PublishResult:
    bundle: Bundle
    created: bool
    left_out: list[str] = field(default_factory=list)

    @property
    def left_out_reasons(self) -> list[str]:
        """``path: why`` for each file left out (issue 17, item 1)."""
        return [f"{path}: left out: {left_out_reason(path)}" for path in self.left_out]

    @property
    def missing_files(self) -> list[str]:
        return list(self.bundle.missing_files)


def limits() -> ArchiveLimits:
    conf = settings.REGISTRY
    return ArchiveLimits(
        max_archive_bytes=conf["MAX_ARCHIVE_BYTES"],
        max_unpacked_bytes=conf["MAX_UNPACKED_BYTES"],
        max_files=conf["MAX_FILES"],
    )


def _staging() -> Path:
    folder = Path(settings.REGISTRY["STAGING_DIR"])
    folder.mkdir(parents=True, exist_ok=True)
    return folder


def _copy_in(source: Path, dest: Path, budget: ArchiveLimits) -> list[str]:
    """Copy the bundle folder ``source`` into ``dest``; return the paths left out."""
    paths = scan_tree(source)
    left_out = [p for p in paths if is_left_out(p)]
    kept = [p for p in paths if not is_left_out(p)]
    if len(kept) > budget.max_files:
        raise PublishError([f"{source}: more than {budget.max_files} files"])
    total = 0
    for rel in kept:
        src = source.joinpath(*rel.split("/"))
        out = dest.joinpath(*rel.split("/"))
        out.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(src, out, follow_symlinks=False)
        total += out.stat().st_size
        if total > budget.max_unpacked_bytes:
            raise PublishError([f"{source}: more than {budget.max_unpacked_bytes} bytes"])
    return left_out


def _drop_left_out(root: Path) -> list[str]:
    left_out = [p for p in scan_tree(root) if is_left_out(p)]
    for rel in left_out:
        root.joinpath(*rel.split("/")).unlink()
    return left_out


def _validate(root: Path) -> ValidationReport:
    try:
        report = validate_bundle(root)
    except Exception as exc:
        log.exception("moetables could not read the bundle at %s", root)
        raise PublishError([f"the bundle cannot be read: {type(exc).__name__}: {exc}"]) from None
    problems = list(report.problems)
    bundle = report.bundle
    if bundle is not None:
        for key in ("hardware", "model", "variant"):
            value = bundle.meta.get(key)
            if not isinstance(value, str) or not value.strip():
                problems.append(
                    f"meta.yaml:{key}: a published bundle needs it as a non-empty string"
                )
            elif len(value) > {"hardware": 128, "model": 256, "variant": 128}[key]:
                problems.append(f"meta.yaml:{key}: is too long")
    if problems:
        raise PublishError(problems)
    return report


def publish_bundle(
    source: str | Path,
    *,
    source_kind: str = BundleSource.IMPORT,
    source_detail: str = "",
    published_by: AbstractBaseUser | None = None,
) -> PublishResult:
    """Publish the bundle folder or archive (.tar.gz, .zip) at ``source``.

    Returns the bundle and whether it is new: the same content published twice is one
    bundle. Raises `PublishError` with every problem found; then nothing was stored.
    """
    path = Path(source)
    budget = limits()
    with tempfile.TemporaryDirectory(prefix="publish-", dir=_staging()) as work:
        try:
            if path.is_dir():
                if not (path / META).is_file():
                    raise PublishError([f"{path}: no {META} in this folder"])
                root = Path(work) / "bundle"
                left_out = _copy_in(path, root, budget)
            elif path.is_file():
                unpacked = Path(work) / "unpacked"
                unpacked.mkdir()
                unpack_archive(path, unpacked, budget)
                root = find_bundle_root(unpacked)
                left_out = _drop_left_out(root)
            else:
                raise PublishError([f"{path}: no such file or folder"])
            report = _validate(root)
            records = []
            for rel in scan_tree(root):
                size, digest = hash_file(root.joinpath(*rel.split("/")))
                records.append(FileRecord(path=rel, size=size, sha256=digest))
        except (ArchiveError, ManifestError) as exc:
            raise PublishError([str(exc)]) from None
        manifest = Manifest.of(records)
        assert report.bundle is not None
        # Every value checked before anything is written (issue 17, items 3 and 5).
        bundle, tables = _rows(report, manifest, source_kind, source_detail, published_by)
        existing = Bundle.objects.filter(sha256=manifest.sha256).first()
        if existing is not None:
            return PublishResult(bundle=existing, created=False, left_out=left_out)
        _check_namespace(published_by, report.bundle.meta)
        check_quota(published_by, manifest.size)
        storage = bundle_storage()
        written: list[str] = []
        try:
            for record in manifest.files:
                path_of = root.joinpath(*record.path.split("/"))
                if put_blob(storage, path_of, record.sha256, record.size):
                    written.append(record.sha256)
            _index(bundle, tables, published_by, report.bundle.meta)
        except IntegrityError:
            # Someone published the same content meanwhile: theirs is ours.
            found = Bundle.objects.filter(sha256=manifest.sha256).first()
            if found is None:
                sweep_unreferenced(written)
                raise
            return PublishResult(bundle=found, created=False, left_out=left_out)
        except BaseException:
            # Nothing of a failed publication stays behind (issue 17, item 5).
            sweep_unreferenced(written)
            raise
    log.info(
        "published bundle %s (%s %s %s)",
        bundle.sha256,
        bundle.hardware,
        bundle.model,
        bundle.variant,
    )
    return PublishResult(bundle=bundle, created=True, left_out=left_out)


def _rows(
    report: ValidationReport,
    manifest: Manifest,
    source_kind: str,
    source_detail: str,
    published_by: Any,
) -> tuple[Bundle, list[DeploymentTable]]:
    """The unsaved rows of the bundle, each value checked against its column; raises
    `PublishError` naming every field that would not fit."""
    opened = report.bundle
    assert opened is not None
    problems = measured_at_problems(opened)
    bundle = Bundle(
        sha256=manifest.sha256,
        hardware=opened.meta["hardware"].strip(),
        model=opened.meta["model"].strip(),
        variant=opened.meta["variant"].strip(),
        layout=opened.layout,
        size=manifest.size,
        file_count=len(manifest.files),
        manifest=manifest.as_list(),
        meta=jsonable(opened.meta),
        missing_files=list(opened.missing_files),
        vllm_version=vllm_version_of(opened),
        exploratory=any(entry.exploratory for entry in opened.entries),
        measured_at=None if problems else measured_at_of(opened),
        source=source_kind,
        source_detail=source_detail[:512],
        published_by=published_by if getattr(published_by, "pk", None) else None,
    )
    sources = {
        "hardware": "meta.yaml:hardware",
        "model": "meta.yaml:model",
        "variant": "meta.yaml:variant",
        "meta": "meta.yaml",
        "source_detail": "the upload's file name",
        "vllm_version": "vllm_version (meta.yaml or a contract)",
        "manifest": "file names",
    }
    problems += check_row(bundle, "bundle", sources)
    tables = []
    for entry in opened.entries:
        table = DeploymentTable(**table_fields(entry, report.tables[entry.table_path]))
        names = {"contract": f"{entry.where} contract", "coverage": f"{entry.where} coverage"}
        problems += check_row(table, entry.where, names)
        tables.append(table)
    if problems:
        raise PublishError(problems)
    tables.sort(key=lambda t: (t.tp, t.dp, t.rank, t.sequence_parallel))
    return bundle, tables


def _index(
    bundle: Bundle, tables: list[DeploymentTable], published_by: Any, meta: dict[str, Any]
) -> None:
    with transaction.atomic():
        bundle.save(force_insert=True)
        for table in tables:
            table.bundle = bundle
        DeploymentTable.objects.bulk_create(tables)
        bundle.targets = [table.brief() for table in tables]
        bundle.save(update_fields=["targets"])
        # The first publisher owns the name; checked again here, under the row's lock, so
        # that two first uploads at once cannot both claim it (issue 17, item 7).
        user = published_by if getattr(published_by, "pk", None) else None
        Namespace.objects.select_for_update().get_or_create(
            hardware=bundle.hardware, model=bundle.model, defaults={"owner": user}
        )
        _check_namespace(published_by, meta)
        record_change(user, "bundle.publish", bundle, sha256=bundle.sha256, source=bundle.source)
        if bundle.source != BundleSource.ACQUISITION:
            # A job's runner closes the requests itself, naming the job that filled them.
            from registry.services.requests import close_filled_requests

            close_filled_requests(bundle)


def sweep_unreferenced(digests: list[str]) -> list[str]:
    """Delete the blobs among ``digests`` that no committed bundle or routing profile names;
    returns them.

    Called when a publication fails after writing blobs, and when a profile is deleted:
    bundle files and profiles share one content-addressed store, so the same bytes may be
    both, and a blob goes only if nothing names it any more.
    """
    from registry.profile_models import RoutingProfileRecord

    if not digests:
        return []
    wanted = set(digests)
    wanted -= set(
        RoutingProfileRecord.objects.filter(sha256__in=wanted).values_list("sha256", flat=True)
    )
    for manifest in Bundle.objects.values_list("manifest", flat=True).iterator():
        if not wanted:
            return []
        wanted -= {record["sha256"] for record in manifest}
    storage = bundle_storage()
    for digest in wanted:
        if storage.exists(blob_name(digest)):
            storage.delete(blob_name(digest))
    if wanted:
        log.warning("removed %d unreferenced blobs", len(wanted))
    return sorted(wanted)


def _check_namespace(published_by: Any, meta: dict[str, Any]) -> None:
    user = published_by if getattr(published_by, "pk", None) else None
    hardware, model = meta["hardware"].strip(), meta["model"].strip()
    if not can_publish_under(user, hardware, model):
        raise NotAllowed(
            f"the name {hardware} / {model} belongs to another publisher; ask its owner or "
            "staff for a grant (issue 17: names belong to publishers)"
        )


def publish_upload(upload: UploadedFile[bytes], *, published_by: Any = None) -> PublishResult:
    """Publish an archive received over HTTP: size-checked before a byte is unpacked.

    Raises `NotAllowed` unless ``published_by`` may upload (an HTTP upload is never the
    server's own, which `publish_bundle` lets publish anywhere).
    """
    if not can_upload(published_by):
        raise NotAllowed("uploading a bundle needs an active account and its token")
    budget = limits()
    if upload.size is not None and upload.size > budget.max_archive_bytes:
        raise PublishError(
            [f"the archive is {upload.size} bytes; the limit is {budget.max_archive_bytes}"]
        )
    name = (upload.name or "upload")[:200]
    with tempfile.NamedTemporaryFile(prefix="upload-", dir=_staging()) as spool:
        for chunk in upload.chunks():
            spool.write(chunk)
        spool.flush()
        return publish_bundle(
            spool.name,
            source_kind=BundleSource.UPLOAD,
            source_detail=name,
            published_by=published_by,
        )
