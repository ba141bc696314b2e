"""Issue 12: moetables.lookup.queries is the one definition of a well-formed lookup envelope,
used by the REST door and RemoteTables (checked here without Django)."""

from __future__ import annotations

from typing import Any

import pytest

from moetables.lookup import RequestError, parse_request

TARGET = {"tp": 1, "dp": 2, "rank": 1}
NAME = {"hardware": "H200", "model": "m", "variant": "bf16"}


def test_it_reads_names_pins_and_bundles() -> None:
    request = parse_request({**NAME, "backend": "vllm-live", "target": TARGET, "queries": []})
    assert request.name == ("H200", "m", "bf16") and request.backend == "vllm-live"
    assert request.target == {"tp": 1, "dp": 2, "ep": 2, "rank": 1, "sequence_parallel": False}
    sha = "a" * 64
    assert parse_request({"bundle": sha, "target": TARGET}).sha256 == sha
    assert parse_request({"bundle": 7, "target": TARGET}).bundle_id == 7
    pinned = parse_request(
        {**NAME, "target": TARGET}, pins={"bundle": "7", "vllm_version": "0.26.0"}
    )
    assert (pinned.bundle_id, pinned.vllm_version) == (7, "0.26.0")
    # the body a request is asked with reads back as the same request
    assert parse_request(request.body()) == request


@pytest.mark.parametrize(
    ("data", "pins", "fragment"),
    [
        ({**NAME, "target": TARGET, "bakend": "x"}, None, "unknown keys 'bakend'"),
        ({**NAME, "target": {**TARGET, "pp": 1}}, None, "target: unknown keys 'pp'"),
        ({**NAME, "target": TARGET}, {"limit": "3"}, "unknown parameter 'limit'"),
        ({**NAME, "target": TARGET, "backend": "a"}, {"backend": "b"}, "the body says 'a'"),
        ({**NAME, "target": TARGET, "vllm_version": 26}, None, "vllm_version: must be a non-empty"),
        ({**NAME, "model": "m\x00", "target": TARGET}, None, "without NUL characters"),
        ({**NAME, "variant": "\udc00", "target": TARGET}, None, "valid Unicode"),
        ({"bundle": True, "target": TARGET}, None, "bundle: must be a positive integer"),
        ({"bundle": 2**63, "target": TARGET}, None, "bundle: must be a positive integer"),
        ({"target": TARGET}, None, "name the bundle"),
        ({**NAME, "target": {**TARGET, "rank": 2}}, None, "rank must be below ep = 2"),
        ({**NAME, "target": TARGET, "queries": [{}] * 3}, None, "at most 2 queries"),
    ],
)
def test_it_names_every_problem(data: Any, pins: Any, fragment: str) -> None:
    with pytest.raises(RequestError) as caught:
        parse_request(data, max_queries=2, pins=pins)
    assert any(fragment in p for p in caught.value.problems), caught.value.problems


@pytest.mark.parametrize("count", [1, 40])  # the one-by-one reader and the column reader
def test_it_refuses_a_query_key_it_does_not_read(count: int) -> None:
    """A key no reader knows (a typo of a load description) is refused, never answered as if
    it were absent (issue 13: unknown keys are errors; issue 18: `loads` is a lookup key, for
    experts only, tests/moetables/test_lookup_loads.py)."""
    from moetables import ComponentTables

    rank = ComponentTables("bundles/H200/Qwen/Qwen3-30B-A3B-Instruct-2507/bf16").deployment(1, 1, 0)
    good = {"component": "gate_routing", "tokens": 4}
    answers = rank.answer([good] * (count - 1) + [{**good, "load": "uniform"}])
    assert all("time_us" in a for a in answers[:-1])
    assert answers[-1]["error"] == "invalid"
    assert "unknown keys 'load'" in answers[-1]["message"]
