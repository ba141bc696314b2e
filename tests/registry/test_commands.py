"""manage.py import_bundle, verify_bundles and export_bundle."""

from __future__ import annotations

import shutil
import stat
from io import StringIO
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
from django.core.management import CommandError, call_command

from registry.bundles.models import Bundle
from registry.bundles.services import checkout_bundle, publish_bundle
from registry.storage import blob_name, bundle_storage

if TYPE_CHECKING:
    from rest_framework.test import APIClient

pytestmark = pytest.mark.django_db

REPO = Path(__file__).resolve().parents[2]


def run(*args: Any) -> tuple[str, str]:
    out, err = StringIO(), StringIO()
    call_command(*args, stdout=out, stderr=err)
    return out.getvalue(), err.getvalue()


def test_it_imports_every_bundle_below_a_folder_once(make_bundle: Any) -> None:
    out, _ = run("import_bundle", str(REPO / "bundles"))
    assert "imported: bundle" in out and "RTXPRO6000 Qwen/Qwen3-30B-A3B-Instruct-2507 bf16" in out
    notes = [line for line in out.splitlines() if "not part of its MoE tables" in line]
    assert len(notes) == 1 and "tp1/skew_fit.csv" in notes[0]  # one clear line, not one per file
    shipped = {p.parent for p in (REPO / "bundles").rglob("meta.yaml")}
    assert Bundle.objects.count() == len(shipped) >= 3  # LLMServingSim's and our two H200 bundles
    assert set(Bundle.objects.values_list("hardware", flat=True)) == {"RTXPRO6000", "H200"}
    out, _ = run("import_bundle", str(REPO / "bundles"))
    assert out.count("already present") == len(shipped)
    assert Bundle.objects.count() == len(shipped)


def test_it_imports_folders_and_archives_and_reports_refusals(
    make_bundle: Any,
    tmp_path: Path,
) -> None:
    good = make_bundle()
    bad = shutil.copytree(make_bundle(hardware="OTHER"), tmp_path / "bad" / "bf16")
    table = next(bad.rglob("components.csv"))
    table.write_bytes(table.read_bytes() + b"\n")
    with pytest.raises(CommandError, match="1 of 2 bundles refused"):
        call_command("import_bundle", str(good), str(bad), stdout=StringIO(), stderr=StringIO())
    assert Bundle.objects.get().source == "import"
    err = StringIO()
    with pytest.raises(CommandError):
        call_command("import_bundle", str(bad), stdout=StringIO(), stderr=err)
    assert "table checksum mismatch" in err.getvalue()


def test_it_marks_acquisition_imports(make_bundle: Any) -> None:
    run("import_bundle", "--source", "acquisition", str(make_bundle()))
    assert Bundle.objects.get().source == "acquisition"


def test_it_says_when_there_is_nothing_to_import(tmp_path: Path) -> None:
    with pytest.raises(CommandError, match="no bundles found"):
        run("import_bundle", str(tmp_path))


def test_it_verifies_intact_bundles(published: Bundle) -> None:
    out, _ = run("verify_bundles")
    assert out.strip() == "checked 1 bundles, 8 files, 0 routing profiles: 0 drifted"


def _writable(path: str) -> None:
    Path(path).chmod(Path(path).stat().st_mode | stat.S_IWUSR)


def test_it_finds_a_file_changed_on_disk(published: Bundle) -> None:
    table = published.tables.order_by("rank").first()
    assert table is not None
    path = bundle_storage().path(blob_name(table.table_sha256))
    _writable(path)
    with open(path, "r+b") as handle:  # one digit of one timing, in place
        data = handle.read()
        handle.seek(data.index(b"5.471"))
        handle.write(b"5.472")
    err = StringIO()
    with pytest.raises(CommandError, match="1 drifted"):
        call_command("verify_bundles", stdout=StringIO(), stderr=err)
    assert f"DRIFT bundle {published.pk}" in err.getvalue()
    assert table.table_path in err.getvalue()
    assert "stored bytes hash to" in err.getvalue()


