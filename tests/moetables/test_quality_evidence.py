"""Quality evidence beside each table (bundle format 2): written, checksummed, validated.

Synthetic controls here are built from the fixture's formula times (the 2B median is the table's
time, the B median a stated 1 % away); they test the format, never a measurement.
"""

from __future__ import annotations

import dataclasses
import hashlib
from pathlib import Path

import pytest
import yaml

from moetables.bundle import (
    ConservationRow,
    StabilityRow,
    TableSpec,
    load_quality,
    load_table,
    open_bundle,
    validate_bundle,
    write_bundle,
)
from moetables.errors import BundleError
from moetables.geometry import MoeTarget
from tests.moetables.conftest import HEADER, make_spec

REPO = Path(__file__).resolve().parents[2]
H200 = [
    REPO / "bundles" / name / "Qwen" / "Qwen3-30B-A3B-Instruct-2507" / "bf16"
    for name in ("H200", "H200-vllm-live", "H200-torch-reference")
]


def with_evidence(spec: TableSpec, *, tolerance: float = 0.03, retry: bool = True) -> TableSpec:
    stability = []
    first = True
    for component, _, n, a, m, t in spec.rows:
        if component != "experts":
            continue
        b = t / 1.01
        published = StabilityRow(
            "experts",
            n,
            a,
            m,
            1 if (retry and first) else 0,
            2,
            b,
            b,
            4,
            t,
            t,
            abs(t - b) / b,
            tolerance,
            abs(t - b) / b <= tolerance,
            True,
        )
        if retry and first:
            # A failed first attempt: 10 % apart, then the passing retry.
            stability.append(
                dataclasses.replace(
                    published,
                    attempt=0,
                    b2_median_us=t * 1.1,
                    b2_pooled_us=b * 1.1,
                    relative_change=abs(b * 1.1 - b) / b,
                    passed=False,
                    published=False,
                )
            )
            first = False
        stability.append(published)
    conservation = [
        ConservationRow(0, 8, 40.0, 0.5, {"gate_routing": 9.5, "experts": 30.0, "wrapper": 0.0})
    ]
    contract = {**spec.contract, "schema": "moe-components-contract-v1"}
    return dataclasses.replace(
        spec, contract=contract, stability=stability, conservation=conservation
    )


@pytest.fixture
def evidence_bundle(tmp_path: Path) -> Path:
    dest = tmp_path / "bundle"
    specs = [with_evidence(make_spec(MoeTarget.for_rank(1, 2, r))) for r in (0, 1)]
    write_bundle(dest, HEADER, specs)
    return dest


def test_it_writes_and_reads_back_every_control_and_traced_forward(evidence_bundle: Path) -> None:
    """R18, R34: controls live in files beside the table, not in the metadata."""
    report = validate_bundle(evidence_bundle)
    assert report.ok, report.problems
    meta = yaml.safe_load((evidence_bundle / "meta.yaml").read_text())
    owner = meta["per_tp"][1]["moe_components"]
    assert owner["format_version"] == 2
    refs = owner["entries"][0]["quality"]
    data = (evidence_bundle / "tp1" / refs["stability"]["file"]).read_bytes()
    assert refs["stability"]["sha256"] == hashlib.sha256(data).hexdigest()
    evidence = next(iter(report.quality.values()))
    assert evidence.stability is not None and evidence.conservation is not None
    retried = [r for r in evidence.stability if not r.passed]
    assert len(retried) == 1 and retried[0].attempt == 0 and not retried[0].published
    assert evidence.conservation[0].attributed_us == 39.5


def test_it_refuses_evidence_that_changed_after_publication(evidence_bundle: Path) -> None:
    path = next(evidence_bundle.rglob("stability.csv"))
    path.write_bytes(path.read_bytes().replace(b",1,1\n", b",1,0\n", 1))
    report = validate_bundle(evidence_bundle)
    assert not report.ok and "sha256" in report.problems[0]


def test_it_refuses_a_published_control_that_is_not_the_table_time(tmp_path: Path) -> None:
    spec = with_evidence(make_spec(MoeTarget.for_rank(1, 1, 0)), retry=False)
    assert spec.stability is not None
    wrong = [
        dataclasses.replace(
            spec.stability[0],
            b2_median_us=123.0,
            b2_pooled_us=123.0,
            relative_change=abs(123.0 - spec.stability[0].b_pooled_us)
            / spec.stability[0].b_pooled_us,
            tolerance=1e9,
        )
    ]
    with pytest.raises(BundleError, match="differs from the table"):
        write_bundle(
            tmp_path / "b",
            HEADER,
            [dataclasses.replace(spec, stability=wrong + list(spec.stability[1:]))],
        )


