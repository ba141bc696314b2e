"""NVIDIA AIConfigurator's MoE performance table (``moe_perf``), balanced distribution.

AIConfigurator (``aiconfigurator-core`` 0.12.0) models a MoE layer's expert compute by one
table per system, framework and version (``systems/data/<system>/moe/vllm/<version>/``,
``moe_perf.parquet``, or ``moe_perf.txt`` with the same columns, which its loader also reads):

    framework, version, device, op_name, kernel_source, moe_dtype, num_tokens, hidden_size,
    inter_size, topk, num_experts, moe_tp_size, moe_ep_size, distribution, latency

``latency`` in milliseconds, one row per token count of a (model shape, parallelism, kernel,
distribution). This export writes the ``balanced`` rows, composed from our measurements:
for each N (the rows presented to the expert kernel, AIConfigurator's ``num_tokens``) the
``experts`` component at the balanced rank load, M = ceil(N*k*L/E) local token-expert pairs
over A = min(L, M) local experts (R41), looked up by ``ComponentTables`` (interpolated inside
measured support, never extrapolated), the slowest EP rank of the deployment (a step waits for
it). gate_routing (AIConfigurator's router GEMM) and finalize_copy (a DP copy) are other ops
there and are not folded in. moe_tp_size is 1 and moe_ep_size is EP: our targets are full EP.

Files: ``moe/vllm/<version>/moe_perf.parquet`` (what AIConfigurator 0.12.0's engine loads;
written when pyarrow is installed, ``pip install moetables[export]``), the same rows as
``moe_perf.txt`` (CSV) and a ``collection_meta.yaml`` sidecar naming the source bundle. Copy
``moe/`` into ``systems/data/<system>/`` of an AIConfigurator systems tree.
``tests/moetables/test_export.py`` loads the export through AIConfigurator's own loader.

Refused, each named: tables that ran no vLLM (no framework version), quantized experts (no
kernel-source name we can derive), deployments whose ranks are not all in the bundle, and
token counts outside measured support (left out, never invented).
"""

from __future__ import annotations

import csv
from pathlib import Path
from typing import Any

import yaml

from moetables.bundle import EXPERTS, TableEntry, validate_bundle
from moetables.errors import CoverageError, QueryError
from moetables.export.common import ExportError, ExportReport
from moetables.lookup import ComponentTables

__all__ = ["COLUMNS", "TOKEN_GRID", "moe_shape", "write_aiconfigurator"]

COLUMNS = (
    "framework",
    "version",
    "device",
    "op_name",
    "kernel_source",
    "moe_dtype",
    "num_tokens",
    "hidden_size",
    "inter_size",
    "topk",
    "num_experts",
    "moe_tp_size",
    "moe_ep_size",
    "distribution",
    "latency",
)
# AIConfigurator's own num_tokens grid (its vLLM 0.24.0 H200 table), where we measured.
TOKEN_GRID = (
    1,
    2,
    4,
    8,
    16,
    32,
    48,
    64,
    80,
    96,
    128,
    160,
    192,
    256,
    320,
    384,
    512,
    768,
    1024,
    1536,
    2048,
    3072,
    4096,
    6144,
    8192,
    12288,
    16384,
)


def _get(mapping: Any, *keys: str) -> Any:
    for key in keys:
        if not isinstance(mapping, dict):
            return None
        mapping = mapping.get(key)
    return mapping


def moe_shape(entry: TableEntry, meta: dict[str, Any]) -> tuple[dict[str, Any], list[str]]:
    """The identity columns of ``entry``'s rows, and why they cannot be written (if so)."""
    c = entry.contract
    where = f"tp{entry.target.tp}/{entry.target.deployment}"
    raw_backend, raw_region = c.get("backend"), c.get("expert_region")
    backend: dict[str, Any] = raw_backend if isinstance(raw_backend, dict) else {}
    region: dict[str, Any] = raw_region if isinstance(raw_region, dict) else {}
    why: list[str] = []
    version = backend.get("vllm_version") or region.get("vllm_version") or c.get("vllm_version")
    if not version:
        why.append(
            f"{where}: ran no vLLM ({backend.get('name') or 'backend unknown'}); "
            "AIConfigurator rows name a framework version"
        )
    quantization = _get(c, "geometry", "quantization")
    if quantization:
        why.append(
            f"{where}: quantized experts ({quantization!r}) have no kernel-source "
            "name this export can derive"
        )
    kernel = backend.get("native_backend") or region.get("backend")
    expert_class = backend.get("expert_class") or region.get("expert_class") or ""
    if not kernel or not expert_class:
        why.append(f"{where}: the contract names no native kernel and expert class")
    dtype = _get(c, "geometry", "dtype") or str(c.get("input_dtype", "")).removeprefix("torch.")
    hidden = _get(c, "geometry", "expert_hidden_size") or c.get("hidden_dim")
    inter = _get(c, "geometry", "expert_intermediate_size") or c.get("intermediate_size")
    if not (dtype and hidden and inter):
        why.append(f"{where}: the contract lacks the expert dtype, hidden or intermediate size")
    device = _get(c, "provenance", "device_name") or meta.get("gpu") or meta.get("hardware")
    shape = {
        "framework": "VLLM",
        "version": str(version or ""),
        "device": str(device),
        "op_name": "moe",
        # AIConfigurator's spelling: vllm_<quant method>_<kernel>_<expert class>, lower case
        "kernel_source": f"vllm_unquantizedfusedmoe_{str(kernel).lower()}_"
        f"{str(expert_class).rsplit('.', 1)[-1].lower()}",
        "moe_dtype": dtype,
        "hidden_size": hidden,
        "inter_size": inter,
        "topk": entry.geometry.top_k,
        "num_experts": entry.geometry.global_experts,
        "moe_tp_size": 1,
        "moe_ep_size": entry.target.ep,
        "distribution": "balanced",
    }
    return shape, why


