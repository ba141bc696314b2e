"""Fakes of vLLM 0.26.0's block-FP8 MoE pieces, on CPU, for the FP8 adapter tests.

They copy the interfaces ``vllm_fp8`` calls (``select_fp8_moe_backend``'s priority walk,
``backend_to_kernel_cls``, ``is_supported_config``, the weight conversion, the quant config and
the per-token-group activation quantization) with plain PyTorch arithmetic behind them: FP8
values dequantized by their block scales, so that outputs are exact functions of the bank's own
weights and scales.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Any, ClassVar

import torch
import vllm_fakes as fv

FP8 = torch.float8_e4m3fn
FM = "vllm.model_executor.layers.fused_moe"
QUANT_UTILS = "vllm.model_executor.layers.quantization.utils.quant_utils"
BLOCK = 128


class Fp8MoeBackend(enum.Enum):
    FLASHINFER_CUTLASS = "FLASHINFER_CUTLASS"
    DEEPGEMM = "DEEPGEMM"
    VLLM_CUTLASS = "VLLM_CUTLASS"
    TRITON = "TRITON"


@dataclass
class Fp8QuantConfig:
    """What the experts read: weight scales, the block shape and the activation dtype."""

    w1_scale: Any
    w2_scale: Any
    block_shape: list[int]
    quant_dtype: Any = FP8
    a1_scale: Any = None
    a2_scale: Any = None

    @property
    def is_quantized(self) -> bool:
        return True


def quantize_groups(a1: Any) -> tuple[Any, Any]:
    """Dynamic per-token, per-128-column FP8 quantization (``per_token_group_fp8_quant``)."""
    fv.launch("per_token_group_fp8_quant")
    rows, cols = a1.shape
    groups = a1.float().reshape(rows, cols // BLOCK, BLOCK)
    scale = groups.abs().amax(dim=2, keepdim=True).clamp(min=1e-12) / 448.0
    q = (groups / scale).to(FP8).reshape(rows, cols)
    return q, scale.reshape(rows, cols // BLOCK)


def quantize_and_setup_dispatch(
    a1: Any, quant_config: Any, defer_input_quant: bool = False
) -> tuple[Any, Any, Any]:
    q, scale = quantize_groups(a1)
    return q, [scale], scale


class Fp8NoDPEP(fv.NoDPEP):
    """The no-DP prepare of a quantized kernel: it quantizes the activations."""

    def quantize(self, a1: Any, quant_config: Any) -> tuple[Any, Any]:
        if getattr(quant_config, "quant_dtype", None) is None:
            return a1, None
        return quantize_groups(a1)


class Fp8Kernel(fv.FusedMoEKernel):
    """vLLM's FusedMoEKernel.apply: prepare (quantizing), experts into its workspace, finalize."""

    def prepare_input(
        self,
        hidden_states: Any,
        topk_weights: Any,
        topk_ids: Any,
        global_num_experts: int,
        expert_map: Any,
        apply_router_weight_on_input: bool,
    ) -> tuple[Any, Any]:
        a1q, scale, _, _, _ = self.prepare_finalize.prepare(
            hidden_states,
            topk_weights,
            topk_ids,
            global_num_experts,
            expert_map,
            apply_router_weight_on_input,
            self.fused_experts.quant_config,
        )
        return a1q, scale


def _dequantize_weight(q: Any, scale: Any) -> Any:
    expanded = scale.repeat_interleave(BLOCK, dim=1).repeat_interleave(BLOCK, dim=2)
    return q.float() * expanded


class _Fp8Experts(fv.FusedMoEExpertsModular):
    """Experts that the FP8 oracle asks ``is_supported_config`` (``SUPPORTED`` answers)."""

    SUPPORTED: ClassVar[tuple[bool, str | None]] = (True, None)

    @staticmethod
    def is_supported_config(
        cls: Any, moe_config: Any, weight_key: Any, activation_key: Any, layout: Any
    ) -> tuple[bool, str | None]:
        supported: tuple[bool, str | None] = cls.SUPPORTED
        return supported


