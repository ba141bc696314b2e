"""Block-wise FP8 experts for ``vllm-modular``: vLLM's own FP8 oracle, weights and scales.

A checkpoint whose ``quantization_config`` declares ``quant_method: fp8`` with a
``weight_block_size`` is served by vLLM's ``Fp8MoEMethod``, which asks
``select_fp8_moe_backend(moe_config, kFp8Static128BlockSym, kFp8Dynamic128Sym,
allow_vllm_cutlass=False)`` for its experts. This module makes the same call on the target
rank's ``FusedMoEConfig``, so the emulated rank runs the class the engine would run, and
records why each backend ahead of it in vLLM's own priority list declined (its
``is_supported_config`` reason, or the import that failed). It also builds what
``Fp8MoEMethod.process_weights_after_loading`` would hand the kernel: FP8 (e4m3) weights with
one float32 scale per weight block, converted by ``convert_to_fp8_moe_kernel_format`` for the
chosen backend, and the kernel's ``FusedMoEQuantConfig`` from ``make_fp8_moe_quant_config``.

Activations are quantized dynamically per token and block-width group by the native prepare
(``moe_kernel_quantize_input``): inside ``experts`` at DP1, and on the rank's local rows before
the all-gather at DP+EP (the ``dispatch_quant`` component), exactly where vLLM runs it.
"""

from __future__ import annotations

import os
import types
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from acquisition.adapters.vllm_capabilities import (
    ApiSurface,
    CapabilityError,
    qualified_name,
)

if TYPE_CHECKING:
    from acquisition.catalog import MoeModel

__all__ = [
    "DISPATCH_QUANT",
    "FP8_SYMBOLS",
    "Fp8Oracle",
    "env_removals",
    "fp8_model_reasons",
    "fp8_quant_config",
    "fp8_weights",
    "oracle_environment",
    "select_fp8",
]

_FUSED_MOE = "vllm.model_executor.layers.fused_moe"
_QUANT_UTILS = "vllm.model_executor.layers.quantization.utils.quant_utils"

# The local component of a quantized DP+EP rank: the native prepare's quantization of this
# rank's own rows, which vLLM runs before the all-gather dispatch (naive_dp_ep.prepare).
DISPATCH_QUANT = "dispatch_quant"

# Extra symbols a block-FP8 target needs, by role.
FP8_SYMBOLS: dict[str, str] = {
    "fp8_select": f"{_FUSED_MOE}.oracle.fp8:select_fp8_moe_backend",
    "fp8_priority": f"{_FUSED_MOE}.oracle.fp8:_get_priority_backends",
    "fp8_backend_classes": f"{_FUSED_MOE}.oracle.fp8:backend_to_kernel_cls",
    "fp8_kernel_format": f"{_FUSED_MOE}.oracle.fp8:convert_to_fp8_moe_kernel_format",
    "fp8_quant_config": f"{_FUSED_MOE}.oracle.fp8:make_fp8_moe_quant_config",
    "fp8_weight_key": f"{_QUANT_UTILS}:kFp8Static128BlockSym",
    "fp8_activation_key": f"{_QUANT_UTILS}:kFp8Dynamic128Sym",
    "dispatch_quantize": (
        f"{_FUSED_MOE}.prepare_finalize.naive_dp_ep:_quantize_and_setup_dispatch"
    ),
}

# The environment switches select_fp8_moe_backend reads before its priority walk (vLLM 0.26.0,
# oracle/fp8.py): a pair set with either false removes its backends from the walk altogether,
# so their is_supported_config reason (for DeepGEMM "kernel does not support current device",
# since is_deep_gemm_supported reads the same variable) would misstate why they were skipped.
# Values as vLLM parses them: bool(int(os.getenv(name, "1"))) for the DeepGEMM pair,
# lower-case "true"/"1" for the AITER pair.
_ENV_REMOVALS: tuple[tuple[tuple[str, str], tuple[str, ...], str], ...] = (
    (("VLLM_USE_DEEP_GEMM", "VLLM_MOE_USE_DEEP_GEMM"), ("DEEPGEMM", "BATCHED_DEEPGEMM"), "int"),
    (("VLLM_ROCM_USE_AITER", "VLLM_ROCM_USE_AITER_MOE"), ("AITER",), "bool"),
)
ORACLE_ENVIRONMENT = (
    "VLLM_USE_DEEP_GEMM",
    "VLLM_MOE_USE_DEEP_GEMM",
    "VLLM_TEST_FORCE_FP8_MARLIN",
    "VLLM_ROCM_USE_AITER",
    "VLLM_ROCM_USE_AITER_MOE",
)