def test_it_finds_missing_and_truncated_blobs(published: Bundle) -> None:
    records = sorted(published.manifest, key=lambda r: r["path"])
    storage = bundle_storage()
    storage.delete(blob_name(records[0]["sha256"]))
    truncated = storage.path(blob_name(records[1]["sha256"]))
    _writable(truncated)
    with open(truncated, "r+b") as handle:
        handle.truncate(10)
    err = StringIO()
    with pytest.raises(CommandError, match="2 drifted"):
        call_command("verify_bundles", stdout=StringIO(), stderr=err)
    assert "is missing from storage" in err.getvalue()
    assert f"stored 10 bytes, published {records[1]['size']}" in err.getvalue()


def test_it_discards_a_drifted_checkout(published: Bundle) -> None:
    folder = checkout_bundle(published)
    (folder / "meta.yaml").write_text("changed")
    with pytest.raises(CommandError, match="1 drifted"):
        run("verify_bundles", "--bundle", str(published.pk))
    assert not folder.exists()
    assert run("verify_bundles")[0].endswith("0 drifted\n")
    assert (checkout_bundle(published) / "meta.yaml").read_bytes() == (
        REPO / "bundles/llmservingsim-rtxpro6000/Qwen/Qwen3-30B-A3B-Instruct-2507/bf16/meta.yaml"
    ).read_bytes()


def test_it_exports_the_same_bytes_as_the_download(
    published: Bundle,
    tmp_path: Path,
    api: APIClient,
) -> None:
    target = tmp_path / "out.tar.gz"
    run("export_bundle", str(published.pk), "-o", str(target))
    response = api.get(f"/api/v1/bundles/{published.pk}/download")
    assert target.read_bytes() == b"".join(response.streaming_content)
    run("export_bundle", published.sha256[:10], "--folder", "-o", str(tmp_path / "tree"))
    assert publish_bundle(tmp_path / "tree").bundle.pk == published.pk
    with pytest.raises(CommandError, match="no such bundle"):
        run("export_bundle", "999")
    with pytest.raises(CommandError, match="already exists"):
        run("export_bundle", str(published.pk), "--folder", "-o", str(tmp_path / "tree"))


def test_create_user_makes_an_ordinary_account_that_can_sign_in(
    db: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    import io

    from django.contrib.auth import get_user_model
    from django.test import Client

    monkeypatch.setattr("sys.stdin", io.StringIO("a-long-enough-secret\n"))
    out = io.StringIO()
    call_command("create_user", "carol", "--password-stdin", stdout=out)
    user = get_user_model().objects.get(username="carol")
    assert not user.is_staff and not user.is_superuser and "sign in" in out.getvalue()
    assert Client().login(username="carol", password="a-long-enough-secret")
    with pytest.raises(CommandError, match="exists already"):
        call_command("create_user", "carol", "--password-stdin")


def test_it_verifies_routing_profile_files_too(published: Bundle, tmp_path: Path) -> None:
    from moetables.profiles import write_profile
    from registry.services.profiles import import_profile_file
    from tests.moetables.test_captured_estimate import qwen_like_profile

    record = import_profile_file(
        write_profile(qwen_like_profile(), tmp_path / "q.routing.npz")
    ).record
    out, _ = run("verify_bundles")
    assert out.strip() == "checked 1 bundles, 8 files, 1 routing profiles: 0 drifted"
    path = bundle_storage().path(blob_name(record.sha256))
    _writable(path)
    with open(path, "r+b") as handle:
        handle.truncate(record.size - 1)
    err = StringIO()
    with pytest.raises(CommandError, match="1 drifted"):
        call_command("verify_bundles", "--profile", str(record.pk), stdout=StringIO(), stderr=err)
    assert f"DRIFT routing profile {record.pk}" in err.getvalue()
    assert f"published {record.size}" in err.getvalue()
