"""Quality figures and the coverage matrix in a real browser (Playwright + Debian chromium).

Every shipped H200 table page draws its stability figures with data (the B/2B controls from the
bundle's stability.csv) and its conservation bars where the bundle has traced forwards (the live
table's own; the modular and torch-reference tables' once `python -m acquisition conserve` has
attached them, labelled as traced separately), or says why there are none. Then a signed-in user
requests a gap of the coverage matrix; the gaps their backend cannot measure offer no request.
Set DASHBOARD_SCREENSHOTS=docs/screenshots to (re)write the committed screenshots.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.frontend.chromium import CHROMIUM
from tests.frontend.test_browser import (  # noqa: F401 - fixtures
    _shot,
    _traces,
    browser,
    page,
)

pytestmark = pytest.mark.skipif(not CHROMIUM.exists(), reason="apt-get install -y chromium")

REPO = Path(__file__).resolve().parents[2]
QWEN = "Qwen/Qwen3-30B-A3B-Instruct-2507"
H200 = [
    REPO / "bundles" / n / QWEN / "bf16" for n in ("H200", "H200-vllm-live", "H200-torch-reference")
]


# Every shipped H200 bundle (one directory holding meta.yaml per model and variant).
ALL_H200 = sorted(p.parent for p in (REPO / "bundles").glob("H200*/*/*/*/meta.yaml"))


@pytest.fixture
def h200(transactional_db: None) -> list[Any]:
    from registry.bundles.services import publish_bundle

    return [publish_bundle(path).bundle for path in H200]


@pytest.fixture
def all_h200(transactional_db: None) -> list[Any]:
    from registry.bundles.services import publish_bundle

    return [publish_bundle(path).bundle for path in ALL_H200]


def test_the_shipped_h200_bundles_are_all_found() -> None:
    """The browser check below walks every H200 bundle: the glob must not silently miss one."""
    found = {str(p.relative_to(REPO / "bundles")) for p in ALL_H200}
    assert {str(p.relative_to(REPO / "bundles")) for p in H200} <= found
    metas = {p.parent for p in (REPO / "bundles").rglob("meta.yaml")}
    assert {p for p in metas if p.relative_to(REPO / "bundles").parts[0].startswith("H200")} == set(
        ALL_H200
    )


def _markers(view: Any, selector: str) -> int:
    """Points drawn by the figure's marker traces (lines and bands excluded)."""
    view.wait_for_selector(f"{selector}[data-rendered]")
    return int(
        view.eval_on_selector(
            selector,
            "el => el.data.filter(t => t.mode === 'markers' || t.type === 'bar')"
            ".reduce((n, t) => n + t.x.length, 0)",
        )
    )


def test_every_h200_table_draws_its_stability_and_conservation(
    page: Any,  # noqa: F811 - the imported fixture
    live_server: Any,
    all_h200: list[Any],
) -> None:
    """R18, R26: the evidence published in every shipped H200 bundle is drawn, point by point,
    and every H200 table has traced forwards to draw (issue 14)."""
    from registry.services.quality import stability_payload

    live = all_h200[ALL_H200.index(H200[1])]
    for bundle in all_h200:
        for table in bundle.tables.all():
            page.goto(live_server.url + f"/tables/{table.pk}/")
            for fig in ("#fig-stability-b2b", "#fig-stability-n", "#fig-stability-a"):
                assert _markers(page, fig) > 0, (table, fig)
            # one marker per control: one per published expert point, plus failed attempts
            summary = stability_payload(table)["summary"]
            assert _markers(page, "#fig-stability-n") <= (
                summary["published_points"] + summary["failed_controls"]
            )
            assert summary["published_points"] <= table.row_count
            text = page.inner_text("#conservation-note")
            _check_conservation(page, table, text, required=True)
            if bundle == live:
                # three traced forwards: each stacks gate_routing, experts, wrapper and the
                # outside remainder (4 x 3 bars), with the native total marked (3 markers)
                assert _traces(page, "#fig-conservation") == 5
                assert _markers(page, "#fig-conservation") == 15
                _shot(page, "table-quality-live")
    # The modular rank 1 retried one point: its failed attempt is marked.
    modular = all_h200[ALL_H200.index(H200[0])].tables.get(dp=2, rank=1)
    page.goto(live_server.url + f"/tables/{modular.pk}/")
    names = page.eval_on_selector(
        "#fig-stability-n", "el => el.data.map(t => t.name + ':' + t.x.length)"
    )
    page.wait_for_selector("#fig-stability-n[data-rendered]")
    assert "failed attempt:1" in names and "passed after a retry:1" in names
    page.locator("#stability-heading").scroll_into_view_if_needed()
    _shot(page, "table-quality-modular")


def _check_conservation(view: Any, table: Any, text: str, *, required: bool = False) -> None:
    """The conservation figure draws every traced forward (one bar per part and the native
    total), says when the forwards were traced separately, or says why there are none (only
    where the caller allows a table without traced forwards)."""
    from registry.services.quality import conservation_payload

    payload = conservation_payload(table)
    forwards = payload["forwards"]
    if not forwards:
        assert not required, f"{table}: no traced native forward to draw"
        assert "traces no native MoE forward" in text, table
        return
    parts = {c for f in forwards for c in f["components_us"]}
    assert _traces(view, "#fig-conservation") == len(parts) + 2
    assert _markers(view, "#fig-conservation") == (len(parts) + 2) * len(forwards)
    assert ("Traced separately from the table" in text) == (payload["supplement"] is not None)