def oracle_environment(environ: Mapping[str, str]) -> dict[str, str]:
    """The FP8 oracle's switches as set in ``environ`` (unset ones left out)."""
    return {k: environ[k] for k in ORACLE_ENVIRONMENT if k in environ}


def _env_true(raw: str | None, kind: str) -> bool:
    if raw is None:
        return kind == "int"  # the DeepGEMM pair defaults to on, the AITER pair to off
    if kind == "int":
        try:
            return bool(int(raw))
        except ValueError:
            return True  # vLLM would fail to parse it; not a removal we can vouch for
    return raw.strip().lower() in ("true", "1")


def env_removals(environ: Mapping[str, str]) -> dict[str, str]:
    """Backends vLLM's FP8 oracle removes from its walk because of the environment, with why."""
    removed: dict[str, str] = {}
    for names, backends, kind in _ENV_REMOVALS:
        if not any(n in environ for n in names):
            continue
        off = [
            f"{n}={environ[n]}" for n in names if n in environ and not _env_true(environ[n], kind)
        ]
        if off:
            for backend in backends:
                removed[backend] = f"removed by the environment: {', '.join(off)}"
    return removed


# float8_e4m3fn's largest finite value: a block's scale maps its absolute maximum onto it.
_E4M3_MAX = 448.0


def fp8_model_reasons(model: MoeModel) -> list[str]:
    """Why a quantized checkpoint is not block FP8 as this adapter emulates it (empty: it is);
    the rule lives with the other declared rules in ``acquisition.options.measurable``."""
    from acquisition.options.measurable import block_fp8_reasons

    return block_fp8_reasons(model)


@dataclass(frozen=True, slots=True)
class Fp8Oracle:
    """What vLLM's FP8 oracle chose for one rank, and why the backends before it declined."""

    backend: Any
    experts_cls: type
    declined: tuple[dict[str, str], ...]
    weight_key: str
    activation_key: str
    block_shape: tuple[int, int]
    # The oracle's environment switches as set when it ran (unset ones left out).
    environment: dict[str, str] = field(default_factory=dict)

    @property
    def backend_label(self) -> str:
        return str(getattr(self.backend, "value", self.backend))

    def as_dict(self) -> dict[str, Any]:
        return {
            "resolution": (
                "select_fp8_moe_backend(FusedMoEConfig of this rank, kFp8Static128BlockSym, "
                "kFp8Dynamic128Sym, allow_vllm_cutlass=False): the call Fp8MoEMethod makes"
            ),
            "selected": self.backend_label,
            "experts_class": qualified_name(self.experts_cls),
            "declined_before_selection": list(self.declined),
            "weight_key": self.weight_key,
            "activation_key": self.activation_key,
            "environment": dict(self.environment),
        }


def _label(value: Any) -> str:
    return str(getattr(value, "value", value))


def _declined(
    surface: ApiSurface,
    moe_config: Any,
    chosen: Any,
    weight_key: Any,
    activation_key: Any,
    environ: Mapping[str, str],
) -> tuple[dict[str, str], ...]:
    """Each backend ahead of ``chosen`` in vLLM's priority order, with vLLM's own reason
    (or the environment switch that removed it before any reason was asked)."""
    removed = env_removals(environ)
    parallel = getattr(moe_config, "moe_parallel_config", None)
    formats = surface["activation_format"]
    layout = (
        formats.BatchedExperts
        if getattr(parallel, "use_batched_activation_format", False)
        else formats.Standard
    )
    try:
        order = list(surface["fp8_priority"](moe_config, weight_key, activation_key))
    except Exception as exc:  # the report is evidence; the selection itself already succeeded
        return ({"backend": "?", "reason": f"priority list unreadable: {exc}"},)
    found: list[dict[str, str]] = []
    for backend in order:
        if backend == chosen:
            break
        label = _label(backend)
        if label in ("VLLM_CUTLASS", "BATCHED_VLLM_CUTLASS"):
            found.append(
                {
                    "backend": label,
                    "reason": "removed: Fp8MoEMethod passes allow_vllm_cutlass=False",
                }
            )
            continue
        if label in removed:
            found.append({"backend": label, "reason": removed[label]})
            continue
        try:
            classes = list(surface["fp8_backend_classes"](backend))
        except Exception as exc:  # a backend whose module is absent from this install
            found.append(
                {"backend": label, "reason": f"cannot be imported: {type(exc).__name__}: {exc}"}
            )
            continue
        reasons = []
        for cls in classes:
            try:
                ok, why = cls.is_supported_config(
                    cls, moe_config, weight_key, activation_key, layout
                )
            except Exception as exc:
                ok, why = False, f"{type(exc).__name__}: {exc}"
            if ok:
                # Supported here yet not chosen: an environment override moved the oracle on.
                why = "supported, but the oracle's overrides (environment) skipped it"
            reasons.append(f"{cls.__name__}: {why or 'unsupported'}")
        found.append({"backend": label, "reason": "; ".join(reasons) or "no kernel classes"})
    return tuple(found)