def test_it_refuses_a_traced_forward_that_does_not_conserve(tmp_path: Path) -> None:
    """R15, R26: components + outside the scopes = the forward's whole CUDA activity."""
    spec = with_evidence(make_spec(MoeTarget.for_rank(1, 1, 0)))
    leak = [ConservationRow(0, 8, 50.0, 0.0, {"gate_routing": 9.5, "experts": 30.0})]
    with pytest.raises(BundleError, match="whole CUDA activity"):
        write_bundle(tmp_path / "b", HEADER, [dataclasses.replace(spec, conservation=leak)])


def test_it_says_why_when_no_forward_was_traced(tmp_path: Path) -> None:
    spec = dataclasses.replace(
        with_evidence(make_spec(MoeTarget.for_rank(1, 1, 0))),
        conservation=[],
        conservation_absent="the modular path traces no native forward",
    )
    bundle = open_bundle(write_bundle(tmp_path / "b", HEADER, [spec]))
    entry = bundle.entries[0]
    evidence = load_quality(bundle.root, entry, load_table(bundle.root, entry))
    assert evidence.conservation is None
    assert evidence.conservation_absent == "the modular path traces no native forward"


def test_it_keeps_reading_format_1_and_says_the_evidence_is_absent(current_bundle: Path) -> None:
    report = validate_bundle(current_bundle)
    assert report.ok
    evidence = next(iter(report.quality.values()))
    assert evidence.stability is None and "format version 1" in (evidence.stability_absent or "")


def test_it_refuses_an_unknown_format_version(evidence_bundle: Path) -> None:
    meta_path = evidence_bundle / "meta.yaml"
    meta = yaml.safe_load(meta_path.read_text())
    meta["per_tp"][1]["moe_components"]["format_version"] = 6
    meta_path.write_text(yaml.safe_dump(meta))
    with pytest.raises(BundleError, match="unknown format version 6"):
        open_bundle(evidence_bundle)


def test_it_refuses_an_unknown_method_schema(current_bundle: Path) -> None:
    """R30: a contract of another method is refused, never read as this one."""
    meta_path = current_bundle / "meta.yaml"
    meta = yaml.safe_load(meta_path.read_text())
    meta["per_tp"][1]["moe_components"]["entries"][0]["contract"]["schema"] = (
        "moe-components-contract-v9"
    )
    meta_path.write_text(yaml.safe_dump(meta))
    with pytest.raises(BundleError, match="unknown method/schema"):
        open_bundle(current_bundle)


def test_it_requires_a_looser_tolerance_to_be_called_exploratory(tmp_path: Path) -> None:
    spec = with_evidence(make_spec(MoeTarget.for_rank(1, 1, 0)), tolerance=0.05)
    contract = {
        **spec.contract,
        "schema": "moe-components-contract-v1",
        "expert_conditioning": {"quality_relative_tolerance": 0.05},
    }
    with pytest.raises(BundleError, match="must say exploratory"):
        write_bundle(tmp_path / "a", HEADER, [dataclasses.replace(spec, contract=contract)])
    labelled = dataclasses.replace(spec, contract={**contract, "quality": "exploratory"})
    bundle = open_bundle(write_bundle(tmp_path / "b", HEADER, [labelled]))
    assert bundle.entries[0].exploratory


# Every shipped H200 bundle (one directory holding meta.yaml per model and variant).
ALL_H200 = sorted(p.parent for p in (REPO / "bundles").glob("H200*/*/*/*/meta.yaml"))


