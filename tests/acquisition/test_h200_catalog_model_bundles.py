"""The shipped H200 bundles of Qwen3-235B-A22B, DeepSeek-V2-Lite and OLMoE (sessions 12-16).

Measured on one H200 (GPU-2f3da545) by `scripts/h200_models.sh more` and two direct
`python -m acquisition slice` calls (docs/h200-runs.md, "Session 12"), and the rule-v4 DP2/EP2
ranks beside DeepSeek-V2-Lite's and OLMoE's DP1 tables on a third (GPU-fa374c99, "Session 13"),
and Qwen3-235B's rule-v4 DP4/EP4 ranks beside its DP1 table on a fourth (GPU-0d46a40f,
"Session 15") and its DP8/EP8 ranks on a fifth (GPU-076d5092, "Session 16"), all moved in with
`python -m acquisition.transplant`; evidence in
docs/benchmarks.md, "Three more catalog models", from `bench/catalog_models_evidence.py`.
These checks fail if a bundle is edited, truncated or mislabelled, if DeepSeek-V2-Lite's
gate_routing stops being vLLM's grouped router (what DeepseekV2MoE builds), or if a lookup
answers outside what was measured.
"""

from __future__ import annotations

import statistics
import tarfile
from pathlib import Path

import pytest
from bundle_checks import checked_rows, shared_row_ratios

from bench.bundle_evidence import eager_rows, ratios
from moetables import ComponentTables, CoverageError
from moetables.bundle import load_table, open_bundle, validate_bundle

ROOT = Path(__file__).resolve().parents[2]
Q235 = "Qwen/Qwen3-235B-A22B"
DSV2 = "deepseek-ai/DeepSeek-V2-Lite"
OLMOE = "allenai/OLMoE-1B-7B-0924"
# The two lent H200s: calls 12-15 on the first, 42-43 on the second (docs/h200-runs.md).
FIRST = "2f3da545-cae5-7261-ea4c-f1716cc46c34"
SECOND = "3efb49b2-4bf5-f57f-e525-662a8ef61068"
THIRD = "fa374c99-64ad-fba1-f501-afceafbb3e51"  # session 13's rule-v4 DP2/EP2 ranks
FOURTH = "0d46a40f-0576-bc48-cbed-3b6949a86910"  # session 15's rule-v4 DP4/EP4 ranks
FIFTH = "076d5092-f3dd-9ee4-0cce-55e207d229f1"  # session 16's rule-v4 DP8/EP8 ranks
DP8 = {f"dp8_ep8_rank{r}_sp0": 328 for r in range(8)}
DP4 = {f"dp4_ep4_rank{r}_sp0": 357 for r in range(4)}
# (bundle folder, model): deployment -> rows, as the calls published them
SHIPPED = {
    ("H200-vllm-modular-f2k4", Q235): {
        "dp1_ep1_rank0_sp0": 386,
        **{f"dp4_ep4_rank{r}_sp0": 1743 for r in range(4)},
        **{f"dp8_ep8_rank{r}_sp0": 1635 for r in range(8)},
    },
    ("H200-vllm-modular-dp8-f4", Q235): DP8,
    ("H200-vllm-modular-f2k4", DSV2): {
        "dp1_ep1_rank0_sp0": 586,
        "dp2_ep2_rank0_sp0": 1616,
        "dp2_ep2_rank1_sp0": 1616,
    },
    ("H200-vllm-modular-dp2-f4", DSV2): {"dp2_ep2_rank0_sp0": 339, "dp2_ep2_rank1_sp0": 339},
    ("H200-vllm-modular-f2k4", OLMOE): {
        "dp1_ep1_rank0_sp0": 315,
        "dp2_ep2_rank0_sp0": 1314,
        "dp2_ep2_rank1_sp0": 1314,
    },
    ("H200-vllm-live-f2k4", OLMOE): {"dp1_ep1_rank0_sp0": 315},
    ("H200-vllm-modular-dp2-f4", OLMOE): {"dp2_ep2_rank0_sp0": 314, "dp2_ep2_rank1_sp0": 314},
    ("H200-vllm-modular-dp4-f4", Q235): DP4,
}
ON_SECOND = {("H200-vllm-modular-dp2-f4", OLMOE), ("H200-vllm-modular-dp4-f4", Q235)}
MEASURED_ON = {key: SECOND if key in ON_SECOND else FIRST for key in SHIPPED}
# The plan flags each bundle's command line carries.
PLANS = {
    "H200-vllm-modular-f2k4": "--moe-grid-factor 2 --moe-kernel-steps auto",
    "H200-vllm-live-f2k4": "--moe-grid-factor 2 --moe-kernel-steps auto",
    "H200-vllm-modular-dp8-f4": "--moe-grid-factor 4 --moe-kernel-steps off",
    "H200-vllm-modular-dp2-f4": "--moe-grid-factor 4 --moe-kernel-steps off",
    "H200-vllm-modular-dp4-f4": "--moe-grid-factor 4 --moe-kernel-steps off",
}
IDS = [f"{folder}-{model.split('/')[1]}" for folder, model in SHIPPED]


