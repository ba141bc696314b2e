"""Admission and build of the ``vllm-live`` adapter (R25-R28, R31): the engine's own MoE
layer at TP1/DP1/EP1, admitted only with the serving limits supplied."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any, ClassVar

from acquisition.adapters.base import Admission, EngineLimits, RuntimeInfo
from acquisition.adapters.vllm_capabilities import (
    LIVE_SYMBOLS,
    CapabilityError,
    Resolver,
    import_resolver,
    probe_surface,
)
from acquisition.adapters.vllm_live import VllmLiveSession
from acquisition.adapters.vllm_live_config import (
    declared_wrapper_work,
    effective_limits,
    model_folder,
    smallest_moe_prefix,
)
from acquisition.adapters.vllm_live_scopes import WRAPPER
from acquisition.options.measurable import declared_reasons
from moetables.bundle import EXPERTS

if TYPE_CHECKING:
    from collections.abc import Callable

    from acquisition.catalog import MoeModel
    from moetables.geometry import MoeTarget

__all__ = ["VllmLiveBackend"]


class VllmLiveBackend:
    """Admits the engine's own MoE layer at TP1/DP1/EP1 (quantized and shared experts too)."""

    name: ClassVar[str] = "vllm-live"
    native: ClassVar[bool] = True

    def __init__(
        self,
        limits: EngineLimits | None = None,
        resolve: Resolver = import_resolver,
        engine_factory: Callable[..., Any] | None = None,
    ) -> None:
        self._limits = limits
        self._resolve = resolve
        self._engine_factory = engine_factory

    def components(self, model: MoeModel, target: MoeTarget) -> tuple[str, ...]:
        """gate_routing and experts; the wrapper where the checkpoint declares work for it.

        A wrapper boundary that launches nothing cannot be a table row (times must be
        positive); the build-time ownership trace verifies the declaration either way.
        """
        if declared_wrapper_work(model):
            return ("gate_routing", EXPERTS, WRAPPER)
        return ("gate_routing", EXPERTS)

    def admit(self, model: MoeModel, target: MoeTarget, runtime: RuntimeInfo) -> Admission:
        # The target (TP1/DP1/EP1, R25) and the checkpoint: the rules the registry also asks.
        reasons = declared_reasons(self.name, model, target)
        if runtime.device != "cuda" or not runtime.accelerator_available:
            reasons.append("needs a CUDA device: the component engine is a vLLM GPU engine")
        if effective_limits(runtime, self._limits) is None:
            reasons.append(
                "engine limits (max batched tokens, max sequences) were not supplied to the "
                "live adapter; it never starts an engine with guessed limits (R31)"
            )
        try:
            folder = model_folder(model)
            config = json.loads((folder / "config.json").read_text())
            if not config.get("architectures"):
                reasons.append(
                    f"{folder}/config.json names no architectures: vLLM cannot build the model"
                )
            else:
                smallest_moe_prefix(config)
        except (CapabilityError, OSError, ValueError) as exc:
            reasons.append(f"model folder: {exc}")
        try:
            self._resolve("vllm")
        except Exception as exc:
            reasons.append(f"vLLM is not importable here: {type(exc).__name__}: {exc}")
            return Admission.decline(self.name, *reasons)
        surface = probe_surface(LIVE_SYMBOLS, self._resolve)
        reasons += surface.missing
        if reasons:
            return Admission.decline(self.name, *reasons)
        return Admission.accept(self.name)

    def build(
        self, model: MoeModel, target: MoeTarget, runtime: RuntimeInfo, dtype: str
    ) -> VllmLiveSession:
        limits = effective_limits(runtime, self._limits)
        if limits is None:
            raise CapabilityError(
                "engine limits were not supplied to the live adapter", backend=self.name
            )
        return VllmLiveSession(
            model,
            target,
            runtime,
            dtype,
            limits,
            probe_surface(LIVE_SYMBOLS, self._resolve),
            engine_factory=self._engine_factory,
            components=self.components(model, target),
            resolve=self._resolve,
        )
