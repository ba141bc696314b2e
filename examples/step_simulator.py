"""A small step simulator: the MoE layer time of every step of a TP1/DP2/EP2 Qwen3-30B-A3B
deployment on an H200, from measured tables, in process or from a registry.

    python examples/step_simulator.py                       # both ways, totals compared
    python examples/step_simulator.py --url http://127.0.0.1:8000 --steps 1000

1,000 decode steps (16-128 running sequences per DP rank) and 1,000 prefill steps (chunks of
256-2048 tokens per DP rank), drawn from a fixed seed. DP ranks are padded to the larger count,
as vLLM pads them. For each step and DP rank the MoE layer is gate_routing over the rank's own
rows, the experts over the gathered rows with balanced routing (R41: M = N*k*L/E local
token-expert pairs and the expected number of distinct local experts for that many
choices), and finalize_copy over its own rows; the step's MoE time is its slower rank's. The
logical collectives between them are left out (they are not measured components). The same
steps also go through the layer estimate (``estimate_batch``: the block's trace, with waits),
in process and over REST alike.

Remotely ``RemoteTables`` asks the registry that ``bash scripts/run.sh`` serves for the best
H200 bundle of that model for the target (covering it, native vLLM first, newest vLLM, newest
measurement); in process the same bundle is opened from ``bundles/`` (found by its sha256), so
the totals are identical to the last bit.
"""

from __future__ import annotations

import argparse
import math
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from moetables import ComponentTables, MoeTarget
from moetables.client import RemoteTables, manifest_sha256

BUNDLES = Path(__file__).resolve().parents[1] / "bundles"
BUNDLE = BUNDLES / "H200/Qwen/Qwen3-30B-A3B-Instruct-2507/bf16"  # in process without a registry
NAME = {"hardware": "H200", "model": "Qwen/Qwen3-30B-A3B-Instruct-2507", "variant": "bf16"}
TP, DP = 1, 2
EXPERTS, TOP_K = 128, 8  # Qwen3-30B-A3B


@dataclass(frozen=True)
class Totals:
    decode_us: float
    prefill_us: float
    refused: int  # queries outside measured support (none for these steps)
    # The same steps through the layer estimate (`estimate_batch`: balanced routing, the
    # block's trace, no cluster, so compute and waits only), decode and prefill together.
    estimate_us: float


def workload(steps: int, seed: int) -> dict[str, npt.NDArray[np.int64]]:
    """Per-DP-rank token counts of each step, already padded to the larger rank's count."""
    rng = np.random.default_rng(seed)
    decode = rng.integers(16, 129, size=(steps, DP))
    prefill = rng.integers(256, 2049, size=(steps, DP))
    return {
        "decode": np.repeat(decode.max(axis=1, keepdims=True), DP, axis=1),
        "prefill": np.repeat(prefill.max(axis=1, keepdims=True), DP, axis=1),
    }


def balanced_routing(rows: npt.NDArray[np.int64], local: int) -> tuple[Any, Any]:
    """A and M of one rank under balanced routing of ``rows`` gathered tokens (R41)."""
    pairs = rows * TOP_K * local // EXPERTS
    expected = local * (1.0 - (1.0 - 1.0 / EXPERTS) ** (rows * TOP_K))
    active = np.clip(np.rint(expected).astype(np.int64), 1, local)
    active = np.minimum(active, pairs)  # never more active experts than local pairs
    return active, pairs


def moe_layer_us(tables: Any, counts: npt.NDArray[np.int64]) -> tuple[Any, int]:
    """Each step's MoE layer time (its slower DP rank) and the number of refused queries."""
    per_rank = []
    refused = 0
    for rank in range(TP * DP):
        target = MoeTarget.for_rank(TP, DP, rank)
        deployment = tables.deployment(TP, DP, rank)
        local_rows = counts[:, target.dp_rank]
        expert_rows = counts.sum(axis=1)
        active, pairs = balanced_routing(expert_rows, EXPERTS // target.ep)
        parts = [
            deployment.batch("gate_routing", local_rows),
            deployment.batch("experts", expert_rows, active, pairs),
        ]
        if "finalize_copy" in deployment.components:
            parts.append(deployment.batch("finalize_copy", local_rows))
        refused += sum(int((p.code != 0).sum()) for p in parts)
        per_rank.append(sum(p.time_us for p in parts))
    return np.max(per_rank, axis=0), refused


def simulate(tables: Any, steps: int = 1000, seed: int = 0) -> Totals:
    counts = workload(steps, seed)
    decode, refused_d = moe_layer_us(tables, counts["decode"])
    prefill, refused_p = moe_layer_us(tables, counts["prefill"])
    estimate = sum(
        float(np.nansum(tables.estimate_batch(c, tp=TP, dp=DP).layer_compute_us))
        for c in counts.values()
    )
    return Totals(
        float(np.nansum(decode)), float(np.nansum(prefill)), refused_d + refused_p, estimate
    )


def shipped_folder(sha256: str) -> Path | None:
    """The shipped bundle folder whose content is the registry's bundle ``sha256``."""
    for meta in sorted(BUNDLES.glob("*/**/meta.yaml")):
        if manifest_sha256(meta.parent) == sha256:
            return meta.parent
    return None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--url", default="http://127.0.0.1:8000", help="the registry")
    parser.add_argument("--steps", type=int, default=1000)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--local-only", action="store_true")
    args = parser.parse_args(argv)

    if args.local_only:
        local = simulate(ComponentTables(BUNDLE), args.steps, args.seed)
        print(
            f"in process : decode {local.decode_us:.3f} us, prefill {local.prefill_us:.3f} us "
            f"over {args.steps} steps each ({local.refused} refused); "
            f"layer estimate {local.estimate_us:.3f} us"
        )
        return 0
    try:
        remote_tables = RemoteTables(args.url, **NAME, retries=1)
        answerer = remote_tables.deployment(TP, DP, 0).answerer
        remote = simulate(remote_tables, args.steps, args.seed)
    except OSError as exc:
        print(
            f"no registry at {args.url} ({exc}); start it with: bash scripts/run.sh",
            file=sys.stderr,
        )
        return 1
    folder = shipped_folder(answerer["sha256"])
    if folder is None:
        print(f"bundle {answerer['sha256']} is not among the shipped folders", file=sys.stderr)
        return 1
    local = simulate(ComponentTables(folder), args.steps, args.seed)
    print(
        f"in process : decode {local.decode_us:.3f} us, prefill {local.prefill_us:.3f} us "
        f"over {args.steps} steps each ({local.refused} refused), layer estimate "
        f"{local.estimate_us:.3f} us, {folder.relative_to(BUNDLES)}"
    )
    print(
        f"registry   : decode {remote.decode_us:.3f} us, prefill {remote.prefill_us:.3f} us, "
        f"layer estimate {remote.estimate_us:.3f} us (bundle {answerer['id']}, {answerer['backend']}, vLLM {answerer['vllm_version']})"
    )
    same = remote == local and not math.isnan(local.decode_us)
    print("identical totals" if same else "TOTALS DIFFER")
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())
