"""Issue 15 part 2: a routing profile's page in a real browser (Debian's chromium), under the
strict Content-Security-Policy: the heatmap, imbalance and per-rank A(N), M(N) figures draw."""

from __future__ import annotations

import io
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

os.environ.setdefault("DJANGO_ALLOW_ASYNC_UNSAFE", "true")
playwright_sync = pytest.importorskip("playwright.sync_api")

CHROMIUM = Path("/usr/bin/chromium")
ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]
SHOTS = os.environ.get("DASHBOARD_SCREENSHOTS", "")

pytestmark = [
    pytest.mark.browser,
    pytest.mark.slow,
    pytest.mark.skipif(not CHROMIUM.exists(), reason="apt-get install -y chromium"),
]


@pytest.fixture
def page() -> Iterator[Any]:
    with playwright_sync.sync_playwright() as p:
        browser = p.chromium.launch(executable_path=str(CHROMIUM), args=ARGS)
        context = browser.new_context(viewport={"width": 1280, "height": 900})
        page = context.new_page()
        page.set_default_timeout(15_000)
        blocked: list[str] = []
        page.on(
            "console",
            lambda m: blocked.append(m.text) if "Content Security Policy" in m.text else None,
        )
        yield page
        browser.close()
        assert blocked == [], blocked


@pytest.fixture
def published(transactional_db: None, tmp_path: Path) -> Any:
    from django.contrib.auth import get_user_model

    from moetables.profiles import write_profile
    from registry.services.profiles import publish_profile
    from tests.moetables.test_routing_profiles import make_profile

    user = get_user_model().objects.create_user("alice", password="x")
    path = write_profile(make_profile([64] * 20 + [8] * 20 + [200] * 5), tmp_path / "z.routing.npz")
    upload = io.BytesIO(path.read_bytes())
    upload.name = "z.routing.npz"
    return publish_profile(upload, published_by=user).record


def _traces(page: Any, selector: str) -> int:
    page.wait_for_selector(f"{selector}[data-rendered]")
    return int(page.eval_on_selector(selector, "el => el.data.length"))


def test_it_draws_the_profile_and_switches_the_ep_size(
    page: Any, live_server: Any, published: Any
) -> None:
    page.goto(live_server.url + "/routing-profiles/")
    page.click(f"a[href='/routing-profiles/{published.pk}/']")
    assert _traces(page, "#fig-heatmap") == 1
    rows = page.eval_on_selector("#fig-heatmap", "el => el.data[0].z.length")
    assert rows == 2  # two captured layers
    assert _traces(page, "#fig-imbalance") == 1
    # EP2 (the default): two captured ranks and two balanced lines per figure.
    assert _traces(page, "#fig-m") == 4
    page.select_option("#p-ep", "4")
    page.click("#profile-form button[type=submit]")
    page.wait_for_url("**ep=4*")
    assert _traces(page, "#fig-m") == 4 + 2
    assert _traces(page, "#fig-a") == 4 + 2
    if SHOTS:
        Path(SHOTS).mkdir(parents=True, exist_ok=True)
        page.screenshot(path=str(Path(SHOTS) / "routing-profile.png"), full_page=True)
