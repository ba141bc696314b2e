"""Issue 18 on the dashboard (QA, session 5): the table page lists the recorded per-block
row-tile costs and a kernel-step table's segments as `python -m moetables info` prints them,
and the lookup playground takes a load description through the lookup's own answer (R44)."""

from __future__ import annotations

from html import unescape
from pathlib import Path
from typing import Any

import pytest
from django.test import Client

from moetables.cli import describe

REPO = Path(__file__).resolve().parents[2]
F2K = REPO / "bundles/H200-vllm-modular-f2k/Qwen/Qwen3-30B-A3B-Instruct-2507/bf16"
LIVE_F2K = REPO / "bundles/H200-vllm-live-f2k/Qwen/Qwen3-30B-A3B-Instruct-2507/bf16"


def _publish(path: Path) -> Any:
    from registry.bundles.services import publish_bundle

    if not path.is_dir():
        pytest.skip(f"no shipped {path.parts[-4]} bundle")
    return publish_bundle(path).bundle


@pytest.fixture
def f2k(db: None) -> Any:
    return _publish(F2K)


def _info(path: Path, table: Any) -> dict[str, Any]:
    return next(d for d in describe(path)["deployments"] if d["table"] == table.table_path)


@pytest.mark.parametrize("path", [F2K, LIVE_F2K], ids=["format-3", "format-4"])
def test_the_table_page_lists_tile_costs_and_kernel_segments_as_info_does(
    client: Client, db: None, path: Path
) -> None:
    bundle = _publish(path)
    for table in bundle.tables.all():
        page = client.get(f"/tables/{table.pk}/")
        assert page.status_code == 200
        info = _info(path, table)
        assert page.context["kernel_segments"] == info["kernel_segments"]
        assert page.context["tile_costs"] == info.get("tile_costs", [])
        html = unescape(page.content.decode())
        assert 'id="kernel-segments"' in html
        for seg in info["kernel_segments"]:
            assert f"{seg['tokens'][0]}–{seg['tokens'][1]}" in html and seg["kernel"] in html
        if info.get("tile_costs"):
            assert 'id="tile-costs"' in html
            for cost in info["tile_costs"]:
                at = "≥ " if cost["applies"] == "at_least" else ""  # format 3: this block and up
                shown = (
                    f"{cost['wave_cost_us']} per extra wave ({cost['programs_per_sm']} "
                    f"programs/SM, {cost['sms']} SMs)"
                    if cost.get("wave_cost_us") is not None  # format 5: per wave, not tile
                    else cost["tile_cost_us"]
                )
                assert f"<td>{at}{cost['block_m']}</td><td>{shown}</td>" in html


def test_a_table_without_kernel_steps_or_tile_costs_shows_neither(
    client: Client, current_bundle: Any
) -> None:
    html = client.get(f"/tables/{current_bundle.tables.first().pk}/").content.decode()
    assert 'id="kernel-segments"' not in html and 'id="tile-costs"' not in html


def test_the_playground_answers_a_load_description_as_the_lookup_does(
    client: Client, f2k: Any
) -> None:
    from moetables.lookup import ComponentTables

    table = f2k.tables.get(tp=1, dp=1)
    n, a, m = client.get(f"/tables/{table.pk}/").context["example"]
    deployment = ComponentTables(F2K).deployment(1, 1, 0)
    url = f"/tables/{table.pk}/lookup"
    base = {"component": "experts", "tokens": n, "activated_experts": a, "local_assignments": m}
    for loads, cost, expected in [
        ("uniform", "2.5", deployment.experts_time_us(n, a, m, loads="uniform", tile_cost_us=2.5)),
        ("power_law(1.2)", "table", deployment.experts_time_us(n, a, m, loads="power_law(1.2)")),
        ("uniform", "", deployment.experts_time_us(n, a, m, loads="uniform")),
    ]:
        page = client.get(url, {**base, "loads": loads, "tile_cost_us": cost})
        assert "error" not in page.context, page.content.decode()
        assert page.context["loaded_time_us"] == expected
        assert page.context["time_us"] == deployment.experts_time_us(n, a, m)
        assert 'id="lookup-balanced"' in page.content.decode()
    counts = [m - (a - 1)] + [1] * (a - 1)  # A experts holding M pairs
    page = client.get(url, {**base, "loads": str(counts), "tile_cost_us": "1"})
    expected = deployment.experts_time_us(n, a, m, loads=counts, tile_cost_us=1.0)
    assert page.context["loaded_time_us"] == expected
    plain = client.get(url, base)
    assert "loaded_time_us" not in plain.context and "lookup-balanced" not in plain.content.decode()


