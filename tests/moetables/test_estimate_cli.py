"""``python -m moetables estimate``: one JSON answer per step, in the issue's shape (R44, R45)."""

from __future__ import annotations

import io
import json
from pathlib import Path

import pytest

from moetables.cli import main

H200 = Path(__file__).resolve().parents[2] / "bundles/H200/Qwen/Qwen3-30B-A3B-Instruct-2507/bf16"
FIXTURE = Path(__file__).parent / "data" / "cluster-fixture.yaml"
BASE = [str(H200), "--tp", "1", "--dp", "2"]


def run(*args: str) -> tuple[int, str]:
    out = io.StringIO()
    code = main(["estimate", *args], out=out)
    return code, out.getvalue()


def test_it_prints_one_answer_with_ranks_collectives_and_layer_time() -> None:
    code, text = run(*BASE, "--tokens", "5,300", "--cluster", str(FIXTURE))
    assert code == 0
    answer = json.loads(text)
    assert {"ranks", "collectives", "layer_us"} <= answer.keys()
    rank = answer["ranks"][0]
    assert {"rank", "tokens", "N", "A", "M", "components", "compute_us"} <= rank.keys()
    assert (rank["tokens"], rank["N"]) == (5, 305)
    assert set(rank["components"]) == {"gate_routing", "experts", "finalize_copy"}
    first = answer["collectives"][0]
    assert {"op", "bytes", "transfer_us", "wait_us"} <= first.keys()
    assert (first["op"], first["bytes"]) == ("all_gather", 305 * 4096)
    assert answer["layer_us"] > max(r["compute_us"] for r in answer["ranks"])


def test_it_answers_a_jsonl_file_of_steps_line_by_line(tmp_path: Path) -> None:
    steps = tmp_path / "steps.jsonl"
    steps.write_text('[4, 4]\n{"tokens": [9000, 3]}\n[100, 7]\n')
    code, text = run(*BASE, "--tokens", str(steps))
    lines = [json.loads(line) for line in text.splitlines()]
    assert code == 0 and len(lines) == 3
    assert lines[0]["padded_tokens"] == [4, 4] and lines[2]["tokens"] == [100, 7]
    assert lines[1]["error"] == "out_of_support"
    assert "line 2" in lines[1]["message"] and "rank 0 gate_routing" in lines[1]["message"]


def test_it_routes_a_histogram_from_an_expert_counts_file(tmp_path: Path) -> None:
    counts = [0] * 128
    for e in range(8):
        counts[e] = 10  # N = 10 rows, every token on experts 0..7 (all on rank 0)
    path = tmp_path / "counts.json"
    path.write_text(json.dumps(counts))
    code, text = run(
        *BASE, "--tokens", "4,6", "--policy", "histogram", "--expert-counts", str(path)
    )
    assert code == 0
    r0, r1 = json.loads(text)["ranks"]
    assert (r0["A"], r0["M"], r1["A"], r1["M"]) == (8, 80, 0, 0)


@pytest.mark.parametrize(
    ("args", "words"),
    [
        (["--tokens", "5,300", "--policy", "random", "--seed", "-1"], "seed"),
        (["--tokens", "5", "--policy", "balanced"], "one token count per DP rank (2)"),
        (["--tokens", "5,300", "--policy", "custom"], "needs an active-expert curve"),
    ],
)
def test_it_prints_a_refusal_and_fails(args: list[str], words: str) -> None:
    code, text = run(*BASE, *args)
    assert code == 1
    answer = json.loads(text)
    assert answer["error"] == "invalid" and words in answer["message"]


def test_it_names_a_bad_cluster_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    bad = tmp_path / "c.yaml"
    bad.write_text("schema: moe-cluster\nversion: 2\n")
    code, _ = run(*BASE, "--tokens", "5,300", "--cluster", str(bad))
    assert code == 1
    assert "c.yaml" in capsys.readouterr().err


def test_it_takes_a_custom_curve_and_shares_inline_and_graph_mode() -> None:
    code, text = run(
        *BASE,
        "--tokens",
        "100,100",
        "--policy",
        "custom",
        "--active-curve",
        "[[1, 8], [4096, 128]]",
        "--load-shares",
        "[0.75, 0.25]",
        "--no-events",
    )
    answer = json.loads(text)
    assert code == 0 and "events" not in answer
    assert [r["M"] for r in answer["ranks"]] == [1200, 400]
    code, text = run(*BASE, "--tokens", "3,5", "--mode", "graph")
    answer = json.loads(text)
    # The H200 contract records capture sizes 1..256: both ranks run the padded 8.
    assert code == 0 and answer["padded_tokens"] == [8, 8] and answer["table_mode"] == "eager"
