"""A plain PyTorch MoE layer: the reference backend, on CPU or CUDA.

Gate linear, softmax top-k routing (optionally renormalized), and per-expert SiLU-and-mul
MLPs in a Python loop over the active local experts, as a textbook implementation writes it.
It is *not* native vLLM execution: its contract says ``native: false`` and names this module,
so its tables are never mistaken for an engine's.

Components: ``gate_routing`` (gate projection, fp32 softmax, top-k, renormalization) on local
rows; ``experts`` (dispatch by the top-k ids through the rank's expert map, the expert MLPs,
weighting and accumulation into the caller's buffer) on gathered rows; ``finalize_copy`` (this
rank's slice of the combined expert output copied into the layer output) on local rows, for
DP+EP targets. Synthetic weights; equal outputs between banks are exact because every bank is
a clone of the same values and the per-expert accumulation has unique rows per call.

On CUDA the build traces the layer's whole forward at a few row counts (``traced_forward``):
the components in one window in the order the layer runs them, each in its own scope, every
activity attributed by launch correlation; the sums against the window's whole CUDA activity
are the bundle's ``conservation.csv``. DP+EP ranks get their gathered rows and routing made
before the window (the all-gather is a collective, not a component).
"""

from __future__ import annotations

import time
from collections import Counter
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar

from acquisition.adapters.base import Admission, GateRoutingForward, RuntimeInfo
from acquisition.adapters.shared_experts import with_shared_expert_statement
from acquisition.options.measurable import declared_reasons
from moetables.bundle import EXPERTS
from moetables.geometry import MoeTarget, linear_expert_map

if TYPE_CHECKING:
    from collections.abc import Callable

    from acquisition.catalog import MoeModel
    from acquisition.protocol.attribution import ProfiledWindow
    from acquisition.protocol.stimulus import RoutingStimulus

    Tracer = Callable[[Callable[[Any], None]], ProfiledWindow]

__all__ = ["TorchReferenceBackend", "TorchReferenceSession"]

_SEED = 20260101
# Local rows traced for conservation when the runtime carries no serving limits.
_PROBE_ROWS = 32


def reference_components(target: MoeTarget) -> tuple[str, ...]:
    """gate_routing and experts; finalize_copy too where DP+EP returns to local rows (R23)."""
    if target.dp > 1:
        return ("gate_routing", EXPERTS, "finalize_copy")
    return ("gate_routing", EXPERTS)


def _torch_dtype(name: str) -> Any:
    import torch

    return {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}[name]


class TorchReferenceBackend:
    """Admits any unquantized SiLU-and-mul softmax-routed MoE geometry it can run."""

    name: ClassVar[str] = "torch-reference"
    native: ClassVar[bool] = False

    def __init__(self, trace: Tracer | None = None) -> None:
        self._trace = trace

    def admit(self, model: MoeModel, target: MoeTarget, runtime: RuntimeInfo) -> Admission:
        reasons = declared_reasons(self.name, model, target)
        if runtime.device == "cuda" and not runtime.accelerator_available:
            reasons.append("--device cuda: torch sees no CUDA device on this host")
        if reasons:
            return Admission.decline(self.name, *reasons)
        return Admission.accept(self.name)

    def components(self, model: MoeModel, target: MoeTarget) -> tuple[str, ...]:
        return reference_components(target)

    def build(
        self, model: MoeModel, target: MoeTarget, runtime: RuntimeInfo, dtype: str
    ) -> TorchReferenceSession:
        return TorchReferenceSession(model, target, runtime, dtype, trace=self._trace)


@dataclass(slots=True)
class _PreparedExperts:
    hidden: Any
    topk_ids: Any
    topk_weights: Any
    output: Any


class _FinalizeCopy:
    """This rank's rows of the combined expert output, copied into the layer output."""

    def __init__(self, session: TorchReferenceSession, rows: int) -> None:
        import torch

        target = session.target
        # SP ranks hold one TP slice of every DP rank's rows; others hold their DP rank's rows.
        slices = target.tp * target.dp if target.sequence_parallel else target.dp
        position = target.rank if target.sequence_parallel else target.dp_rank
        self._combined = session.random((slices * rows, session.hidden), seed=rows + 7)
        self._start = position * rows
        self._rows = rows
        self._output = torch.empty(
            (rows, session.hidden), dtype=session.dtype, device=session.device
        )

    def run(self) -> Any:
        self._output.copy_(self._combined[self._start : self._start + self._rows])
        return self._output

    def reference(self) -> Any:
        return self._combined[self._start : self._start + self._rows].clone()


