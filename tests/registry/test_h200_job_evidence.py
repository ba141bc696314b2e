"""The committed H200 end-to-end job run (issue 6, item 5) is consistent with itself.

`docs/evidence/h200-jobs-e2e/` holds what `scripts/h200_jobs_e2e.sh` recorded on the H200: the
job's JSON, the published bundle as the API streamed it, and one lookup answered by the API.
These checks recompute everything the registry claimed from the bytes it served.
"""

from __future__ import annotations

import json
import tarfile
from pathlib import Path

import pytest

from moetables.bundle import validate_bundle
from moetables.lookup import ComponentTables
from registry.manifest import FileRecord, Manifest, hash_file, is_left_out, scan_tree

EVIDENCE = Path(__file__).resolve().parents[2] / "docs" / "evidence" / "h200-jobs-e2e"


@pytest.fixture(scope="module")
def job() -> dict:
    return json.loads((EVIDENCE / "job.json").read_text())


@pytest.fixture(scope="module")
def bundle_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    dest = tmp_path_factory.mktemp("h200-e2e")
    with tarfile.open(EVIDENCE / "published_bundle.tar.gz") as archive:
        archive.extractall(dest, filter="data")
    (meta,) = dest.rglob("meta.yaml")
    return meta.parent


def test_job_ran_on_the_h200_gpu_queue_and_succeeded(job: dict) -> None:
    assert job["state"] == "succeeded" and job["phase"] == "done"
    assert job["queue"] == "gpu.H200"
    assert job["parameters"]["backend"] == "vllm-modular"
    assert job["points_done"] == job["points_total"] > 0
    assert "published 1 targets" in job["log_tail"]


def test_served_archive_is_the_published_bundle(job: dict, bundle_root: Path) -> None:
    """R40-style integrity: the content hash over the served files is the job's bundle hash."""
    records = []
    for rel in scan_tree(bundle_root):
        if not is_left_out(rel):
            size, digest = hash_file(bundle_root / rel)
            records.append(FileRecord(path=rel, size=size, sha256=digest))
    assert Manifest.of(records).sha256 == job["result_bundle"]["sha256"]
    report = validate_bundle(bundle_root)
    assert report.ok, report.problems


def test_contract_names_the_hardware_software_and_command(bundle_root: Path) -> None:
    bundle = json.loads((EVIDENCE / "bundle.json").read_text())
    contract = bundle["tables"][0]["contract"]
    assert contract["backend"]["vllm_version"] == "0.26.0"
    assert contract["provenance"]["device_name"] == "NVIDIA H200"
    assert contract["provenance"]["command_line"].startswith("python -m acquisition slice")


def test_api_lookup_equals_moetables_on_the_served_bundle(bundle_root: Path) -> None:
    recorded = json.loads((EVIDENCE / "lookup.json").read_text())
    target = recorded["request"]["target"]
    tables = ComponentTables(bundle_root).deployment(target["tp"], target["dp"], target["rank"])
    assert tables.answer(recorded["request"]["queries"]) == recorded["answer"]["answers"]
