"""What a contract says about the model's shared expert (issue 20, item 2).

The method's routed-path components are ``gate_routing`` (the router's gate and top-k),
``experts`` (the routed experts) and, at DP+EP, ``finalize_copy``. A shared expert is
surrounding native work of the MoE block, which only the live path's ``wrapper`` holds (seed 000:
the live path "adds a local wrapper component for the surrounding native work"). A table of
another path times the routed path only, and its contract says so in ``backend.shared_experts``
(``moetables.estimate`` repeats it in every answer read from such a table).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from acquisition.catalog import MoeModel

__all__ = ["shared_expert_statement", "with_shared_expert_statement"]


def shared_expert_statement(model: MoeModel, *, component: str | None) -> dict[str, Any] | None:
    """The ``backend.shared_experts`` field, or None for a model without shared experts.

    ``component`` is the table component that holds the shared expert (``wrapper`` on the
    live path), or None where no component does.
    """
    if not model.shared_experts:
        return None
    base: dict[str, Any] = {
        "count": model.shared_experts,
        "intermediate_size": model.shared_expert_intermediate_size,
        "gate": model.shared_expert_gate,
        "rows": "local: vLLM's MoE runner applies it to the rank's own rows, never to the "
        "gathered ones",
    }
    if component is not None:
        return {
            **base,
            "measured": True,
            "component": component,
            "statement": "the shared expert, its gate and the sum with the routed output run in "
            f"the parent block's forward outside the gate/router and routed-kernel scopes, so "
            f"the {component} rows hold them (launch ownership verified at build)",
        }
    return {
        **base,
        "measured": False,
        "component": None,
        "statement": "not in any component of this table: gate_routing is the router's gate "
        "and top-k (not the shared expert's gate), experts the routed experts. A layer time "
        "from this table alone leaves out the shared expert's MLP, its gate and the sum with "
        "the routed output; the vllm-live wrapper rows (TP1) measure them",
    }


def with_shared_expert_statement(
    described: dict[str, Any], model: MoeModel, *, component: str | None
) -> dict[str, Any]:
    """``described`` with the statement added where the model has shared experts (other
    models' contracts keep their shape)."""
    statement = shared_expert_statement(model, component=component)
    if statement is not None:
        described["shared_experts"] = statement
    return described
