"""Typed estimates rebuilt from their JSON answers (`LayerEstimate.as_dict`,
`BatchEstimate.as_dicts`): what a client of the registry's estimate receives.

A rebuilt `LayerEstimate` equals the one computed in process field for field (JSON writes floats
in their shortest round-trip form, so they come back exact). A rebuilt `BatchEstimate` holds the
same arrays for every answered step, and its ``step(i)`` and ``as_dicts()`` give the same
answers; a refused step comes back as its code and message only (the registry sends no routing
for it), so its routing arrays are zero and its times NaN.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from moetables.comm import CollectiveStep, ComputeStep, TensorWidths, build_trace
from moetables.estimate import (
    BatchEstimate,
    CollectiveEstimate,
    LayerEstimate,
    RankEstimate,
    StepArrays,
    TraceEvent,
)
from moetables.lookup.codes import INVALID, OK, OUT_OF_SUPPORT
from moetables.routing import BatchRouting

__all__ = ["batch_from_dicts", "layer_from_dict"]

EAGER_NOTE = "graph mode: this step exceeds the largest capture size and runs eagerly"
EAGER_TABLES_NOTE = "graph mode: this bundle holds eager timings only"


def _opt_float(value: Any) -> float | None:
    return None if value is None else float(value)


def layer_from_dict(answer: Mapping[str, Any]) -> LayerEstimate:
    """`LayerEstimate.as_dict`'s inverse (the registry's ``bundle`` field is ignored)."""
    d = answer["deployment"]
    ranks = tuple(
        RankEstimate(
            rank=r["rank"],
            dp_rank=r["dp_rank"],
            tp_rank=r["tp_rank"],
            tokens=r["tokens"],
            local_rows=r["local_rows"],
            N=r["N"],
            A=r["A"],
            M=r["M"],
            components={k: float(v) for k, v in r["components"].items()},
            compute_us=float(r["compute_us"]),
            wait_us=float(r["wait_us"]),
            transfer_us=_opt_float(r["transfer_us"]),
            end_us=_opt_float(r["end_us"]),
            expert_counts=tuple(r["expert_counts"]) if "expert_counts" in r else None,
            expert_range=(
                (int(r["expert_range"][0]), int(r["expert_range"][1]))
                if "expert_range" in r
                else None
            ),
        )
        for r in answer["ranks"]
    )
    collectives = tuple(
        CollectiveEstimate(
            op=c["op"],
            tensor=c["tensor"],
            scope=c["scope"],
            ranks=tuple(c["ranks"]),
            bytes=c["bytes"],
            bytes_by_rank=tuple(c["bytes_by_rank"]),
            equal_counts=c["equal_counts"],
            vllm_call=c["vllm_call"],
            kernels=tuple(c["kernels"]),
            launch=c["launch"],
            start_us=float(c["start_us"]),
            transfer_us=_opt_float(c["transfer_us"]),
            wait_us=float(c["wait_us"]),
            wait_by_rank=tuple(float(w) for w in c["wait_by_rank"]),
        )
        for c in answer["collectives"]
    )
    events = tuple(
        TraceEvent(
            e["rank"],
            e["name"],
            e["kind"],
            float(e["start_us"]),
            float(e["end_us"]),
            float(e["wait_us"]),
            _opt_float(e["transfer_us"]),
            e["bytes"],
        )
        for e in answer.get("events", ())
    )
    return LayerEstimate(
        kind=d["kind"],
        tp=d["tp"],
        dp=d["dp"],
        sequence_parallel=d["sequence_parallel"],
        policy=answer["policy"],
        mode=answer["mode"],
        table_mode=answer["table_mode"],
        tokens=tuple(answer["tokens"]),
        padded_tokens=tuple(answer["padded_tokens"]),
        ranks=ranks,
        collectives=collectives,
        events=events,
        layer_us=_opt_float(answer["layer_us"]),
        layer_compute_us=float(answer["layer_compute_us"]),
        critical_rank=answer["critical_rank"],
        cluster=answer["cluster"],
        notes=tuple(answer["notes"]),
    )


def _widths(answer: Mapping[str, Any] | None) -> TensorWidths:
    """Bytes per row of the collectives' tensors, as the answer shows them (a share divided by
    its rank's rows); zero where no answered step shows them."""
    found = {"hidden_states": 0, "topk_weights": 0, "topk_ids": 0}
    if answer is not None:
        rows = {r["rank"]: r["local_rows"] for r in answer["ranks"]}
        for c in answer["collectives"]:
            tensor = c["tensor"] if c["tensor"] in found else "hidden_states"
            first = c["ranks"][0]
            if not found[tensor] and rows.get(first):
                found[tensor] = int(c["bytes_by_rank"][0]) // int(rows[first])
    return TensorWidths(source="the registry's answer", **found)