class Fp8TritonExperts(_Fp8Experts):
    """Block-FP8 experts: dequantize the activations and this quant config's weights."""

    def compute(
        self,
        output: Any,
        hidden_states: Any,
        w1: Any,
        w2: Any,
        topk_weights: Any,
        topk_ids: Any,
        expert_map: Any,
        a1q_scale: Any,
    ) -> None:
        fv.launch("fused_moe_kernel_fp8")
        rows, cols = hidden_states.shape
        hidden = (
            hidden_states.float().reshape(rows, cols // BLOCK, BLOCK) * a1q_scale.unsqueeze(2)
        ).reshape(rows, cols)
        w13 = _dequantize_weight(w1, self.quant_config.w1_scale)
        w2d = _dequantize_weight(w2, self.quant_config.w2_scale)
        result = torch.zeros(rows, cols, dtype=torch.float32)
        fv.moe_reference(result, hidden, w13, w2d, topk_weights, topk_ids, expert_map)
        output.copy_(result.to(output.dtype))


class DeepGemmExperts(_Fp8Experts):
    SUPPORTED = (False, "DeepGEMM is not available (no deep_gemm kernels for this Python)")


def backend_to_kernel_cls(backend: Fp8MoeBackend) -> list[type]:
    if backend is Fp8MoeBackend.FLASHINFER_CUTLASS:
        raise ImportError("No module named 'flashinfer'")
    if backend is Fp8MoeBackend.DEEPGEMM:
        return [DeepGemmExperts]
    return [Fp8TritonExperts]


def priority_backends(cfg: Any, weight_key: Any, activation_key: Any) -> list[Fp8MoeBackend]:
    """vLLM's Hopper block-FP8 order: FlashInfer CUTLASS first for EP, Triton first for TP."""
    order = [
        Fp8MoeBackend.DEEPGEMM,
        Fp8MoeBackend.VLLM_CUTLASS,
        Fp8MoeBackend.TRITON,
    ]
    if cfg.moe_parallel_config.ep_size > 1:
        return [Fp8MoeBackend.FLASHINFER_CUTLASS, *order]
    return [Fp8MoeBackend.TRITON, Fp8MoeBackend.FLASHINFER_CUTLASS, *order[:2]]


CALLS: list[dict[str, Any]] = []


def select_fp8_moe_backend(
    config: Any, weight_key: Any, activation_key: Any, allow_vllm_cutlass: bool = False
) -> tuple[Fp8MoeBackend, type]:
    CALLS.append({"weight_key": weight_key, "allow_vllm_cutlass": allow_vllm_cutlass})
    for backend in priority_backends(config, weight_key, activation_key):
        if backend is Fp8MoeBackend.VLLM_CUTLASS and not allow_vllm_cutlass:
            continue
        try:
            classes = backend_to_kernel_cls(backend)
        except ImportError:
            continue
        for cls in classes:
            if cls.is_supported_config(cls, config, weight_key, activation_key, None)[0]:
                return backend, cls
    raise NotImplementedError("No FP8 MoE backend supports the deployment configuration.")


def make_fp8_moe_quant_config(
    fp8_backend: Any,
    w1_scale: Any,
    w2_scale: Any,
    a1_scale: Any,
    a2_scale: Any,
    block_shape: list[int] | None = None,
) -> Fp8QuantConfig:
    assert block_shape is not None
    return Fp8QuantConfig(w1_scale=w1_scale, w2_scale=w2_scale, block_shape=block_shape)


def convert_to_fp8_moe_kernel_format(
    backend: Any,
    layer: Any,
    w13: Any,
    w2: Any,
    w13_scale: Any,
    w2_scale: Any,
    w13_input_scale: Any,
    w2_input_scale: Any,
) -> tuple[Any, Any, Any, Any]:
    assert layer.weight_block_size == [BLOCK, BLOCK]
    return w13, w2, w13_scale, w2_scale


def fp8_namespace(**overrides: Any) -> dict[str, Any]:
    namespace = fv.modular_namespace()
    namespace.update(
        {
            f"{FM}.modular_kernel:FusedMoEKernel": Fp8Kernel,
            f"{FM}.oracle.fp8:select_fp8_moe_backend": select_fp8_moe_backend,
            f"{FM}.oracle.fp8:_get_priority_backends": priority_backends,
            f"{FM}.oracle.fp8:backend_to_kernel_cls": backend_to_kernel_cls,
            f"{FM}.oracle.fp8:convert_to_fp8_moe_kernel_format": convert_to_fp8_moe_kernel_format,
            f"{FM}.oracle.fp8:make_fp8_moe_quant_config": make_fp8_moe_quant_config,
            f"{QUANT_UTILS}:kFp8Static128BlockSym": "kFp8Static128BlockSym",
            f"{QUANT_UTILS}:kFp8Dynamic128Sym": "kFp8Dynamic128Sym",
            f"{FM}.prepare_finalize.naive_dp_ep:_quantize_and_setup_dispatch": (
                quantize_and_setup_dispatch
            ),
        }
    )
    namespace.update(overrides)
    return namespace
