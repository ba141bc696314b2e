"""The MoE layer of a real vLLM engine at TP1/DP1/EP1: the ``vllm-live`` adapter (R25-R28).

The isolated component engine is a real ``vllm.LLM`` of the smallest prefix of the model that
contains a MoE layer (a layer-count override), with dummy weights, the requested token and
sequence limits kept as they are, the checkpoint's own context length, and a private KV cache
capped by ``kv_cache_memory_bytes`` (1 GiB by default; vLLM validates the context against it
or startup fails). The engine runs in this process so that its MoE layer can be reached and
called directly; the engine's processed weights, scales, activation and selected backend are
kept, never replaced by an unquantized kernel.

Components of the native forward:

- ``gate_routing``: the layer's gate projection and its router's ``select_experts`` (when the
  native kernel fuses routing, this adapter declines: no routing replay can be verified);
- ``experts``: the modular kernel's ``apply`` (native preparation, experts, finalization, the
  kernel's own output allocation) on an explicit routing stimulus; the reference is the exact
  native method ``routed_experts.forward_modular`` with the layer's own weights, compared
  exactly with every cloned bank for every stimulus;
- ``wrapper``: the parent MoE block's forward minus the gate/router and routed-kernel scopes.

Before any timing the session traces one native parent forward with those scopes marked and
checks launch ownership: each device activity belongs to exactly one innermost scope, and the
scope sums add up to the parent's total (``vllm_ownership.nested_ownership``). The wrapper is
then run with the two scopes *elided* (their callables return the outputs they produced for
the same input, launching nothing); its activities must be exactly the parent's remainder and
its output exactly the native forward's. State checks (parameter bindings, layouts, version
counters, effective MoE configuration, callable identities) run at build and before every
reference comparison; a change is an error.
"""

from __future__ import annotations

import contextlib
import gc
import json
import os
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from acquisition.adapters.base import EngineLimits, GateRoutingForward, RuntimeInfo
from acquisition.adapters.vllm_capabilities import (
    CapabilityError,
    deferral_reasons,
)
from moetables.bundle import EXPERTS

if TYPE_CHECKING:
    from collections.abc import Callable, Iterator, Sequence

    from acquisition.adapters.triton_precompile import PrecompileReport
    from acquisition.catalog import MoeModel
    from acquisition.protocol.stimulus import RoutingStimulus
    from moetables.geometry import MoeTarget
from acquisition.adapters.vllm_banks import ScaledExpertBanks
from acquisition.adapters.vllm_descriptions import describe_live
from acquisition.adapters.vllm_live_config import (
    DEFAULT_KV_CACHE_BYTES,
    GPU_MEMORY_UTILIZATION,
    actual_settings,
    model_folder,
    register_model_classes,
    smallest_moe_prefix,
)
from acquisition.adapters.vllm_live_layer import (
    LiveMoeLayer,
    bank_quant_config,
    deferral_owners,
    find_moe_layer,
    layer_reasons,
    layer_value,
    state_difference,
    state_snapshot,
)
from acquisition.adapters.vllm_live_scopes import WRAPPER, LiveScopes
from acquisition.adapters.vllm_modular_native import torch_dtype

__all__ = ["WRAPPER", "VllmLiveSession"]

_SEED = 20261130


@dataclass(slots=True)
class _Prepared:
    hidden: Any
    topk_ids: Any
    topk_weights: Any


class _GateRouting(GateRoutingForward):
    def __init__(self, session: VllmLiveSession, rows: int) -> None:
        super().__init__(session, rows)
        self._live = session

    def reference(self) -> Any:
        # The engine's own layer: its parameters must not have moved since the build.
        self._live.check_state()
        return super().reference()


class _Wrapper:
    """The parent forward with the gate/router and routed-kernel scopes elided."""

    def __init__(self, session: VllmLiveSession, rows: int) -> None:
        self._session = session
        self._hidden = session.random((rows, session.hidden), seed=rows + 3)
        self._scopes = session.scope_outputs(self._hidden)

    def run(self) -> Any:
        return self._session.elided_forward(self._hidden, self._scopes)

    def reference(self) -> Any:
        self._session.check_state()
        return self._session.native_forward(self._hidden.clone())


