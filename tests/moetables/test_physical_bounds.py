"""Physical plausibility of every shipped expert row (issue 20, item 5).

Each expert row's time must be at least the time to read its A active experts' weights once at
the GPU's peak memory bandwidth, and at least its gated-MLP FLOPs at the dense tensor-core peak
(``moetables.bounds``, figures in ``moetables.hardware``). A row below either bound is a
measurement error (cache-resident weights, a router that did not route as planned); R17's
rotated weight banks exist to prevent the first, R20's explicit routing stimulus the second.
R33: ``expert_weight_bytes`` counts weights and scales, so it may exceed the weights' bytes.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from moetables.bounds import (
    BoundViolation,
    entry_bounds,
    expert_weights,
    table_violations,
    tightest,
)
from moetables.bundle import load_table, open_bundle, write_bundle
from moetables.errors import BundleError
from moetables.geometry import MoeTarget
from moetables.hardware import HARDWARE, hardware_spec

from .conftest import HEADER, REPO, make_spec

BUNDLES = REPO / "bundles"
MODEL = "Qwen/Qwen3-30B-A3B-Instruct-2507/bf16"
# The bundles bundles/README.md lists; discovery below must find at least these.
NAMED = (
    "llmservingsim-rtxpro6000",
    "H200",
    "H200-torch-reference",
    "H200-vllm-live",
    "H200-vllm-live-f2",
    "H200-vllm-modular-f2",
    "H200-vllm-modular-dp4-f4",
    "H200-vllm-modular-dp8-f4",
    "H200-vllm-modular-fp8-f2",
    "H200-vllm-live-fp8-f2",
    "H200-vllm-modular-tp2-f2",
    "H200-vllm-modular-f2k",
    "H200-vllm-live-f2k",
)

# Rows of shipped tables known to be below a bound, each with the reason, keyed by
# (bundle folder, table path, mode, N, A, M). Empty: on 2026-12-01 no shipped row is below
# either bound (the closest, vllm-modular DP1 at small N with all 128 experts active, runs at
# 87 % of the H200's peak bandwidth). A new violation fails the test; so does a listed one that
# is no longer there (the list must stay true).
KNOWN_VIOLATIONS: dict[tuple[str, str, str, int, int, int], str] = {}


def _shipped() -> list[Path]:
    return sorted(meta.parent for meta in BUNDLES.rglob("meta.yaml"))


def test_it_finds_every_bundle_the_readme_names() -> None:
    """Item 5: the check covers every shipped bundle, both layouts."""
    found = {p.relative_to(BUNDLES).parts[0] for p in _shipped()}
    assert set(NAMED) <= found, f"missing from bundles/: {set(NAMED) - found}"
    layouts = {open_bundle(p).layout for p in _shipped()}
    assert layouts == {"current", "historical"}


@pytest.mark.parametrize("root", _shipped(), ids=lambda p: str(p.relative_to(BUNDLES)))
def test_it_finds_no_shipped_expert_row_faster_than_physics(root: Path) -> None:
    """Item 5 (R17, R20): no expert row below its weight-read or tensor-core bound."""
    bundle = open_bundle(root)
    folder = str(root.relative_to(BUNDLES))
    new: list[str] = []
    seen: set[tuple[str, str, str, int, int, int]] = set()
    checked = 0
    for entry in bundle.entries:
        bounds = entry_bounds(bundle, entry)
        table = load_table(bundle.root, entry)
        checked += int((table.component == "experts").sum())
        for violation in table_violations(bounds, entry, table):
            key = (folder, *violation.key)
            seen.add(key)
            if key not in KNOWN_VIOLATIONS:
                new.append(f"{folder}: {violation}")
    assert checked > 0
    assert not new, "expert rows below a physical bound:\n" + "\n".join(new)
    stale = [k for k in KNOWN_VIOLATIONS if k[0] == folder and k not in seen]
    assert not stale, f"listed as known violations but no longer below a bound: {stale}"


def test_it_computes_both_bounds_from_the_h200_contract() -> None:
    """Item 5: H200 4.8 TB/s, 989.5 dense BF16 TFLOPS; Qwen3-30B-A3B experts H=2048, I=768."""
    root = BUNDLES / "H200-vllm-modular-f2" / MODEL
    bundle = open_bundle(root)
    entry = bundle.entries[0]
    bounds = entry_bounds(bundle, entry)
    assert bounds.weights.bytes_per_expert == 3 * 2048 * 768 * 2
    assert any("expert_layout" in note for note in bounds.weights.notes)
    # 128 experts x 9,437,184 bytes / 4.8e12 B/s
    assert float(bounds.memory_us(128)) == pytest.approx(128 * 9_437_184 / 4.8e12 * 1e6)
    assert float(bounds.memory_us(128)) == pytest.approx(251.66, abs=0.01)
    # 2 x 16,384 x 2,048 x (3 x 768) FLOPs / 989.5e12
    assert float(bounds.compute_us(16_384)) == pytest.approx(
        2 * 16_384 * 2048 * 3 * 768 / 989.5e12 * 1e6
    )
    # the tightest shipped row: N=32, A=128, M=256 at 87 % of the peak bandwidth
    table = load_table(bundle.root, entry)
    row = (table.tokens == 32) & (table.activated_experts == 128) & (table.component == "experts")
    measured = float(table.time_us[row][0])
    assert tightest(bounds, 128, 256, measured) == pytest.approx(251.658 / measured, rel=1e-4)
    assert 0.8 < tightest(bounds, 128, 256, measured) < 1.0


def test_it_reads_the_historical_contract_and_says_what_it_assumes() -> None:
    """Item 5: the LLMServingSim layout records H, I, dtype and bytes, not weight shapes."""
    bundle = open_bundle(BUNDLES / "llmservingsim-rtxpro6000" / MODEL)
    entry = bundle.entries[0]
    weights = expert_weights(entry)
    assert (weights.hidden, weights.intermediate, weights.dtype) == (2048, 768, "bfloat16")
    assert weights.local_experts == 64
    assert any("assumed" in note for note in weights.notes)
    assert any("agrees" in note for note in weights.notes)  # 603,979,776 bytes recorded
    bounds = entry_bounds(bundle, entry)
    assert bounds.hardware.label == "RTXPRO6000"
    assert float(bounds.memory_us(64)) == pytest.approx(64 * 9_437_184 / 1.792e12 * 1e6)


def _h200_contract(**extra: object) -> dict[str, object]:
    return {
        "hardware": "H200",
        "geometry": {"expert_hidden_size": 64, "expert_intermediate_size": 32, "dtype": "bfloat16"},
        "backend": {"dtypes": {"expert_weights": "bfloat16"}},
        **extra,
    }


def _write(tmp_path: Path, contract_extra: dict[str, object], slow: float) -> Path:
    """A one-entry H200 bundle whose expert times are ``slow`` x the larger bound."""
    target = MoeTarget.for_rank(1, 1, 0)
    spec = make_spec(target)
    contract = {**spec.contract, **contract_extra}
    per_expert = 3 * 64 * 32
    rows = []
    for component, mode, n, a, m, t in spec.rows:
        if component == "experts":
            memory = a * per_expert * 2 / 4.8e12 * 1e6
            compute = 2 * m * per_expert / 989.5e12 * 1e6
            t = slow * max(memory, compute)
        rows.append((component, mode, n, a, m, t))
    dest = tmp_path / "b"
    write_bundle(
        dest,
        {**HEADER, "hardware": "H200"},
        [dataclasses.replace(spec, contract=contract, rows=rows)],
    )
    return dest


def test_it_names_bundle_table_row_and_both_bounds_of_a_row_below(tmp_path: Path) -> None:
    """Item 5: a row at 0.9 x its bound fails, with table, (N, A, M) and both bounds named."""
    root = _write(tmp_path, _h200_contract(), slow=0.9)
    bundle = open_bundle(root)
    entry = bundle.entries[0]
    found = table_violations(entry_bounds(bundle, entry), entry, load_table(root, entry))
    experts = int((load_table(root, entry).component == "experts").sum())
    assert len(found) == experts
    text = str(found[0])
    assert entry.table_path in text and "N=" in text and "A=" in text and "M=" in text
    assert "memory bound" in text and "compute bound" in text
    assert isinstance(found[0], BoundViolation)


def test_it_passes_rows_at_or_above_their_bounds(tmp_path: Path) -> None:
    """Item 5: exactly at the bound is physically possible (peak), so it passes."""
    root = _write(tmp_path, _h200_contract(), slow=1.0001)
    bundle = open_bundle(root)
    entry = bundle.entries[0]
    assert table_violations(entry_bounds(bundle, entry), entry, load_table(root, entry)) == []


def test_it_refuses_a_contract_whose_recorded_bytes_contradict_its_geometry(
    tmp_path: Path,
) -> None:
    """Item 5, R33: bytes come from dtypes and geometry; a smaller recorded total contradicts them."""
    root = _write(tmp_path, _h200_contract(expert_weight_bytes=100), slow=2.0)
    bundle = open_bundle(root)
    with pytest.raises(BundleError, match="expert_weight_bytes"):
        entry_bounds(bundle, bundle.entries[0])


def test_it_refuses_an_unknown_gpu_or_weight_dtype(tmp_path: Path) -> None:
    """Item 5: no figures, no bounds: never a guessed bandwidth or rate."""
    with pytest.raises(KeyError, match="no peak figures"):
        hardware_spec("TESTGPU")
    with pytest.raises(KeyError, match="recorded as device"):
        hardware_spec("H200", "NVIDIA H100 80GB HBM3")
    with pytest.raises(ValueError, match="no tensor-core rate"):
        HARDWARE["H200"].dense_flops("int4")
    contract = _h200_contract()
    contract["backend"] = {"dtypes": {"expert_weights": "int4"}}
    root = _write(tmp_path, contract, slow=2.0)
    bundle = open_bundle(root)
    with pytest.raises(BundleError, match="unknown weight dtype"):
        entry_bounds(bundle, bundle.entries[0])


def test_every_hardware_figure_cites_its_source() -> None:
    """Item 5: each GPU's figures say where they come from."""
    for spec in HARDWARE.values():
        assert spec.sources and all(spec.sources)
        assert spec.dense_fp8_flops >= spec.dense_bf16_flops > 0
        assert spec.memory_bandwidth_bytes_per_s > 0


