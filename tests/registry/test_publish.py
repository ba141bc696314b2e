"""publish_bundle: validation through moetables, content identity, atomic storage."""

from __future__ import annotations

import io
import shutil
import zipfile
from typing import TYPE_CHECKING, Any

import pytest

from registry.bundles.models import Bundle, DeploymentTable
from registry.bundles.services import PublishError, publish_bundle
from registry.choices import BundleSource
from registry.manifest import Manifest
from registry.storage import blob_name, bundle_storage

if TYPE_CHECKING:
    from pathlib import Path

pytestmark = pytest.mark.django_db


def test_it_publishes_the_shipped_historical_bundle(shipped: Path) -> None:
    result = publish_bundle(shipped)
    bundle = result.bundle
    assert result.created
    assert (bundle.hardware, bundle.model, bundle.variant) == (
        "RTXPRO6000",
        "Qwen/Qwen3-30B-A3B-Instruct-2507",
        "bf16",
    )
    assert bundle.layout == "historical"
    assert bundle.vllm_version == "0.28.0"
    assert bundle.measured_at is not None
    assert bundle.measured_at.isoformat().startswith("2026-10-02")
    assert bundle.source == BundleSource.IMPORT
    assert bundle.file_count == 8
    assert bundle.size == sum(p.stat().st_size for p in shipped.rglob("*") if p.is_file())
    # What meta.yaml names but the bundle lacks is reported, not invented.
    assert bundle.missing_files == ["tp1/skew_fit.csv", "tp2/skew_fit.csv"]
    tables = list(bundle.tables.order_by("rank"))
    assert [(t.tp, t.dp, t.ep, t.rank, t.sequence_parallel) for t in tables] == [
        (1, 2, 2, 0, False),
        (1, 2, 2, 1, False),
    ]
    first = tables[0]
    # R-issue 13: the LLMServingSim profiler's native modular region, kernel TRITON
    assert (first.backend, first.kernel, first.native, first.vllm_version) == (
        "vllm-modular",
        "TRITON",
        True,
        "0.28.0",
    )
    assert first.components == ["gate_routing", "experts", "finalize_copy"]
    assert first.modes == ["eager", "graph"]
    assert first.row_count == 514
    assert first.contract_id == "1bab816900f45218fbe1a37b885878164202f9e55f26772cc7390736e0b9b535"
    assert first.table_sha256 == first.coverage["table_sha256"]
    assert (first.tokens_min, first.activated_experts_min, first.local_assignments_min) == (1, 0, 0)
    assert first.activated_experts_max == 64
    assert first.local_tokens_min == 1


def test_it_identifies_a_bundle_by_the_hash_of_its_manifest(shipped: Path) -> None:
    bundle = publish_bundle(shipped).bundle
    manifest = Manifest.from_dicts(bundle.manifest)
    assert bundle.sha256 == manifest.sha256
    lines = manifest.canonical_bytes().decode().splitlines()
    assert lines[0].endswith(" meta.yaml")
    assert lines == sorted(lines, key=lambda line: line.split(" ", 2)[2].encode())


def test_it_stores_every_file_byte_exact_under_its_sha256(shipped: Path) -> None:
    bundle = publish_bundle(shipped).bundle
    storage = bundle_storage()
    for record in bundle.manifest:
        with storage.open(blob_name(record["sha256"]), "rb") as handle:
            assert handle.read() == (shipped / record["path"]).read_bytes()
    # The tables keep their CRLF line endings: their checksums are declared in the metadata.
    table = bundle.tables.first()
    assert table is not None
    with storage.open(blob_name(table.table_sha256), "rb") as handle:
        assert b"\r\n" in handle.read()


def test_it_is_idempotent_for_the_same_content(shipped: Path, tmp_path: Path) -> None:
    first = publish_bundle(shipped)
    copy = shutil.copytree(shipped, tmp_path / "elsewhere" / "bf16")
    again = publish_bundle(copy, source_kind=BundleSource.ACQUISITION)
    assert not again.created
    assert again.bundle.pk == first.bundle.pk
    assert Bundle.objects.count() == 1
    assert DeploymentTable.objects.count() == 2


def test_it_gives_a_folder_and_its_archives_one_identity(
    shipped: Path,
    tmp_path: Path,
    make_bundle: Any,
    tar_gz_of: Any,
) -> None:
    folder = make_bundle(dp=2)
    by_folder = publish_bundle(folder).bundle
    archive = tmp_path / "b.tar.gz"
    archive.write_bytes(tar_gz_of(folder, prefix="some-name"))
    assert publish_bundle(archive).bundle.pk == by_folder.pk
    flat = tmp_path / "b.zip"
    with zipfile.ZipFile(flat, "w") as zf:
        for path in sorted(folder.rglob("*")):
            if path.is_file():
                zf.write(path, path.relative_to(folder).as_posix())
    assert publish_bundle(flat).bundle.pk == by_folder.pk


def test_it_indexes_a_current_layout_bundle(make_bundle: Any) -> None:
    bundle = publish_bundle(make_bundle(tp=2, dp=2, experts=16, backend="DEEPGEMM")).bundle
    assert bundle.layout == "current"
    assert bundle.vllm_version == "0.26.0"
    assert bundle.missing_files == []
    tables = list(bundle.tables.all())
    assert [(t.tp, t.dp, t.ep, t.rank) for t in tables] == [(2, 2, 4, r) for r in range(4)]
    assert {(t.backend, t.kernel, t.vllm_version) for t in tables} == {
        ("vllm-modular", "DEEPGEMM", "0.26.0")
    }
    assert tables[0].table_path == "tp2/moe_components/dp2_ep4_rank0_sp0/components.csv"
    assert tables[0].tokens_max == 64 and tables[0].local_tokens_max == 32


