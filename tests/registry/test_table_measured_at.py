"""Each table is ranked by its own measurement time (issue 18's transplanted ranks; R43: the
registry answers what the in-process lookup answers for the chosen table).

A bundle's tables need not share a day: Qwen3-235B's rule-v4 DP4/EP4 ranks (session 15) and
DP8/EP8 ranks (session 16) were moved in beside its DP1 table of session 12. Before, the
registry dated the bundle by its root (session 12's first publication), so a lookup by name
chose the older factor-4 rank bundles for those targets.
"""

from __future__ import annotations

import datetime as dt
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
import yaml
from django.db import connection
from django.db.migrations.executor import MigrationExecutor

from registry.bundles.services import publish_bundle
from registry.bundles.services.describe import table_measured_at
from registry.models import Bundle, DeploymentTable
from tests.registry.test_upload_values import refused, upload

if TYPE_CHECKING:
    from rest_framework.test import APIClient

ROOT = Path(__file__).resolve().parents[2] / "bundles"
Q235 = ROOT / "H200-vllm-modular-f2k4/Qwen/Qwen3-235B-A22B/bf16"


def _utc(text: str) -> dt.datetime:
    return dt.datetime.fromisoformat(text)


def test_a_table_is_dated_by_the_latest_time_its_records_state() -> None:
    contract = {
        "provenance": {
            "started_at": "2026-12-04T19:24:30+00:00",
            "acquisition_contexts": [
                {"started_at": "2026-12-04T19:24:30+00:00"},
                {"started_at": "2026-12-04T19:30:55+00:00"},  # the resumed call
            ],
        }
    }
    assert table_measured_at(contract, {}) == _utc("2026-12-04T19:30:55+00:00")
    assert table_measured_at(contract, {"completed_at": "2026-12-05T01:00:00Z"}) == _utc(
        "2026-12-05T01:00:00+00:00"
    )
    # Nothing stated, or nothing storable: no time (the bundle's stands in for it).
    assert table_measured_at({}, {}) is None
    assert (
        table_measured_at({"provenance": {"started_at": "9999-12-31T23:59:59-14:00"}}, {}) is None
    )
    assert table_measured_at("not a mapping", None) is None


@pytest.mark.django_db
def test_the_transplanted_ranks_keep_their_own_days() -> None:
    bundle = publish_bundle(Q235).bundle
    days = {
        t.dp: {x.measured_at.date().isoformat() for x in bundle.tables.filter(dp=t.dp)}
        for t in bundle.tables.all()
    }
    assert days == {1: {"2026-12-02"}, 4: {"2026-12-03"}, 8: {"2026-12-04"}}
    # The bundle's time is its newest table's: DP8/EP8 rank 6's resumed call (session 16).
    assert bundle.measured_at == _utc("2026-12-04T19:39:50+00:00")
    assert bundle.measured_at == max(t.measured_at for t in bundle.tables.all())


@pytest.mark.django_db
def test_the_table_detail_says_when_it_was_measured(api: APIClient) -> None:
    bundle = publish_bundle(Q235).bundle
    got = api.get(f"/api/v1/bundles/{bundle.pk}")
    assert got.status_code == 200, got.content[:300]
    rows = got.json()["tables"]
    assert {r["target"]["rank"]: r["measured_at"][:16] for r in rows if r["target"]["dp"] == 8} == {
        0: "2026-12-04T19:22",
        1: "2026-12-04T19:30",
        2: "2026-12-04T19:26",
        3: "2026-12-04T19:30",
        4: "2026-12-04T19:39",
        5: "2026-12-04T19:33",
        6: "2026-12-04T19:39",
        7: "2026-12-04T19:37",
    }


@pytest.mark.parametrize(
    ("where", "edit"),
    [
        (
            "contract:provenance.started_at",
            lambda e, when: e["contract"].__setitem__("provenance", {"started_at": when}),
        ),
        (
            "contract:provenance.acquisition_contexts[1].started_at",
            lambda e, when: e["contract"].__setitem__(
                "provenance",
                {
                    "acquisition_contexts": [
                        {"started_at": "2026-11-01T00:00:00Z"},
                        {"started_at": when},
                    ]
                },
            ),
        ),
    ],
)
@pytest.mark.django_db
def test_a_contract_time_that_cannot_be_stored_is_refused_naming_it(
    uploader: APIClient,
    make_bundle: Any,
    tar_gz_of: Any,
    stored_files: Any,
    registry_dirs: Path,
    where: str,
    edit: Any,
) -> None:
    """As a coverage's (issue 17, item 3): a 400 naming the field, nothing kept."""
    folder = make_bundle()
    meta_path = folder / "meta.yaml"
    meta = yaml.safe_load(meta_path.read_text())
    edit(meta["per_tp"][1]["moe_components"]["entries"][0], "0001-01-01T00:00:00+14:00")
    meta_path.write_text(yaml.safe_dump(meta))
    problems = refused(upload(uploader, tar_gz_of(folder)), where, stored_files, registry_dirs)
    assert "outside" in problems


@pytest.mark.django_db(transaction=True)
def test_the_migration_dates_tables_published_before() -> None:
    """Publish, go back to 0008 (no column) with the bundle dated as 0008 dated it (its root's
    first publication), migrate to 0009: each table dated from its stored contract, the bundle
    by its newest table."""
    bundle = publish_bundle(Q235).bundle
    want = {t.pk: t.measured_at for t in bundle.tables.all()}
    executor = MigrationExecutor(connection)
    executor.migrate([("registry", "0008_routing_profiles")])
    with connection.cursor() as cursor:
        cursor.execute("UPDATE registry_bundle SET measured_at = %s", ["2026-12-02 08:24:15+00:00"])
    executor = MigrationExecutor(connection)
    executor.migrate(executor.loader.graph.leaf_nodes())
    bundle.refresh_from_db()
    assert bundle.measured_at == _utc("2026-12-04T19:39:50+00:00")
    assert {t.pk: t.measured_at for t in DeploymentTable.objects.all()} == want
    assert Bundle.objects.count() == 1


@pytest.mark.django_db
def test_the_coverage_matrix_shows_each_targets_newest_measurement(api: APIClient) -> None:
    """The matrix's cell is the table a lookup by name answers from: the rule-v4 DP4 ranks,
    though the factor-4 DP4 bundle was published after them; its own day, not its bundle's."""
    rule_v4 = publish_bundle(Q235).bundle
    publish_bundle(ROOT / "H200-vllm-modular-dp4-f4/Qwen/Qwen3-235B-A22B/bf16")
    body = api.get("/api/v1/coverage/").json()
    (row,) = [r for r in body["rows"] if r["model"] == "Qwen/Qwen3-235B-A22B"]
    cells = {c["deployment"]: c for c in row["cells"] if c["table"] is not None}
    dp4 = [c for d, c in cells.items() if "dp4_ep4" in d]
    assert len(dp4) == 4
    tables = set(rule_v4.tables.filter(dp=4).values_list("pk", flat=True))
    assert {c["table"] for c in dp4} == tables
    assert {c["measured_at"][:10] for c in dp4} == {"2026-12-03"}
    assert {c["measured_at"][:10] for d, c in cells.items() if "dp1_ep1" in d} == {"2026-12-02"}