class TorchReferenceSession:
    """Weights, banks and component callables of the reference layer for one target."""

    def __init__(
        self,
        model: MoeModel,
        target: MoeTarget,
        runtime: RuntimeInfo,
        dtype: str,
        *,
        trace: Tracer | None = None,
    ) -> None:
        import torch

        self._torch = torch
        self.model = model
        self.target = target
        self.device = torch.device("cuda" if runtime.device == "cuda" else "cpu")
        if self.device.type == "cpu":
            # One intra-op thread: with OpenMP workers a shared CPU turns tiny scatter
            # operators into milliseconds of spin-waiting, and the timings into noise.
            torch.set_num_threads(1)
        self.dtype_name = dtype
        self.dtype = _torch_dtype(dtype)
        self.hidden = model.hidden_size
        self.width = model.expert_intermediate_size
        self.top_k = model.top_k
        self.expert_map_list = linear_expert_map(model.global_experts, target.ep, target.rank)
        self.local_experts = sum(1 for e in self.expert_map_list if e >= 0)
        self.components = reference_components(target)
        self.expert_map = torch.tensor(self.expert_map_list, dtype=torch.int64, device=self.device)
        scale = self.hidden**-0.5
        self.gate_weight = self.random((model.global_experts, self.hidden), seed=1, scale=scale)
        # w13 stacks the gate and up projections ([L, 2I, H]); w2 is the down projection.
        self.w13 = self.random(
            (self.local_experts, 2 * self.width, self.hidden), seed=2, scale=scale
        )
        self.w2 = self.random(
            (self.local_experts, self.hidden, self.width), seed=3, scale=self.width**-0.5
        )
        self.banks: list[tuple[Any, Any]] = []
        self.ownership: list[dict[str, Any]] = []
        self.build_phases: dict[str, float] = {}
        if trace is None and self.device.type == "cuda":
            from acquisition.adapters.vllm_ownership import trace
        if trace is not None:
            started = time.perf_counter()
            budget = runtime.limits.max_num_batched_tokens if runtime.limits else _PROBE_ROWS
            self.ownership = [
                self.traced_forward(rows, trace) for rows in sorted({1, min(256, budget), budget})
            ]
            self.build_phases["build.conservation_traces"] = time.perf_counter() - started

    def traced_forward(self, rows: int, trace: Tracer) -> dict[str, Any]:
        """One traced forward of the layer at ``rows`` local rows per DP rank."""
        from acquisition.adapters.vllm_ownership import nested_ownership

        torch = self._torch
        domain = self.target.token_domains((rows,) * self.target.dp)
        local = self.random((domain.local_rows, self.hidden), seed=domain.local_rows + 23)
        dp_ep = "finalize_copy" in self.components
        gathered: _PreparedExperts | None = None
        finalize: _FinalizeCopy | None = None
        if dp_ep:
            hidden = self.random((domain.expert_rows, self.hidden), seed=domain.expert_rows)
            weights, ids = self.gate_routing(hidden)
            gathered = _PreparedExperts(hidden, ids, weights, torch.empty_like(hidden))
            finalize = _FinalizeCopy(self, domain.local_rows)

        def forward(capture: Any) -> None:
            with capture.region("gate_routing"):
                weights, ids = self.gate_routing(local)
            experts = gathered or _PreparedExperts(local, ids, weights, torch.empty_like(local))
            with capture.region(EXPERTS):
                self.experts(experts, self.w13, self.w2, experts.output)
            if finalize is not None:
                with capture.region("finalize_copy"):
                    finalize.run()

        owned = nested_ownership(trace(forward))
        result: dict[str, Any] = {
            "tokens": domain.local_rows,
            "expert_rows": domain.expert_rows,
            "forward": "reference layer" + (" (collectives excluded)" if dp_ep else ""),
            "native_forward_total_us": owned.total_ns / 1000.0,
            "outside_scopes_us": owned.outside_ns / 1000.0,
            "activities": {
                **{k: dict(Counter(v)) for k, v in sorted(owned.per_scope_names.items())},
                "outside": dict(Counter(owned.outside_names)),
            },
        }
        for component in self.components:
            result[f"{component}_us"] = owned.per_scope_ns.get(component, 0) / 1000.0
        return result

    def random(self, shape: tuple[int, ...], *, seed: int, scale: float = 1.0) -> Any:
        torch = self._torch
        generator = torch.Generator(device=self.device).manual_seed(_SEED + seed)
        values = torch.randn(shape, generator=generator, device=self.device, dtype=torch.float32)
        return (values * scale).to(self.dtype)

    def describe(self) -> dict[str, Any]:
        torch = self._torch
        cuda = self.device.type == "cuda"
        described: dict[str, Any] = {
            "name": TorchReferenceBackend.name,
            "native": False,
            "implementation": f"{__name__}.TorchReferenceSession",
            "expert_class": f"{__name__}.TorchReferenceSession.experts",
            "device": self.device.type,
            "cpu_threads": torch.get_num_threads() if not cuda else None,
            "expert_layout": "w13 [L, 2I, H] (gate, up) and w2 [L, H, I], per-expert loop",
            "activation": "silu_and_mul",
            "routing": {
                "scoring": "softmax",
                "renormalize": self.model.renormalize,
                "logits_dtype": "float32",
            },
            "dtypes": {
                "hidden_states": str(self.dtype).removeprefix("torch."),
                "expert_weights": str(self.dtype).removeprefix("torch."),
                "gate_weight": str(self.dtype).removeprefix("torch."),
                "router_logits": "float32",
                "topk_weights": "float32",
                "topk_ids": str(torch.int64).removeprefix("torch."),
            },
            "gate_weight_bytes": self.gate_weight.numel() * self.gate_weight.element_size(),
            "excluded": ["collectives", "cpu_time", "launch_gaps", "shared_experts"],
            # The layer's whole forward traced at a few row counts: conservation.csv.
            "launch_ownership": self.ownership,
            "attribution": (
                "launch_correlation: CUDA kernels, copies and sets attributed by the "
                "correlation id of their host launch inside each component's range"
                if cuda
                else "cpu_operator_events: no device timeline on CPU; outermost CPU operator "
                "events inside each component's range stand in for device activities"
            ),
        }
        # A textbook layer of the routed path: a shared expert is in none of its components.
        return with_shared_expert_statement(described, self.model, component=None)

    def expert_weight_bytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in (self.w13, self.w2))

    def expert_bank_bytes(self) -> int:
        # Plain tensors: a clone owns exactly the weights, no scales or native state.
        return self.expert_weight_bytes()

    def allocate_banks(self, count: int) -> None:
        self.banks = [(self.w13.clone(), self.w2.clone()) for _ in range(count)]

    def local_forward(self, component: str, rows: int) -> Any:
        if component == "gate_routing":
            return GateRoutingForward(self, rows)
        if component == "finalize_copy":
            return _FinalizeCopy(self, rows)
        raise ValueError(f"torch-reference has no local component {component!r}")

    def gate_routing(self, hidden: Any) -> tuple[Any, Any]:
        torch = self._torch
        logits = torch.nn.functional.linear(hidden, self.gate_weight)
        probs = torch.softmax(logits.float(), dim=-1)
        weights, ids = torch.topk(probs, self.top_k, dim=-1)
        if self.model.renormalize:
            weights = weights / weights.sum(dim=-1, keepdim=True)
        return weights, ids

    def prepare_experts(self, stimulus: RoutingStimulus) -> _PreparedExperts:
        torch = self._torch
        n = stimulus.tokens
        return _PreparedExperts(
            hidden=self.random((n, self.hidden), seed=n + 11),
            topk_ids=torch.from_numpy(stimulus.topk_ids).to(self.device),
            topk_weights=torch.from_numpy(stimulus.topk_weights).to(self.device),
            output=torch.empty((n, self.hidden), dtype=self.dtype, device=self.device),
        )

    def experts(self, prepared: _PreparedExperts, w13: Any, w2: Any, output: Any) -> Any:
        torch = self._torch
        local = self.expert_map[prepared.topk_ids].reshape(-1)
        # Sorting by local expert groups each expert's pairs; remote pairs (-1) sort first.
        order = torch.argsort(local, stable=True)
        counts = torch.bincount(local + 1, minlength=self.local_experts + 1).tolist()
        owned = order[counts[0] :]
        rows = owned // self.top_k
        weights = prepared.topk_weights.reshape(-1)[owned].to(self.dtype).unsqueeze(1)
        routed = prepared.hidden.index_select(0, rows)
        output.zero_()
        start = 0
        for expert, count in enumerate(counts[1:]):
            if count == 0:
                continue
            end = start + count
            gate_up = torch.nn.functional.linear(routed[start:end], w13[expert])
            act = torch.nn.functional.silu(gate_up[:, : self.width]) * gate_up[:, self.width :]
            out = torch.nn.functional.linear(act, w2[expert]).mul_(weights[start:end])
            # Rows are unique within one expert, so each call adds once per element and the
            # accumulation order (expert by expert) is fixed: outputs are exactly reproducible.
            output.index_add_(0, rows[start:end], out)
            start = end
        return output

    def run_experts(self, prepared: _PreparedExperts, bank: int) -> Any:
        w13, w2 = self.banks[bank]
        return self.experts(prepared, w13, w2, prepared.output)

    def reference_experts(self, prepared: _PreparedExperts) -> Any:
        output = self._torch.empty_like(prepared.output)
        return self.experts(prepared, self.w13, self.w2, output)

    def synchronize(self) -> None:
        if self.device.type == "cuda":
            self._torch.cuda.synchronize()

    def close(self) -> None:
        self.banks = []
        if self.device.type == "cuda":
            self._torch.cuda.empty_cache()