def batch_from_dicts(
    answers: Sequence[Mapping[str, Any]],
    *,
    tp: int,
    dp: int,
    sequence_parallel: bool,
    components: Sequence[str],
    policy: str,
    mode: str,
    tokens: Any,
    cluster: str | None,
    expert_counts: bool,
) -> BatchEstimate:
    """A `BatchEstimate` from `BatchEstimate.as_dicts(events=True)`'s answers.

    ``components`` are the deployment's measured components (they decide its trace),
    ``tokens`` the steps as given, ``cluster`` the cluster's name (for a batch whose every
    step was refused), ``expert_counts`` whether the answers carry each rank's counts.
    """
    steps = len(answers)
    ep = tp * dp
    ok = [i for i, a in enumerate(answers) if "error" not in a]
    first = answers[ok[0]] if ok else None
    if first is not None:
        cluster = first["cluster"]
    trace = build_trace(
        tp, dp, sequence_parallel, components, _widths(first), where="the registry's answer"
    )
    given = np.atleast_2d(np.asarray(tokens, dtype=np.int64))
    padded = given.copy()
    local_rows = np.zeros((steps, ep), dtype=np.int64)
    n_tokens = np.zeros(steps, dtype=np.int64)
    active = np.zeros((steps, ep), dtype=np.int64)
    pairs = np.zeros((steps, ep), dtype=np.int64)
    global_counts = None
    if expert_counts and first is not None:
        experts = sum(len(r["expert_counts"]) for r in first["ranks"])
        global_counts = np.zeros((steps, experts), dtype=np.int64)
    comps = {c: np.full((steps, ep), np.nan) for c in trace.components}
    compute = np.full((steps, ep), np.nan)
    wait = np.full((steps, ep), np.nan)
    timed = cluster is not None
    transfer = np.full((steps, ep), np.nan) if timed else None
    layer = np.full(steps, np.nan) if timed else None
    layer_compute = np.full(steps, np.nan)
    code = np.full(steps, OK, dtype=np.int8)
    errors: dict[int, str] = {}
    graph = np.ones(steps, dtype=bool) if mode == "graph" else None
    nan = np.full((steps, ep), np.nan)
    walked: list[StepArrays] = []
    for tstep in trace.steps:
        groups: list[Any] = []
        if isinstance(tstep, CollectiveStep):
            for group in tstep.groups:
                width = len(group)
                groups.append(
                    (
                        group,
                        np.zeros(steps, dtype=np.int64),
                        np.zeros((steps, width), dtype=np.int64),
                        np.zeros(steps, dtype=bool),
                        np.full(steps, np.nan),
                        np.full(steps, np.nan) if timed else None,
                        np.full((steps, width), np.nan),
                    )
                )
        walked.append(StepArrays(nan.copy(), nan.copy(), nan.copy(), groups))
    notes: tuple[str, ...] = ()
    own: dict[int, tuple[str, ...]] = {}  # each answered step's notes, as the step says them
    table_mode = "eager"
    for i, answer in enumerate(answers):
        if "error" in answer:
            code[i] = OUT_OF_SUPPORT if answer["error"] == "out_of_support" else INVALID
            errors[i] = str(answer.get("message", "refused"))
            continue
        padded[i] = answer["padded_tokens"]
        n_tokens[i] = answer["ranks"][0]["N"]
        for k, r in enumerate(answer["ranks"]):
            local_rows[i, k], active[i, k], pairs[i, k] = r["local_rows"], r["A"], r["M"]
            for c, v in r["components"].items():
                comps[c][i, k] = v
            compute[i, k], wait[i, k] = r["compute_us"], r["wait_us"]
            if transfer is not None:
                transfer[i, k] = r["transfer_us"]
            if global_counts is not None:
                start, stop = r["expert_range"]
                global_counts[i, start:stop] = r["expert_counts"]
        if layer is not None:
            layer[i] = answer["layer_us"]
        layer_compute[i] = answer["layer_compute_us"]
        step_notes = tuple(answer["notes"])
        if graph is not None and EAGER_NOTE in step_notes:
            graph[i] = False
        own[i] = tuple(n for n in step_notes if n != EAGER_NOTE)
        if i == ok[0]:
            notes = own[i]
            table_mode = answer["table_mode"]
        if graph is not None and graph[i]:
            table_mode = answer["table_mode"]
        events = iter(answer["events"])
        collectives = iter(answer["collectives"])
        for tstep, arrays in zip(trace.steps, walked, strict=True):
            if isinstance(tstep, ComputeStep):
                for _ in range(ep):
                    e = next(events)
                    k = e["rank"]
                    arrays.arrive[i, k] = arrays.start[i, k] = e["start_us"]
                    arrays.end[i, k] = e["end_us"]
                continue
            for group, size, shares, equal, start_us, tr, w in arrays.collectives:
                c = next(collectives)
                size[i], equal[i], start_us[i] = c["bytes"], c["equal_counts"], c["start_us"]
                shares[i] = c["bytes_by_rank"]
                w[i] = c["wait_by_rank"]
                if tr is not None:
                    tr[i] = c["transfer_us"]
                for _ in group:
                    e = next(events)
                    k = e["rank"]
                    arrays.arrive[i, k] = e["start_us"]
                    arrays.start[i, k] = e["start_us"] + e["wait_us"]
                    arrays.end[i, k] = e["end_us"]
    if (
        mode == "graph"
        and first is not None
        and not any(n.startswith(EAGER_TABLES_NOTE) for n in notes)
        and not (graph is not None and graph[ok].any())
    ):
        table_mode = "graph"  # every answered step ran eagerly: the tables' mode is graph's
    routing = BatchRouting(policy, padded, local_rows, n_tokens, active, pairs, global_counts)
    # Steps whose notes differ (a tile charge names its step's blocks) keep their own; a
    # refused step has none to say.
    by_step = None
    if len(set(own.values())) > 1:
        by_step = [own.get(i, notes) for i in range(len(answers))]
    return BatchEstimate(
        trace=trace,
        routing=routing,
        policy=policy,
        mode=mode,
        table_mode=table_mode,
        tokens=given,
        components=comps,
        compute_us=compute,
        wait_us=wait,
        transfer_us=transfer,
        layer_us=layer,
        layer_compute_us=layer_compute,
        code=code,
        errors=errors,
        cluster=cluster,
        notes=notes,
        graph=graph,
        step_notes=by_step,
        _steps=walked,
    )
