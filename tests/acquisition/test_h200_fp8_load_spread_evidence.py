"""The FP8 load-spread run on the H200 and the tile model it supports (issue 18; docs/benchmarks.md,
"FP8 expert time follows tiles at its 64-row blocks"). Every figure the section states is
recomputed from the committed raw file, and the FP8 bundle's recorded model is checked against
it: a tile charged where vLLM's FP8 block is 64 rows (the kernel never runs 128 at E = 128),
balanced answers unchanged bit for bit, the bf16 tables' 128-row models unchanged (R41)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest

from acquisition.load_spread import LoadSpreadError, attach
from bench.load_spread import kernel_report
from moetables.lookup.tables import ComponentTables
from moetables.tiles import MODEL_BLOCK_M, block_size_m, row_tiles
from tests.json_close import json_close

ROOT = Path(__file__).resolve().parents[2]
EVIDENCE = ROOT / "docs/evidence/h200-fp8-load-spread"
RAW = json.loads((EVIDENCE / "load_spread_fp8.json").read_text())


FP8 = ROOT / "bundles/H200-vllm-modular-fp8-f2/Qwen/Qwen3-30B-A3B-Instruct-2507-FP8/fp8"
BF16 = ROOT / "bundles/H200-vllm-modular-f2/Qwen/Qwen3-30B-A3B-Instruct-2507/bf16"


def test_it_is_a_complete_stable_fp8_run_whose_blocks_and_tiles_moetables_reproduces() -> None:
    results = RAW["results"]
    assert RAW["meta"]["gpu"] == "NVIDIA H200" and len(results) == 78
    assert {r["dtype"] for r in results} == {"fp8"}
    assert not any("error" in r or r["unstable"] for r in results)
    for r in results:
        block = block_size_m(r["N"], 128, 768, dtype="fp8_w8a8", block_shape=[128, 128])
        assert r["block_m"] == block == (16 if r["N"] <= 128 else 64)
        counts = np.array(r["counts"])
        assert r["tiles"] == row_tiles(counts, r["block_m"])
        assert (r["M"], r["A"], r["max"]) == (counts.sum(), (counts > 0).sum(), counts.max())


def test_tiles_explain_the_extra_time_and_the_spread_does_not() -> None:
    """R^2 of the extra time over the balanced arm on 64-row blocks: tiles 0.97, the counts'
    coefficient of variation 0.04, their max 0.19."""
    from acquisition.load_spread import rows_of

    rows = rows_of(RAW, "tp1")
    bal = {r.tokens: r for r in rows if r.distribution == "balanced"}
    spread = [r for r in rows if r.block_m >= 64 and r.distribution != "balanced"]
    y = np.array([r.b2_us - bal[r.tokens].b2_us for r in spread])
    x = np.array([r.tiles - bal[r.tokens].tiles for r in spread], dtype=float)
    total = (y - y.mean()) @ (y - y.mean())
    res = y - (x @ y) / (x @ x) * x
    assert 1 - res @ res / total == pytest.approx(0.967, abs=0.005)
    for summary, r2 in (([r.cv for r in spread], 0.040), ([r.max_count for r in spread], 0.187)):
        a = np.c_[np.ones(len(spread)), summary]
        res = y - a @ np.linalg.lstsq(a, y, rcond=None)[0]
        assert 1 - res @ res / total == pytest.approx(r2, abs=0.005)


def test_the_committed_report_is_what_the_raw_file_gives() -> None:
    committed = json.loads((EVIDENCE / "report.json").read_text())
    assert json_close(json.loads(json.dumps(kernel_report(RAW, block_m=64))), committed)


def test_fp8_time_follows_tiles_at_64_row_blocks_and_predicts_held_out_distributions() -> None:
    """0.850 us a tile over N = 256-2,048; each spread distribution held out: the median error
    to at most 1.1 %, the worst to at most 3.4 % (from 15-21 % for the two power laws)."""
    report = kernel_report(RAW, block_m=64)["tp1"]
    assert report["tile_cost_us"] == pytest.approx(0.850, abs=5e-4)
    assert (report["fit_records"], report["fit_groups"]) == (65, 5)
    held = {h["held_out"]: h for h in report["leave_one_distribution_out"]}
    assert set(held) == {"uniform", "power_law(0.6)", "power_law(1.2)"}
    for h in held.values():
        assert h["median_after"] <= h["median_before"] + 1e-12
        assert h["max_after"] < h["max_before"]
        assert h["median_after"] <= 0.0111 and h["max_after"] <= 0.0342
    for d in ("power_law(0.6)", "power_law(1.2)"):
        assert held[d]["max_before"] > 0.15 and held[d]["max_after"] < 0.026


def test_the_fp8_bundle_charges_64_row_tiles_and_keeps_balanced_answers() -> None:
    tables = ComponentTables(FP8).deployment(1, 1, 0)
    assert tables.tile_block_m == 64 and tables.fitted_tile_cost_us == 0.85
    for n in (128, 256, 1024, 2048):
        m = 8 * n
        plain = tables.time_us("experts", n, 128, m)
        assert tables.experts_time_us(n, 128, m) == plain  # bit for bit
    # 16-row blocks (N = 128) are not charged; 64-row blocks are, at the recorded cost.
    assert tables.experts_time_us(128, 128, 1024, loads="power_law(0.6)") == tables.time_us(
        "experts", 128, 128, 1024
    )
    draw = next(
        r
        for r in RAW["results"]
        if r["N"] == 1024 and r["seed"] == 0 and r["distribution"] == "uniform"
    )
    counts = np.array(draw["counts"])
    charged = tables.experts_time_us(1024, int((counts > 0).sum()), 8192, loads=counts.tolist())
    extra = row_tiles(counts, 64) - tables.balanced_tiles(1024, int((counts > 0).sum()), 8192)
    assert extra > 40
    assert charged == pytest.approx(
        tables.time_us("experts", 1024, int((counts > 0).sum()), 8192) + 0.85 * extra
    )
    # ... and the charge adds what the draw measured over its own balanced arm. Ratios, not
    # absolute times: the arms ran vLLM's Triton kernel with the unfused activation and
    # quantization kernels, the table (re-measured in session 5 under VLLM_USE_DEEP_GEMM=0)
    # the fused silu_and_mul_per_block_quant_kernel, a few per cent slower at this N.
    balanced = next(
        r
        for r in RAW["results"]
        if r["N"] == 1024 and r["distribution"] == "balanced" and r["deployment"] == "tp1"
    )
    measured = draw["b2_us"] / balanced["b2_us"]
    predicted = charged / tables.time_us("experts", 1024, int((counts > 0).sum()), 8192)
    assert measured > 1.15 and abs(predicted / measured - 1) < 0.02


def test_the_bf16_tables_keep_their_128_row_model() -> None:
    for rank in (0, 1):
        tables = ComponentTables(BF16).deployment(1, 2, rank)
        assert tables.tile_block_m == MODEL_BLOCK_M == 128
    tp1 = ComponentTables(BF16).deployment(1, 1, 0)
    assert tp1.tile_block_m == 128
    # N = 512 runs 64-row blocks in the bf16 TP1 kernel: a caller's one cost is not charged
    # there (it is a 128-row cost); the table's own 64-row cost (format 4) is.
    plain = tp1.time_us("experts", 512, 128, 4096)
    assert tp1.experts_time_us(512, 128, 4096, loads="power_law(1.2)", tile_cost_us=1.416) == (
        plain
    )
    assert tp1.tile_cost_at(64) == 0.541
    assert tp1.experts_time_us(512, 128, 4096, loads="power_law(1.2)") > plain


def test_the_estimate_charges_each_rank_at_its_own_block() -> None:
    """tile_cost_us='table' on the FP8 TP1 table: a 64-row-block step is charged 0.85 us per
    extra tile; the note names the block."""
    tables = ComponentTables(FP8)
    counts = np.array(
        [
            next(
                r["counts"]
                for r in RAW["results"]
                if r["N"] == 2048 and r["seed"] == 1 and r["distribution"] == "power_law(0.6)"
            )
        ]
    )
    steps = np.array([[2048]])
    base = tables.estimate_batch(
        steps, tp=1, dp=1, policy="histogram", expert_counts=counts, tile_cost_us="none"
    )
    charged = tables.estimate_batch(
        steps, tp=1, dp=1, policy="histogram", expert_counts=counts, tile_cost_us="table"
    )
    rank = tables.deployment(1, 1, 0)
    c = counts[0]
    extra = row_tiles(c, 64) - rank.balanced_tiles(2048, int((c > 0).sum()), int(c.sum()))
    delta = charged.components["experts"][0, 0] - base.components["experts"][0, 0]
    assert extra > 50 and delta == pytest.approx(0.85 * extra)
    assert any("at least 64 rows" in n for n in charged.notes)


def test_fp8_evidence_is_refused_on_a_bf16_bundle(tmp_path: Path) -> None:
    copy = tmp_path / "bf16"
    shutil.copytree(BF16, copy)
    with pytest.raises(LoadSpreadError, match="fp8"):
        attach(copy, RAW, ["tp1"], block_m=64)


def test_bf16_small_blocks_one_cost_holds_at_64_rows_only() -> None:
    """The bf16 TP1 kernel at N = 64-640 (docs/benchmarks.md, "Small blocks with six N"): per
    block size one cost per extra tile, fitted against the table-moved balanced reference.
    64-row blocks: about 0.6 us at both N, every held-out distribution and N to <= 1.8 % worst;
    32-row: the cost moves 0.82-1.56 us between N and the held-out worst stays 5-8 %; 16-row:
    1.89 vs 0.67 us, and leaving N = 128 out doubles its worst error."""
    import bench.small_block_tiles as sbt

    committed = json.loads((EVIDENCE / "small_blocks_by_block.json").read_text())
    kernels = [Path(k) for k in committed["kernels"]]
    blocks = sbt.block_report(ComponentTables(ROOT / sbt.BUNDLE), [ROOT / k for k in kernels])
    assert json_close(json.loads(json.dumps(blocks)), committed["blocks"])
    b64 = blocks["tp1 64"]
    assert b64["N"] == [512, 640] and b64["cost_us_all"] == pytest.approx(0.607, abs=5e-4)
    for held in (*b64["left_out_distribution"].values(), *b64["left_out_N"].values()):
        assert held["max_after"] <= 0.018 and held["max_after"] <= held["max_before"]
    b32 = blocks["tp1 32"]
    per_n = [c for c in b32["per_N_cost_us"].values() if c is not None]
    assert max(per_n) / min(per_n) > 1.8
    assert all(0.05 < h["max_after"] < 0.08 for h in b32["left_out_N"].values())
    b16 = blocks["tp1 16"]
    assert b16["per_N_cost_us"]["64"] > 2.5 * b16["per_N_cost_us"]["128"]
    assert b16["left_out_N"]["128"]["max_after"] > 2 * b16["left_out_N"]["128"]["max_before"]


def test_the_documented_command_reproduces_the_shipped_record(tmp_path: Path) -> None:
    from acquisition.load_spread import main

    copy = tmp_path / "fp8"
    shutil.copytree(FP8, copy)
    evidence = str(EVIDENCE / "load_spread_fp8.json")
    assert main([str(copy), evidence, "--block-m", "64", "--deployments", "tp1"]) == 0
    assert (copy / "meta.yaml").read_bytes() == (FP8 / "meta.yaml").read_bytes()
    spread = "tp1/moe_components/dp1_ep1_rank0_sp0/load_spread.csv"
    assert (copy / spread).read_bytes() == (FP8 / spread).read_bytes()
    with pytest.raises(SystemExit):
        main([str(copy), evidence, "--deployments", "ep16"])


def test_a_deployment_the_evidence_does_not_time_is_refused_by_name(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from acquisition.load_spread import main

    copy = tmp_path / "fp8"
    shutil.copytree(FP8, copy)
    before = (copy / "meta.yaml").read_bytes()
    with pytest.raises(SystemExit):
        main([str(copy), str(EVIDENCE / "load_spread_fp8.json"), "--deployments", "ep4"])
    assert "no timed records of deployment 'ep4'" in capsys.readouterr().err
    assert (copy / "meta.yaml").read_bytes() == before
