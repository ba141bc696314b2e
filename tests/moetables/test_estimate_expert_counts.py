"""Each rank's per-expert counts in an estimate's JSON, opt-in (R41, R44): the CLI's
``--rank-expert-counts`` and the request field ``rank_expert_counts`` (REST reads the same)."""

from __future__ import annotations

import io
import json
from pathlib import Path

import numpy as np
import pytest

from moetables.cli import main
from moetables.errors import QueryError
from moetables.estimate_query import answer_estimate, parse_estimate_request
from moetables.lookup.tables import ComponentTables

H200 = Path(__file__).resolve().parents[2] / "bundles/H200/Qwen/Qwen3-30B-A3B-Instruct-2507/bf16"
BASE = [str(H200), "--tp", "1", "--dp", "2"]


def _counts(seed: int, n: int) -> list[int]:
    """A router-like histogram over 128 experts: n tokens, top-8 distinct experts each."""
    rng = np.random.default_rng(seed)
    picks = np.argsort(rng.random((n, 128)), axis=1)[:, :8]
    return np.bincount(picks.ravel(), minlength=128).tolist()


def run(*args: str) -> tuple[int, str]:
    out = io.StringIO()
    code = main(["estimate", *args], out=out)
    return code, out.getvalue()


def test_it_adds_each_ranks_counts_to_a_histogram_answer_when_asked(tmp_path: Path) -> None:
    """R41: the rank's slice of the step's histogram, by its linear expert map; A and M agree."""
    counts = _counts(1, 300)
    path = tmp_path / "counts.json"
    path.write_text(json.dumps(counts))
    code, text = run(
        *BASE,
        "--tokens",
        "100,200",
        "--policy",
        "histogram",
        "--expert-counts",
        str(path),
        "--rank-expert-counts",
        "--no-events",
    )
    assert code == 0
    ranks = json.loads(text)["ranks"]
    assert [r["expert_range"] for r in ranks] == [[0, 64], [64, 128]]
    assert ranks[0]["expert_counts"] + ranks[1]["expert_counts"] == counts
    for r in ranks:
        assert r["M"] == sum(r["expert_counts"])
        assert r["A"] == sum(c > 0 for c in r["expert_counts"])
    # Off by default: answers stay small.
    _, plain = run(
        *BASE,
        "--tokens",
        "100,200",
        "--policy",
        "histogram",
        "--expert-counts",
        str(path),
        "--no-events",
    )
    assert "expert_counts" not in json.loads(plain)["ranks"][0]


def test_it_gives_the_same_counts_for_a_file_of_steps(tmp_path: Path) -> None:
    """The batch path (a JSONL file of steps, answered together) matches the single step."""
    steps = tmp_path / "steps.jsonl"
    rows = [([4, 4], _counts(2, 8)), ([512, 16], _counts(3, 528)), ([100, 200], _counts(1, 300))]
    steps.write_text("".join(json.dumps({"tokens": t, "expert_counts": c}) + "\n" for t, c in rows))
    code, text = run(
        *BASE,
        "--tokens",
        str(steps),
        "--policy",
        "histogram",
        "--rank-expert-counts",
        "--no-events",
    )
    lines = [json.loads(line) for line in text.splitlines()]
    assert code == 0 and len(lines) == 3
    for (tokens, counts), answer in zip(rows, lines, strict=True):
        got = answer["ranks"][0]["expert_counts"] + answer["ranks"][1]["expert_counts"]
        assert got == counts and answer["tokens"] == tokens


def test_it_counts_round_robin_and_refuses_policies_without_counts() -> None:
    """round_robin counts its pairs; balanced and custom give no per-expert counts: a clear
    refusal, not an empty list."""
    code, text = run(*BASE, "--tokens", "3,5", "--policy", "round_robin", "--rank-expert-counts")
    ranks = json.loads(text)["ranks"]
    assert code == 0 and sum(sum(r["expert_counts"]) for r in ranks) == 8 * 8
    code, text = run(*BASE, "--tokens", "3,5", "--rank-expert-counts")
    answer = json.loads(text)
    assert code == 1 and answer["error"] == "invalid"
    assert "rank_expert_counts: the balanced policy gives no per-expert counts" in answer["message"]
    with pytest.raises(QueryError, match="must be true or false"):
        parse_estimate_request({"tp": 1, "dp": 2, "tokens": [1, 1], "rank_expert_counts": 1})


def test_it_refuses_counts_from_the_typed_result_of_a_policy_without_them() -> None:
    tables = ComponentTables(H200)
    layer = tables.estimate([3, 5], tp=1, dp=2)
    with pytest.raises(QueryError, match="the balanced policy gives none"):
        layer.as_dict(expert_counts=True)
    request = parse_estimate_request(
        {
            "tp": 1,
            "dp": 2,
            "steps": [[3, 5]],
            "policy": "random",
            "seed": 4,
            "rank_expert_counts": True,
            "events": False,
        }
    )
    (answer,) = answer_estimate(tables, request, None)  # type: ignore[misc]
    assert sum(len(r["expert_counts"]) for r in answer["ranks"]) == 128
