"""The ``captured`` policy through the layer estimate: Python API, CLI and the shared request
parser the REST API uses (issue 15 part 3; R41)."""

from __future__ import annotations

import io
import json
from pathlib import Path

import numpy as np
import pytest

from moetables import ComponentTables
from moetables.cli import main
from moetables.errors import QueryError
from moetables.estimate_query import parse_estimate_request
from moetables.profiles import RoutingProfile, write_profile

H200 = Path(__file__).resolve().parents[2] / "bundles/H200/Qwen/Qwen3-30B-A3B-Instruct-2507/bf16"


def qwen_like_profile() -> RoutingProfile:
    """E=128, top-8 (the bundle's geometry), a skewed synthetic router: experts 0..63 (rank 0 at
    EP2) are picked four times as often as the rest."""
    rng = np.random.default_rng(0)
    weights = np.r_[np.full(64, 4.0), np.ones(64)]
    steps = [64] * 30 + [300] * 10
    counts = np.zeros((len(steps), 1, 128), dtype=np.int64)
    for i, n in enumerate(steps):
        scores = np.log(weights)[None, :] + rng.gumbel(size=(n, 128))
        picked = np.argpartition(-scores, 7, axis=1)[:, :8]
        counts[i, 0] = np.bincount(picked.ravel(), minlength=128)
    return RoutingProfile.create(
        model={
            "name": "Qwen/Qwen3-30B-A3B-Instruct-2507",
            "global_experts": 128,
            "top_k": 8,
            "layers": [3],
        },
        workload={
            "prompts_sha256": "0" * 64,
            "prompts": 1,
            "prompt_tokens": 1,
            "generated_tokens": 1,
        },
        step_tokens=steps,
        counts=counts,
        router="synthetic",
        source="synthetic",
    )


def test_it_estimates_a_layer_with_the_captured_routing() -> None:
    tables = ComponentTables(H200)
    profile = qwen_like_profile()
    skewed = tables.estimate([32, 32], tp=1, dp=2, policy="captured", profile=profile, layer=3)
    balanced = tables.estimate([32, 32], tp=1, dp=2, policy="balanced")
    m = [r.M for r in skewed.ranks]
    assert sum(m) == 64 * 8
    assert m[0] > m[1] + 100  # the captured skew reaches the ranks, balanced splits evenly
    assert [r.M for r in balanced.ranks] == [256, 256]
    assert skewed.ranks[0].components["experts"] != balanced.ranks[0].components["experts"]


def test_it_takes_a_profile_file_on_the_command_line(tmp_path: Path) -> None:
    path = write_profile(qwen_like_profile(), tmp_path / "q.routing.npz")
    out = io.StringIO()
    code = main(
        [
            "estimate",
            str(H200),
            "--tp",
            "1",
            "--dp",
            "2",
            "--tokens",
            "32,32",
            "--policy",
            "captured",
            "--profile",
            str(path),
            "--layer",
            "3",
            "--profile-expectation",
            "--no-events",
        ],
        out=out,
    )
    assert code == 0, out.getvalue()
    ranks = json.loads(out.getvalue())["ranks"]
    assert ranks[0]["M"] + ranks[1]["M"] == 512 and ranks[0]["M"] > ranks[1]["M"] + 100
    out = io.StringIO()
    assert (
        main(
            [
                "estimate",
                str(H200),
                "--tp",
                "1",
                "--dp",
                "2",
                "--tokens",
                "32,32",
                "--policy",
                "captured",
                "--profile",
                str(path),
                "--layer",
                "9",
            ],
            out=out,
        )
        == 1
    )
    assert "layer 9 is not in the profile" in out.getvalue()


