"""Scopes of the live layer's native forward, and the launch-ownership proof (R26).

The gate/router and routed-kernel calls of the parent block's forward are wrapped (recorded,
marked as profiler scopes, or elided: they return what they produced for the same input and
launch nothing). At build, one traced native forward per token count proves that every
device activity belongs to exactly one innermost scope and that the scopes add up to the
parent's total; the elided wrapper must launch exactly the parent's remainder and return the
native output. A mixin of ``VllmLiveSession``.
"""

from __future__ import annotations

import contextlib
from collections import Counter
from typing import TYPE_CHECKING, Any

from acquisition.adapters.vllm_capabilities import (
    CapabilityError,
)

if TYPE_CHECKING:
    from collections.abc import Callable, Iterator


__all__ = ["WRAPPER", "LiveScopes"]

WRAPPER = "wrapper"


class LiveScopes:
    """Scope wrapping and the ownership proof of the live session."""

    layer: Any
    hidden: int
    components: tuple[str, ...]
    ownership: list[dict[str, Any]]
    _torch: Any

    if TYPE_CHECKING:  # implemented by the session class this mixin is part of

        def random(self, shape: tuple[int, ...], *, seed: int, scale: float = 1.0) -> Any: ...

        def native_forward(self, hidden: Any) -> Any: ...

        def gate_routing(self, hidden: Any) -> Any: ...

        def experts_on(self, hidden: Any, topk_weights: Any, topk_ids: Any) -> Any: ...

    def scope_outputs(self, hidden: Any) -> dict[str, Any]:
        """What the gate/router and routed-kernel scopes return inside one native forward."""
        recorded: dict[str, Any] = {}

        def record(name: str, fn: Callable[..., Any]) -> Callable[..., Any]:
            def call(*args: Any, **kwargs: Any) -> Any:
                result = fn(*args, **kwargs)
                recorded[name] = result
                return result

            return call

        with self._patched(
            gate=lambda f: record("gate", f),
            router=lambda f: record("router", f),
            experts=lambda f: record("experts", f),
        ):
            self.native_forward(hidden)
        missing = {"gate", "router", "experts"} - recorded.keys()
        if missing:
            raise CapabilityError(
                f"the parent forward never called the {', '.join(sorted(missing))} scope(s): "
                "the layer does not run the modular path this adapter audits"
            )
        return recorded

    def elided_forward(self, hidden: Any, scopes: dict[str, Any]) -> Any:
        """The parent forward whose gate/router and routed-kernel scopes launch nothing."""
        with self._patched(
            gate=lambda f: lambda *a, **k: scopes["gate"],
            router=lambda f: lambda *a, **k: scopes["router"],
            experts=lambda f: lambda *a, **k: scopes["experts"],
        ):
            return self.native_forward(hidden)

    @contextlib.contextmanager
    def _patched(
        self, **wrappers: Callable[[Callable[..., Any]], Callable[..., Any]]
    ) -> Iterator[None]:
        """Temporarily wrap scope callables as instance attributes; always restored."""
        targets = {
            "gate": (self.layer.gate, "forward"),
            "router": (self.layer.router, "select_experts"),
            "experts": (self.layer.routed_experts, "forward_modular"),
        }
        installed = []
        try:
            for key, wrap in wrappers.items():
                owner, name = targets[key]
                if name in owner.__dict__:
                    raise CapabilityError(f"{type(owner).__name__}.{name} is already patched")
                original = getattr(owner, name)
                setattr(owner, name, wrap(original))
                installed.append((owner, name))
            yield
        finally:
            for owner, name in installed:
                owner.__dict__.pop(name, None)

    def _check_ownership(self, tokens: int) -> dict[str, Any]:
        """One traced native forward: ownership per scope, conservation, the elided wrapper."""
        from acquisition.adapters.vllm_ownership import nested_ownership, trace

        hidden = self.random((tokens, self.hidden), seed=tokens + 17)
        scopes = self.scope_outputs(hidden)

        def native(capture: Any) -> None:
            def region(name: str, fn: Callable[..., Any]) -> Callable[..., Any]:
                def call(*args: Any, **kwargs: Any) -> Any:
                    with capture.region(name):
                        return fn(*args, **kwargs)

                return call

            with (
                self._patched(
                    gate=lambda f: region("gate", f),
                    router=lambda f: region("router", f),
                    experts=lambda f: region("experts", f),
                ),
                capture.region("parent"),
            ):
                self.native_forward(hidden)

        def elided(capture: Any) -> None:
            with capture.region(WRAPPER):
                self.elided_forward(hidden, scopes)

        topk_weights, topk_ids = scopes["router"]

        def timed(capture: Any) -> None:
            # The callables the table times, on this forward's input and routing.
            with capture.region("gate_routing"):
                self.gate_routing(hidden)
            with capture.region("experts"):
                self.experts_on(hidden, topk_weights, topk_ids)

        owned = nested_ownership(trace(native))
        wrapper = nested_ownership(trace(elided))
        components = nested_ownership(trace(timed))
        remainder = Counter(owned.per_scope_names.get("parent", []))
        elided_names = Counter(wrapper.per_scope_names.get(WRAPPER, []))
        if remainder != elided_names:
            raise CapabilityError(
                f"wrapper elision at {tokens} tokens does not reproduce the parent's own "
                f"activities: parent remainder {dict(remainder)}, elided {dict(elided_names)}"
            )
        # R26, the other two components: each timed callable launches exactly what its scopes
        # launched in the native forward. A shared expert run inside the routed kernel (an
        # overlapping prepare/finalize) would be in the experts scope but not in the timed
        # kernel call, and would belong to no row.
        scoped = {
            "gate_routing": Counter(owned.per_scope_names.get("gate", []))
            + Counter(owned.per_scope_names.get("router", [])),
            "experts": Counter(owned.per_scope_names.get("experts", [])),
        }
        for name, native_names in scoped.items():
            timed_names = Counter(components.per_scope_names.get(name, []))
            if timed_names != native_names:
                raise CapabilityError(
                    f"the {name} component at {tokens} tokens does not launch what its scopes "
                    f"launched in the native forward: native {dict(native_names)}, "
                    f"component {dict(timed_names)}",
                    backend="vllm-live",
                )
        native_out = self.native_forward(hidden.clone())
        elided_out = self.elided_forward(hidden, scopes)
        if not self._torch.equal(native_out, elided_out):
            raise CapabilityError(
                f"the elided wrapper's output differs from the native forward at {tokens} tokens"
            )
        scope_us = {k: v / 1000.0 for k, v in owned.per_scope_ns.items()}
        gate_routing = scope_us.get("gate", 0.0) + scope_us.get("router", 0.0)
        return {
            "tokens": tokens,
            "native_forward_total_us": owned.total_ns / 1000.0,
            "outside_scopes_us": owned.outside_ns / 1000.0,
            "gate_routing_us": gate_routing,
            "experts_us": scope_us.get("experts", 0.0),
            "wrapper_us": scope_us.get("parent", 0.0),
            "activities": {
                "gate": dict(Counter(owned.per_scope_names.get("gate", []))),
                "router": dict(Counter(owned.per_scope_names.get("router", []))),
                "experts": dict(Counter(owned.per_scope_names.get("experts", []))),
                "wrapper": dict(remainder),
            },
            # More than one stream: part of the parent's own work (vLLM's shared expert at
            # small token counts) ran beside the routed kernel in the engine.
            "streams": {
                "parent": owned.per_scope_streams.get("parent", []),
                "experts": owned.per_scope_streams.get("experts", []),
            },
            "note": "router under dummy weights: the routing of this trace is not a stimulus",
        }

    def _check_wrapper_declaration(self) -> None:
        """The planned components must match what the traced parent forward launches."""
        busy = [o["tokens"] for o in self.ownership if o["activities"]["wrapper"]]
        if busy and WRAPPER not in self.components:
            raise CapabilityError(
                f"the parent block launches its own work at {busy} tokens but the checkpoint "
                "declares none; the wrapper would be missing from the table",
                backend="vllm-live",
            )
        if not busy and WRAPPER in self.components:
            raise CapabilityError(
                "the wrapper boundary launches no device activity at any traced token count; "
                "a table row cannot be zero (R22's rule for empty boundaries)",
                backend="vllm-live",
            )