def test_it_leaves_out_acquisition_artifacts_and_reports_them(make_bundle: Any) -> None:
    folder = make_bundle()
    deployment = folder / "tp1" / "moe_components" / "dp1_ep1_rank0_sp0"
    (deployment / "samples.jsonl").write_text('{"forward": 1}\n')
    (deployment / "failures.jsonl").write_text("{}\n")
    (deployment / "writer.lock").write_text("")
    clean = publish_bundle(make_bundle())  # the same bundle without the artifacts
    result = publish_bundle(folder)
    assert sorted(result.left_out) == [
        "tp1/moe_components/dp1_ep1_rank0_sp0/failures.jsonl",
        "tp1/moe_components/dp1_ep1_rank0_sp0/samples.jsonl",
        "tp1/moe_components/dp1_ep1_rank0_sp0/writer.lock",
    ]
    assert result.bundle.pk == clean.bundle.pk
    assert not any("samples" in r["path"] for r in result.bundle.manifest)


def test_it_refuses_a_changed_table_with_the_checksum_problem(
    shipped: Path,
    tmp_path: Path,
    registry_dirs: Path,
    stored_files: Any,
) -> None:
    copy = shutil.copytree(shipped, tmp_path / "bf16")
    table = next(copy.rglob("components.csv"))
    table.write_bytes(table.read_bytes().replace(b"5.471", b"5.472", 1))
    with pytest.raises(PublishError) as caught:
        publish_bundle(copy)
    assert any("table checksum mismatch" in p for p in caught.value.problems)
    assert Bundle.objects.count() == 0
    assert stored_files(registry_dirs) == []


def test_it_collects_every_problem_not_just_the_first(shipped: Path, tmp_path: Path) -> None:
    copy = shutil.copytree(shipped, tmp_path / "bf16")
    for table in copy.rglob("components.csv"):
        table.write_bytes(table.read_bytes() + b"experts,eager,1,1,1,1.0\r\n")
    with pytest.raises(PublishError) as caught:
        publish_bundle(copy)
    assert len([p for p in caught.value.problems if "checksum" in p]) == 2


@pytest.mark.parametrize("key", ["hardware", "model", "variant"])
def test_it_needs_hardware_model_and_variant(make_bundle: Any, key: str) -> None:
    folder = make_bundle()
    meta = folder / "meta.yaml"
    meta.write_text(
        "\n".join(line for line in meta.read_text().splitlines() if not line.startswith(f"{key}:"))
        + "\n"
    )
    with pytest.raises(PublishError) as caught:
        publish_bundle(folder)
    assert caught.value.problems == [
        f"meta.yaml:{key}: a published bundle needs it as a non-empty string"
    ]


def test_it_refuses_a_folder_without_meta_yaml(tmp_path: Path) -> None:
    (tmp_path / "x.csv").write_text("a\n")
    with pytest.raises(PublishError, match=r"no meta\.yaml"):
        publish_bundle(tmp_path)
    with pytest.raises(PublishError, match="no such file"):
        publish_bundle(tmp_path / "absent")


def test_it_refuses_links_inside_a_bundle_folder(make_bundle: Any, tmp_path: Path) -> None:
    folder = make_bundle()
    (tmp_path / "secret").write_text("outside")
    (folder / "extra.yaml").symlink_to(tmp_path / "secret")
    with pytest.raises(PublishError, match="links are not allowed"):
        publish_bundle(folder)


def test_it_keeps_files_it_does_not_understand(make_bundle: Any) -> None:
    folder = make_bundle()
    (folder / "README.md").write_text("notes kept as given\n")
    bundle = publish_bundle(folder).bundle
    assert "README.md" in [r["path"] for r in bundle.manifest]


def test_it_writes_nothing_when_indexing_fails(
    make_bundle: Any,
    registry_dirs: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The rows appear in one transaction: a failure mid-way leaves no bundle row."""
    from registry.models import DeploymentTable as Table

    def explode(*args: Any, **kwargs: Any) -> None:
        raise RuntimeError("database went away")

    monkeypatch.setattr(Table.objects, "bulk_create", explode)
    with pytest.raises(RuntimeError):
        publish_bundle(make_bundle())
    assert Bundle.objects.count() == 0


def test_it_accepts_an_archive_of_the_upload_kind(
    make_bundle: Any,
    tmp_path: Path,
    tar_gz_of: Any,
) -> None:
    archive = tmp_path / "upload.bin"  # recognized by content, not by name
    archive.write_bytes(tar_gz_of(make_bundle()))
    result = publish_bundle(archive, source_kind=BundleSource.UPLOAD, source_detail="x.tgz")
    assert result.created and result.bundle.source == "upload"
    assert result.bundle.source_detail == "x.tgz"


def test_it_cleans_its_staging_folder(
    make_bundle: Any,
    registry_dirs: Path,
    tmp_path: Path,
) -> None:
    publish_bundle(make_bundle())
    bad = tmp_path / "bad.tar.gz"
    bad.write_bytes(io.BytesIO(b"\x1f\x8b" + b"0" * 50).getvalue())
    with pytest.raises(PublishError):
        publish_bundle(bad)
    assert list((registry_dirs / "staging").iterdir()) == []