def select_fp8(
    surface: ApiSurface,
    moe_config: Any,
    model: MoeModel,
    environ: Mapping[str, str] | None = None,
) -> Fp8Oracle:
    """vLLM's FP8 backend for this rank, as ``Fp8MoEMethod.__init__`` selects it
    (``environ``: the process environment vLLM reads; given only by tests)."""
    env = os.environ if environ is None else environ
    reasons = fp8_model_reasons(model)
    if reasons:
        raise CapabilityError(*reasons)
    weight_key, activation_key = surface["fp8_weight_key"], surface["fp8_activation_key"]
    try:
        backend, experts_cls = surface["fp8_select"](
            moe_config, weight_key, activation_key, allow_vllm_cutlass=False
        )
    except (ValueError, NotImplementedError) as exc:
        raise CapabilityError(f"vLLM selects no FP8 MoE backend here: {exc}") from None
    if experts_cls is None:
        raise CapabilityError(f"FP8 backend {_label(backend)} has no kernel class")
    assert model.weight_block_size is not None  # fp8_model_reasons checked it
    return Fp8Oracle(
        backend=backend,
        experts_cls=experts_cls,
        declined=_declined(surface, moe_config, backend, weight_key, activation_key, env),
        weight_key=str(weight_key),
        activation_key=str(activation_key),
        block_shape=model.weight_block_size,
        environment=oracle_environment(env),
    )


def _block_quantize(weight: Any, block: tuple[int, int], fp8_dtype: Any) -> tuple[Any, Any]:
    """[E, R, C] float weights to FP8 with one float32 scale per (block_n x block_k) block.

    The scale is the block's absolute maximum over e4m3's largest value, the inverse scale
    vLLM stores as ``weight_scale_inv`` (dequantized weight = fp8 value x scale).
    """
    import torch

    e, rows, cols = weight.shape
    bn, bk = block
    blocks = weight.float().reshape(e, rows // bn, bn, cols // bk, bk)
    amax = blocks.abs().amax(dim=(2, 4), keepdim=True).clamp(min=1e-12)
    scale = amax / _E4M3_MAX
    quantized = (blocks / scale).clamp(-_E4M3_MAX, _E4M3_MAX).to(fp8_dtype)
    return (
        quantized.reshape(e, rows, cols).contiguous(),
        scale.reshape(e, rows // bn, cols // bk).to(torch.float32).contiguous(),
    )


def fp8_weights(
    surface: ApiSurface, oracle: Fp8Oracle, w13: Any, w2: Any
) -> tuple[Any, Any, Any, Any]:
    """Block-FP8 weights and scales in the layout the chosen backend runs (vLLM's conversion)."""
    import torch

    fp8 = torch.float8_e4m3fn
    q13, s13 = _block_quantize(w13, oracle.block_shape, fp8)
    q2, s2 = _block_quantize(w2, oracle.block_shape, fp8)
    # convert_to_fp8_moe_kernel_format reads only the layer's weight_block_size for the
    # Triton, CUTLASS and DeepGEMM backends; a backend needing more of a layer fails here.
    layer = types.SimpleNamespace(weight_block_size=list(oracle.block_shape))
    try:
        converted = surface["fp8_kernel_format"](
            oracle.backend, layer, q13, q2, s13, s2, None, None
        )
    except (AttributeError, AssertionError, TypeError) as exc:
        raise CapabilityError(
            f"FP8 backend {oracle.backend_label}: its weight conversion needs more of a vLLM "
            f"layer than one emulated rank has ({type(exc).__name__}: {exc})"
        ) from None
    w13q, w2q, s13q, s2q = converted
    return w13q, w2q, s13q, s2q


def fp8_quant_config(surface: ApiSurface, oracle: Fp8Oracle, w13_scale: Any, w2_scale: Any) -> Any:
    """The kernel's FusedMoEQuantConfig, as ``Fp8MoEMethod.get_fused_moe_quant_config`` makes it."""
    return surface["fp8_quant_config"](
        fp8_backend=oracle.backend,
        w1_scale=w13_scale,
        w2_scale=w2_scale,
        a1_scale=None,
        a2_scale=None,
        block_shape=list(oracle.block_shape),
    )
