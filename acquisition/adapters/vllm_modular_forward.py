"""Traced forwards of one rank's whole modular MoE path: conservation evidence (R15, R22, R26).

The protocol times each component in its own forward. These traces run, outside every timed
range and once per build, the rank's path in one call with each component's calls marked as
scopes, and attribute every device activity to the innermost scope holding its launch
(``vllm_ownership.nested_ownership``). Per traced forward the contract keeps each component's
sum, what no scope owned (``outside_scopes_us``) and the forward's whole CUDA activity; the
bundle publishes them as ``conservation.csv``.

- DP1 (``native``): the gate projection and ``router.select_experts`` (``gate_routing``), then
  vLLM's own ``FusedMoEKernel.apply`` on the router's choice, as the engine's modular method
  calls it, with its native ``prepare``, ``experts.apply`` and ``finalize`` scoped (all three
  are the ``experts`` boundary, R22). Whatever ``FusedMoEKernel.apply`` launches outside those
  three calls (an output fill, the no-op reduction's copy where vLLM leaves the expert output
  in its workspace) falls outside the scopes and is shown, not hidden.
- DP+EP (``composed``): one GPU cannot run the all-gather dispatch and reduce-scatter combine
  (collectives, charged by the network model), so ``FusedMoEKernel.apply`` cannot run for a
  DP+EP rank. The trace composes the rank's components in one window in the order the engine
  runs them: gate/routing on the local rows, the experts and their no-op reduction on the
  gathered rows (prepared before the window, standing for the all-gather's delivery), and the
  finalize copy into the local output. It shows that each scope owns its own activity and
  that nothing else launches between them; it is not evidence about the collectives.

The router runs on synthetic weights: its choice in these traces is not a routing stimulus.
"""

from __future__ import annotations

import contextlib
from collections import Counter
from types import SimpleNamespace
from typing import TYPE_CHECKING, Any

from acquisition.adapters.vllm_capabilities import CapabilityError
from acquisition.adapters.vllm_modular_native import NO_DP_EP
from moetables.bundle import EXPERTS

if TYPE_CHECKING:
    from collections.abc import Callable, Iterator

    from acquisition.protocol.attribution import ProfiledWindow

__all__ = ["trace_tokens", "traced_forward"]

# Local rows of the traced forwards: one row, a decode-sized step and the full budget, as the
# live path traces its parent forward.
_MIDDLE_ROWS = 256


def trace_tokens(budget: int) -> tuple[int, ...]:
    """Local rows per DP rank of the traced forwards, for a local token budget."""
    return tuple(sorted({1, min(_MIDDLE_ROWS, budget), budget}))


@contextlib.contextmanager
def _scoped(capture: Any, calls: dict[str, tuple[Any, str]]) -> Iterator[None]:
    """Each ``obj.name`` called inside runs in ``capture.region(scope)`` (instance patches,
    removed on exit, so the kernel's own lookups reach them)."""
    installed: list[tuple[Any, str]] = []
    try:
        for scope, (owner, name) in calls.items():
            if name in vars(owner):
                raise CapabilityError(f"{type(owner).__name__}.{name} is already patched")
            original = getattr(owner, name)

            def call(*args: Any, _f: Any = original, _s: str = scope, **kwargs: Any) -> Any:
                with capture.region(_s):
                    return _f(*args, **kwargs)

            setattr(owner, name, call)
            installed.append((owner, name))
        yield
    finally:
        for owner, name in installed:
            vars(owner).pop(name, None)


def _gate_routing(session: Any, capture: Any, hidden: Any) -> tuple[Any, Any]:
    with capture.region("gate"):
        logits = session.gate(hidden)
    with capture.region("router"):
        weights, ids = session.router.select_experts(
            hidden_states=hidden, router_logits=logits, topk_indices_dtype=session.topk_dtype
        )
    return weights, ids


def traced_forward(
    session: Any, rows: int, trace: Callable[[Callable[[Any], None]], ProfiledWindow]
) -> dict[str, Any]:
    """One traced forward of ``session``'s rank at ``rows`` local rows per DP rank."""
    from acquisition.adapters.vllm_ownership import nested_ownership

    domain = session.target.token_domains((rows,) * session.target.dp)
    local = session.random((domain.local_rows, session.hidden), seed=domain.local_rows + 23)
    native = session.choice.prepare_kind == NO_DP_EP

    if native:

        def forward(capture: Any) -> None:
            weights, ids = _gate_routing(session, capture, local)
            inputs = SimpleNamespace(hidden=local, topk_weights=weights, topk_ids=ids)
            with _scoped(
                capture,
                {
                    "prepare": (session.prepare_finalize, "prepare"),
                    "experts": (session.experts, "apply"),
                    "finalize": (session.prepare_finalize, "finalize"),
                },
            ):
                session._native_apply(inputs)

    else:
        # What the all-gather would deliver: every DP rank's rows and their routing, made
        # before the window (the collective itself is not a component, R23).
        gathered = session.random((domain.expert_rows, session.hidden), seed=domain.expert_rows)
        logits = session.gate(gathered)
        g_weights, g_ids = session.router.select_experts(
            hidden_states=gathered, router_logits=logits, topk_indices_dtype=session.topk_dtype
        )
        gathered_inputs = SimpleNamespace(
            hidden=gathered,
            topk_weights=g_weights,
            topk_ids=g_ids,
            dispatched=None,
            dispatched_scale=None,
        )
        if session.quantized:
            # FP8: the all-gather delivers rows each rank quantized before sending; that
            # quantization is the dispatch_quant component, timed on its own and, like the
            # collective it feeds, made before the window.
            gathered_inputs.dispatched, gathered_inputs.dispatched_scale = (
                session._dispatch_quantize_native(gathered)
            )
        expert_out = session._torch.empty_like(gathered)
        combined = session.random((domain.local_rows, session.hidden), seed=domain.local_rows + 7)
        layer_out = session._torch.empty_like(combined)

        def forward(capture: Any) -> None:
            _gate_routing(session, capture, local)
            with capture.region("experts"):
                session._experts(gathered_inputs, session.w13, session.w2, expert_out)
            with capture.region("finalize_copy"):
                layer_out.copy_(combined)

    owned = nested_ownership(trace(forward))
    scope_us = {k: v / 1000.0 for k, v in owned.per_scope_ns.items()}
    names = {k: dict(Counter(v)) for k, v in sorted(owned.per_scope_names.items())}
    result: dict[str, Any] = {
        "tokens": domain.local_rows,
        "expert_rows": domain.expert_rows,
        "forward": "native FusedMoEKernel.apply" if native else "composed (collectives excluded)",
        "native_forward_total_us": owned.total_ns / 1000.0,
        "outside_scopes_us": owned.outside_ns / 1000.0,
        "gate_routing_us": scope_us.get("gate", 0.0) + scope_us.get("router", 0.0),
        f"{EXPERTS}_us": (
            scope_us.get("prepare", 0.0)
            + scope_us.get("experts", 0.0)
            + scope_us.get("finalize", 0.0)
        ),
        "activities": {**names, "outside": dict(Counter(owned.outside_names))},
        "note": "router under synthetic weights: the routing of this trace is not a stimulus",
    }
    if not native:
        result["finalize_copy_us"] = scope_us.get("finalize_copy", 0.0)
    return result
