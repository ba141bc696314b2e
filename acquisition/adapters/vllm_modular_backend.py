"""Admission and build of the ``vllm-modular`` adapter (R21-R24): which target ranks vLLM's
modular kernel can be emulated for on one GPU, and why the others are declined."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, ClassVar

from acquisition.adapters.base import Admission, RuntimeInfo
from acquisition.adapters.vllm_capabilities import (
    MODULAR_SYMBOLS,
    ApiSurface,
    CapabilityError,
    Resolver,
    import_resolver,
    probe_surface,
)
from acquisition.adapters.vllm_fp8 import FP8_SYMBOLS
from acquisition.adapters.vllm_modular import VllmModularSession, modular_components
from acquisition.adapters.vllm_modular_native import (
    class_reasons,
    resolve_native,
    torch_dtype,
    vllm_context,
)
from acquisition.options.measurable import declared_reasons
from moetables.geometry import MoeTarget

if TYPE_CHECKING:
    from collections.abc import Callable

    from acquisition.catalog import MoeModel
    from acquisition.protocol.attribution import ProfiledWindow

__all__ = ["VllmModularBackend"]


class VllmModularBackend:
    """Admits modular expert execution (unquantized or block FP8) of any full-EP target rank."""

    name: ClassVar[str] = "vllm-modular"
    native: ClassVar[bool] = True

    def __init__(
        self,
        resolve: Resolver = import_resolver,
        activities: Callable[[Callable[[], Any]], list[str]] | None = None,
        trace: Callable[[Callable[[Any], None]], ProfiledWindow] | None = None,
    ) -> None:
        self._resolve = resolve
        self._activities = activities
        self._trace = trace

    def components(self, model: MoeModel, target: MoeTarget) -> tuple[str, ...]:
        """DP+EP adds the local finalize copy (and, with FP8 activations, the local dispatch
        quantization); DP1's finalize is a verified no-op (R22, R23)."""
        return modular_components(model, target)

    def surface(self, model: MoeModel | None = None) -> ApiSurface:
        symbols = dict(MODULAR_SYMBOLS)
        if model is not None and model.quantization is not None:
            symbols.update(FP8_SYMBOLS)
        return probe_surface(symbols, self._resolve)

    def admit(self, model: MoeModel, target: MoeTarget, runtime: RuntimeInfo) -> Admission:
        reasons: list[str] = []
        if runtime.device != "cuda" or not runtime.accelerator_available:
            reasons.append(
                "needs a CUDA device: vLLM's modular experts are GPU kernels "
                f"(--device {runtime.device}, accelerator available: "
                f"{runtime.accelerator_available})"
            )
        reasons += declared_reasons(self.name, model, target)
        try:
            self._resolve("vllm")
            surface = self.surface(model)
        except Exception as exc:  # vLLM failing at import is a decline, not a crash
            reasons.append(f"vLLM is not importable here: {type(exc).__name__}: {exc}")
            return Admission.decline(self.name, *reasons)
        if not surface.complete:
            return Admission.decline(self.name, *reasons, *surface.missing)
        reasons += class_reasons(surface)
        if reasons:
            return Admission.decline(self.name, *reasons)
        try:
            import torch

            with vllm_context(surface) as config:
                resolve_native(
                    surface,
                    model,
                    target,
                    device=torch.device("cuda"),
                    dtype=torch_dtype(model.dtype or "bfloat16"),
                    all2all_backend=config.parallel_config.all2all_backend,
                )
        except CapabilityError as exc:
            return Admission.decline(self.name, *exc.reasons)
        return Admission.accept(self.name)

    def build(
        self, model: MoeModel, target: MoeTarget, runtime: RuntimeInfo, dtype: str
    ) -> VllmModularSession:
        return VllmModularSession(
            model,
            target,
            runtime,
            dtype,
            self.surface(model),
            activities=self._activities,
            trace=self._trace,
            resolve=self._resolve,
        )
