"""Issue 18 on the table page in a real browser (Playwright, Debian chromium): the tile-cost
and kernel-segment cards, and the playground's load fields over htmx, refused field marked."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from tests.frontend.chromium import CHROMIUM, launched
from tests.frontend.test_load_pages import F2K, _publish

pytestmark = [
    pytest.mark.browser,
    pytest.mark.slow,
    pytest.mark.skipif(not CHROMIUM.exists(), reason="apt-get install -y chromium"),
]


@pytest.fixture(scope="module")
def page() -> Iterator[Any]:
    with launched() as browser:
        page = browser.new_page(viewport={"width": 1280, "height": 900})
        page.set_default_timeout(15_000)
        yield page


def test_the_playground_charges_a_load_description_and_marks_a_refused_field(
    page: Any, live_server: Any, transactional_db: None
) -> None:
    from moetables.lookup import ComponentTables

    table = _publish(F2K).tables.get(tp=1, dp=1)
    page.goto(live_server.url + f"/tables/{table.pk}/")
    assert page.locator("#kernel-segments tbody tr").count() >= 2
    assert page.locator("#tile-costs tbody tr").count() >= 1
    n, a, m = (int(page.input_value(s)) for s in ("#q-n", "#q-a", "#q-m"))
    page.fill("#q-loads", "uniform")
    page.fill("#q-tilecost", "oops")
    page.click("#q-submit")
    page.wait_for_selector("#lookup-error")
    assert "tile_cost_us" in page.inner_text("#lookup-error")
    assert page.get_attribute("#q-tilecost", "aria-invalid") == "true"
    assert page.input_value("#q-tilecost") == "oops"  # the value survives the swap
    page.fill("#q-tilecost", "2.5")
    page.click("#q-submit")
    page.wait_for_selector("#lookup-balanced")
    assert page.get_attribute("#q-tilecost", "aria-invalid") is None
    expected = (
        ComponentTables(F2K)
        .deployment(1, 1, 0)
        .experts_time_us(n, a, m, loads="uniform", tile_cost_us=2.5)
    )
    assert page.inner_text("#lookup-time") == f"{expected:.3f} µs"
