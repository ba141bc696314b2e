"""python -m moetables validate | info | lookup, run as a user runs them."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def run(*args: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "moetables", *args],
        cwd=REPO,
        input=stdin,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def test_it_validates_the_shared_bundle_and_notes_what_is_absent(shared_copy: Path) -> None:
    done = run("validate", str(shared_copy))
    assert done.returncode == 0, done.stdout + done.stderr
    assert "2 deployment tables, 1028 rows" in done.stdout
    assert "tp1/skew_fit.csv, which is not in this bundle" in done.stdout


def test_it_exits_1_with_each_problem_named(shared_copy: Path) -> None:
    for table in shared_copy.glob("tp1/moe_components/*/components.csv"):
        table.write_bytes(table.read_bytes() + b"\r\n")
    done = run("validate", str(shared_copy))
    assert done.returncode == 1
    assert done.stdout.count("table checksum mismatch") == 2


def test_it_describes_support_as_json(current_bundle: Path) -> None:
    done = run("info", str(current_bundle))
    info = json.loads(done.stdout)
    assert info["valid"] and info["layout"] == "current" and info["hardware"] == "TESTGPU"
    dp2 = [d for d in info["deployments"] if d["target"]["dp"] == 2]
    assert dp2[0]["support"]["tokens"] == [1, 64]
    assert dp2[0]["components"] == ["gate_routing", "experts", "finalize_copy"]


def test_it_answers_one_line_per_query_in_order(shared_copy: Path, tmp_path: Path) -> None:
    queries = tmp_path / "q.jsonl"
    queries.write_text(
        '{"component": "experts", "tokens": 3, "activated_experts": 6, "local_assignments": 12}\n'
        "{broken\n"
        '{"component": "gate_routing", "tokens": 99999}\n'
        '{"component": "gate_routing", "mode": "graph", "tokens": 1}\n'
    )
    done = run(
        "lookup",
        str(shared_copy),
        "--tp",
        "1",
        "--dp",
        "2",
        "--rank",
        "0",
        "--queries",
        str(queries),
    )
    assert done.returncode == 0, done.stderr
    answers = [json.loads(line) for line in done.stdout.splitlines()]
    assert answers[0] == {"time_us": 55.358999999999995}
    assert answers[1]["error"] == "invalid"
    assert answers[2]["error"] == "out_of_support"
    assert answers[3]["time_us"] > 0


def test_it_fails_clearly_for_an_uncovered_deployment(shared_copy: Path) -> None:
    done = run(
        "lookup",
        str(shared_copy),
        "--tp",
        "1",
        "--dp",
        "1",
        "--rank",
        "0",
        "--queries",
        "-",
        stdin="",
    )
    assert done.returncode == 1
    assert "no table for TP1/DP1/EP1 rank 0" in done.stderr


def test_a_reader_that_closes_the_pipe_ends_it_quietly() -> None:
    """`python -m moetables info BUNDLE | head` (QA, session 5): the closed pipe ends the
    command with status 1 and no traceback on stderr."""
    bundle = REPO / "bundles/H200-vllm-modular-f2k/Qwen/Qwen3-30B-A3B-Instruct-2507/bf16"
    proc = subprocess.Popen(
        [sys.executable, "-m", "moetables", "info", str(bundle)],
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    assert proc.stdout is not None and proc.stderr is not None
    proc.stdout.close()  # before the command writes anything: its first write meets EPIPE
    err = proc.stderr.read().decode()
    assert proc.wait(timeout=120) == 1
    assert "Traceback" not in err and "BrokenPipeError" not in err, err


def test_info_names_the_kernel_segments_of_a_kernel_step_table() -> None:
    """QA, session 5: a kernel-step table answers each N from its own segment only (R40), so
    `info` lists the segments beside the support box; other tables list none."""
    from moetables.lookup import ComponentTables

    f2k = REPO / "bundles/H200-vllm-modular-f2k/Qwen/Qwen3-30B-A3B-Instruct-2507/bf16"
    done = run("info", str(f2k))
    assert done.returncode == 0, done.stderr
    for item in json.loads(done.stdout)["deployments"]:
        t = item["target"]
        switches = ComponentTables(f2k).deployment(t["tp"], t["dp"], t["rank"]).kernel_switches
        assert switches is not None
        segments = item["kernel_segments"]
        top = item["support"]["tokens"][1]
        assert [s["tokens"][1] for s in segments[:-1]] == switches.switches(top)
        assert segments[0]["tokens"][0] == 1 and segments[-1]["tokens"][1] == top
        assert all(s["measured_tokens"] is not None for s in segments)
        assert all("BLOCK_SIZE_M=" in s["kernel"] for s in segments)
    f2 = REPO / "bundles/H200-vllm-modular-f2/Qwen/Qwen3-30B-A3B-Instruct-2507/bf16"
    plain = json.loads(run("info", str(f2)).stdout)["deployments"]
    assert all("kernel_segments" not in item for item in plain)


def test_info_names_the_contracts_vllm_version_and_the_per_block_tile_costs() -> None:
    """QA, session 5: current-layout bundles printed ``"vllm_version": null`` although every
    contract names it; the recorded per-block row-tile costs (issue 18) are listed too."""
    from moetables.bundle import open_bundle

    for name in ("H200-vllm-modular-f2k", "H200-vllm-modular-tp2-f2", "H200-vllm-live-f2k"):
        path = REPO / f"bundles/{name}/Qwen/Qwen3-30B-A3B-Instruct-2507/bf16"
        done = run("info", str(path))
        assert done.returncode == 0, done.stderr
        info = json.loads(done.stdout)
        assert info["layout"] == "current" and info["vllm_version"] == "0.26.0", name
        bundle = open_bundle(path)
        for item, entry in zip(info["deployments"], bundle.entries, strict=True):
            models = entry.expert_loads.models
            assert [c["block_m"] for c in item.get("tile_costs", [])] == [m.block_m for m in models]
            assert [c["tile_cost_us"] for c in item.get("tile_costs", [])] == [
                getattr(m, "tile_cost_us", None) for m in models
            ]
            assert [c.get("wave_cost_us") for c in item.get("tile_costs", [])] == [
                getattr(m, "wave_cost_us", None) for m in models
            ]


def test_a_bundle_wide_vllm_version_needs_every_contract_to_agree() -> None:
    from moetables.describe import contracts_vllm_version

    assert contracts_vllm_version([{"backend": {"vllm_version": "0.26.0"}}] * 2) == "0.26.0"
    assert (
        contracts_vllm_version([{"vllm_version": "0.26.0"}, {"versions": {"vllm": "0.25"}}]) is None
    )
    assert contracts_vllm_version([{"vllm_version": "0.26.0"}, {}]) is None
