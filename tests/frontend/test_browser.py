"""The dashboard in a real browser: Playwright driving Debian's chromium (never a downloaded one).

Set DASHBOARD_SCREENSHOTS=docs/screenshots to (re)write the committed screenshots of each page.
"""

from __future__ import annotations

import gzip
import os
import time
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


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    with launched() as browser:
        yield browser


@pytest.fixture
def page(browser: Any) -> Iterator[Any]:
    context = browser.new_context(viewport={"width": 1280, "height": 900}, accept_downloads=True)
    page = context.new_page()
    page.set_default_timeout(15_000)
    # Issue 17 item 1: every page works under the strict Content-Security-Policy; a blocked
    # script, style or worker shows up as a console error naming the policy.
    blocked: list[str] = []
    page.on(
        "console",
        lambda msg: blocked.append(msg.text) if "Content Security Policy" in msg.text else None,
    )
    yield page
    context.close()
    assert blocked == [], blocked


@pytest.fixture
def bundles(transactional_db: None, tmp_path: Path) -> tuple[Any, Any]:
    from registry.bundles.services import publish_bundle
    from tests.frontend.conftest import H200, SHIPPED, write_current_bundle

    shipped = publish_bundle(SHIPPED).bundle
    current = publish_bundle(H200 if H200.is_dir() else write_current_bundle(tmp_path)).bundle
    return shipped, current


def _shot(page: Any, name: str) -> None:
    if SHOTS:
        Path(SHOTS).mkdir(parents=True, exist_ok=True)
        page.screenshot(path=str(Path(SHOTS) / f"{name}.png"), full_page=True)


def _traces(page: Any, selector: str) -> int:
    # A lazy figure (the 3-D scatter) draws when scrolled near: look at it, as a reader would.
    page.locator(selector).scroll_into_view_if_needed()
    page.wait_for_selector(f"{selector}[data-rendered]")
    return int(page.eval_on_selector(selector, "el => el.data.length"))


def test_it_browses_opens_a_bundle_and_downloads_it(
    page: Any, live_server: Any, bundles: tuple[Any, Any], tmp_path: Path
) -> None:
    shipped, _ = bundles
    page.goto(live_server.url + "/")
    assert "2 of 2 bundles" in page.inner_text("main")
    _shot(page, "home")
    page.select_option("#f-hardware", "RTXPRO6000")
    page.click("button[type=submit]")
    page.wait_for_url("**/?*hardware=RTXPRO6000*")
    assert "1 of 2 bundles" in page.inner_text("main")
    page.click(f"a[href='/bundles/{shipped.pk}/']")
    assert page.inner_text("#bundle-sha256") == shipped.sha256
    assert "tp1/skew_fit.csv" in page.inner_text("#missing-files")
    _shot(page, "bundle")
    with page.expect_download() as info:
        page.click("#download")
    download = info.value
    assert download.suggested_filename.endswith(".tar.gz")
    saved = tmp_path / download.suggested_filename
    download.save_as(saved)
    assert gzip.decompress(saved.read_bytes())[:512].strip(b"\0")


def test_it_draws_the_surface_with_data_and_answers_the_playground(
    page: Any, live_server: Any, bundles: tuple[Any, Any]
) -> None:
    shipped, current = bundles
    table = shipped.tables.first()
    page.goto(live_server.url + f"/tables/{table.pk}/")
    assert _traces(page, "#fig-surface") == 3
    cells = page.eval_on_selector(
        "#fig-surface", "el => el.data[0].z.flat().filter(v => v !== null).length"
    )
    assert cells > 100
    assert _traces(page, "#fig-points") == 1
    assert _traces(page, "#fig-local") >= 2
    assert _traces(page, "#fig-stability-n") >= 1
    page.fill("#q-n", "128")
    page.fill("#q-a", "30")
    page.fill("#q-m", "512")
    page.click("#q-submit")
    page.wait_for_selector("#lookup-vertices")
    assert "µs" in page.inner_text("#lookup-answer")
    _shot(page, "table")
    page.fill("#q-n", "99999")
    page.click("#q-submit")
    page.wait_for_selector(".answer.refused")
    # A mode the menu does not offer (a hand-edited request): htmx shows the 400's refusal.
    page.evaluate(
        "() => { const s = document.querySelector('#q-mode'); s.add(new Option('lazy'));"
        " s.value = 'lazy'; }"
    )
    page.fill("#q-n", "128")
    page.click("#q-submit")
    page.wait_for_selector("#lookup-error:has-text(\"no mode 'lazy'\")")
    # A current table (the shipped H200 one): per-M slices and a simplex with its weights.
    table = current.tables.order_by("-dp", "rank").first()
    page.goto(live_server.url + f"/tables/{table.pk}/")
    assert _traces(page, "#fig-surface") == 3
    page.click("#q-submit")  # the form starts at a measured row
    page.wait_for_selector("#lookup-vertices")
    _shot(page, "table-current")


