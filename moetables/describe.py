"""What a bundle entry says of itself beyond its rows, for ``python -m moetables info`` and
the dashboard's table page alike (one wording, never re-derived by a caller): a kernel-step
table's segments in N, the recorded per-block row-tile costs, and the vLLM version its
contracts name."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from moetables.bundle.model import ExpertLoads, TableEntry, WaveModel
from moetables.errors import BundleError

__all__ = ["contracts_vllm_version", "kernel_segments", "tile_costs"]


def kernel_segments(entry: TableEntry, tokens: Any) -> list[dict[str, Any]] | None:
    """A kernel-step table's segments in N (docs/bundle-format.md, "Kernel-step tables"): each
    answers from its own points only, so the table's support box alone would mislead a caller.
    ``tokens`` are the measured N of its expert rows. None for a table planned without kernel
    steps (or one whose contract ``validate`` refuses)."""
    from moetables.lookup.segments import contract_kernel_switches, describe_kernel

    try:
        switches = contract_kernel_switches(entry.contract, entry.geometry, entry.table_path)
    except BundleError:
        return None  # validate names the problem
    if switches is None or len(tokens) == 0:
        return None
    top = int(max(tokens))
    starts = [1, *(t + 1 for t in switches.switches(top))]
    ends = [*(t - 1 for t in starts[1:]), top]
    out = []
    for first, last in zip(starts, ends, strict=True):
        inside = [int(n) for n in tokens if first <= n <= last]
        out.append(
            {
                "tokens": [first, last],
                "measured_tokens": [min(inside), max(inside)] if inside else None,
                "kernel": describe_kernel(switches.kernel(first)),
            }
        )
    return out


def tile_costs(loads: ExpertLoads) -> list[dict[str, Any]]:
    """The recorded cost of an extra row tile per vLLM block size, largest block first: format
    4 records one per block size (``applies: "exactly"``), format 3 one for every block of at
    least its ``block_m`` rows (``"at_least"``); empty for a table that records none. A format-5
    wave model's block has ``tile_cost_us: None`` and its ``wave_cost_us``, ``programs_per_sm``
    and ``sms`` instead."""
    applies = "at_least" if loads.tile_model is not None else "exactly"
    out: list[dict[str, Any]] = []
    for m in loads.models:
        item: dict[str, Any] = {"block_m": m.block_m, "applies": applies}
        if isinstance(m, WaveModel):
            # Format 5: charged per weighted wave of the kernel's grid, not per tile.
            item |= {
                "tile_cost_us": None,
                "wave_cost_us": m.wave_cost_us,
                "programs_per_sm": m.programs_per_sm,
                "sms": m.sms,
            }
        else:
            item["tile_cost_us"] = m.tile_cost_us
        out.append(item | {"vllm_version": m.vllm_version, "schema": m.schema})
    return out


def _contract_version(contract: Mapping[str, Any]) -> str | None:
    """Where the two layouts' contracts keep the vLLM version (as the dashboard reads them)."""
    for holder, key in (
        (contract, "vllm_version"),
        (contract.get("versions"), "vllm"),
        (contract.get("backend"), "vllm_version"),
        (contract.get("expert_region"), "vllm_version"),
    ):
        if isinstance(holder, Mapping) and isinstance(holder.get(key), str) and holder[key]:
            return str(holder[key])
    return None


def contracts_vllm_version(contracts: Iterable[Mapping[str, Any]]) -> str | None:
    """The vLLM version every contract names, or None when one names none or two disagree (a
    bundle-wide version would then misstate some table)."""
    found = {_contract_version(c) for c in contracts}
    if len(found) != 1:
        return None
    return found.pop()
