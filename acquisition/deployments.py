"""Which deployment targets a command measures, checked before any engine or GPU work (R6, R7).

EP is always TP x DP (full expert parallelism). ``--ep`` only filters the TP x DP combinations a
command already selects; an EP degree no selected combination produces is an error, never a
reason to add TP or DP values.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from moetables.geometry import MoeTarget

if TYPE_CHECKING:
    from collections.abc import Sequence

    from acquisition.catalog import MoeModel

__all__ = ["DegreeError", "Deployment", "select_deployments", "select_ranks", "targets_for"]


class DegreeError(ValueError):
    """Unmatched or malformed TP/DP/EP degrees; raised before anything is built.

    ``field`` names the option at fault (``tp``, ``tp_refresh``, ``dp``, ``ep``), so a caller
    files the error under it without reading the message.
    """

    def __init__(self, message: str, *, field: str) -> None:
        super().__init__(message)
        self.field = field


@dataclass(frozen=True, slots=True)
class Deployment:
    """One TP x DP combination; its EP ranks are measured as separate targets."""

    tp: int
    dp: int

    @property
    def ep(self) -> int:
        return self.tp * self.dp


def _degrees(values: Sequence[int], option: str) -> list[int]:
    field = option.lstrip("-").replace("-", "_")
    if not values:
        raise DegreeError(f"{option} needs at least one degree", field=field)
    bad = [v for v in values if v < 1]
    if bad:
        raise DegreeError(f"{option} degrees must be positive integers, got {bad}", field=field)
    if len(set(values)) != len(values):
        raise DegreeError(f"{option} lists a degree twice: {list(values)}", field=field)
    return sorted(values)


def select_deployments(
    command: str,
    tp: Sequence[int],
    tp_refresh: Sequence[int] | None,
    dp: Sequence[int] | None,
    ep: Sequence[int] | None,
) -> list[Deployment]:
    """The TP x DP combinations to measure, in a stable order.

    ``slice`` measures only the ``--tp-refresh`` degrees, ``profile`` every ``--tp`` degree.
    """
    session_tp = _degrees(tp, "--tp")
    if 1 not in session_tp:
        # The method keeps TP1 in every session list; a slice still measures only its degree.
        raise DegreeError(
            f"--tp must include 1 (got {session_tp}); use --tp-refresh to choose", field="tp"
        )
    if command == "slice":
        if not tp_refresh:
            raise DegreeError(
                "slice needs --tp-refresh: the TP degree whose MoE tables to refresh",
                field="tp_refresh",
            )
        measured_tp = _degrees(tp_refresh, "--tp-refresh")
        missing = [t for t in measured_tp if t not in session_tp]
        if missing:
            raise DegreeError(
                f"--tp-refresh {missing} is not in the session's --tp {session_tp}",
                field="tp_refresh",
            )
    elif command == "profile":
        if tp_refresh:
            raise DegreeError(
                "--tp-refresh belongs to slice; profile measures every --tp degree",
                field="tp_refresh",
            )
        measured_tp = session_tp
    else:
        raise DegreeError(f"unknown command {command!r}", field="command")
    dps = _degrees(dp, "--dp") if dp else [1]
    combos = [Deployment(tp=t, dp=d) for t in measured_tp for d in dps]
    if ep:
        eps = _degrees(ep, "--ep")
        produced = {c.ep for c in combos}
        unmatched = [e for e in eps if e not in produced]
        if unmatched:
            options = ", ".join(f"TP{c.tp}xDP{c.dp}={c.ep}" for c in combos)
            raise DegreeError(
                f"--ep {unmatched} matches no selected TP x DP ({options}); EP is always TP x DP "
                "and --ep never adds TP or DP degrees",
                field="ep",
            )
        combos = [c for c in combos if c.ep in eps]
    return combos


def targets_for(model: MoeModel, deployments: Sequence[Deployment]) -> list[MoeTarget]:
    """Every EP rank of every deployment, with the catalog's sequence-parallel declaration."""
    targets: list[MoeTarget] = []
    for deployment in deployments:
        if deployment.ep > model.global_experts:
            raise DegreeError(
                f"EP{deployment.ep} (TP{deployment.tp} x DP{deployment.dp}) exceeds the "
                f"{model.global_experts} experts of {model.name}: a rank would own none",
                field="ep",
            )
        sp = model.uses_sequence_parallel(deployment.tp, deployment.dp)
        targets.extend(
            MoeTarget.for_rank(deployment.tp, deployment.dp, rank, sp)
            for rank in range(deployment.ep)
        )
    return targets


def select_ranks(targets: Sequence[MoeTarget], ranks: Sequence[int] | None) -> list[MoeTarget]:
    """The targets whose EP rank is in ``ranks`` (None: all), in the same order.

    A filter only, like ``--ep``: a rank that no selected deployment has is an error (never a
    reason to add a deployment), so a typo cannot silently measure nothing.
    """
    if ranks is None:
        return list(targets)
    if not ranks:
        raise DegreeError("--ranks needs at least one rank", field="ranks")
    if len(set(ranks)) != len(ranks):
        raise DegreeError(f"--ranks lists a rank twice: {list(ranks)}", field="ranks")
    present = {t.rank for t in targets}
    unknown = sorted(r for r in ranks if r not in present)
    if unknown:
        eps = sorted({t.ep for t in targets})
        raise DegreeError(
            f"--ranks {unknown}: no selected deployment has such an EP rank (selected EP "
            f"degrees {eps}; ranks are 0..EP-1)",
            field="ranks",
        )
    return [t for t in targets if t.rank in set(ranks)]
