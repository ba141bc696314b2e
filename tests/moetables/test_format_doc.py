"""The complete example in docs/bundle-format.md is a valid bundle: the reference stays true."""

from __future__ import annotations

import hashlib
import re
from pathlib import Path

from moetables.bundle import validate_bundle
from moetables.lookup import ComponentTables

DOC = Path(__file__).resolve().parents[2] / "docs" / "bundle-format.md"


def test_it_validates_the_documented_example(tmp_path: Path) -> None:
    text = DOC.read_text()
    section = text.split("### A complete small example", 1)[1]
    meta, table = re.findall(r"```(?:yaml)?\n(.*?)```", section, flags=re.S)[:2]
    csv = table.encode()
    path = tmp_path / "tp1/moe_components/dp2_ep2_rank0_sp0/components.csv"
    path.parent.mkdir(parents=True)
    path.write_bytes(csv)
    meta = meta.replace("<sha256 of the CSV below>", hashlib.sha256(csv).hexdigest())
    (tmp_path / "meta.yaml").write_text(meta)
    report = validate_bundle(tmp_path)
    assert report.ok, report.problems
    deployment = ComponentTables(tmp_path).deployment(1, 2, 0)
    assert deployment.time_us("experts", 2, 2, 4) == 31.0
    assert deployment.time_us("experts", 3, 0, 0) == 9.5