def test_fp8_contracts_are_bounded_with_fp8_bytes_their_scales_and_the_fp8_rate(
    tmp_path: Path,
) -> None:
    """Item 5 for FP8 tables (issue 20, item 4): one byte per weight plus the recorded float32
    block scales against the bandwidth, and the dense FP8 tensor-core rate for the FLOPs."""
    contract = _h200_contract()
    contract["backend"] = {
        "dtypes": {"expert_weights": "float8_e4m3fn", "weight_scales": "float32"},
        "expert_layout": {
            "w13": {"shape": [16, 64, 64]},
            "w2": {"shape": [16, 64, 32]},
            "w13_scale": {"shape": [16, 1, 1]},
            "w2_scale": {"shape": [16, 1, 1]},
        },
    }
    root = _write(tmp_path, contract, slow=2.0)
    bundle = open_bundle(root)
    bounds = entry_bounds(bundle, bundle.entries[0])
    assert bounds.weights.dtype == "float8_e4m3fn"
    assert bounds.weights.scale_bytes == 2 * 4
    assert bounds.weights.bytes_per_expert == 3 * 64 * 32 + 8
    assert float(bounds.memory_us(4)) == pytest.approx(4 * (3 * 64 * 32 + 8) / 4.8e12 * 1e6)
    assert float(bounds.compute_us(100)) == pytest.approx(2 * 100 * 3 * 64 * 32 / 1979e12 * 1e6)
    assert any("weight scales" in note for note in bounds.weights.notes)
