"""Issue 18 part 2: "the layer estimate's histogram and captured policies pass the exact
per-expert counts, so a captured step is answered for the loads it really had". The estimate's
default ``tile_cost_us="auto"`` charges a counting policy's step at each rank's table's recorded
tile model where every rank has one, and nothing elsewhere (a note says which);
``tile_cost_us="none"`` (or None) gives the balanced-load answer; the balanced policy's answer
is the same under every one of them, bit for bit (R41, R44)."""

from __future__ import annotations

import io
import json
from pathlib import Path

import numpy as np
import pytest

from moetables.cli import main as cli_main
from moetables.errors import QueryError
from moetables.lookup.tables import ComponentTables

ROOT = Path(__file__).resolve().parents[2] / "bundles"
Q = "Qwen/Qwen3-30B-A3B-Instruct-2507"
F2K4 = ROOT / f"H200-vllm-modular-f2k4/{Q}/bf16"
# The same targets, no tile model on any rank.
BARE = ROOT / f"H200-torch-reference/{Q}/bf16"
DP8 = ROOT / f"H200-vllm-modular-dp8-f4/{Q}/bf16"


def _counts(seed: int, n: int) -> list[int]:
    """A router-like histogram over 128 experts: n tokens, top-8 distinct experts each."""
    rng = np.random.default_rng(seed)
    picks = np.argsort(rng.random((n, 128)), axis=1)[:, :8]
    return np.bincount(picks.ravel(), minlength=128).tolist()


def _compute(estimate: object) -> list[float]:
    return [r.compute_us for r in estimate.ranks]  # type: ignore[attr-defined]


def test_a_counting_step_is_charged_at_the_tables_models_by_default() -> None:
    tables = ComponentTables(F2K4)
    kw = {"tp": 1, "dp": 2, "policy": "histogram", "expert_counts": _counts(3, 4096)}
    default = tables.estimate([2048, 2048], **kw)
    table = tables.estimate([2048, 2048], tile_cost_us="table", **kw)
    plain = tables.estimate([2048, 2048], tile_cost_us="none", **kw)
    assert _compute(default) == _compute(table)
    assert all(d > p for d, p in zip(_compute(default), _compute(plain), strict=True))
    assert any("charged by default" in n for n in default.notes)
    assert not any("charged by default" in n for n in table.notes)
    assert _compute(tables.estimate([2048, 2048], tile_cost_us=None, **kw)) == _compute(plain)


@pytest.mark.parametrize("policy", ["random", "round_robin"])
def test_the_seeded_and_round_robin_policies_follow_the_same_default(policy: str) -> None:
    tables = ComponentTables(DP8)
    steps = np.array([[512] * 8, [1024] * 8])
    kw = {"tp": 1, "dp": 8, "policy": policy, "seed": 5}
    default = tables.estimate_batch(steps, **kw)
    table = tables.estimate_batch(steps, tile_cost_us="table", **kw)
    assert np.array_equal(default.components["experts"], table.components["experts"])


def test_the_balanced_policy_answers_alike_under_every_choice() -> None:
    tables = ComponentTables(F2K4)
    answers = [
        tables.estimate([300, 5], tp=1, dp=2, **({} if c == "default" else {"tile_cost_us": c}))
        for c in ("default", "auto", "none", None)
    ]
    assert all(_compute(a) == _compute(answers[0]) for a in answers)
    assert all(a.notes == answers[0].notes for a in answers)
    # An explicit charge still needs counts, as before.
    with pytest.raises(QueryError, match="needs per-expert counts"):
        tables.estimate([300, 5], tp=1, dp=2, tile_cost_us="table")


def test_tables_without_a_model_are_answered_for_balanced_loads_and_say_so() -> None:
    tables = ComponentTables(BARE)
    kw = {"tp": 1, "dp": 2, "policy": "histogram", "expert_counts": _counts(4, 4096)}
    default = tables.estimate([2048, 2048], **kw)
    plain = tables.estimate([2048, 2048], tile_cost_us="none", **kw)
    assert _compute(default) == _compute(plain)
    (note,) = [n for n in default.notes if "not charged" in n]
    assert "ranks [0, 1] record no tile model" in note
    with pytest.raises(QueryError, match=r"ranks \[0, 1\] record no fitted tile cost"):
        tables.estimate([2048, 2048], tile_cost_us="table", **kw)


def test_the_captured_expectation_has_no_counts_and_is_not_charged() -> None:
    from moetables.profiles import read_profile

    profile = read_profile(
        next((ROOT.parent / "docs/evidence/h200-routing").glob("*normal*.routing.npz"))
    )
    tables = ComponentTables(F2K4)
    kw = {"tp": 1, "dp": 2, "policy": "captured", "profile": profile, "layer": 0}
    expectation = tables.estimate([1024, 1024], captured_expectation=True, **kw)
    plain = tables.estimate([1024, 1024], captured_expectation=True, tile_cost_us="none", **kw)
    assert _compute(expectation) == _compute(plain)
    drawn = tables.estimate([1024, 1024], seed=2, **kw)
    assert _compute(drawn) == _compute(
        tables.estimate([1024, 1024], seed=2, tile_cost_us="table", **kw)
    )


def test_a_word_it_does_not_know_is_refused_naming_the_choices() -> None:
    tables = ComponentTables(F2K4)
    with pytest.raises(QueryError, match=r"\['auto', 'table', 'none'\], got 'tables'"):
        tables.estimate([2048, 2048], tp=1, dp=2, policy="random", tile_cost_us="tables")


def test_the_cli_takes_auto_and_none() -> None:
    def run(*extra: str) -> dict[str, object]:
        out = io.StringIO()
        args = ["estimate", str(F2K4), "--tp", "1", "--dp", "2", "--tokens", "2048,2048"]
        assert cli_main([*args, "--policy", "random", "--seed", "1", *extra], out=out) == 0
        return json.loads(out.getvalue())

    default, auto, none, table = (
        run(),
        run("--tile-cost-us", "auto"),
        run("--tile-cost-us", "none"),
        run("--tile-cost-us", "table"),
    )
    assert default["ranks"] == auto["ranks"] == table["ranks"] != none["ranks"]