def _root(folder: str, model: str) -> Path:
    return ROOT / "bundles" / folder / model / "bf16"


@pytest.mark.parametrize("key", list(SHIPPED), ids=IDS)
def test_each_bundle_validates_and_names_what_measured_it(key: tuple[str, str]) -> None:
    """R38 checksums; R18 every published expert point passed B/2B at 3 %; the contract names
    the GPU, software and the exact command (the project's standard for shipped timings)."""
    folder, model = key
    report = validate_bundle(_root(folder, model))
    assert report.ok, report.problems
    bundle = open_bundle(_root(folder, model))
    assert (bundle.hardware, bundle.model) == ("H200", model)
    assert checked_rows(bundle) == SHIPPED[key]
    for entry in bundle.entries:
        provenance = entry.contract["provenance"]
        later = folder == "H200-vllm-modular-f2k4" and entry.target.dp > 1
        uuid, day = {
            2: (THIRD, "2026-12-02T14:"),
            4: (FOURTH, "2026-12-03T14:"),
            8: (FIFTH, "2026-12-04T19:"),
        }.get(entry.target.dp if later else 0, (MEASURED_ON[key], "2026-12-02T08:"))
        assert provenance["uuid"] == uuid
        assert provenance["device_name"] == "NVIDIA H200"
        assert provenance["torch_version"] == "2.11.0+cu130"
        # session 12's calls ran 08:23-08:47 UTC, 13's 14:08-14:18, 15's 14:25-14:34, 16's
        # 19:22-19:40
        assert provenance["started_at"].startswith(day)
        command = provenance["command_line"]
        assert command.startswith(f"python -m acquisition slice {model} ")
        assert " --hardware H200 " in command
        assert PLANS[folder] in command
        assert entry.contract["backend"]["vllm_version"] == "0.26.0"


def test_the_dp4_rank_that_failed_its_control_six_times_was_resumed_and_passed() -> None:
    """Call 42 left Qwen3-235B's DP4 rank 1 unpublished (experts:8192:8:65536 failed six
    B/2B attempts); call 43 ran the same command, which measured only that point."""
    bundle = open_bundle(_root("H200-vllm-modular-dp4-f4", Q235))
    contexts = {
        e.target.rank: len(e.contract["provenance"]["acquisition_contexts"]) for e in bundle.entries
    }
    assert contexts == {0: 1, 1: 2, 2: 1, 3: 1}


def test_the_rule_v4_dp4_ranks_finished_at_the_resumed_call() -> None:
    """Session 15's call 9 measured all four ranks; five expert points of ranks 1-3 failed six
    B/2B attempts; call 10 (the same command) measured only those and published the three."""
    bundle = open_bundle(_root("H200-vllm-modular-f2k4", Q235))
    contexts = {
        e.target.rank: len(e.contract["provenance"]["acquisition_contexts"])
        for e in bundle.entries
        if e.target.dp == 4
    }
    assert contexts == {0: 1, 1: 2, 2: 2, 3: 2}
    transplanted = bundle.meta["transplanted"]
    moved = {m["deployment"] for m in transplanted if m["deployment"].startswith("tp1/dp4")}
    assert moved == {f"tp1/dp4_ep4_rank{r}_sp0" for r in range(4)}


def test_the_rule_v4_dp8_ranks_were_measured_over_three_resumed_calls() -> None:
    """Session 16: call 4 measured ranks 0-3 (`--ranks 0,1,2,3`) and published 0 and 2; call 5
    (all ranks) finished 1 and 3 and measured 4-7, publishing 5 and 7; call 6 (the same
    command) finished 4 and 6. Each contract lists the calls that measured its points."""
    bundle = open_bundle(_root("H200-vllm-modular-f2k4", Q235))
    contexts = {
        e.target.rank: len(e.contract["provenance"]["acquisition_contexts"])
        for e in bundle.entries
        if e.target.dp == 8
    }
    assert contexts == {0: 1, 1: 2, 2: 1, 3: 2, 4: 2, 5: 1, 6: 2, 7: 1}
    transplanted = bundle.meta["transplanted"]
    moved = {m["deployment"] for m in transplanted if m["deployment"].startswith("tp1/dp8")}
    assert moved == {f"tp1/dp8_ep8_rank{r}_sp0" for r in range(8)}