def balanced_load(tokens: int, entry: TableEntry) -> tuple[int, int]:
    """A and M of a rank under balanced routing of ``tokens`` rows (R41)."""
    g = entry.geometry
    pairs = -(-tokens * g.top_k * g.local_experts // g.global_experts)
    return min(g.local_experts, pairs), pairs


def _write_parquet(path: Path, rows: list[dict[str, Any]]) -> bool:
    """The rows as AIConfigurator's own parquet tables type them; False without pyarrow."""
    try:
        import pyarrow as pa
        import pyarrow.parquet as pq
    except ImportError:
        return False
    text = {
        "framework",
        "version",
        "device",
        "op_name",
        "kernel_source",
        "moe_dtype",
        "distribution",
    }
    schema = pa.schema(
        [
            (c, pa.large_string() if c in text else pa.float64() if c == "latency" else pa.int64())
            for c in COLUMNS
        ]
    )
    table = pa.Table.from_pylist([{c: r[c] for c in COLUMNS} for r in rows], schema=schema)
    pq.write_table(table, path)
    return True


def write_aiconfigurator(bundle_dir: Path, out: Path) -> ExportReport:
    report = validate_bundle(bundle_dir)
    if not report.ok or report.bundle is None:
        raise ExportError([f"the bundle is not valid: {p}" for p in report.problems])
    bundle = report.bundle
    tables = ComponentTables(bundle)
    left_out: list[str] = []
    rows: list[dict[str, Any]] = []
    groups: dict[tuple[int, int, bool], list[TableEntry]] = {}
    for entry in bundle.entries:
        t = entry.target
        groups.setdefault((t.tp, t.dp, t.sequence_parallel), []).append(entry)
    for (tp, dp, sp), entries in sorted(groups.items()):
        label = f"TP{tp}/DP{dp}{' SP' if sp else ''}"
        ranks = sorted(e.target.rank for e in entries)
        if ranks != list(range(tp * dp)):
            left_out.append(
                f"{label}: ranks {ranks} of EP{tp * dp} in the bundle; the slowest "
                "rank of a deployment needs them all"
            )
            continue
        shapes = [moe_shape(e, bundle.meta) for e in entries]
        why = [w for _, ws in shapes for w in ws]
        if why:
            left_out += why
            continue
        shape = shapes[0][0]
        if any("eager" not in e.modes for e in entries):
            left_out.append(f"{label}: no eager expert rows")
            continue
        outside: list[int] = []
        for n in TOKEN_GRID:
            times = []
            for entry in entries:
                a, m = balanced_load(n, entry)
                try:
                    times.append(
                        tables.deployment(tp, dp, entry.target.rank, sp).time_us(EXPERTS, n, a, m)
                    )
                except (CoverageError, QueryError):
                    break
            if len(times) != len(entries):
                outside.append(n)
                continue
            rows.append({**shape, "num_tokens": n, "latency": max(times) / 1000.0})
        if outside:
            left_out.append(
                f"{label}: num_tokens {outside} outside measured support (left "
                "out, never extrapolated)"
            )
    if not rows:
        raise ExportError(
            ["nothing of this bundle can be written as AIConfigurator MoE rows", *left_out]
        )
    versions = sorted({r["version"] for r in rows})
    out.mkdir(parents=True, exist_ok=True)
    result = ExportReport(format="aiconfigurator", out=out, left_out=left_out)
    for version in versions:
        # Laid out as in AIConfigurator's systems tree: moe/vllm/<version>/moe_perf.txt
        folder = out / "moe" / "vllm" / version
        folder.mkdir(parents=True, exist_ok=True)
        mine = [r for r in rows if r["version"] == version]
        with (folder / "moe_perf.txt").open("w", newline="") as handle:
            writer = csv.DictWriter(handle, fieldnames=COLUMNS, lineterminator="\n")
            writer.writeheader()
            for row in mine:
                writer.writerow({**row, "latency": repr(float(row["latency"]))})
        result.rows += len(mine)
        result.files.append(f"moe/vllm/{version}/moe_perf.txt")
        if _write_parquet(folder / "moe_perf.parquet", mine):
            result.files.append(f"moe/vllm/{version}/moe_perf.parquet")
        else:
            result.left_out.append(
                "moe_perf.parquet: pyarrow is not installed (pip install moetables[export]); "
                "AIConfigurator 0.12.0's engine loads the parquet table"
            )
        # "complete": AIConfigurator's shared layer would otherwise fill the token counts we
        # left out from other versions' rows, i.e. invent them.
        sidecar = {
            "schema_version": 1,
            "provenance": "moetables export",
            "runtime": {"framework": "vllm", "version": version},
            "source": {
                "hardware": bundle.hardware,
                "model": bundle.model,
                "variant": bundle.variant,
            },
            "tables": {
                "moe_perf": {
                    "status": "complete",
                    "note": (
                        "balanced rows composed from measured moetables components; token counts "
                        "outside measured support are absent"
                    ),
                }
            },
        }
        (folder / "collection_meta.yaml").write_text(yaml.safe_dump(sidecar, sort_keys=False))
        result.files.append(f"moe/vllm/{version}/collection_meta.yaml")
    return result
