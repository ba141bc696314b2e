"""Reading, validating and writing bundles (R35, R36, R38, R43)."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest
import yaml

from moetables.bundle import load_table, open_bundle, validate_bundle, write_bundle
from moetables.errors import BundleError
from moetables.geometry import MoeTarget
from tests.moetables.conftest import HEADER, make_spec

HIST_TABLE = "tp1/moe_components/1bab816900f45218fbe1a37b885878164202f9e55f26772cc7390736e0b9b535"


def problems(path: Path) -> str:
    report = validate_bundle(path)
    assert not report.ok, "the corruption went unnoticed"
    return "\n".join(report.problems)


def test_it_validates_the_published_llmservingsim_bundle(shared_copy: Path) -> None:  # R38
    report = validate_bundle(shared_copy)
    assert report.ok, report.problems
    bundle = report.bundle
    assert bundle is not None and bundle.layout == "historical"
    assert sorted(e.target.rank for e in bundle.entries) == [0, 1]
    assert sum(len(t) for t in report.tables.values()) == 1028
    # other categories named by meta.yaml are reported, not invented
    assert bundle.missing_files == ("tp1/skew_fit.csv", "tp2/skew_fit.csv")


def test_it_refuses_a_flipped_byte_in_a_table(shared_copy: Path) -> None:  # R43
    path = shared_copy / HIST_TABLE / "components.csv"
    data = bytearray(path.read_bytes())
    data[200] ^= 0x01
    path.write_bytes(bytes(data))
    assert "components.csv: table checksum mismatch" in problems(shared_copy)


def test_it_refuses_an_edited_contract(shared_copy: Path) -> None:  # R43
    path = shared_copy / HIST_TABLE / "contract.json"
    contract = json.loads(path.read_bytes())
    contract["global_top_k"] = 4
    path.write_text(json.dumps(contract))
    assert "contract_id" in problems(shared_copy)


def test_it_refuses_a_missing_table(shared_copy: Path) -> None:
    (shared_copy / HIST_TABLE / "components.csv").unlink()
    assert "the table file is missing" in problems(shared_copy)


def test_it_refuses_a_missing_coverage_file(shared_copy: Path) -> None:
    (shared_copy / HIST_TABLE / "coverage.json").unlink()
    assert "coverage.json: is missing" in problems(shared_copy)


def test_it_refuses_a_wrong_index_schema(shared_copy: Path) -> None:
    meta = yaml.safe_load((shared_copy / "meta.yaml").read_text())
    meta["moe_components"]["schema"] = "moe-components-v0"
    (shared_copy / "meta.yaml").write_text(yaml.safe_dump(meta))
    assert "moe_components.schema: must be 'moe-components-v1'" in problems(shared_copy)


def test_it_refuses_an_index_whose_checksum_differs(shared_copy: Path) -> None:
    index = shared_copy / "tp1/moe_components.json"
    index.write_bytes(index.read_bytes().replace(b'"rank": 1', b'"rank": 1 '))
    assert "index checksum mismatch" in problems(shared_copy)


def _rewrite_index(bundle: Path, edit) -> None:  # type: ignore[no-untyped-def]
    index_path = bundle / "tp1/moe_components.json"
    index = json.loads(index_path.read_bytes())
    edit(index)
    data = json.dumps(index).encode()
    index_path.write_bytes(data)
    meta = yaml.safe_load((bundle / "meta.yaml").read_text())
    meta["moe_components"]["per_tp"][1]["sha256"] = hashlib.sha256(data).hexdigest()
    (bundle / "meta.yaml").write_text(yaml.safe_dump(meta))


def test_it_refuses_duplicate_entries(shared_copy: Path) -> None:
    _rewrite_index(shared_copy, lambda index: index["entries"].append(index["entries"][0]))
    assert "duplicate entry" in problems(shared_copy)


@pytest.mark.parametrize("escape", ["../../../../etc", "/etc", "moe_components/../../.."])
def test_it_refuses_a_path_leaving_the_bundle(shared_copy: Path, escape: str) -> None:
    def edit(index: dict) -> None:
        index["entries"][0]["path"] = escape

    _rewrite_index(shared_copy, edit)
    text = problems(shared_copy)
    assert "leaves the bundle" in text or "absolute" in text or "outside" in text


def test_it_refuses_a_link_pointing_outside(shared_copy: Path, tmp_path: Path) -> None:
    outside = tmp_path / "elsewhere"
    outside.mkdir()
    target = shared_copy / HIST_TABLE
    for name in ("contract.json", "coverage.json", "components.csv"):
        (outside / name).write_bytes((target / name).read_bytes())
    link = shared_copy / "tp1/moe_components/escape"
    link.symlink_to(outside)

    def edit(index: dict) -> None:
        index["entries"][0]["path"] = "moe_components/escape"

    _rewrite_index(shared_copy, edit)
    assert "resolves outside the bundle" in problems(shared_copy)


def test_it_writes_the_current_layout_deterministically(tmp_path: Path) -> None:  # R35
    specs = [make_spec(MoeTarget.for_rank(1, 2, r)) for r in (0, 1)]
    a = write_bundle(tmp_path / "a", HEADER, specs)
    b = write_bundle(tmp_path / "b", HEADER, list(reversed(specs)))
    files_a = sorted(p.relative_to(a).as_posix() for p in a.rglob("*") if p.is_file())
    assert files_a == [
        "meta.yaml",
        "tp1/moe_components/dp2_ep2_rank0_sp0/components.csv",
        "tp1/moe_components/dp2_ep2_rank1_sp0/components.csv",
    ]
    for name in files_a:
        assert (a / name).read_bytes() == (b / name).read_bytes()
    report = validate_bundle(a)
    assert report.ok, report.problems
    meta = yaml.safe_load((a / "meta.yaml").read_text())
    entry = meta["per_tp"][1]["moe_components"]["entries"][0]
    table = (a / "tp1" / entry["table"]).read_bytes()
    assert entry["coverage"]["table_sha256"] == hashlib.sha256(table).hexdigest()
    assert table.startswith(b"component,mode,tokens,activated_experts,local_assignments,time_us\n")


def test_it_merges_targets_and_keeps_files_beside_them(tmp_path: Path) -> None:  # R36
    dest = tmp_path / "bundle"
    write_bundle(dest, HEADER, [make_spec(MoeTarget.for_rank(1, 2, 0))])
    samples = dest / "tp1/moe_components/dp2_ep2_rank0_sp0/samples.jsonl"
    samples.write_text('{"forward": 1}\n')
    write_bundle(dest, HEADER, [make_spec(MoeTarget.for_rank(1, 2, 1))])
    bundle = open_bundle(dest)
    assert [e.target.rank for e in bundle.entries] == [0, 1]
    assert samples.read_text() == '{"forward": 1}\n'


def test_it_leaves_the_old_bundle_whole_when_a_write_fails(tmp_path: Path) -> None:
    dest = tmp_path / "bundle"
    write_bundle(dest, HEADER, [make_spec(MoeTarget.for_rank(1, 2, 0))])
    before = {p: p.read_bytes() for p in dest.rglob("*") if p.is_file()}
    bad = make_spec(MoeTarget.for_rank(1, 2, 1))
    bad.contract["local_experts"] = 3  # rank 1 owns 8 of 16 experts
    with pytest.raises(BundleError, match="local_experts"):
        write_bundle(dest, HEADER, [bad])
    assert {p: p.read_bytes() for p in dest.rglob("*") if p.is_file()} == before
    assert [p.name for p in tmp_path.iterdir()] == ["bundle"] or all(
        p.name.endswith(".meta.lock") or p.name == "bundle" for p in tmp_path.iterdir()
    )


def _edit_entry(bundle: Path, edit) -> None:  # type: ignore[no-untyped-def]
    meta = yaml.safe_load((bundle / "meta.yaml").read_text())
    edit(meta["per_tp"][1]["moe_components"]["entries"][0])
    (bundle / "meta.yaml").write_text(yaml.safe_dump(meta))


@pytest.mark.parametrize(
    ("edit", "fragment"),
    [
        (lambda e: e["coverage"].update(complete=False), "incomplete acquisition"),
        (
            lambda e: e["coverage"]["conditioning_summary"].update(failed_points=2),
            "failed the stability",
        ),
        (
            lambda e: e["coverage"]["conditioning_summary"].update(max_relative_change=0.2),
            "tolerance",
        ),
        (lambda e: e["contract"].update(modes=["eager", "graph"]), "eager only"),
        (lambda e: e["contract"]["target"].update(tp=2, ep=2), "differs from the entry"),
        (lambda e: e["contract"].update(components=["gate_routing"]), "must include experts"),
        (lambda e: e.update(table="../../meta.yaml"), "leaves the bundle"),
        (lambda e: e.pop("contract"), "contract must be a mapping"),
    ],
)
def test_it_refuses_inconsistent_current_entries(current_bundle: Path, edit, fragment: str) -> None:  # type: ignore[no-untyped-def]
    _edit_entry(current_bundle, edit)
    assert fragment in problems(current_bundle)


@pytest.mark.parametrize(
    ("line", "fragment"),
    [
        ("experts,eager,4,2,3,10.0", "infeasible"),
        ("gate_routing,eager,4,2,3,10.0", "must have activated_experts"),
        ("gate_routing,eager,3,-1,-1,nan", "finite and positive"),
        ("gate_routing,eager,3,-1,-1,-2", "finite and positive"),
        ("gate_routing,eager,x,-1,-1,2", "tokens must be an integer"),
        ("gate_routing,eager,3,-1,-1", "needs 6 fields"),
        ("wrapper,eager,3,-1,-1,1.0", "not declared"),
        ("gate_routing,graph,3,-1,-1,1.0", "not declared"),
        ("gate_routing,eager,1,-1,-1,9.0", "duplicates the row"),
    ],
)
def test_it_refuses_bad_rows_naming_file_and_line(
    current_bundle: Path, line: str, fragment: str
) -> None:
    meta = yaml.safe_load((current_bundle / "meta.yaml").read_text())
    entry = meta["per_tp"][1]["moe_components"]["entries"][0]
    path = current_bundle / "tp1" / entry["table"]
    data = path.read_bytes() + line.encode() + b"\n"
    path.write_bytes(data)
    entry["coverage"]["table_sha256"] = hashlib.sha256(data).hexdigest()
    (current_bundle / "meta.yaml").write_text(yaml.safe_dump(meta))
    text = problems(current_bundle)
    assert fragment in text
    assert "components.csv:" in text


def test_it_requires_every_declared_component(current_bundle: Path) -> None:
    meta = yaml.safe_load((current_bundle / "meta.yaml").read_text())
    entry = next(
        e for e in meta["per_tp"][1]["moe_components"]["entries"] if e["target"]["dp"] == 2
    )
    path = current_bundle / "tp1" / entry["table"]
    data = b"".join(
        line
        for line in path.read_bytes().splitlines(keepends=True)
        if not line.startswith(b"finalize_copy")
    )
    path.write_bytes(data)
    entry["coverage"]["table_sha256"] = hashlib.sha256(data).hexdigest()
    (current_bundle / "meta.yaml").write_text(yaml.safe_dump(meta))
    assert "declared component 'finalize_copy' has no 'eager' rows" in problems(current_bundle)


def test_it_reads_tables_column_wise(current_bundle: Path) -> None:
    bundle = open_bundle(current_bundle)
    assert bundle.missing_files == ()  # its own tables are not "named but absent"
    table = load_table(bundle.root, bundle.entries[0])
    assert len(table) == len(table.time_us) > 0
    assert set(table.component.tolist()) == set(bundle.entries[0].components)
