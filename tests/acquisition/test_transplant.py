"""`python -m acquisition.transplant`: a re-measured target replaces a shipped entry through the
bundle writer (issue 20 items 2 and 4). Fails if the other entries change, if checksums are not
the writer's, if quality evidence is dropped, or if a mismatched bundle is accepted."""

from __future__ import annotations

from pathlib import Path

import pytest

from acquisition.transplant import main, transplant
from moetables.bundle import load_quality, load_table, open_bundle, validate_bundle, write_bundle
from moetables.errors import BundleError
from moetables.geometry import MoeTarget
from tests.moetables.conftest import HEADER, make_spec
from tests.moetables.test_quality_evidence import with_evidence

DP1 = MoeTarget.for_rank(1, 1, 0)
DP2 = [MoeTarget.for_rank(1, 2, r) for r in (0, 1)]


def _bundle(dest: Path, scale: float, targets: list[MoeTarget]) -> Path:
    specs = [
        with_evidence(make_spec(t, time_fn=lambda n, a, m: scale * (5.0 + n + a + 0.1 * m)))
        for t in targets
    ]
    write_bundle(dest, HEADER, specs)
    return dest


def test_it_replaces_one_entry_and_keeps_the_others_byte_for_byte(tmp_path: Path) -> None:
    shipped = _bundle(tmp_path / "shipped", 1.0, [DP1, *DP2])
    new = _bundle(tmp_path / "new", 0.9, [DP1])
    kept = {p: p.read_bytes() for p in shipped.rglob("*.csv") if "dp2" in str(p)}
    before = {e.target: e.table_sha256 for e in open_bundle(shipped).entries}
    lines = transplant(new, shipped, ["tp1/dp1_ep1_rank0_sp0"], "re-measured")
    assert lines == [
        f"tp1/dp1_ep1_rank0_sp0: {before[DP1]} -> {open_bundle(new).entries[0].table_sha256}"
    ]
    assert validate_bundle(shipped).ok
    bundle = open_bundle(shipped)
    after = {e.target: e.table_sha256 for e in bundle.entries}
    assert after[DP1] == open_bundle(new).entries[0].table_sha256 != before[DP1]
    assert [after[t] for t in DP2] == [before[t] for t in DP2]
    assert {p: p.read_bytes() for p in kept} == kept
    entry = next(e for e in bundle.entries if e.target == DP1)
    quality = load_quality(bundle.root, entry, load_table(bundle.root, entry))
    assert quality.stability and quality.conservation  # evidence moved with the table
    [record] = bundle.meta["transplanted"]
    assert record["replaced_table_sha256"] == before[DP1] and record["note"] == "re-measured"


def test_it_adds_a_target_the_destination_lacks(tmp_path: Path) -> None:
    shipped = _bundle(tmp_path / "shipped", 1.0, [DP1, DP2[0]])
    new = _bundle(tmp_path / "new", 1.0, [DP1, *DP2])
    assert (
        main([str(new), str(shipped), "--deployment", "tp1/dp2_ep2_rank1_sp0", "--note", "x"]) == 0
    )
    assert {e.target for e in open_bundle(shipped).entries} == {DP1, *DP2}
    assert open_bundle(shipped).meta["transplanted"][0]["replaced_table_sha256"] is None


def test_it_refuses_another_model_or_a_missing_target(tmp_path: Path) -> None:
    shipped = _bundle(tmp_path / "shipped", 1.0, [DP1])
    other = tmp_path / "other"
    write_bundle(other, {**HEADER, "model": "test/other"}, [make_spec(DP1)])
    with pytest.raises(BundleError, match="model"):
        transplant(other, shipped, None, "x")
    new = _bundle(tmp_path / "new", 1.0, [DP1])
    with pytest.raises(BundleError, match="no target"):
        transplant(new, shipped, ["tp1/dp2_ep2_rank1_sp0"], "x")
    assert main([str(new), str(shipped), "--deployment", "tp2/nope", "--note", "x"]) == 1
    assert "transplanted" not in open_bundle(shipped).meta


def test_it_refuses_to_mix_an_entry_without_evidence_into_a_format_2_bundle(
    tmp_path: Path,
) -> None:
    """The writer's rule stands: no evidence is invented, and the destination is unchanged."""
    shipped = _bundle(tmp_path / "shipped", 1.0, [DP1])
    meta = (shipped / "meta.yaml").read_bytes()
    plain = tmp_path / "plain"
    write_bundle(plain, HEADER, [make_spec(DP2[0])])
    with pytest.raises(BundleError, match="mixes entries"):
        transplant(plain, shipped, None, "x")
    assert (shipped / "meta.yaml").read_bytes() == meta


def test_it_prints_new_for_a_target_the_destination_lacked(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """QA, session 5: a new target printed ``None -> <sha>``."""
    shipped = _bundle(tmp_path / "shipped", 1.0, [DP1, DP2[0]])
    new = _bundle(tmp_path / "new", 1.0, [DP1, *DP2])
    assert (
        main([str(new), str(shipped), "--deployment", "tp1/dp2_ep2_rank1_sp0", "--note", "x"]) == 0
    )
    sha = next(e.table_sha256 for e in open_bundle(shipped).entries if e.target == DP2[1])
    assert capsys.readouterr().out.strip() == f"tp1/dp2_ep2_rank1_sp0: new -> {sha}"