class VllmLiveSession(LiveScopes, ScaledExpertBanks):
    """A component engine and the native callables of its MoE layer."""

    def __init__(
        self,
        model: MoeModel,
        target: MoeTarget,
        runtime: RuntimeInfo,
        dtype: str,
        limits: EngineLimits,
        surface: Any,
        *,
        engine_factory: Callable[..., Any] | None = None,
        components: tuple[str, ...] = ("gate_routing", EXPERTS, WRAPPER),
        check_ownership: bool = True,
        ownership_tokens: tuple[int, ...] | None = None,
        resolve: Callable[[str], Any] | None = None,
    ) -> None:
        import torch

        if not surface.complete:
            raise CapabilityError(*surface.missing)
        self._torch = torch
        self.model = model
        self.target = target
        self.dtype_name = dtype
        self.limits = limits
        self.surface = surface
        # Finds vLLM's Triton expert kernel and Triton's async compile mode for `precompile`.
        self._resolve = resolve
        self.hidden = model.hidden_size
        # What the plan times (VllmLiveBackend.components); checked against the traces below.
        self.components: tuple[str, ...] = tuple(components)
        self.banks: list[tuple[Any, ...]] = []
        self.ownership: list[dict[str, Any]] = []
        self.engine_settings: dict[str, Any] = {}
        # Seconds of the build's own phases, for the acquisition's phase table (issue 19).
        self.build_phases: dict[str, float] = {}
        started = time.perf_counter()
        self._engine = self._start_engine(engine_factory)
        self.build_phases["build.engine_start"] = (
            time.perf_counter() - started - self.build_phases.get("build.model_info", 0.0)
        )
        self.layer = self._reach_layer()
        reasons = layer_reasons(self.layer, model, surface)
        if reasons:
            raise CapabilityError(*reasons)
        _, self.deferral_readings = deferral_reasons(deferral_owners(self.layer))
        weights = self.layer.routed_experts
        self.w13, self.w2 = weights.w13_weight, weights.w2_weight
        # Quantized experts (block FP8): the kernel reads its weight scales from the experts'
        # quant config; each bank clones them and gets a kernel of the native classes whose
        # experts read the bank's clones (``_bank_experts``).
        native_experts = getattr(self.layer.kernel, "fused_experts", None)
        config = getattr(native_experts, "quant_config", None)
        self.quant_config = config if getattr(config, "is_quantized", False) else None
        self.w13_scale = None if self.quant_config is None else self.quant_config.w1_scale
        self.w2_scale = None if self.quant_config is None else self.quant_config.w2_scale
        self.bank_experts: list[Any] = []
        self.device = self.w13.device
        # The activations' dtype: the weights' own unless they are quantized (FP8 weights run
        # on activations of the engine's dtype, quantized inside the kernel).
        self.dtype = self.w13.dtype if self.quant_config is None else torch_dtype(dtype)
        self.topk_dtype = layer_value(self.layer.quant_method, "topk_indices_dtype") or torch.int32
        self._state = state_snapshot(self.layer)
        self.observations: dict[str, Any] = {}
        probe = self.random((8, self.hidden), seed=5)
        logits = self.gate_logits(probe)
        self.observations["router_logits_dtype"] = str(logits.dtype).removeprefix("torch.")
        if check_ownership:
            started = time.perf_counter()
            tokens = ownership_tokens or tuple(
                sorted({1, min(256, limits.max_num_batched_tokens), limits.max_num_batched_tokens})
            )
            for n in tokens:
                self.ownership.append(self._check_ownership(n))
            self._check_wrapper_declaration()
            self.build_phases["build.ownership_traces"] = time.perf_counter() - started
        self.check_state()

    # -- the engine -----------------------------------------------------------------------

    def _start_engine(self, engine_factory: Callable[..., Any] | None) -> Any:
        folder = model_folder(self.model)
        config = json.loads((folder / "config.json").read_text())
        prefix = smallest_moe_prefix(config)
        text = config.get("text_config") if isinstance(config.get("text_config"), dict) else config
        # The checkpoint's context, never reduced. A config that states none (the catalog
        # keeps only confirmed fields) leaves it to vLLM, which derives its own default: a
        # length of ours could exceed it and be refused.
        max_model_len = self.limits.max_model_len or text.get("max_position_embeddings")
        # The engine must run in this process for its layer to be called directly.
        os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
        arguments: dict[str, Any] = {
            "model": str(folder),
            "load_format": "dummy",
            "hf_overrides": {"num_hidden_layers": prefix},
            "enforce_eager": True,
            "max_num_batched_tokens": self.limits.max_num_batched_tokens,
            "max_num_seqs": self.limits.max_num_seqs,
            "kv_cache_memory_bytes": self.limits.kv_cache_memory_bytes or DEFAULT_KV_CACHE_BYTES,
            "gpu_memory_utilization": GPU_MEMORY_UTILIZATION,
            "skip_tokenizer_init": True,
            "generation_config": "vllm",
            "dtype": self.dtype_name,
            "tensor_parallel_size": 1,
            "data_parallel_size": 1,
        }
        if max_model_len:
            arguments["max_model_len"] = int(max_model_len)
        if self.limits.attention_backend:
            arguments["attention_backend"] = self.limits.attention_backend
        factory = engine_factory or self.surface["llm"]
        inspected: list[str] = []
        if engine_factory is None:
            started = time.perf_counter()
            inspected = register_model_classes(config.get("architectures") or [])
            self.build_phases["build.model_info"] = time.perf_counter() - started
        engine = factory(**arguments)
        self.engine_settings = {
            "requested": {k: v for k, v in arguments.items() if k != "model"},
            "model_classes_inspected_in_process": inspected,
            "model_folder": str(folder),
            "smallest_moe_prefix_layers": prefix,
            "multiprocessing": os.environ.get("VLLM_ENABLE_V1_MULTIPROCESSING"),
        }
        self.engine_settings["actual"] = actual_settings(engine)
        return engine

    def _vllm_config(self) -> Any:
        return getattr(getattr(self._engine, "llm_engine", None), "vllm_config", None)

    def _reach_layer(self) -> LiveMoeLayer:
        models = self._engine.apply_model(lambda model: model)
        model = models[0] if isinstance(models, list | tuple) else models
        if not hasattr(model, "named_modules"):
            raise CapabilityError(
                "apply_model did not return the in-process model (is the engine running in "
                "worker processes?)"
            )
        return find_moe_layer(model)

    @contextlib.contextmanager
    def forward_context(self, tokens: int) -> Iterator[None]:
        config = self._vllm_config()
        if config is None:
            yield
            return
        with self.surface["forward_context"](None, config, num_tokens=tokens):
            yield

    # -- native callables -------------------------------------------------------------------

    def random(self, shape: tuple[int, ...], *, seed: int, scale: float = 1.0) -> Any:
        torch = self._torch
        generator = torch.Generator(device=self.device).manual_seed(_SEED + seed)
        values = torch.randn(shape, generator=generator, device=self.device, dtype=torch.float32)
        return (values * scale).to(self.dtype)

    def gate_logits(self, hidden: Any) -> Any:
        out = self.layer.gate(hidden)
        return out[0] if isinstance(out, tuple) else out

    def gate_routing(self, hidden: Any) -> tuple[Any, Any]:
        logits = self.gate_logits(hidden)
        return tuple(
            self.layer.router.select_experts(
                hidden_states=hidden, router_logits=logits, topk_indices_dtype=self.topk_dtype
            )
        )

    def native_forward(self, hidden: Any) -> Any:
        with self.forward_context(hidden.shape[0]):
            return self.layer.parent(hidden)

    def experts_on(self, hidden: Any, topk_weights: Any, topk_ids: Any) -> Any:
        """The experts component's kernel call, with the layer's own weights."""
        return self._kernel_apply(_Prepared(hidden, topk_ids, topk_weights), self.w13, self.w2)

    def check_state(self) -> None:
        changed = state_difference(self._state, state_snapshot(self.layer))
        if changed:
            raise CapabilityError(
                f"the engine's MoE layer state changed during acquisition: {', '.join(changed)}"
            )

    def _bank_experts(self, w13_scale: Any, w2_scale: Any) -> Any:
        """A kernel of the engine's classes (its prepare/finalize, a new experts object of the
        native class) whose quant config reads one bank's cloned scales."""
        kernel = self.layer.kernel
        native = kernel.fused_experts
        config = bank_quant_config(self.quant_config, w13_scale, w2_scale)
        experts = type(native)(moe_config=native.moe_config, quant_config=config)
        return type(kernel)(kernel.prepare_finalize, experts)

    def _kernel_apply(self, prepared: _Prepared, w13: Any, w2: Any, kernel: Any = None) -> Any:
        routed = self.layer.routed_experts
        kernel = self.layer.kernel if kernel is None else kernel
        return kernel.apply(
            hidden_states=prepared.hidden,
            w1=w13,
            w2=w2,
            topk_weights=prepared.topk_weights,
            topk_ids=prepared.topk_ids,
            activation=routed.activation,
            global_num_experts=routed.global_num_experts,
            expert_map=routed.expert_map,
            apply_router_weight_on_input=routed.apply_router_weight_on_input,
        )

    # -- the ComponentSession interface ---------------------------------------------------

    def describe(self) -> dict[str, Any]:
        return describe_live(self)

    def local_forward(self, component: str, rows: int) -> Any:
        if component == "gate_routing":
            return _GateRouting(self, rows)
        if component == WRAPPER:
            return _Wrapper(self, rows)
        raise ValueError(f"vllm-live has no local component {component!r}")

    def prepare_experts(self, stimulus: RoutingStimulus) -> _Prepared:
        torch = self._torch
        n = stimulus.tokens
        return _Prepared(
            hidden=self.random((n, self.hidden), seed=n + 11),
            topk_ids=torch.from_numpy(stimulus.topk_ids).to(self.device, self.topk_dtype),
            topk_weights=torch.from_numpy(stimulus.topk_weights).to(self.device),
        )

    def run_experts(self, prepared: _Prepared, bank: int) -> Any:
        weights = self.banks[bank]
        kernel = self.bank_experts[bank] if self.bank_experts else None
        return self._kernel_apply(prepared, weights[0], weights[1], kernel)

    def reference_experts(self, prepared: _Prepared) -> Any:
        self.check_state()
        return self.layer.routed_experts.forward_modular(
            x=prepared.hidden,
            topk_weights=prepared.topk_weights,
            topk_ids=prepared.topk_ids,
            shared_experts=None,
            shared_experts_input=None,
        )

    def precompile(
        self, stimuli: Sequence[RoutingStimulus], workers: int, configs: int | None = None
    ) -> PrecompileReport:
        """Compile the engine's Triton expert kernels for these stimuli's rows before the
        measuring loop (issue 19; ``acquisition.adapters.triton_precompile``): one dry
        ``FusedMoEKernel.apply`` per stimulus, as ``run_experts`` calls it, on the engine's own
        weights and the stimulus's own inputs."""
        from acquisition.adapters.triton_precompile import precompile_stimuli

        def dry(stimulus: RoutingStimulus) -> Any:
            return self._kernel_apply(self.prepare_experts(stimulus), self.w13, self.w2)

        return precompile_stimuli(
            self._resolve, stimuli, dry, workers=workers, synchronize=self.synchronize,
            configs=configs,
        )  # fmt: skip

    def close(self) -> None:
        self.banks = []
        self.bank_experts = []
        engine, self._engine = self._engine, None
        shutdown = getattr(getattr(engine, "llm_engine", None), "engine_core", None)
        with contextlib.suppress(Exception):
            if shutdown is not None and hasattr(shutdown, "shutdown"):
                shutdown.shutdown()
        del engine
        gc.collect()
        if self.device.type == "cuda":
            self._torch.cuda.empty_cache()