@pytest.mark.parametrize(
    ("loads", "cost", "field", "message"),
    [
        ("[1, 2", "", "loads", "loads: per-expert counts are not JSON"),
        ("lumpy", "1", "loads", "loads must be &#x27;balanced&#x27;, &#x27;uniform&#x27;"),
        ("[1, 1]", "1", "loads", "loads: the per-expert counts hold 2 pairs"),
        ("uniform", "cheap", "tile_cost_us", "tile_cost_us: &#x27;cheap&#x27; is neither"),
        ("uniform", "-2", "tile_cost_us", "tile_cost_us must be a finite number &gt;= 0"),
        ("", "3", "tile_cost_us", "tile_cost_us needs loads"),
    ],
)
def test_the_playground_refuses_a_load_field_naming_it(
    client: Client, f2k: Any, loads: str, cost: str, field: str, message: str
) -> None:
    table = f2k.tables.get(tp=1, dp=1)
    n, a, m = client.get(f"/tables/{table.pk}/").context["example"]
    params = {"component": "experts", "tokens": n, "activated_experts": a, "local_assignments": m}
    page = client.get(
        f"/tables/{table.pk}/lookup", {**params, "loads": loads, "tile_cost_us": cost}
    )
    html = page.content.decode()
    assert "Refused (invalid)" in html and message in html, html
    assert page.context["field"] == field and f'data-field="{field}"' in html


def test_a_load_description_is_for_experts_only(client: Client, f2k: Any) -> None:
    table = f2k.tables.get(tp=1, dp=1)
    html = client.get(
        f"/tables/{table.pk}/lookup",
        {"component": "gate_routing", "tokens": 8, "loads": "uniform", "tile_cost_us": "1"},
    ).content.decode()
    assert "loads: a load description is for experts only" in html


def test_htmx_gets_the_load_fields_back_marked_where_refused(client: Client, f2k: Any) -> None:
    table = f2k.tables.get(tp=1, dp=1)
    n, a, m = client.get(f"/tables/{table.pk}/").context["example"]
    url = f"/tables/{table.pk}/lookup"
    query = {"component": "experts", "tokens": n, "activated_experts": a, "local_assignments": m}
    refused = client.get(
        url, {**query, "loads": "uniform", "tile_cost_us": "x"}, HTTP_HX_REQUEST="true"
    ).content.decode()
    assert 'id="q-tilecost" name="tile_cost_us" value="x"' in refused
    assert 'aria-invalid="true" aria-describedby="lookup-error" hx-swap-oob="true"' in refused
    assert refused.count("hx-swap-oob") == 2 and refused.count("aria-invalid") == 1
    fixed = client.get(
        url, {**query, "loads": "uniform", "tile_cost_us": "1"}, HTTP_HX_REQUEST="true"
    ).content.decode()
    assert fixed.count("hx-swap-oob") == 2 and "aria-invalid" not in fixed
    plain = client.get(url, {**query, "loads": "uniform", "tile_cost_us": "x"}).content.decode()
    assert "hx-swap-oob" not in plain  # no htmx: the fragment alone


def test_table_cost_on_a_table_without_one_is_refused_naming_tile_cost(
    client: Client, current_bundle: Any
) -> None:
    table = current_bundle.tables.first()
    page = client.get(
        f"/tables/{table.pk}/lookup",
        {
            "component": "experts",
            "tokens": 8,
            "activated_experts": 2,
            "local_assignments": 8,
            "loads": "uniform",
            "tile_cost_us": "table",
        },
    )
    assert page.context["field"] == "tile_cost_us", page.content.decode()
    assert "records no fitted tile cost" in page.content.decode()
