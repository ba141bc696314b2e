"""The engine's MoE layer as ``vllm-live`` reaches it, and what it refuses in it (R25-R28).

Found by structure (a runner with routed experts, a router and a MoE config, inside a parent
block), checked for every state the adapter cannot verify, and snapshotted (parameter
bindings, layouts, version counters, effective configuration, callable identities) so that a
change during the acquisition is an error.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from acquisition.adapters.vllm_capabilities import (
    CapabilityError,
    deferral_reasons,
    qualified_name,
)

if TYPE_CHECKING:
    from acquisition.catalog import MoeModel

__all__ = [
    "LiveMoeLayer",
    "deferral_owners",
    "find_moe_layer",
    "layer_reasons",
    "layer_value",
    "state_difference",
    "state_snapshot",
]


@dataclass(frozen=True, slots=True)
class LiveMoeLayer:
    """The engine's MoE layer: its parent block, runner and the runner's parts."""

    path: str
    parent: Any
    runner: Any
    routed_experts: Any
    router: Any
    gate: Any
    quant_method: Any
    kernel: Any


def find_moe_layer(model: Any) -> LiveMoeLayer:
    """The first module shaped like a modular MoE runner (found by structure, not by name)."""
    modules = dict(model.named_modules())
    for path, module in modules.items():
        routed = getattr(module, "routed_experts", None)
        router = getattr(module, "router", None)
        if routed is None or router is None or not hasattr(module, "moe_config"):
            continue
        parent_path = path.rpartition(".")[0]
        parent = modules.get(parent_path)
        if parent is None:
            raise CapabilityError(f"MoE runner {path} has no parent block to run as the wrapper")
        gate = getattr(module, "gate", None) or getattr(parent, "gate", None)
        quant_method = getattr(routed, "quant_method", None)
        return LiveMoeLayer(
            path=path,
            parent=parent,
            runner=module,
            routed_experts=routed,
            router=router,
            gate=gate,
            quant_method=quant_method,
            kernel=getattr(quant_method, "moe_kernel", None),
        )
    raise CapabilityError(
        "no module has the modular MoE runner shape (routed_experts, router, moe_config)"
    )


def layer_value(obj: Any, name: str, default: Any = None) -> Any:
    value = getattr(obj, name, default)
    return value() if callable(value) else value


def layer_reasons(layer: LiveMoeLayer, model: MoeModel, surface: Any) -> list[str]:
    """R25, R27, R28: every state of the engine's layer the live adapter cannot verify."""
    reasons: list[str] = []
    runner, routed, quant = layer.runner, layer.routed_experts, layer.quant_method
    config = runner.moe_config
    if (
        layer_value(config, "tp_size"),
        layer_value(config, "dp_size"),
        layer_value(config, "ep_size"),
    ) != (
        1,
        1,
        1,
    ):
        reasons.append(
            "the engine's MoE layer is not TP1/DP1/EP1 "
            f"(tp={layer_value(config, 'tp_size')} dp={layer_value(config, 'dp_size')} "
            f"ep={layer_value(config, 'ep_size')})"
        )
    if layer_value(config, "use_ep"):
        reasons.append("expert parallelism is enabled in the engine")
    if layer_value(config, "is_sequence_parallel"):
        reasons.append(
            "the engine's MoE layer is sequence-parallel: the token layout is not standard"
        )
    if getattr(routed, "expert_map", None) is not None:
        reasons.append("the layer holds an expert map: not every expert is local")
    parallel = getattr(config, "moe_parallel_config", None)
    if getattr(runner, "eplb_state", None) is not None or getattr(parallel, "enable_eplb", False):
        reasons.append("EPLB is enabled (R28)")
    if getattr(routed, "global_num_experts", model.global_experts) != model.global_experts:
        reasons.append(
            f"redundant experts: the layer has {routed.global_num_experts} physical experts for "
            f"{model.global_experts} logical ones (R28)"
        )
    if getattr(config, "is_lora_enabled", False):
        reasons.append("LoRA is enabled (R28)")
    if getattr(config, "has_bias", False):
        reasons.append("biased experts (R28)")
    if getattr(routed, "apply_router_weight_on_input", False):
        reasons.append("input-weighted routing: router weights are applied to the input (R28)")
    if getattr(runner, "_fse_fuse_gate", False):
        reasons.append("fused shared gate: the shared-expert gate is fused into the router (R28)")
    hidden_dim = getattr(config, "hidden_dim", model.hidden_size)
    unpadded = getattr(config, "hidden_dim_unpadded", hidden_dim)
    if (
        hidden_dim != unpadded
        or hidden_dim != model.hidden_size
        or getattr(config, "intermediate_pad", None)
    ):
        reasons.append(
            f"padded hidden dimensions (hidden {hidden_dim}, unpadded {unpadded}, "
            f"intermediate pad {getattr(config, 'intermediate_pad', None)}) (R28)"
        )
    per_partition = getattr(config, "intermediate_size_per_partition", None)
    if per_partition is not None and per_partition != getattr(
        config, "intermediate_size", per_partition
    ):
        reasons.append("tensor-sharded experts: the intermediate width is split (R28)")
    if layer.gate is None:
        reasons.append("the MoE layer has no gate module to replay")
    if quant is None or layer.kernel is None:
        reasons.append("the layer's quant method holds no modular kernel (unsupported API)")
    else:
        if layer_value(quant, "is_monolithic"):
            reasons.append(
                "monolithic kernel: routing runs inside the native kernel and it exposes no "
                "verifiable routing replay (R25)"
            )
        experts = getattr(layer.kernel, "fused_experts", None)
        if experts is not None and not isinstance(experts, surface["modular_experts"]):
            reasons.append(f"native experts {qualified_name(experts)} are not modular experts")
        prepare = getattr(layer.kernel, "prepare_finalize", None)
        standard = surface["activation_format"].Standard
        if prepare is not None and getattr(prepare, "activation_format", standard) != standard:
            reasons.append("the native prepare/finalize uses a batched activation layout")
        quant_config = getattr(experts, "quant_config", None)
        if quant_config is not None and getattr(quant_config, "is_quantized", False):
            reasons += quantized_reasons(quant_config)
    if not callable(getattr(layer.router, "select_experts", None)):
        reasons.append(f"router {qualified_name(layer.router)} has no select_experts")
    deferral, _ = deferral_reasons(deferral_owners(layer))
    reasons += deferral
    return reasons


