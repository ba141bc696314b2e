"""manage.py import_profile: the shipped H200 routing profiles reach the registry as the shipped
bundles do (issue 15 part 4; the run command imports them on every start)."""

from __future__ import annotations

from io import StringIO
from pathlib import Path
from typing import Any

import pytest
from django.core.management import CommandError, call_command

from moetables.profiles import sha256_of
from registry.profile_models import RoutingProfileRecord
from registry.services.profiles import load_profile

pytestmark = pytest.mark.django_db

REPO = Path(__file__).resolve().parents[2]
SHIPPED = REPO / "docs" / "evidence" / "h200-routing"


def run(*args: Any) -> tuple[str, str]:
    out, err = StringIO(), StringIO()
    call_command(*args, stdout=out, stderr=err)
    return out.getvalue(), err.getvalue()


def test_it_imports_the_shipped_profiles_once() -> None:
    files = sorted(SHIPPED.glob("*.routing.npz"))
    assert [f.name for f in files] == ["native.routing.npz", "normal_routing.routing.npz"]
    out, _ = run("import_profile", str(SHIPPED))
    assert out.count("imported: routing profile") == 2
    records = {r.router: r for r in RoutingProfileRecord.objects.all()}
    assert set(records) == {"native", "vllm simulator normal_routing"}
    for f in files:
        record = RoutingProfileRecord.objects.get(sha256=sha256_of(f))
        assert record.published_by is None and record.filename == f.name
        assert (record.global_experts, record.top_k, record.layers, record.steps) == (
            128,
            8,
            48,
            128,
        )
        # Stored bytes read back and re-validated. Rows: every prompt token once, plus 31 decode
        # rows per prompt (its first new token comes out of the prefill step).
        assert load_profile(record).step_tokens.sum() == record.tokens == 18_912 + 64 * 31
    # The skewed simulator's layers are more uneven than the untrained router's.
    skew = max(records["vllm simulator normal_routing"].summary["imbalance"])
    native = max(records["native"].summary["imbalance"])
    assert skew > native > 1.0
    out, _ = run("import_profile", str(SHIPPED))
    assert out.count("already present") == 2
    assert RoutingProfileRecord.objects.count() == 2


def test_it_refuses_a_corrupt_file_and_imports_the_rest(tmp_path: Path) -> None:
    good = tmp_path / "a" / "native.routing.npz"
    good.parent.mkdir()
    good.write_bytes((SHIPPED / "native.routing.npz").read_bytes())
    bad = tmp_path / "b.routing.npz"
    bad.write_bytes(b"PK\x03\x04 not a profile")
    err = StringIO()
    with pytest.raises(CommandError, match="1 of 2 routing profiles refused"):
        call_command("import_profile", str(tmp_path), stdout=StringIO(), stderr=err)
    assert f"refused {bad}" in err.getvalue()
    assert RoutingProfileRecord.objects.get().filename == "native.routing.npz"


def test_it_says_when_there_is_nothing_to_import(tmp_path: Path) -> None:
    with pytest.raises(CommandError, match="no routing profiles found"):
        run("import_profile", str(tmp_path))
    with pytest.raises(CommandError, match="no such file or folder"):
        run("import_profile", str(tmp_path / "missing"))
