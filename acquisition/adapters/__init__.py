"""Choosing an execution path: ask each adapter in priority order, report why each declined.

Selection holds no capability knowledge (design: selection owner); adapters decide. ``auto``
considers native adapters only: the torch reference measures a textbook layer, not an
engine, so it runs only when asked for by name and is never substituted for a native path
that declined. The vLLM adapters of issue 5 join ``NATIVE_BACKENDS`` in priority order.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from acquisition.adapters.base import (
    Admission,
    ComponentBackend,
    ComponentSession,
    LocalForward,
    RuntimeInfo,
)
from acquisition.adapters.torch_reference import TorchReferenceBackend
from acquisition.adapters.vllm_live_backend import VllmLiveBackend
from acquisition.adapters.vllm_modular_backend import VllmModularBackend

if TYPE_CHECKING:
    from collections.abc import Sequence

    from acquisition.catalog import MoeModel
    from moetables.geometry import MoeTarget

__all__ = [
    "BACKENDS",
    "NATIVE_BACKENDS",
    "Admission",
    "AdmissionError",
    "AdmissionReport",
    "ComponentBackend",
    "ComponentSession",
    "LocalForward",
    "RuntimeInfo",
    "backend_names",
    "select_backend",
]

# Native execution paths, highest priority first: vLLM's modular kernel for any full-EP rank
# of an unquantized checkpoint (the routed path only: a shared expert is in none of its
# components, and its contract says so), then the engine's live layer at TP1 (quantized
# layers, which the modular path declines, and the whole block of a shared-expert layer:
# ask for it with --backend vllm-live, since auto takes the modular path first).
NATIVE_BACKENDS: tuple[ComponentBackend, ...] = (VllmModularBackend(), VllmLiveBackend())
REFERENCE_BACKENDS: tuple[ComponentBackend, ...] = (TorchReferenceBackend(),)
BACKENDS: tuple[ComponentBackend, ...] = NATIVE_BACKENDS + REFERENCE_BACKENDS


def backend_names() -> list[str]:
    return ["auto", *(b.name for b in BACKENDS)]


@dataclass(frozen=True, slots=True)
class AdmissionReport:
    """Every adapter asked for one target, in order, and what it answered."""

    target: MoeTarget
    requested: str
    admissions: tuple[Admission, ...]

    @property
    def selected(self) -> str | None:
        for admission in self.admissions:
            if admission.admitted:
                return admission.backend
        return None

    def lines(self) -> list[str]:
        target = f"tp{self.target.tp}/{self.target.deployment}"
        out = [f"admission for {target} (--backend {self.requested}):"]
        if not self.admissions:
            out.append("  no adapter was asked")
        for admission in self.admissions:
            if admission.admitted:
                out.append(f"  {admission.backend}: admitted")
            else:
                out.extend(
                    f"  {admission.backend}: declined: {reason}" for reason in admission.reasons
                )
        return out

    def as_dict(self) -> dict[str, object]:
        return {
            "requested": self.requested,
            "selected": self.selected,
            "admissions": [
                {"backend": a.backend, "admitted": a.admitted, "reasons": list(a.reasons)}
                for a in self.admissions
            ],
        }


class AdmissionError(RuntimeError):
    """No adapter admitted the target; ``report`` says why each declined."""

    def __init__(self, report: AdmissionReport, hint: str = "") -> None:
        message = "\n".join(report.lines())
        if hint:
            message += "\n" + hint
        super().__init__(message)
        self.report = report


def select_backend(
    requested: str,
    model: MoeModel,
    target: MoeTarget,
    runtime: RuntimeInfo,
    *,
    candidates: Sequence[ComponentBackend] | None = None,
) -> tuple[ComponentBackend, AdmissionReport]:
    """The first adapter that admits ``target``; AdmissionError with the report otherwise."""
    if candidates is None:
        if requested == "auto":
            candidates = NATIVE_BACKENDS
        else:
            candidates = tuple(b for b in BACKENDS if b.name == requested)
            if not candidates:
                raise ValueError(f"unknown backend {requested!r}; choose from {backend_names()}")
    admissions: list[Admission] = []
    for backend in candidates:
        admission = backend.admit(model, target, runtime)
        admissions.append(admission)
        if admission.admitted:
            return backend, AdmissionReport(target, requested, tuple(admissions))
    report = AdmissionReport(target, requested, tuple(admissions))
    hint = ""
    if requested == "auto":
        hint = (
            "auto selects native adapters only; the plain PyTorch layer runs only with "
            "--backend torch-reference"
        )
    raise AdmissionError(report, hint)
