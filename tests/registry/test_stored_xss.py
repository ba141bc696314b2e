"""Issue 17, item 1 (stored XSS): bundle files are downloads, every response carries a strict
Content-Security-Policy, and only the bundle format's own files are stored at all (R44)."""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, Any

import pytest
from django.core.files.uploadedfile import SimpleUploadedFile

from registry.bundles.models import Bundle
from registry.manifest import FileRecord
from registry.storage import bundle_storage, put_blob

if TYPE_CHECKING:
    from pathlib import Path

    from django.test import Client
    from rest_framework.test import APIClient

pytestmark = pytest.mark.django_db

EVIL_HTML = b"<html><script>fetch('/api/v1/jobs/1/cancel',{method:'POST'})</script></html>"
EVIL_SVG = b'<svg xmlns="http://www.w3.org/2000/svg" onload="alert(1)"/>'


def upload(api: APIClient, data: bytes) -> Any:
    return api.post(
        "/api/v1/bundles/", {"archive": SimpleUploadedFile("b.tar.gz", data)}, format="multipart"
    )


def test_it_leaves_out_files_that_are_not_of_the_bundle_format(
    uploader: APIClient,
    make_bundle: Any,
    tar_gz_of: Any,
    stored_files: Any,
    registry_dirs: Path,
) -> None:
    """Issue 17 item 1: evil.html / evil.svg are never stored, and the answer says why."""
    folder = make_bundle()
    (folder / "evil.html").write_bytes(EVIL_HTML)
    (folder / "tp1" / "evil.svg").write_bytes(EVIL_SVG)
    (folder / "notes.md").write_text("where this comes from\n")
    response = upload(uploader, tar_gz_of(folder))
    assert response.status_code == 201, response.json()
    body = response.json()
    assert body["left_out"] == ["evil.html", "tp1/evil.svg"]
    assert all("not a file of the bundle format" in why for why in body["left_out_reasons"])
    assert body["left_out_reasons"][0].startswith("evil.html: left out: ")
    paths = {record["path"] for record in Bundle.objects.get().manifest}
    assert "notes.md" in paths and not paths & {"evil.html", "tp1/evil.svg"}
    stored = b"".join(p.read_bytes() for p in stored_files(registry_dirs))
    assert EVIL_HTML not in stored and EVIL_SVG not in stored


def test_it_serves_bundle_files_as_sandboxed_downloads(api: APIClient, published: Bundle) -> None:
    """Issue 17 item 1: attachment, nosniff and a sandbox policy on every stored file."""
    response = api.get(f"/api/v1/bundles/{published.pk}/files/meta.yaml")
    assert response.status_code == 200
    assert response["Content-Disposition"] == 'attachment; filename="meta.yaml"'
    assert response["X-Content-Type-Options"] == "nosniff"
    assert "sandbox" in response["Content-Security-Policy"]
    assert "default-src 'none'" in response["Content-Security-Policy"]


def test_it_never_serves_an_already_stored_html_file_as_html(
    api: APIClient,
    published: Bundle,
    tmp_path: Path,
) -> None:
    """Issue 17 item 1: a .html/.svg stored before the rule existed comes back as bytes to save,
    never as text/html or image/svg+xml."""
    for name, data in (("evil.html", EVIL_HTML), ("evil.svg", EVIL_SVG)):
        source = tmp_path / name
        source.write_bytes(data)
        import hashlib

        digest = hashlib.sha256(data).hexdigest()
        put_blob(bundle_storage(), source, digest, len(data))
        published.manifest = [*published.manifest, FileRecord(name, len(data), digest).as_dict()]
    published.save(update_fields=["manifest"])
    for name in ("evil.html", "evil.svg"):
        response = api.get(f"/api/v1/bundles/{published.pk}/files/{name}")
        assert response.status_code == 200
        assert response["Content-Type"] == "application/octet-stream"
        assert response["Content-Disposition"].startswith("attachment;")
        assert "sandbox" in response["Content-Security-Policy"]


SCRIPT_TAG = re.compile(rb"<script\b([^>]*)>", re.IGNORECASE)


def _inline_scripts(html: bytes) -> list[bytes]:
    """Script elements that would execute without a src (JSON data blocks do not execute)."""
    found = []
    for attrs in SCRIPT_TAG.findall(html):
        if b"src=" in attrs or b"application/json" in attrs:
            continue
        found.append(attrs)
    return found


@pytest.mark.parametrize(
    "path",
    [
        "/",
        "/jobs/",
        "/compare/",
        "/api/v1/",
        "/api/v1/bundles/",
        "/api/docs/",
        "/api/docs/?script=",
        "/api/redoc/",
        "/api/schema/",
        "/accounts/login/",
        "/admin/login/",
        "/no/such/page",
    ],
)
def test_it_sends_a_strict_policy_on_every_response(client: Client, path: str) -> None:
    """Issue 17 item 1: a strict CSP on every response, and no page relies on inline script."""
    response = client.get(path)
    policy = response["Content-Security-Policy"]
    assert (
        "script-src 'self'" in policy
        and "'unsafe-inline'" not in policy.split("script-src")[1].split(";")[0]
    )
    assert "object-src 'none'" in policy and "frame-ancestors 'none'" in policy
    if response.get("Content-Type", "").startswith("text/html") and response.status_code == 200:
        assert _inline_scripts(response.content) == [], path


def test_it_sends_the_policy_on_the_lookup_fast_path(client: Client) -> None:
    """Issue 17 item 1: even the cookieless lookup (answered before the rest) carries it."""
    response = client.post("/api/v1/lookup", b'{"bundle": 999999}', content_type="application/json")
    assert response.status_code in (400, 404)
    assert "script-src 'self'" in response["Content-Security-Policy"]


def test_it_keeps_pages_with_figures_free_of_inline_script(
    client: Client,
    published: Bundle,
) -> None:
    """Issue 17 item 1: the bundle and table pages (plotly figures) run only static scripts."""
    for url in (f"/bundles/{published.pk}/", f"/tables/{published.tables.first().pk}/"):
        response = client.get(url)
        assert response.status_code == 200
        assert _inline_scripts(response.content) == [], url


def test_only_the_redoc_page_may_load_redocs_logo(client: Client) -> None:
    """ReDoc's bundle draws its attribution from one fixed URL: that page's policy names that
    file exactly (no host-wide source, no 'unsafe-*'), and no other page's policy names it."""
    from config.security import REDOC_LOGO

    policy = client.get("/api/redoc/")["Content-Security-Policy"]
    images = next(p for p in policy.split(";") if p.strip().startswith("img-src")).split()
    assert images == ["img-src", "'self'", "data:", "blob:", REDOC_LOGO]
    assert REDOC_LOGO.endswith(".svg") and "unsafe" not in policy.split("style-src")[0]
    assert "script-src 'self';" in policy
    for path in ("/", "/api/docs/", "/api/v1/bundles/"):
        assert "cdn.redoc.ly" not in client.get(path)["Content-Security-Policy"], path