@pytest.mark.parametrize("root", ALL_H200, ids=lambda p: "/".join(p.parts[-4:]))
def test_every_shipped_h200_bundle_carries_its_evidence(root: Path) -> None:
    """The shipped H200 bundles were re-published with evidence from their kept samples."""
    report = validate_bundle(root)
    assert report.ok, report.problems
    assert report.bundle is not None
    for entry in report.bundle.entries:
        evidence = report.quality[entry.table_path]
        # Format 3 (issue 18) adds the fitted tile cost to the H200 modular tables, format 4
        # one cost per block size (their TP1/DP1 tables).
        assert entry.format_version in (2, 3, 4, 5) and not entry.exploratory
        assert evidence.stability and all(r.tolerance == 0.03 for r in evidence.stability)
        # Every table has traced forwards (issue 14): the live tables their own; the modular
        # and torch-reference tables acquired before the traces existed got theirs from
        # `python -m acquisition conserve` on the H200, marked as traced separately.
        assert evidence.conservation and len(evidence.conservation) >= 3
        assert not evidence.conservation_absent
        supplement = evidence.conservation_supplement
        if root in H200 and entry.contract["backend"]["name"] != "vllm-live":
            assert supplement is not None
        if supplement is not None:
            assert supplement["device_name"] == "NVIDIA H200"


def test_validate_reports_each_tables_evidence(capsys: pytest.CaptureFixture[str]) -> None:
    from moetables.cli import main

    assert main(["validate", str(H200[1])]) == 0
    out = capsys.readouterr().out
    assert "31 B/2B controls (from files), 3 traced forwards conserved" in out


# -- supplementary conservation (python -m acquisition conserve) ---------------------------------


def _supplement(**extra: object) -> dict[str, object]:
    return {
        "measured": "separately from the table",
        "measured_at": "2026-12-01T06:00:00+00:00",
        "command_line": "python -m acquisition conserve TEST",
        "written_by": "python -m acquisition conserve",
        "device_name": "TEST GPU",
        **extra,
    }


def _test_rows() -> list[ConservationRow]:
    """Test values (not a measurement): components plus outside equal the whole."""
    return [ConservationRow(0, 1, 31.0, 1.0, {"gate_routing": 10.0, "experts": 20.0})]


def test_attached_conservation_keeps_every_other_byte_of_a_format_3_bundle(
    tmp_path: Path,
) -> None:
    """The shipped modular bundle (format 3: load spread and tile models) gets its rows marked
    supplementary; tables, stability and load evidence keep their bytes, its format (5) stays."""
    import shutil

    from moetables.bundle import attach_conservation

    copy = tmp_path / "bf16"
    shutil.copytree(H200[0], copy)
    before = {
        str(p.relative_to(copy)): p.read_bytes()
        for p in copy.rglob("*")
        if p.is_file() and p.name not in ("meta.yaml", "conservation.csv")
    }
    targets = [e.target for e in open_bundle(copy).entries]
    attach_conservation(copy, {t: (_test_rows(), _supplement()) for t in targets}, replace=True)
    bundle = open_bundle(copy)
    for entry in bundle.entries:
        assert entry.format_version == 5 and entry.expert_loads.models
        assert entry.quality is not None and entry.quality.conservation_supplementary
        evidence = load_quality(copy, entry, load_table(copy, entry))
        assert evidence.conservation is not None and evidence.conservation_supplement is not None
        assert evidence.conservation_supplement["device_name"] == "TEST GPU"
    for name, data in before.items():
        assert (copy / name).read_bytes() == data, name


def test_the_supplementary_mark_must_be_a_boolean(tmp_path: Path) -> None:
    import shutil

    from moetables.bundle import attach_conservation

    copy = tmp_path / "bf16"
    shutil.copytree(H200[2], copy)
    targets = [e.target for e in open_bundle(copy).entries]
    attach_conservation(copy, {t: (_test_rows(), _supplement()) for t in targets}, replace=True)
    meta = yaml.safe_load((copy / "meta.yaml").read_text())
    meta["per_tp"][1]["moe_components"]["entries"][0]["quality"]["conservation"][
        "supplementary"
    ] = "yes"
    (copy / "meta.yaml").write_text(yaml.safe_dump(meta, sort_keys=False))
    with pytest.raises(BundleError, match="supplementary"):
        open_bundle(copy)


def test_attaching_refuses_a_supplement_without_its_provenance(tmp_path: Path) -> None:
    import shutil

    from moetables.bundle import attach_conservation

    copy = tmp_path / "bf16"
    shutil.copytree(H200[2], copy)
    target = open_bundle(copy).entries[0].target
    incomplete = _supplement()
    del incomplete["command_line"]
    kept = {p: p.read_bytes() for p in copy.rglob("conservation.csv")}
    with pytest.raises(ValueError, match="command_line"):
        attach_conservation(copy, {target: (_test_rows(), incomplete)}, replace=True)
    assert {p: p.read_bytes() for p in copy.rglob("conservation.csv")} == kept
