"""The component engine's configuration for ``vllm-live`` (R31), before any engine starts.

The serving limits arrive on ``RuntimeInfo.limits`` (the command's token and sequence limits
and its engine options); the checkpoint's folder, its smallest MoE prefix and its declared
wrapper work come from ``config.json``; the model class is registered with vLLM in process.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

from acquisition.adapters.base import EngineLimits, RuntimeInfo
from acquisition.adapters.vllm_capabilities import (
    CapabilityError,
)

if TYPE_CHECKING:
    from pathlib import Path

    from acquisition.catalog import MoeModel

__all__ = [
    "DEFAULT_KV_CACHE_BYTES",
    "GPU_MEMORY_UTILIZATION",
    "actual_settings",
    "declared_wrapper_work",
    "effective_limits",
    "model_folder",
    "register_model_classes",
    "smallest_moe_prefix",
]

DEFAULT_KV_CACHE_BYTES = 1 << 30
# A cap the engine checks its own allocations against; the KV cache is sized by
# kv_cache_memory_bytes, so this never decides what the engine measures.
GPU_MEMORY_UTILIZATION = 0.3


def effective_limits(runtime: RuntimeInfo, own: EngineLimits | None = None) -> EngineLimits | None:
    """The runtime's limits (the command's), with the fields it leaves open filled from the
    adapter's own (``VllmLiveBackend(limits=...)``); the KV cache defaults to 1 GiB."""
    base = runtime.limits or own
    if base is None:
        return None

    def pick(name: str) -> Any:
        value = getattr(base, name)
        return value if value is not None or own is None else getattr(own, name)

    return EngineLimits(
        max_num_batched_tokens=base.max_num_batched_tokens,
        max_num_seqs=base.max_num_seqs,
        max_model_len=pick("max_model_len"),
        kv_cache_memory_bytes=pick("kv_cache_memory_bytes") or DEFAULT_KV_CACHE_BYTES,
        attention_backend=pick("attention_backend"),
    )


def declared_wrapper_work(model: MoeModel) -> bool:
    """Whether the checkpoint declares work of the parent block beyond gate and experts.

    Shared experts run in the wrapper boundary; a checkpoint without them and without a
    latent projection leaves the parent block with no native work of its own at TP1, which the
    build-time ownership trace then confirms (and refuses the build if it finds otherwise).
    """
    if model.shared_experts:
        return True
    try:
        config = json.loads((model_folder(model) / "config.json").read_text())
    except (OSError, ValueError, CapabilityError):
        return False
    nested = config.get("text_config")
    text: dict[str, Any] = nested if isinstance(nested, dict) else config
    return bool(text.get("shared_expert_intermediate_size") or text.get("moe_latent_size"))


def model_folder(model: MoeModel) -> Path:
    """The folder holding the model's config.json (catalog entry or local folder)."""
    from pathlib import Path

    from acquisition.catalog import CATALOG_ROOT

    if model.source == "catalog":
        return CATALOG_ROOT / model.name
    if model.source.startswith("local:"):
        return Path(model.source.removeprefix("local:"))
    raise CapabilityError(f"{model.name}: no local folder with config.json is known")


def register_model_classes(architectures: list[str]) -> list[str]:
    """Give vLLM's model registry the checkpoint's model classes, inspected in this process.

    vLLM inspects a lazily registered model class in a fresh Python subprocess (so that a
    parent which never touched CUDA stays fork-safe), which imports vLLM and torch again:
    about 20 s of a 45 s engine start on the H200 host, on every fresh machine (the result
    is cached on disk, but a lent machine starts empty). This process has initialised CUDA
    already, so the reason does not apply: the very class the registry would load
    (``load_model_cls``) is registered through vLLM's public ``register_model``, which
    inspects it here. Returns the architectures registered; nothing where vLLM's registry
    is not reachable (the engine then inspects as usual).
    """
    try:
        from vllm import ModelRegistry
    except Exception:
        return []
    done = []
    for arch in architectures:
        entry = getattr(ModelRegistry, "models", {}).get(arch)
        if entry is None or not callable(getattr(entry, "load_model_cls", None)):
            continue
        try:
            ModelRegistry.register_model(arch, entry.load_model_cls())
        except Exception:  # the engine's own inspection still runs; never fatal here
            continue
        done.append(arch)
    return done


def smallest_moe_prefix(config: dict[str, Any]) -> int:
    """Layers up to and including the first MoE layer, from the checkpoint's declarations."""
    nested = config.get("text_config")
    text: dict[str, Any] = nested if isinstance(nested, dict) else config
    layers = int(text.get("num_hidden_layers") or 1)
    dense_first = int(text.get("first_k_dense_replace") or 0)
    step = int(text.get("decoder_sparse_step") or 1)
    mlp_only = set(text.get("mlp_only_layers") or [])
    for index in range(dense_first, layers):
        if index not in mlp_only and (index + 1) % step == 0:
            return index + 1
    raise CapabilityError("config.json declares no MoE layer")


def actual_settings(engine: Any) -> dict[str, Any]:
    """What the engine really runs with (observations for the contract, R31)."""
    config = getattr(getattr(engine, "llm_engine", None), "vllm_config", None)
    if config is None:
        return {}
    scheduler = getattr(config, "scheduler_config", None)
    model = getattr(config, "model_config", None)
    cache = getattr(config, "cache_config", None)
    compilation = getattr(config, "compilation_config", None)
    return {
        "max_num_batched_tokens": getattr(scheduler, "max_num_batched_tokens", None),
        "max_num_seqs": getattr(scheduler, "max_num_seqs", None),
        "max_model_len": getattr(model, "max_model_len", None),
        "enforce_eager": getattr(model, "enforce_eager", None),
        "dtype": str(getattr(model, "dtype", None)).removeprefix("torch."),
        "kv_cache_memory_bytes": getattr(cache, "kv_cache_memory_bytes", None),
        "num_gpu_blocks": getattr(cache, "num_gpu_blocks", None),
        "block_size": getattr(cache, "block_size", None),
        "cudagraph_mode": str(getattr(compilation, "cudagraph_mode", None)),
    }
