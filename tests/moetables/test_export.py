"""Issue 13.3: exports for other simulators write what the format can express, exactly, and
refuse the rest naming it; each round-trips through the reader of its format."""

from __future__ import annotations

import csv
import io
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from moetables import ComponentTables, cli, validate_bundle
from moetables.export import ExportError, export_bundle
from moetables.export.aiconfigurator import COLUMNS, balanced_load

ROOT = Path(__file__).resolve().parents[2] / "bundles"
QWEN = "Qwen/Qwen3-30B-A3B-Instruct-2507/bf16"
HISTORICAL = ROOT / "llmservingsim-rtxpro6000" / QWEN
H200 = ROOT / "H200" / QWEN
REFERENCE = ROOT / "H200-torch-reference" / QWEN


def _queries(deployment: Any, count: int = 400) -> list[dict[str, Any]]:
    rng = np.random.default_rng(11)
    g = deployment.entry.geometry
    out: list[dict[str, Any]] = []
    for _ in range(count):
        mode = str(rng.choice(deployment.modes))
        n = int(rng.integers(1, 5000))
        if rng.random() < 0.4:
            out.append(
                {"component": str(rng.choice(deployment.components[:1])), "mode": mode, "tokens": n}
            )
        else:
            m = -(-n * g.top_k * g.local_experts // g.global_experts)  # balanced totals
            a = int(rng.integers(1, g.local_experts + 1))
            out.append(
                {
                    "component": "experts",
                    "mode": mode,
                    "tokens": n,
                    "activated_experts": a,
                    "local_assignments": m,
                }
            )
    return out


def test_llmservingsim_round_trips_a_historical_bundle_exactly(tmp_path: Path) -> None:
    """R38/R42: our historical reader answers the export exactly as the source."""
    report = export_bundle(HISTORICAL, "llmservingsim", tmp_path / "out")
    assert report.left_out == [] and report.rows > 1000
    assert validate_bundle(tmp_path / "out").ok
    source, exported = ComponentTables(HISTORICAL), ComponentTables(tmp_path / "out")
    assert exported.bundle.layout == "historical"
    for entry in source.bundle.entries:
        t = entry.target
        here = source.deployment(t.tp, t.dp, t.rank, t.sequence_parallel)
        there = exported.deployment(t.tp, t.dp, t.rank, t.sequence_parallel)
        queries = _queries(here)
        assert there.answer(queries) == here.answer(queries)
        table = next(e for e in exported.bundle.entries if e.target == t)
        assert (tmp_path / "out" / table.table_path).read_bytes() == (
            HISTORICAL / entry.table_path
        ).read_bytes()


def test_llmservingsim_refuses_tables_of_another_method_naming_why(tmp_path: Path) -> None:
    with pytest.raises(ExportError) as caught:
        export_bundle(H200, "llmservingsim", tmp_path / "out")
    problems = "\n".join(caught.value.problems)
    assert "expert_conditioning.schema is 'rotated-weight-sets-v1'" in problems
    assert "graph_attribution" in problems
    assert not (tmp_path / "out").exists()


def _rows(path: Path) -> list[dict[str, str]]:
    with path.open() as handle:
        return list(csv.DictReader(handle))


def test_aiconfigurator_rows_are_our_balanced_expert_times(tmp_path: Path) -> None:
    report = export_bundle(H200, "aiconfigurator", tmp_path / "out")
    folder = tmp_path / "out" / "moe" / "vllm" / "0.26.0"
    rows = _rows(folder / "moe_perf.txt")
    assert list(rows[0]) == list(COLUMNS)
    assert len(rows) == report.rows > 0
    tables = ComponentTables(H200)
    for row in rows:
        ep, n = int(row["moe_ep_size"]), int(row["num_tokens"])
        assert (row["framework"], row["version"], row["device"], row["moe_dtype"]) == (
            "VLLM",
            "0.26.0",
            "NVIDIA H200",
            "bfloat16",
        )
        assert row["kernel_source"] == "vllm_unquantizedfusedmoe_triton_tritonexperts"
        assert (row["hidden_size"], row["inter_size"], row["topk"], row["num_experts"]) == (
            "2048",
            "768",
            "8",
            "128",
        )
        assert (row["moe_tp_size"], row["distribution"]) == ("1", "balanced")
        times = []
        for rank in range(ep):
            deployment = tables.deployment(1, ep, rank)
            a, m = balanced_load(n, deployment.entry)
            times.append(deployment.time_us("experts", n, a, m))
        assert float(row["latency"]) == max(times) / 1000.0  # milliseconds, slowest rank
    # never extrapolated: DP1 expert rows stop at N=2048
    assert any("num_tokens [3072" in why for why in report.left_out)
    assert max(int(r["num_tokens"]) for r in rows if r["moe_ep_size"] == "1") == 2048


def test_aiconfigurator_refuses_a_reference_backend(tmp_path: Path) -> None:
    out = io.StringIO()
    code = cli.main(
        ["export", str(REFERENCE), "--format", "aiconfigurator", "--out", str(tmp_path / "out")],
        out=out,
    )
    assert code == 1
    assert "ran no vLLM (torch-reference)" in out.getvalue()


def _systems_tree(package: Path, dest: Path, export: Path, version: str) -> None:
    """AIConfigurator's packaged systems tree, linked, with our table added as a version."""

    def link_all(src: Path, dst: Path, keep: str | None) -> None:
        dst.mkdir(parents=True, exist_ok=True)
        for item in src.iterdir():
            if item.name != keep:
                (dst / item.name).symlink_to(item)

    link_all(package, dest, "data")
    link_all(package / "data", dest / "data", "h200_sxm")
    link_all(package / "data" / "h200_sxm", dest / "data" / "h200_sxm", "moe")
    link_all(package / "data/h200_sxm/moe", dest / "data/h200_sxm/moe", "vllm")
    link_all(package / "data/h200_sxm/moe/vllm", dest / "data/h200_sxm/moe/vllm", version)
    (dest / "data/h200_sxm/moe/vllm" / version).symlink_to(export / "moe" / "vllm" / version)


def test_aiconfigurator_loads_the_export_with_its_own_loader(tmp_path: Path) -> None:
    """Round trip through aiconfigurator-core 0.12.0's PerfDatabase (pinned in the dev extra)."""
    core = pytest.importorskip("aiconfigurator_core")
    from aiconfigurator_core.sdk import common, perf_database
    from aiconfigurator_core.sdk.operations.moe import MoE

    export_bundle(H200, "aiconfigurator", tmp_path / "out")
    systems = tmp_path / "systems"
    _systems_tree(Path(core.__file__).parent / "systems", systems, tmp_path / "out", "0.26.0")
    MoE.clear_cache()
    database = perf_database.get_database(
        "h200_sxm",
        "vllm",
        "0.26.0",
        systems_paths=str(systems),
        allow_unlisted_version=True,
        shared_layer=False,
    )
    assert database is not None
    MoE.load_data(database)
    loaded = database._moe_data[common.MoEQuantMode.bfloat16]["balanced"][8][128][2048][768][1]
    rows = _rows(tmp_path / "out" / "moe/vllm/0.26.0/moe_perf.txt")
    assert sum(len(by_tokens) for by_tokens in loaded.values()) == len(rows)
    for row in rows:
        got = loaded[int(row["moe_ep_size"])][int(row["num_tokens"])]["latency"]
        assert got == float(row["latency"])
    MoE.clear_cache()
