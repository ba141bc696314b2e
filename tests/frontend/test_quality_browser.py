"""Quality figures and the coverage matrix in a real browser (Playwright + Debian chromium).

Every shipped H200 table page draws its stability figures with data (the B/2B controls from the
bundle's stability.csv); the live table draws its conservation bars, and the modular and
torch-reference tables, which trace no native forward, say why instead. Then a signed-in user
requests a gap of the coverage matrix; the gaps their backend cannot measure offer no request.
Set DASHBOARD_SCREENSHOTS=docs/screenshots to (re)write the committed screenshots.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.frontend.test_browser import (  # noqa: F401 - fixtures
    CHROMIUM,
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


@pytest.fixture
def h200(transactional_db: None) -> list[Any]:
    from registry.bundles.services import publish_bundle

    return [publish_bundle(path).bundle for path in H200]


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
    h200: list[Any],
) -> None:
    """R18, R26: the evidence published in each H200 bundle is drawn, point by point."""
    for bundle in h200:
        for table in bundle.tables.all():
            page.goto(live_server.url + f"/tables/{table.pk}/")
            for fig in ("#fig-stability-b2b", "#fig-stability-n", "#fig-stability-a"):
                assert _markers(page, fig) > 0, (table, fig)
            # one marker per control: one per published expert point, plus failed attempts
            assert _markers(page, "#fig-stability-n") <= table.row_count + 1
            text = page.inner_text("#conservation-note")
            if table.contract["backend"]["name"] == "vllm-live":
                # three traced forwards: each stacks gate_routing, experts, wrapper and the
                # outside remainder (4 x 3 bars), with the native total marked (3 markers)
                assert _traces(page, "#fig-conservation") == 5
                assert _markers(page, "#fig-conservation") == 15
                _shot(page, "table-quality-live")
            else:
                assert "traces no native MoE forward" in text
    # The modular rank 1 retried one point: its failed attempt is marked.
    modular = h200[0].tables.get(dp=2, rank=1)
    page.goto(live_server.url + f"/tables/{modular.pk}/")
    names = page.eval_on_selector(
        "#fig-stability-n", "el => el.data.map(t => t.name + ':' + t.x.length)"
    )
    page.wait_for_selector("#fig-stability-n[data-rendered]")
    assert "failed attempt:1" in names and "passed after a retry:1" in names
    page.locator("#stability-heading").scroll_into_view_if_needed()
    _shot(page, "table-quality-modular")


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
    assert (
        live_dp2.locator(".not-measurable")
        .inner_text()
        .startswith("not measurable by vllm-live: target TP1/DP2/EP2")
    )
    assert page.locator(".not-measurable").count() == 6
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