def _is_tensor(value: Any) -> bool:
    return callable(getattr(value, "data_ptr", None)) and hasattr(value, "dtype")


def quantized_reasons(quant_config: Any) -> list[str]:
    """Why the kernel's quantized state cannot be cloned per bank (empty: it can).

    Each bank gets the engine's weights *and* weight scales cloned, and its own experts built
    on a copy of the quant config pointing at the bank's scales; anything else the quant config
    holds per weight (static activation scales, zero points, alphas, precision configs) would
    stay shared between banks, so it is declined rather than silently left cache resident.
    """
    reasons = []
    for name in ("w1_scale", "w2_scale"):
        if not _is_tensor(getattr(quant_config, name, None)):
            reasons.append(
                f"quantized experts: the quant config's {name} is not a plain tensor that a "
                "bank can clone"
            )
    for name in ("a1_scale", "a2_scale", "w1_zp", "w2_zp", "g1_alphas", "g2_alphas"):
        if getattr(quant_config, name, None) is not None:
            reasons.append(
                f"quantized experts: the quant config holds {name}, per-weight state this "
                "adapter does not clone per bank"
            )
    return reasons


def bank_quant_config(quant_config: Any, w1_scale: Any, w2_scale: Any) -> Any:
    """A copy of the kernel's quant config whose weight scales are one bank's clones."""
    if not dataclasses.is_dataclass(quant_config) or isinstance(quant_config, type):
        raise CapabilityError(
            f"quantized experts: {qualified_name(quant_config)} is not a dataclass; its weight "
            "scales cannot be pointed at a bank's clones"
        )
    names = {f.name for f in dataclasses.fields(quant_config)}
    native: Any = quant_config  # vLLM's class, untyped here
    copy: Any
    if {"_w1", "_w2"} <= names:  # vLLM's FusedMoEQuantConfig keeps scales in its descriptors
        copy = dataclasses.replace(
            quant_config,
            _w1=dataclasses.replace(native._w1, scale=w1_scale),
            _w2=dataclasses.replace(native._w2, scale=w2_scale),
        )
    elif {"w1_scale", "w2_scale"} <= names:
        copy = dataclasses.replace(quant_config, w1_scale=w1_scale, w2_scale=w2_scale)
    else:
        raise CapabilityError(
            f"quantized experts: {qualified_name(quant_config)} holds its weight scales in no "
            "field this adapter knows"
        )
    if copy.w1_scale is not w1_scale or copy.w2_scale is not w2_scale:
        raise CapabilityError("quantized experts: the bank's quant config does not read its scales")
    return copy


def deferral_owners(layer: LiveMoeLayer) -> dict[str, Any]:
    return {
        "runner": layer.runner,
        "routed_experts": layer.routed_experts,
        "quant_method": layer.quant_method,
        "moe_kernel": layer.kernel,
        "moe_config": getattr(layer.runner, "moe_config", None),
    }


def state_snapshot(layer: LiveMoeLayer) -> dict[str, Any]:
    """Bindings, layouts and version counters of the layer's parameters, the effective MoE
    configuration and the identities of the callables the components run (R27).

    Not a checksum of device memory: an in-place CUDA write that bumps no version counter
    is not detected.
    """
    params = {}
    for name, p in layer.parent.named_parameters():
        params[name] = (
            p.data_ptr(),
            tuple(p.shape),
            tuple(p.stride()),
            str(p.dtype),
            str(p.device),
            int(getattr(p, "_version", 0)),
        )
    config = layer.runner.moe_config
    try:
        effective = repr(dataclasses.asdict(config))
    except TypeError:
        effective = repr(config)
    callables = {}
    for owner, name in (
        (layer.runner, "forward"),
        (layer.router, "select_experts"),
        (layer.routed_experts, "forward_modular"),
        (layer.quant_method, "apply"),
        (layer.kernel, "apply"),
        (layer.gate, "forward"),
        (layer.parent, "forward"),
    ):
        attr = getattr(owner, name, None)
        callables[f"{type(owner).__name__}.{name}"] = (
            id(getattr(attr, "__func__", attr)),
            name in getattr(owner, "__dict__", {}),
        )
    classes = {
        "kernel.impl": qualified_name(getattr(layer.kernel, "impl", None)),
        "kernel.fused_experts": qualified_name(getattr(layer.kernel, "fused_experts", None)),
        "kernel.prepare_finalize": qualified_name(getattr(layer.kernel, "prepare_finalize", None)),
    }
    return {"parameters": params, "moe_config": effective, "callables": callables, **classes}


def state_difference(before: dict[str, Any], after: dict[str, Any]) -> list[str]:
    changed = []
    for key, value in before.items():
        now = after.get(key)
        if isinstance(value, dict) and isinstance(now, dict):
            label = "parameter" if key == "parameters" else "callable"
            changed += [f"{label} {name}" for name in value if now.get(name) != value[name]]
            changed += [f"new {label} {name}" for name in now.keys() - value.keys()]
        elif value != now:
            changed.append(key)
    return changed