@pytest.mark.parametrize("key", list(SHIPPED), ids=IDS)
def test_the_samples_archive_beside_each_bundle_holds_every_target(key: tuple[str, str]) -> None:
    folder, model = key
    with tarfile.open(ROOT / "bundles" / folder / model / "bf16.acquisition-samples.tar.gz") as tar:
        names = tar.getnames()
    assert {"progress.jsonl", "run.log", "phases.jsonl"} <= set(names)
    assert not [n for n in names if n.endswith(".lock")]
    samples = {n.split("/")[-2] for n in names if n.endswith("samples.jsonl")}
    assert set(SHIPPED[key]) == samples


@pytest.mark.parametrize(("dp", "folder"), [(4, "dp4-f4"), (8, "dp8-f4")])
def test_the_rule_v4_rank_tables_hold_the_factor_4_plan_and_agree_there(
    dp: int, folder: str
) -> None:
    """Every row of the factor-4 DP4/EP4 and DP8/EP8 ranks (other H200s, session 12) was
    measured again (sessions 15 and 16); the expert rows agree within 0.5 % at the median,
    each component within 2 %."""
    new = open_bundle(_root("H200-vllm-modular-f2k4", Q235))
    old = open_bundle(_root(f"H200-vllm-modular-{folder}", Q235))
    for entry in (e for e in new.entries if e.target.dp == dp):
        for component, values in shared_row_ratios(new, old, entry.target).items():
            median = statistics.median(values)
            assert abs(median - 1) < (0.005 if component == "experts" else 0.02), component


def test_deepseek_v2_lite_was_routed_by_vllms_grouped_router() -> None:
    """DeepseekV2MoE asks for use_grouped_topk=True; the contracts record the router that ran
    and the routing the catalog read, and the routed path only (two shared experts)."""
    for folder in ("H200-vllm-modular-f2k4", "H200-vllm-modular-dp2-f4"):
        bundle = open_bundle(_root(folder, DSV2))
        for entry in bundle.entries:
            backend = entry.contract["backend"]
            assert backend["router_class"].endswith("grouped_topk_router.GroupedTopKRouter")
            assert backend["routing"]["grouped_topk"] == {"num_expert_group": 1, "topk_group": 1}
            assert backend["shared_experts"]["measured"] is False
            assert backend["shared_experts"]["intermediate_size"] == 2816
    for model in (Q235, OLMOE):
        entry = open_bundle(_root("H200-vllm-modular-f2k4", model)).entries[0]
        assert entry.contract["backend"]["router_class"].endswith("FusedTopKRouter")
        assert "grouped_topk" not in entry.contract["backend"]["routing"]


def test_the_grouped_router_costs_more_than_twice_the_fused_top_k() -> None:
    """The same gate GEMM (2,048 -> 64 logits) in both models: the router is the difference,
    so a table timed with the plain router would have been about half DeepSeek's real time."""

    def gate(model: str) -> dict[int, float]:
        bundle = open_bundle(_root("H200-vllm-modular-f2k4", model))
        rows = eager_rows(load_table(bundle.root, bundle.entries[0]))
        return {k[1]: t for k, t in rows.items() if k[0] == "gate_routing"}

    grouped, plain = gate(DSV2), gate(OLMOE)
    assert sorted(grouped) == sorted(plain)
    assert all(grouped[n] > 2.0 * plain[n] for n in grouped)


def test_olmoe_live_and_modular_agree_at_the_points_both_measured() -> None:
    def rows(folder: str) -> dict[tuple[str, int, int, int], float]:
        bundle = open_bundle(_root(folder, OLMOE))
        return eager_rows(load_table(bundle.root, bundle.entries[0]))

    live, modular = rows("H200-vllm-live-f2k4"), rows("H200-vllm-modular-f2k4")
    for component in ("gate_routing", "experts"):
        values = ratios(live, modular, component)
        assert len(values) > 10
        assert abs(statistics.median(values) - 1) < 0.015
        assert max(abs(v - 1) for v in values) < 0.06


def test_lookups_answer_inside_support_and_refuse_outside() -> None:
    rank3 = ComponentTables(_root("H200-vllm-modular-dp8-f4", Q235)).deployment(tp=1, dp=8, rank=3)
    # a rank's expert rows reach N = 16,384 (2,048 rows from each of the 8 DP ranks)
    assert rank3.time_us("experts", 6000, 16, 6000) > 0
    with pytest.raises(CoverageError):
        rank3.time_us("experts", 20000, 16, 20000)
    dp1 = ComponentTables(_root("H200-vllm-modular-f2k4", DSV2)).deployment(tp=1, dp=1, rank=0)
    assert dp1.time_us("gate_routing", 700) > 0
    with pytest.raises(CoverageError):
        dp1.time_us("gate_routing", 4096)