def test_it_draws_the_3d_scatter_only_when_asked_or_scrolled_to(
    page: Any, live_server: Any, bundles: tuple[Any, Any]
) -> None:
    """QA: the WebGL scatter of every row held up the table page on big tables. It is drawn
    when it comes near the viewport or on its button, never with the page's first figures."""
    _, current = bundles
    table = current.tables.order_by("-dp", "rank").first()
    page.goto(live_server.url + f"/tables/{table.pk}/")
    page.wait_for_selector("#fig-surface[data-rendered]")
    page.wait_for_selector("#fig-local[data-rendered]")
    below = page.evaluate(
        "document.querySelector('#fig-points').getBoundingClientRect().top - innerHeight"
    )
    assert below > 200  # out of the observer's reach, so nothing but a reader draws it
    page.wait_for_timeout(300)
    assert page.get_attribute("#fig-points", "data-rendered") is None
    assert page.eval_on_selector("#fig-points", "el => el.children.length") == 0
    page.click("#draw-points")
    page.wait_for_selector("#fig-points[data-rendered='1']")
    assert page.is_hidden("#draw-points")
    n = page.eval_on_selector("#fig-points", "el => el.data[0].x.length")
    assert n == int(page.inner_text("#points-rows"))
    # Scrolling draws it too (a fresh visit, at the top: a reload would restore the scroll).
    page.goto(live_server.url + f"/tables/{table.pk}/")
    page.wait_for_selector("#fig-surface[data-rendered]")
    assert page.get_attribute("#fig-points", "data-rendered") is None
    page.locator("#fig-points").scroll_into_view_if_needed()
    page.wait_for_selector("#fig-points[data-rendered='1']")


def test_it_compares_two_bundles(page: Any, live_server: Any, bundles: tuple[Any, Any]) -> None:
    shipped, current = bundles
    a, b = shipped.tables.first(), shipped.tables.last()
    page.goto(live_server.url + f"/compare/?a={a.pk}&b={b.pk}")
    assert _traces(page, "#fig-compare3") == 2  # eager and graph
    assert page.eval_on_selector("#fig-compare3", "el => el.data[0].y.length") > 100
    page.goto(live_server.url + "/compare/")
    assert _traces(page, "#fig-compare0") >= 1
    # The shipped H200 bundle's TP1/DP2 rank 0 against RTXPRO6000's, both on vLLM's Triton path.
    h200 = current.tables.filter(tp=1, dp=2, rank=0).first() or current.tables.first()
    page.goto(live_server.url + f"/compare/?a={a.pk}&b={h200.pk}")
    for i in range(4):
        assert _traces(page, f"#fig-compare{i}") >= 1
    _shot(page, "compare")


def test_it_works_at_phone_width(browser: Any, live_server: Any, bundles: tuple[Any, Any]) -> None:
    shipped, _ = bundles
    context = browser.new_context(viewport={"width": 390, "height": 844}, is_mobile=True)
    page = context.new_page()
    try:
        for url in ["/", f"/bundles/{shipped.pk}/", f"/tables/{shipped.tables.first().pk}/"]:
            page.goto(live_server.url + url)
            overflow = page.evaluate("document.documentElement.scrollWidth - window.innerWidth")
            assert overflow <= 1, (url, overflow)
        assert _traces(page, "#fig-surface") == 3
        _shot(page, "table-phone")
        page.goto(live_server.url + "/")
        page.keyboard.press("Tab")
        assert page.evaluate("document.activeElement.textContent") == "Skip to content"
        _shot(page, "home-phone")
    finally:
        context.close()


