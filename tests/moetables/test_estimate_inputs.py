"""The layer estimate's inputs: every malformed argument is a QueryError naming it (R43), never
a plain Python exception, and the seeded policies' streams are addressable by step (R41).

Each case here raised IndexError, TypeError or ValueError from deep inside before (the
session-9 audit), or was accepted after a silent coercion (True as one token, 1.5 as a
capture size).
"""

from __future__ import annotations

import io
import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from moetables import ComponentTables
from moetables.cli import main
from moetables.errors import QueryError

H200 = Path(__file__).resolve().parents[2] / "bundles/H200/Qwen/Qwen3-30B-A3B-Instruct-2507/bf16"
CURVE = [[1, 8], [4096, 128]]


@pytest.fixture(scope="module")
def tables() -> ComponentTables:
    return ComponentTables(H200)


@pytest.mark.parametrize(
    ("call", "named"),
    [
        (lambda t: t.estimate([5], tp=0, dp=1), "tp must be a positive integer, got 0"),
        (lambda t: t.estimate([5], tp=1, dp=0), "dp must be a positive integer, got 0"),
        (lambda t: t.estimate([5], tp=1, dp=-1), "dp must be a positive integer, got -1"),
        (lambda t: t.estimate([5], tp="1", dp=1), "tp must be a positive integer, got '1'"),
        (lambda t: t.estimate([5], tp=1.0, dp=1), "tp must be a positive integer, got 1.0"),
        (lambda t: t.estimate([5], tp=True, dp=1), "tp must be a positive integer, got True"),
        (
            lambda t: t.estimate([5], tp=1, dp=1, sequence_parallel="yes"),
            "sequence_parallel must be true or false",
        ),
        (lambda t: t.estimate([True, 300], tp=1, dp=2), "token counts must be integers"),
        (
            lambda t: t.estimate_batch(np.array([[True, False]]), tp=1, dp=2),
            "token counts must be integers, got booleans",
        ),
        (
            lambda t: t.estimate_batch([[5, 300], [7]], tp=1, dp=2),
            "tokens_per_rank must be steps of one integer per DP rank (2), all of the same length",
        ),
        (
            lambda t: t.estimate([5, 300], tp=1, dp=2, mode="graph", capture_sizes=["x"]),
            "capture sizes must be positive integers, got ['x']",
        ),
        (
            lambda t: t.estimate([5, 300], tp=1, dp=2, mode="graph", capture_sizes=[1.5, 512]),
            "capture sizes must be positive integers, got [1.5, 512]",
        ),
        (
            lambda t: t.estimate([5, 300], tp=1, dp=2, mode="graph", capture_sizes=[True, 512]),
            "capture sizes must be positive integers, got [True, 512]",
        ),
        (
            lambda t: t.estimate([5, 300], tp=1, dp=2, mode="graph", capture_sizes=512),
            "capture sizes must be a non-empty list of positive integers, got 512",
        ),
        (
            lambda t: t.estimate(
                [5, 300], tp=1, dp=2, policy="custom", active_curve=CURVE, load_shares=["a", "b"]
            ),
            "load shares need one non-negative number per EP rank (2), got ['a', 'b']",
        ),
        (
            lambda t: t.estimate(
                [5, 300], tp=1, dp=2, policy="custom", active_curve=CURVE, load_shares=3
            ),
            "load shares need one non-negative number per EP rank (2), got 3",
        ),
        (
            lambda t: t.estimate(
                [5, 300], tp=1, dp=2, policy="custom", active_curve=CURVE, load_shares=[True, True]
            ),
            "load shares need one non-negative number per EP rank (2), got [True, True]",
        ),
        (
            lambda t: t.estimate([5, 300], tp=1, dp=2, policy="random", first_step=-1),
            "random policy: first_step must be a non-negative integer, got -1",
        ),
        (
            lambda t: t.deployment(1, 2, 0).estimate([5, 300], tp=2),
            "these tables are rank 0 of TP1/DP2 (sequence_parallel=False) and estimate that "
            "deployment; got tp=2",
        ),
    ],
)
def test_a_malformed_argument_is_a_query_error_naming_it(
    tables: ComponentTables, call: Any, named: str
) -> None:
    with pytest.raises(QueryError) as caught:
        call(tables)
    assert named in str(caught.value)


def test_an_unknown_option_names_the_method_and_the_options_it_takes(
    tables: ComponentTables,
) -> None:
    with pytest.raises(
        TypeError,
        match=r"estimate_batch\(\) got an unexpected keyword argument "
        r"'bogus'; its options are \[.*'first_step'.*'seed'",
    ):
        tables.estimate_batch([[5, 300]], tp=1, dp=2, bogus=1)


def test_a_rank_told_its_own_deployment_answers_as_without_it(tables: ComponentTables) -> None:
    rank = tables.deployment(1, 2, 0)
    alone = rank.estimate([5, 300]).as_dict()
    told = rank.estimate([5, 300], tp=1, dp=2, sequence_parallel=False).as_dict()
    assert told == alone