def test_supplementary_conservation_is_drawn_and_labelled(
    page: Any,  # noqa: F811 - the imported fixture
    live_server: Any,
    transactional_db: None,
    tmp_path: Path,
) -> None:
    """Forwards traced after the table (python -m acquisition conserve) are drawn like the
    table's own, with when and on what they were traced. The rows are test values attached to
    a copy of the shipped modular bundle."""
    import shutil

    from moetables.bundle import ConservationRow, attach_conservation, open_bundle
    from registry.bundles.services import publish_bundle

    copy = tmp_path / "H200" / QWEN / "bf16"
    shutil.copytree(H200[0], copy)
    traced = {}
    for entry in open_bundle(copy).entries:
        rows = [
            ConservationRow(i, n, 3.0 * n + 20.0, 0.0, {"gate_routing": 20.0, "experts": 3.0 * n})
            for i, n in enumerate((1, 256, 2048))
        ]
        supplement = {
            "measured": "separately from the table",
            "measured_at": "2026-12-01T06:00:00+00:00",
            "table_measured_at": entry.contract["provenance"]["started_at"],
            "command_line": "python -m acquisition conserve TEST",
            "written_by": "python -m acquisition conserve",
            "device_name": "TEST GPU",
        }
        traced[entry.target] = (rows, supplement)
    attach_conservation(copy, traced, replace=True)
    bundle = publish_bundle(copy).bundle
    table = bundle.tables.get(dp=1)
    page.goto(live_server.url + f"/tables/{table.pk}/")
    text = page.inner_text("#conservation-note")
    assert "Traced separately from the table, on 2026-12-01T06:00:00+00:00 (TEST GPU" in text
    _check_conservation(page, table, text)
    assert _markers(page, "#fig-conservation") == 4 * 3  # gate, experts, outside, total


def test_it_shows_the_coverage_matrix_and_records_a_request(
    page: Any,  # noqa: F811 - the imported fixture
    live_server: Any,
    h200: list[Any],
) -> None:
    """A requestable gap (the torch reference lacks the DP4 ranks the modular DP4 bundle
    covers) can be requested; the live row's DP2/DP4 gaps say why they cannot (R25)."""
    from django.contrib.auth import get_user_model

    from registry.bundles.services import publish_bundle
    from registry.models import CoverageRequest

    publish_bundle(REPO / "bundles" / "H200-vllm-modular-dp4-f4" / QWEN / "bf16")
    get_user_model().objects.create_user("alice", password="pw-alice")
    page.goto(live_server.url + "/coverage/")
    assert page.inner_text("#coverage-gaps") == "10 gaps"
    assert page.locator("#coverage-matrix a[href^='/tables/']").count() == 11
    assert page.locator(".request-cell").count() == 0  # signed out: nothing to press
    page.goto(live_server.url + "/accounts/login/?next=/coverage/")
    page.fill("#id_username", "alice")
    page.fill("#id_password", "pw-alice")
    page.click("button[type=submit]")
    page.wait_for_url("**/coverage/")
    # Signed in: a button on each of the four torch-reference DP4 gaps, none on the live gaps.
    assert page.locator(".request-cell").count() == 4
    live_dp2 = page.locator("td[data-gap='vllm-live tp1 dp2_ep2_rank0_sp0']")
    assert live_dp2.locator(".request-cell").count() == 0
    # Issue 14's note: the cell is short, its row says the reason once, the cell's title
    # keeps the cell's own full reason.
    cell = live_dp2.locator(".not-measurable")
    assert cell.inner_text() == "not measurable [1]"
    assert cell.get_attribute("title").startswith("not measurable by vllm-live: target TP1/DP2/EP2")
    assert page.locator(".not-measurable").count() == 6
    reasons = page.locator(".row-reason")
    assert reasons.count() == 1
    assert reasons.inner_text() == (
        "[1] not measurable by vllm-live: the live path measures the engine's layer at "
        "TP1/DP1/EP1 only (R25)"
    )
    assert page.content().count("measures the engine's layer at TP1/DP1/EP1 only") == 1 + 6
    cell.click()  # the marker links to the row's reason
    assert page.url.endswith(f"#{reasons.get_attribute('id')}")
    reference = page.locator("td[data-gap='torch-reference tp1 dp4_ep4_rank0_sp0']")
    reference.locator(".request-cell").click()
    page.wait_for_selector("#coverage-message")
    assert "no worker for H200 is online" in page.inner_text("#coverage-message")
    assert page.locator("#coverage-requests tbody tr").count() == 1
    assert "open" in page.inner_text("#coverage-requests")
    request = CoverageRequest.objects.get()
    assert request.state == "open" and request.requested_by.username == "alice"
    assert (request.backend, request.dp, request.rank) == ("torch-reference", 4, 0)
    _shot(page, "coverage")


def test_figures_over_n_zoom_together(
    page: Any,  # noqa: F811 - the imported fixture
    live_server: Any,
    h200: list[Any],
) -> None:
    """The surface and the stability figure over N share their x axis: zooming one zooms both."""
    table = h200[0].tables.get(dp=2, rank=0)
    page.goto(live_server.url + f"/tables/{table.pk}/")
    page.wait_for_selector("#fig-surface[data-rendered]")
    page.wait_for_selector("#fig-stability-n[data-rendered]")
    page.evaluate(
        "Plotly.relayout(document.getElementById('fig-surface'), {'xaxis.range': [1, 2]})"
    )
    page.wait_for_function(
        "() => { const r = document.getElementById('fig-stability-n').layout.xaxis.range;"
        " return r && Math.abs(r[0] - 1) < 1e-9 && Math.abs(r[1] - 2) < 1e-9; }"
    )
    local = page.eval_on_selector("#fig-local", "el => el.layout.xaxis.range")
    assert local != [1, 2]  # rows of local components are another quantity: not linked
