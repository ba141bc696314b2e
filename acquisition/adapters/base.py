"""The interface every execution path implements, and what admission decides with.

An adapter owns two things (design: adapter owner): a pure ``admit(model, target, runtime)``
that reads declared capabilities and live API presence, and ``build`` which returns a
``ComponentSession`` whose callables run one forward of each component. It never measures,
never chooses between adapters and never reads version strings.

The protocol drives a session like this, for one target::

    session = backend.build(model, target, runtime, dtype)
    session.allocate_banks(2 * B)           # B from expert_bank_bytes() and the cache size
    forward = session.local_forward("gate_routing", rows)
    forward.run()                           # timed, inside a profiler range
    forward.reference()                     # compared exactly before timing
    prepared = session.prepare_experts(stimulus)
    session.run_experts(prepared, bank)     # timed, inside a profiler range
    session.reference_experts(prepared)     # cloned eager reference, compared exactly

Tensors never cross into the plan; the protocol only compares them with ``torch.equal``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar, Protocol, runtime_checkable

if TYPE_CHECKING:
    from acquisition.catalog import MoeModel
    from acquisition.protocol.stimulus import RoutingStimulus
    from moetables.geometry import MoeTarget

__all__ = [
    "AdapterRefusal",
    "Admission",
    "ComponentBackend",
    "ComponentSession",
    "EngineLimits",
    "GateRoutingForward",
    "GateRoutingSession",
    "LocalForward",
    "RuntimeInfo",
]


@dataclass(frozen=True, slots=True)
class EngineLimits:
    """The serving limits a component engine must keep (R31): never reduced to fit.

    ``max_model_len``, ``kv_cache_memory_bytes`` and ``attention_backend`` are None unless an
    adapter's own command line supplies them.
    """

    max_num_batched_tokens: int
    max_num_seqs: int
    max_model_len: int | None = None
    kv_cache_memory_bytes: int | None = None
    attention_backend: str | None = None


class AdapterRefusal(RuntimeError):
    """A refusal an adapter can only learn while building (e.g. a prepare that launches work).

    Raised from ``build``; the CLI prints ``reasons`` and exits as for a declined admission,
    before any samples are opened. Adapter-specific errors subclass it.
    """

    def __init__(self, backend: str, *reasons: str) -> None:
        super().__init__(f"{backend}: " + "; ".join(reasons))
        self.backend = backend
        self.reasons = reasons


@dataclass(frozen=True, slots=True)
class RuntimeInfo:
    """What the acquisition host offers, observed once before admission.

    ``cache_bytes`` is the cache the weight banks must overflow: the GPU's L2, or the CPU's
    last-level cache; ``cache_source`` says which and how it was read.
    """

    device: str
    device_name: str
    accelerator_available: bool
    torch_version: str | None
    cuda_version: str | None
    capability: tuple[int, int] | None
    cache_bytes: int
    cache_source: str
    total_memory: int | None
    uuid: str | None
    host: str
    limits: EngineLimits | None = None

    def observations(self) -> dict[str, Any]:
        """Provenance: recorded, never part of the resume identity."""
        return {
            "device": self.device,
            "device_name": self.device_name,
            "torch_version": self.torch_version,
            "cuda_version": self.cuda_version,
            "capability": list(self.capability) if self.capability else None,
            "cache_bytes": self.cache_bytes,
            "cache_source": self.cache_source,
            "total_memory": self.total_memory,
            "uuid": self.uuid,
            "host": self.host,
            "limits": None
            if self.limits is None
            else {
                "max_num_batched_tokens": self.limits.max_num_batched_tokens,
                "max_num_seqs": self.limits.max_num_seqs,
                "max_model_len": self.limits.max_model_len,
                "kv_cache_memory_bytes": self.limits.kv_cache_memory_bytes,
                "attention_backend": self.limits.attention_backend,
            },
        }


@dataclass(frozen=True, slots=True)
class Admission:
    """An adapter's answer for one (model, target, runtime); reasons say why it declined."""

    backend: str
    admitted: bool
    reasons: tuple[str, ...] = field(default=())

    @classmethod
    def accept(cls, backend: str) -> Admission:
        return cls(backend=backend, admitted=True)

    @classmethod
    def decline(cls, backend: str, *reasons: str) -> Admission:
        if not reasons:
            raise ValueError("a declined admission needs a reason")
        return cls(backend=backend, admitted=False, reasons=tuple(reasons))


@runtime_checkable
class LocalForward(Protocol):
    """One local component (gate_routing, finalize_copy, wrapper) on fixed inputs."""

    def run(self) -> Any:
        """One timed forward; returns its output."""

    def reference(self) -> Any:
        """The eager reference output for the same inputs."""


class GateRoutingSession(Protocol):
    """What `GateRoutingForward` needs of a session."""

    hidden: int

    def random(self, shape: tuple[int, ...], *, seed: int, scale: float = 1.0) -> Any: ...

    def gate_routing(self, hidden: Any) -> Any: ...


class GateRoutingForward:
    """gate_routing on fixed random rows (seeded by the row count): one workload for every
    backend, so that their gate tables measure the same inputs."""

    def __init__(self, session: GateRoutingSession, rows: int) -> None:
        self._session = session
        self._hidden = session.random((rows, session.hidden), seed=rows)

    def run(self) -> Any:
        return self._session.gate_routing(self._hidden)

    def reference(self) -> Any:
        return self._session.gate_routing(self._hidden.clone())


@runtime_checkable
class ComponentSession(Protocol):
    """A built execution path for one target, holding its weights and banks."""

    components: tuple[str, ...]

    def describe(self) -> dict[str, Any]:
        """Contract fields: backend, implementation class, dtypes, attribution, exclusions."""

    def expert_weight_bytes(self) -> int:
        """Unique native weight/scale storage of the local experts (R33)."""

    def expert_bank_bytes(self) -> int:
        """Bytes a conditioned clone must own: weights plus native state (R33)."""

    def allocate_banks(self, count: int) -> None:
        """Clone ``count`` independent weight banks (aliases, offsets and strides kept)."""

    def local_forward(self, component: str, rows: int) -> LocalForward:
        """Fixed inputs of ``rows`` local rows for a local component."""

    def prepare_experts(self, stimulus: RoutingStimulus) -> Any:
        """Device inputs for one routing stimulus (outside every timed range)."""

    def run_experts(self, prepared: Any, bank: int) -> Any:
        """One timed expert forward with bank ``bank``; returns the caller's output buffer."""

    def reference_experts(self, prepared: Any) -> Any:
        """The cloned eager reference (or exact native method) output for ``prepared``."""

    def synchronize(self) -> None:
        """Wait for every launched activity."""

    def close(self) -> None:
        """Release weights and banks."""


class ComponentBackend(Protocol):
    """An execution path: admission by capability, then building a session."""

    name: ClassVar[str]
    native: ClassVar[bool]

    def admit(self, model: MoeModel, target: MoeTarget, runtime: RuntimeInfo) -> Admission:
        """Pure: read declared capabilities and live API presence; never measure."""

    def components(self, model: MoeModel, target: MoeTarget) -> tuple[str, ...]:
        """The components this path times for ``target``, in table order (planned from it)."""

    def build(
        self, model: MoeModel, target: MoeTarget, runtime: RuntimeInfo, dtype: str
    ) -> ComponentSession:
        """Build the component callables of an admitted target (``runtime.limits`` holds the
        serving limits); raise ``AdapterRefusal`` for what only building can reveal."""
