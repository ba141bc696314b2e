"""The model catalog: MoE geometry read from config.json files shipped in the repository.

Each catalog model is a folder ``<org>/<name>/`` beside this file holding the fields of the
public ``config.json`` that acquisition reads, and a ``catalog.json`` with what a config file
does not say: where the fields were copied from, the routing rule, and whether vLLM's model
wrapper runs the MoE block sequence-parallel (R3: the catalog declares it, TP alone never
does). A local folder with a ``config.json`` (and optionally its own ``catalog.json``) works the
same way. Nothing is fetched at run time.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

__all__ = [
    "CATALOG_ROOT",
    "CatalogError",
    "MoeModel",
    "catalog_models",
    "resolve_model",
    "variant_for_dtype",
]

CATALOG_ROOT = Path(__file__).resolve().parent

# Checkpoint keys for the same quantity differ between architectures; the first present wins.
_EXPERT_KEYS = ("num_experts", "num_local_experts", "n_routed_experts")
_TOP_K_KEYS = ("num_experts_per_tok", "experts_per_token", "moe_topk")
_WIDTH_KEYS = ("moe_intermediate_size", "intermediate_size")
_DTYPES = {"bfloat16": "bf16", "float16": "fp16", "float32": "fp32"}
_QUANTIZED_VARIANTS = {"fp8": "fp8", "mxfp4": "mxfp4"}

# What an architecture implies that its config.json does not spell out. A catalog.json beside
# the config overrides these; they matter for a local folder that has none.
_ARCHITECTURE_DEFAULTS: dict[str, dict[str, Any]] = {
    "mixtral": {"routing": {"scoring": "softmax", "renormalize": True}},
    "gpt_oss": {
        "routing": {"scoring": "softmax", "renormalize": True},
        "activation": "swigluoai",
        "expert_bias": True,
        "router_bias": True,
    },
    # vLLM's Qwen2MoeSparseMoeBlock scales its shared expert by sigmoid(shared_expert_gate(x)).
    "qwen2_moe": {"shared_expert_gate": "sigmoid"},
    # vLLM's DeepseekV2MoE always builds its router with use_grouped_topk=True (n_group and
    # topk_group from the config, 1 where absent): GroupedTopKRouter, not FusedTopKRouter,
    # even for one group, so the gate_routing kernels differ from a plain top-k's.
    "deepseek_v2": {"routing": {"grouped_topk": True}},
    "deepseek_v3": {"routing": {"grouped_topk": True}},
}


class CatalogError(ValueError):
    """An unknown model, or a config.json that does not describe a MoE layer."""


@dataclass(frozen=True, slots=True)
class MoeModel:
    """The MoE layer of one checkpoint, as far as acquisition needs it.

    ``expert_intermediate_size`` is the physical width of one routed expert; ``hidden_size``
    is the gate's input width. ``sequence_parallel`` is None when nobody declared it.
    ``shared_experts`` counts the shared experts the config declares and
    ``shared_expert_intermediate_size`` is the width of the one MLP vLLM builds for them
    (0 without); ``shared_expert_gate`` names the gate that scales its output, if any.
    """

    name: str
    model_type: str
    hidden_size: int
    expert_intermediate_size: int
    global_experts: int
    top_k: int
    dtype: str | None
    scoring: str
    renormalize: bool
    activation: str
    shared_experts: int
    shared_expert_intermediate_size: int
    shared_expert_gate: str | None
    expert_bias: bool
    router_bias: bool
    quantization: str | None
    sequence_parallel: bool | None
    source: str
    source_url: str | None
    config_sha256: str
    # Block-wise FP8 (``quant_method: fp8``): the weight block [N, K], the element format and
    # how activations are scaled, as the checkpoint's quantization_config declares them.
    weight_block_size: tuple[int, int] | None = None
    quant_format: str | None = None
    activation_scheme: str | None = None
    # Grouped top-k routing (DeepSeek): (num_expert_group, topk_group), None for a plain top-k;
    # the scale applied to the routed weights; whether the router adds a per-expert score
    # correction bias before choosing (``topk_method: noaux_tc``).
    grouped_topk: tuple[int, int] | None = None
    routed_scaling_factor: float = 1.0
    score_correction_bias: bool = False

    @property
    def routing(self) -> dict[str, Any]:
        """The router as the contract records it; plain top-k models keep the two older keys."""
        described: dict[str, Any] = {"scoring": self.scoring, "renormalize": self.renormalize}
        if self.grouped_topk is not None:
            described["grouped_topk"] = {
                "num_expert_group": self.grouped_topk[0],
                "topk_group": self.grouped_topk[1],
            }
            described["routed_scaling_factor"] = self.routed_scaling_factor
            described["score_correction_bias"] = self.score_correction_bias
        return described

    @property
    def block_fp8(self) -> bool:
        """Whether the experts are FP8 with one scale per weight block (DeepSeek-style)."""
        return self.quantization == "fp8" and self.weight_block_size is not None

    def uses_sequence_parallel(self, tp: int, dp: int) -> bool:
        """Whether a TP x DP target of this model is sequence-parallel (R2, R3).

        vLLM runs the MoE block sequence-parallel only where the wrapper supports it and the
        deployment has both TP > 1 and DP > 1.
        """
        if tp == 1 or dp == 1:
            return False
        if self.sequence_parallel is None:
            raise CatalogError(
                f"{self.name}: whether the model wrapper runs sequence-parallel is not declared; "
                f'add "sequence_parallel": true|false to catalog.json beside its config.json '
                f"(needed for the TP{tp}/DP{dp} target)"
            )
        return self.sequence_parallel

    @property
    def geometry(self) -> dict[str, Any]:
        shared: dict[str, Any] = {}
        if self.shared_experts:
            # Only where there are shared experts, so that other models' contracts keep their
            # shape.
            shared = {
                "shared_expert_intermediate_size": self.shared_expert_intermediate_size,
                "shared_expert_gate": self.shared_expert_gate,
            }
        return {
            "hidden_size": self.hidden_size,
            "gate_width": self.hidden_size,
            "expert_hidden_size": self.hidden_size,
            "expert_intermediate_size": self.expert_intermediate_size,
            "global_experts": self.global_experts,
            "global_top_k": self.top_k,
            "shared_experts": self.shared_experts,
            **shared,
            "activation": self.activation,
            "routing": self.routing,
            "expert_bias": self.expert_bias,
            "router_bias": self.router_bias,
            "quantization": self.quantization,
            **(
                {
                    "weight_block_size": list(self.weight_block_size),
                    "quant_format": self.quant_format,
                    "activation_scheme": self.activation_scheme,
                }
                if self.weight_block_size is not None
                else {}
            ),
        }


def variant_for_dtype(dtype: str, quantization: str | None = None) -> str:
    """Bundle variant folder of a dtype, as the published bundles name it (``bf16``).

    A quantized checkpoint names its weights' format instead (``fp8``): its activations keep
    the config's dtype, but the tables measure FP8 kernels and must not share the bf16 folder.
    """
    if quantization is not None:
        if quantization in _QUANTIZED_VARIANTS:
            return _QUANTIZED_VARIANTS[quantization]
        raise CatalogError(
            f"no bundle variant for quantization {quantization!r}; known: "
            f"{sorted(_QUANTIZED_VARIANTS)}"
        )
    try:
        return _DTYPES[dtype]
    except KeyError:
        raise CatalogError(
            f"unsupported dtype {dtype!r}; choose one of {sorted(_DTYPES)}"
        ) from None


def catalog_models() -> list[str]:
    """Names of every model shipped in the catalog."""
    return sorted(
        str(path.parent.relative_to(CATALOG_ROOT).as_posix())
        for path in CATALOG_ROOT.glob("*/*/config.json")
    )


def resolve_model(name: str) -> MoeModel:
    """A catalog id (``Qwen/Qwen3-30B-A3B-Instruct-2507``) or a local folder with config.json.

    Explicit paths (``/...``, ``./...``, ``~...``) are always local; otherwise the catalog is
    asked first, so a folder that happens to share a catalog id does not shadow it.
    """
    explicit = name.startswith(("/", "./", "../", "~"))
    if not explicit and name in catalog_models():
        return _load(CATALOG_ROOT / name, source="catalog", default_name=name)
    folder = Path(name).expanduser()
    if (folder / "config.json").is_file():
        return _load(folder.resolve(), source="local", default_name=folder.resolve().name)
    known = ", ".join(catalog_models())
    raise CatalogError(
        f"unknown model {name!r}: not in the catalog ({known}) and not a folder with config.json"
    )


def _read_json(path: Path) -> tuple[dict[str, Any], bytes]:
    data = path.read_bytes()
    try:
        parsed = json.loads(data)
    except json.JSONDecodeError as exc:
        raise CatalogError(f"{path}: not valid JSON ({exc})") from None
    if not isinstance(parsed, dict):
        raise CatalogError(f"{path}: must be a JSON object")
    return parsed, data


def _first_int(config: dict[str, Any], keys: tuple[str, ...], what: str, path: Path) -> int:
    for key in keys:
        value = config.get(key)
        if isinstance(value, int) and not isinstance(value, bool) and value > 0:
            return value
    raise CatalogError(
        f"{path}: no positive {what} under any of {list(keys)}; is this a MoE model?"
    )


def _shared_experts(text: dict[str, Any]) -> tuple[int, int]:
    """Shared experts as vLLM's model wrappers build them: (count, width of their one MLP).

    DeepSeek declares a count and fuses them into one MLP of count x the routed width;
    Qwen2-MoE declares the width of its single shared expert.
    """
    count = text.get("n_shared_experts")
    if isinstance(count, int) and not isinstance(count, bool) and count > 0:
        width = text.get("moe_intermediate_size") or text.get("intermediate_size") or 0
        return count, count * int(width)
    width = text.get("shared_expert_intermediate_size")
    if isinstance(width, int) and not isinstance(width, bool) and width > 0:
        return 1, width
    return 0, 0


def _load(folder: Path, *, source: str, default_name: str) -> MoeModel:
    config_path = folder / "config.json"
    config, raw = _read_json(config_path)
    # Multimodal checkpoints nest the language model's fields.
    text: dict[str, Any] = (
        config["text_config"] if isinstance(config.get("text_config"), dict) else config
    )
    declared: dict[str, Any] = {}
    if (folder / "catalog.json").is_file():
        declared, _ = _read_json(folder / "catalog.json")
    model_type = str(text.get("model_type") or config.get("model_type") or "unknown")
    defaults = _ARCHITECTURE_DEFAULTS.get(model_type, {})
    merged = {**defaults, **declared}
    # A catalog.json that names the scoring keeps what the architecture says of grouping.
    routing = {**(defaults.get("routing") or {}), **(declared.get("routing") or {})}
    renormalize = routing.get("renormalize", text.get("norm_topk_prob", False))
    scoring = routing.get("scoring", text.get("scoring_func", "softmax"))
    quant = text.get("quantization_config") or config.get("quantization_config")
    quantization = quant.get("quant_method") if isinstance(quant, dict) else None
    block = _block_size(quant, config_path) if isinstance(quant, dict) else None
    sp = merged.get("sequence_parallel")
    if sp is not None and not isinstance(sp, bool):
        raise CatalogError(f"{folder}/catalog.json: sequence_parallel must be true or false")
    dtype = text.get("torch_dtype") or text.get("dtype")
    shared_count, shared_width = _shared_experts(text)
    shared_gate = merged.get("shared_expert_gate") if shared_count else None
    grouped, scale, bias = _grouped_routing(routing, text, config_path)
    return MoeModel(
        name=str(merged.get("name") or default_name),
        model_type=model_type,
        hidden_size=_first_int(text, ("hidden_size",), "hidden_size", config_path),
        expert_intermediate_size=_first_int(text, _WIDTH_KEYS, "expert width", config_path),
        global_experts=_first_int(text, _EXPERT_KEYS, "expert count", config_path),
        top_k=_first_int(text, _TOP_K_KEYS, "top-k", config_path),
        dtype=str(dtype) if dtype else None,
        scoring=str(scoring),
        renormalize=bool(renormalize),
        activation=str(merged.get("activation", text.get("hidden_act", "silu"))),
        shared_experts=shared_count,
        shared_expert_intermediate_size=shared_width,
        shared_expert_gate=str(shared_gate) if shared_gate else None,
        expert_bias=bool(merged.get("expert_bias", False)),
        router_bias=bool(merged.get("router_bias", False)),
        quantization=str(quantization) if quantization else None,
        sequence_parallel=sp,
        source=source if source == "catalog" else f"local:{folder}",
        source_url=merged.get("source_url"),
        config_sha256=hashlib.sha256(raw).hexdigest(),
        weight_block_size=block,
        quant_format=str(quant["fmt"]) if isinstance(quant, dict) and quant.get("fmt") else None,
        activation_scheme=(
            str(quant["activation_scheme"])
            if isinstance(quant, dict) and quant.get("activation_scheme")
            else None
        ),
        grouped_topk=grouped,
        routed_scaling_factor=scale,
        score_correction_bias=bias,
    )


def _grouped_routing(
    routing: dict[str, Any], text: dict[str, Any], path: Path
) -> tuple[tuple[int, int] | None, float, bool]:
    """(num_expert_group, topk_group), the routed scale and the score bias of a grouped router.

    Only models whose vLLM wrapper asks for grouped top-k (``routing.grouped_topk``, from the
    architecture or catalog.json) get them; vLLM reads the config's fields with these defaults.
    """
    flag = routing.get("grouped_topk", False)
    if not isinstance(flag, bool):
        raise CatalogError(
            f"{path.parent}/catalog.json: routing.grouped_topk must be true or false"
        )
    if not flag:
        return None, 1.0, False
    groups = []
    for key in ("n_group", "topk_group"):
        value = text.get(key, 1)
        if value is None:
            value = 1
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise CatalogError(f"{path}: {key} must be a positive integer, not {value!r}")
        groups.append(value)
    if groups[1] > groups[0]:
        raise CatalogError(
            f"{path}: topk_group {groups[1]} is more than the {groups[0]} expert groups"
        )
    scale = text.get("routed_scaling_factor", 1.0)
    if scale is None:
        scale = 1.0
    if isinstance(scale, bool) or not isinstance(scale, (int, float)) or not scale > 0:
        raise CatalogError(f"{path}: routed_scaling_factor must be a positive number")
    return (groups[0], groups[1]), float(scale), text.get("topk_method") == "noaux_tc"


def _block_size(quant: dict[str, Any], path: Path) -> tuple[int, int] | None:
    raw = quant.get("weight_block_size")
    if raw is None:
        return None
    if (
        not isinstance(raw, list)
        or len(raw) != 2
        or not all(isinstance(v, int) and not isinstance(v, bool) and v > 0 for v in raw)
    ):
        raise CatalogError(f"{path}: quantization_config.weight_block_size must be [N, K]")
    return int(raw[0]), int(raw[1])
