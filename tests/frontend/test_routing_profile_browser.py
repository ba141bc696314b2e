"""Issue 15 part 2: a routing profile's page in a real browser (Debian's chromium), under the
strict Content-Security-Policy: the heatmap, imbalance and per-rank A(N), M(N) figures draw."""

from __future__ import annotations

import io
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.frontend.chromium import CHROMIUM, launched

SHOTS = os.environ.get("DASHBOARD_SCREENSHOTS", "")

pytestmark = [
    pytest.mark.browser,
    pytest.mark.slow,
    pytest.mark.skipif(not CHROMIUM.exists(), reason="apt-get install -y chromium"),
]


@pytest.fixture
def page() -> Iterator[Any]:
    with launched() as browser:
        context = browser.new_context(viewport={"width": 1280, "height": 900})
        page = context.new_page()
        page.set_default_timeout(15_000)
        blocked: list[str] = []
        page.on(
            "console",
            lambda m: blocked.append(m.text) if "Content Security Policy" in m.text else None,
        )
        yield page
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
    # EP2 (the default): two captured ranks, the busiest rank and two balanced lines.
    assert _traces(page, "#fig-m") == 5
    page.select_option("#p-ep", "4")
    page.click("#profile-form button[type=submit]")
    page.wait_for_url("**ep=4*")
    assert _traces(page, "#fig-m") == 4 + 1 + 2
    assert _traces(page, "#fig-a") == 4 + 1 + 2
    if SHOTS:
        Path(SHOTS).mkdir(parents=True, exist_ok=True)
        page.screenshot(path=str(Path(SHOTS) / "routing-profile.png"), full_page=True)


@pytest.fixture
def shipped(transactional_db: None) -> dict[str, Any]:
    from io import StringIO

    from django.core.management import call_command

    from registry.profile_models import RoutingProfileRecord

    call_command(
        "import_profile",
        str(Path(__file__).resolve().parents[2] / "docs/evidence/h200-routing"),
        stdout=StringIO(),
    )
    return {r.router: r for r in RoutingProfileRecord.objects.all()}


def _ys(page: Any, selector: str) -> list[list[float]]:
    return list(page.eval_on_selector(selector, "el => el.data.map(t => t.y)"))


def test_the_shipped_h200_profiles_draw_with_their_data(
    page: Any, live_server: Any, shipped: dict[str, Any]
) -> None:
    """Issue 15 part 4: the two profiles captured on the H200 (imported as the run command
    does) draw every figure from their own data: 48 layers x 128 experts, the skewed simulator's
    imbalance above the untrained router's, per-rank curves against balanced at EP2 and EP8."""
    skewed = shipped["vllm simulator normal_routing"]
    page.goto(live_server.url + "/routing-profiles/")
    assert page.locator(f"a[href='/routing-profiles/{skewed.pk}/']").count() == 1
    page.click(f"a[href='/routing-profiles/{skewed.pk}/']")
    assert _traces(page, "#fig-heatmap") == 1
    z = page.eval_on_selector("#fig-heatmap", "el => el.data[0].z")
    assert len(z) == 48 and {len(row) for row in z} == {128}
    assert max(max(row) for row in z) > 1.6  # the simulator's busiest expert, x mean
    assert _traces(page, "#fig-imbalance") == 1
    bars = _ys(page, "#fig-imbalance")[0]
    assert len(bars) == 48 and min(bars) > 1.6
    # EP2: two captured ranks, the busiest and two balanced lines; decode (N = 16) A below
    # balanced's 64.
    assert _traces(page, "#fig-a") == 5
    a = page.eval_on_selector("#fig-a", "el => el.data.map(t => [t.name, t.x, t.y])")
    captured = {name: dict(zip(x, y, strict=True)) for name, x, y in a if "captured" in name}
    balanced = {name: dict(zip(x, y, strict=True)) for name, x, y in a if "balanced" in name}
    assert set(captured) == {"rank 0 captured", "rank 1 captured"}
    assert captured["rank 0 captured"][16] < 0.7 * balanced["rank 0 balanced"][16] == 0.7 * 64
    page.select_option("#p-ep", "8")
    page.click("#profile-form button[type=submit]")
    page.wait_for_url("**ep=8*")
    assert _traces(page, "#fig-m") == 8 + 1 + 2
    ms = [y for y in _ys(page, "#fig-m")[:8]]
    # The simulator's normal distribution over expert ids loads the middle ranks: at EP8 the
    # outer ranks get a fraction of the middle ones' pairs at every captured N.
    assert all(min(r[i] for r in ms) < 0.5 * max(r[i] for r in ms) for i in range(len(ms[0])))
    native = shipped["native"]
    page.goto(live_server.url + f"/routing-profiles/{native.pk}/")
    assert _traces(page, "#fig-heatmap") == 1
    assert max(_ys(page, "#fig-imbalance")[0]) < min(bars)
    if SHOTS:
        Path(SHOTS).mkdir(parents=True, exist_ok=True)
        page.goto(live_server.url + f"/routing-profiles/{skewed.pk}/?ep=8")
        _traces(page, "#fig-m")
        page.screenshot(path=str(Path(SHOTS) / "routing-profile-h200.png"), full_page=True)