def test_it_takes_a_profile_files_path_in_process(tmp_path: Path) -> None:
    """Issue 15 part 3: the Python API takes a profile file as the CLI does; a rewritten file
    is read again; an id (a registry's) and a broken file are refused by name."""
    from moetables import ProfileError, read_profile

    tables = ComponentTables(H200)
    path = write_profile(qwen_like_profile(), tmp_path / "q.routing.npz")
    by_path = tables.estimate([32, 32], tp=1, dp=2, policy="captured", profile=path, layer=3)
    loaded = read_profile(path)
    assert by_path == tables.estimate(
        [32, 32], tp=1, dp=2, policy="captured", profile=loaded, layer=3
    )
    steps = np.array([[32, 32], [300, 5], [64, 64]])
    assert (
        tables.estimate_batch(
            steps, tp=1, dp=2, policy="captured", profile=str(path), seed=4
        ).as_dicts()
        == tables.estimate_batch(
            steps, tp=1, dp=2, policy="captured", profile=loaded, seed=4
        ).as_dicts()
    )
    base = qwen_like_profile()
    moved_skew = RoutingProfile.create(  # the skew moves to rank 1
        model=base.meta["model"],
        workload=base.meta["workload"],
        step_tokens=base.step_tokens,
        counts=base.counts[:, :, ::-1],
        router="synthetic",
        source="synthetic",
    )
    write_profile(moved_skew, path)
    moved = tables.estimate([32, 32], tp=1, dp=2, policy="captured", profile=path, layer=3)
    assert moved.ranks[1].M > moved.ranks[0].M + 100
    with pytest.raises(QueryError, match="profile 3 names a published profile"):
        tables.estimate([32, 32], tp=1, dp=2, policy="captured", profile=3)
    (tmp_path / "bad.routing.npz").write_bytes(b"not a zip")
    with pytest.raises(ProfileError, match=r"bad\.routing\.npz"):
        tables.estimate(
            [32, 32], tp=1, dp=2, policy="captured", profile=tmp_path / "bad.routing.npz"
        )


def test_it_validates_a_profile_file_on_the_command_line(tmp_path: Path) -> None:
    path = write_profile(qwen_like_profile(), tmp_path / "q.routing.npz")
    out = io.StringIO()
    assert main(["validate", str(path)], out=out) == 0
    said = out.getvalue()
    assert said.startswith(f"ok: {path}: routing profile of Qwen/Qwen3-30B-A3B-Instruct-2507")
    assert "(E=128, top-8), 1 layers, 40 steps, 4920 tokens, router synthetic" in said
    broken = tmp_path / "broken.routing.npz"
    broken.write_bytes(path.read_bytes()[:-40])
    out = io.StringIO()
    assert main(["validate", str(broken)], out=out) == 1
    assert out.getvalue().startswith(f"invalid: {broken}\n  - ")


def test_it_reads_an_inline_profile_and_names_what_is_wrong() -> None:
    inline = qwen_like_profile().to_json()
    request = parse_estimate_request(
        {
            "tp": 1,
            "dp": 2,
            "tokens": [4, 4],
            "policy": "captured",
            "profile": inline,
            "profile_draw": "expectation",
        }
    )
    assert request.profile is not None and request.captured_expectation
    with pytest.raises(QueryError, match="profile: the captured policy needs"):
        parse_estimate_request({"tp": 1, "dp": 2, "tokens": [4, 4], "policy": "captured"})
    with pytest.raises(QueryError, match="layer: belongs to the captured policy"):
        parse_estimate_request({"tp": 1, "dp": 2, "tokens": [4, 4], "layer": 1})
    with pytest.raises(QueryError, match="a profile id is resolved by the registry"):
        parse_estimate_request(
            {"tp": 1, "dp": 2, "tokens": [4, 4], "policy": "captured", "profile": 7}
        )
    broken = dict(inline, counts=[[[1]]])
    with pytest.raises(QueryError, match="profile: counts"):
        parse_estimate_request(
            {"tp": 1, "dp": 2, "tokens": [4, 4], "policy": "captured", "profile": broken}
        )


def test_it_gives_each_ranks_expert_counts_when_drawn() -> None:
    """A drawn captured step is a histogram: each rank's per-expert counts can be answered."""
    from moetables.estimate_query import answer_estimate

    tables = ComponentTables(H200)
    inline = qwen_like_profile().to_json()
    base = {
        "tp": 1,
        "dp": 2,
        "tokens": [32, 32],
        "policy": "captured",
        "profile": inline,
        "layer": 3,
        "rank_expert_counts": True,
        "events": False,
    }
    answer = answer_estimate(tables, parse_estimate_request(base), None)
    assert isinstance(answer, dict)
    for rank in answer["ranks"]:
        assert len(rank["expert_counts"]) == 64 and sum(rank["expert_counts"]) == rank["M"]
    with pytest.raises(QueryError, match="expectation gives no per-expert counts"):
        parse_estimate_request(dict(base, profile_draw="expectation"))
