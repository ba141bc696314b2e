"""Issue 17, item 6: storage faults answer cleanly. A deleted blob is a 503 naming it (not a
500, not a cut connection); a corrupted blob is never served under the published ETag; a
checkout discarded under a running worker is rebuilt (R44)."""

from __future__ import annotations

import json
import shutil
from typing import TYPE_CHECKING, Any

import pytest

from registry.bundles.services.checkout import checkout_path
from registry.lookup.services import clear_lookup_cache
from registry.storage import blob_name, bundle_storage

if TYPE_CHECKING:
    from pathlib import Path

    from django.test import Client

    from registry.bundles.models import Bundle

pytestmark = pytest.mark.django_db

TARGET = {"tp": 1, "dp": 2, "rank": 0, "sequence_parallel": False}
QUERY = {"component": "gate_routing", "tokens": 1}


def _table_record(bundle: Bundle) -> dict[str, Any]:
    path = bundle.tables.first().table_path
    record = bundle.file_record(path)
    assert record is not None
    return record


def _blob(bundle: Bundle, record: dict[str, Any]) -> Path:
    from pathlib import Path

    path = Path(bundle_storage().path(blob_name(record["sha256"])))
    path.chmod(0o644)  # blobs are stored read-only
    return path


def _lookup(client: Client, bundle: Bundle) -> Any:
    return client.post(
        "/api/v1/lookup",
        json.dumps({"bundle": bundle.pk, "target": TARGET, "queries": [QUERY]}),
        content_type="application/json",
    )


def _everything(client: Client, bundle: Bundle, record: dict[str, Any]) -> dict[str, Any]:
    table = bundle.tables.first()
    return {
        "files": client.get(f"/api/v1/bundles/{bundle.pk}/files/{record['path']}"),
        "download": client.get(f"/api/v1/bundles/{bundle.pk}/download"),
        "lookup": _lookup(client, bundle),
        "table page": client.get(f"/tables/{table.pk}/"),
        "detail": client.get(f"/api/v1/bundles/{bundle.pk}"),
        "list": client.get("/api/v1/bundles/"),
    }


def test_it_answers_503_naming_a_deleted_blob(client: Client, published: Bundle) -> None:
    """Issue 17 item 6: 500 on lookup and files, and a download cut with no response."""
    record = _table_record(published)
    _blob(published, record).unlink()
    answers = _everything(client, published, record)
    for name in ("files", "download", "lookup", "table page"):
        assert answers[name].status_code == 503, name
        assert record["sha256"] in answers[name].content.decode() or name == "table page"
    assert answers["detail"].status_code == 200 and answers["list"].status_code == 200
    assert answers["files"].json()["error"] == "storage_fault"


def test_it_never_serves_a_corrupted_blob_under_the_published_etag(
    client: Client,
    published: Bundle,
) -> None:
    """Issue 17 item 6: a corrupted blob was served with 200 and the published sha256 ETag."""
    record = _table_record(published)
    blob = _blob(published, record)
    blob.write_bytes(b"X" + blob.read_bytes()[1:])
    answers = _everything(client, published, record)
    assert answers["files"].status_code == 503
    assert "ETag" not in answers["files"]
    assert answers["download"].status_code == 503
    assert answers["lookup"].status_code == 409
    assert answers["table page"].status_code == 503


def test_it_serves_the_verified_checkout_once_it_exists(
    client: Client,
    published: Bundle,
) -> None:
    """Issue 17 item 6: files come from a checkout whose bytes were hashed when it was made."""
    record = _table_record(published)
    original = _blob(published, record).read_bytes()
    assert _lookup(client, published).status_code == 200  # checks the bundle out
    blob = _blob(published, record)
    blob.write_bytes(b"X" + original[1:])
    response = client.get(f"/api/v1/bundles/{published.pk}/files/{record['path']}")
    assert response.status_code == 200
    assert b"".join(response.streaming_content) == original
    assert response["ETag"] == f'"{record["sha256"]}"'


def test_it_rebuilds_a_checkout_discarded_under_a_running_worker(
    client: Client,
    published: Bundle,
) -> None:
    """Issue 17 item 6: after verify_bundles discarded a checkout, lookups answered 409 and the
    table page 500 until a restart."""
    record = _table_record(published)
    assert _lookup(client, published).status_code == 200
    shutil.rmtree(checkout_path(published.sha256))
    answers = _everything(client, published, record)
    assert {name: r.status_code for name, r in answers.items()} == {
        "files": 200,
        "download": 200,
        "lookup": 200,
        "table page": 200,
        "detail": 200,
        "list": 200,
    }
    clear_lookup_cache()


def test_it_rebuilds_a_damaged_checkout_file(client: Client, published: Bundle) -> None:
    """Issue 17 item 6: a truncated checkout copy is rebuilt from the blobs, then served."""
    record = _table_record(published)
    assert _lookup(client, published).status_code == 200
    local = checkout_path(published.sha256).joinpath(*record["path"].split("/"))
    local.chmod(0o644)
    local.write_bytes(b"short")
    response = client.get(f"/api/v1/bundles/{published.pk}/files/{record['path']}")
    assert response.status_code == 200
    import hashlib

    assert hashlib.sha256(b"".join(response.streaming_content)).hexdigest() == record["sha256"]