# The jobs run: a real Celery worker process on the `cpu` queue with Redis, the CPU reference
# backend on a tiny model (the same harness as tests/registry/test_jobs_worker.py).
from tests.registry.conftest import redis_broker  # noqa: E402, F401 - a fixture
from tests.registry.test_jobs_worker import (  # noqa: E402
    CPU_JOB,
    Worker,
    tiny_model,  # noqa: F401 - a fixture
    worker,  # noqa: F401 - a fixture
)


def _explain_jobs(running: Worker) -> None:
    """Printed only when the test fails (pytest shows captured output then)."""
    from registry.models import AcquisitionJob

    for job in AcquisitionJob.objects.all():
        print(job, job.phase, job.error, job.log_tail[-2000:])
    print(running.log.read_text()[-3000:])


def test_it_queues_a_cpu_job_and_watches_it_reach_100_percent(
    page: Any,
    live_server: Any,
    transactional_db: None,
    worker: Worker,  # noqa: F811
    tiny_model: str,  # noqa: F811
    request: pytest.FixtureRequest,
) -> None:
    from django.contrib.auth import get_user_model

    # an ordinary account (not staff): signing in on the dashboard's own page is enough
    get_user_model().objects.create_user("alice", "alice@example.com", "pw-alice")
    page.goto(live_server.url + "/jobs/new")
    page.fill("#id_username", "alice")
    page.fill("#id_password", "pw-alice")
    page.click("main button[type=submit]")
    page.wait_for_selector("#job-form")
    values = {**CPU_JOB, "model": tiny_model, "max_num_batched_tokens": 4}
    for name, value in values.items():
        text = ",".join(map(str, value)) if isinstance(value, list) else str(value)
        if page.eval_on_selector(f"#p-{name}", "el => el.tagName") == "SELECT":
            page.select_option(f"#p-{name}", text)
        else:
            page.fill(f"#p-{name}", text)
    _shot(page, "job-new")
    page.click("#job-submit")
    page.wait_for_selector("#job-progress")
    request.addfinalizer(lambda: _explain_jobs(worker))
    # Polled from here: wait_for_function evaluates a string in the page, which the page's
    # Content-Security-Policy (no eval) rightly refuses (issue 17, item 1).
    deadline = time.monotonic() + 60
    while not (
        page.inner_text("#job-state").strip() == "running"
        or page.inner_text("#job-percent").strip() == "100%"
    ):
        assert time.monotonic() < deadline, "the job did not start within 60 s"
        page.wait_for_timeout(200)
    page.wait_for_selector("#job-bundle", timeout=90_000)
    assert page.inner_text("#job-percent") == "100%"
    assert page.inner_text("#job-state") == "succeeded"
    _shot(page, "job")
    page.click("#job-bundle")
    assert "CPU · test/tiny-moe" in page.inner_text("h1")
    page.goto(live_server.url + "/jobs/")
    _shot(page, "jobs")


def test_it_shows_redoc_with_nothing_blocked(
    page: Any, live_server: Any, transactional_db: None
) -> None:
    """The ReDoc page under the Content-Security-Policy: its attribution logo (a fixed URL in
    ReDoc's bundle) was blocked, which the page fixture's console check reports."""
    remote: list[str] = []
    page.on(
        "request",
        lambda r: (
            remote.append(r.url) if not r.url.startswith((live_server.url, "blob:")) else None
        ),
    )
    page.goto(live_server.url + "/api/redoc/")
    page.get_by_text("API docs by Redocly").wait_for()
    page.get_by_text("MoE component timing registry").first.wait_for()
    page.wait_for_timeout(500)  # the logo is requested after the first render
    # Nothing but the one image leaves this origin.
    assert set(remote) <= {"https://cdn.redoc.ly/redoc/logo-mini.svg"}, remote