@pytest.mark.parametrize("policy", ["random"])
def test_step_i_of_a_call_is_step_first_step_plus_i_of_the_stream(
    tables: ComponentTables, policy: str
) -> None:
    """A run asked in parts (a chunk or a step at a time) gets one call's draws (R41's
    seeded policies)."""
    steps = [[37, 300], [600, 5], [128, 128], [2000, 16]]
    whole = tables.estimate_batch(steps, tp=1, dp=2, policy=policy, seed=3).as_dicts()
    parts = tables.estimate_batch(steps[:1], tp=1, dp=2, policy=policy, seed=3).as_dicts()
    parts += tables.estimate_batch(
        steps[1:], tp=1, dp=2, policy=policy, seed=3, first_step=1
    ).as_dicts()
    assert parts == whole
    for i, step in enumerate(steps):
        one = tables.estimate(step, tp=1, dp=2, policy=policy, seed=3, first_step=i).as_dict()
        assert one == whole[i]
    # Without the offset every call is step 0 again: the draws differ.
    restarted = tables.estimate(steps[3], tp=1, dp=2, policy=policy, seed=3).as_dict()
    assert [r["M"] for r in restarted["ranks"]] != [r["M"] for r in whole[3]["ranks"]]


def _run(*args: str) -> tuple[int, list[dict[str, Any]]]:
    out = io.StringIO()
    code = main(["estimate", str(H200), "--tp", "1", "--dp", "2", *args], out=out)
    return code, [json.loads(line) for line in out.getvalue().splitlines()]


def test_a_file_with_a_bad_line_answers_its_good_lines_as_one_batch_would(
    tmp_path: Path, tables: ComponentTables
) -> None:
    """Step i of a file is its i-th step line whether or not another line is malformed: the
    fallback to answering line by line used to draw every seeded line as step 0, and to
    number lines without the blank ones."""
    clean = tmp_path / "clean.jsonl"
    clean.write_text("[37, 300]\n[1, 1]\n[600, 5]\n[1, 1]\n[128, 128]\n")
    mixed = tmp_path / "mixed.jsonl"
    mixed.write_text('[37, 300]\n\n{"tokns": [1, 2]}\n[600, 5]\nnot json\n[128, 128]\n')
    args = ("--policy", "random", "--seed", "9", "--no-events")
    code, batch = _run("--tokens", str(clean), *args)
    assert code == 0 and all("error" not in a for a in batch)
    code, lines = _run("--tokens", str(mixed), *args)
    assert code == 0
    assert len(lines) == 5
    assert lines[1]["error"] == "invalid"
    assert lines[1]["message"].startswith("line 3: unknown key 'tokns'")
    assert lines[3]["error"] == "invalid"
    assert lines[3]["message"].startswith("line 5: not JSON")
    for i in (0, 2, 4):
        assert lines[i] == batch[i]
        one = tables.estimate(
            json.loads(clean.read_text().splitlines()[i]),
            tp=1,
            dp=2,
            policy="random",
            seed=9,
            first_step=i,
        ).as_dict()
        del one["events"]
        assert json.loads(json.dumps(one)) == lines[i]
    # The file's steps continue a stream with --first-step.
    code, later = _run("--tokens", str(clean), *args, "--first-step", "4")
    assert later[0] != batch[0]
    code, tail = _run("--tokens", str(mixed), *args, "--first-step", "4")
    assert tail[0] == later[0]


def test_a_refused_step_in_a_batched_file_names_its_line(tmp_path: Path) -> None:
    steps = tmp_path / "steps.jsonl"
    steps.write_text("[5, 300]\n\n[5, 999999]\n")
    code, lines = _run("--tokens", str(steps), "--no-events")
    assert code == 0
    assert "error" not in lines[0]
    assert lines[1]["error"] == "out_of_support"
    assert lines[1]["message"].startswith("line 3: ")
    assert "step 1" not in lines[1]["message"]


def test_each_step_of_a_batch_names_only_the_tile_charges_it_ran(
    tables: ComponentTables,
) -> None:
    """Issue 18's charge note: a batch whose steps ran different vLLM blocks (format 5: a
    cost per block, some per wave) answers each step with the note its own request would
    get, not the blocks of every step."""
    steps = [[40], [300], [2048]]
    options: dict[str, Any] = {"tp": 1, "dp": 1, "policy": "random", "seed": 1}
    batch = tables.estimate_batch(steps, tile_cost_us="table", **options)
    charged = [[n for n in batch.step(i).notes if "charged" in n] for i in range(3)]
    assert len({tuple(c) for c in charged}) == 3
    assert "128 rows" in charged[2][0] and "32 rows" not in charged[2][0]
    assert "32 rows" in charged[1][0] and "128 rows" not in charged[1][0]
    answers = batch.as_dicts(events=False)
    for i, step in enumerate(steps):
        alone = tables.estimate(step, tile_cost_us="table", first_step=i, **options)
        assert batch.step(i) == alone
        assert answers[i]["notes"] == list(alone.notes)
    # The batch's own notes still say every block it charged.
    (summary,) = [n for n in batch.notes if "charged" in n]
    assert "128 rows" in summary and "32 rows" in summary
