"""vLLM 0.26.0's choice of the Triton expert kernel's configuration: the one owner of the table.

``TritonExperts`` (and the monolithic ``fused_experts``) call ``try_get_optimal_moe_config``
with the rank's weight shapes and the token rows M the kernel is given
(``vllm/model_executor/layers/fused_moe/fused_moe.py``):

- the file ``E={E},N={N},device_name={device}[,dtype={dtype}][,block_shape=[bn,bk]].json``,
  where E = ``w2.size(0)`` (the rank's LOCAL experts) and N = ``w2.size(2)`` (the expert width
  of the partition; with expert parallelism every expert is whole, so the model's width), dtype
  the quantization's config name (None for bf16/fp16, ``fp8_w8a8`` for FP8 weights and
  activations) and block_shape the weight block of block-quantized FP8; every H200 variant is
  ``NVIDIA_H200``;
- if that file ships with vLLM, the configuration of the key nearest to M (``min(keys,
  key=abs(key - M))``: ties go to the key that comes first in the file, the smaller one in every
  H200 file);
- else ``get_default_config(M, E, N, K, top_k, dtype, block_shape)``.

The H200 files of vLLM 0.26.0 are embedded verbatim in
``moetables/data/vllm-0.26.0-fused-moe-h200.json`` (written by
``scripts/embed_vllm_moe_configs.py``; ``tests/moetables/test_triton_config.py`` checks it
against vLLM's files and functions where the source is present). Both the planner's
kernel-step rule (``acquisition.plan.kernel``) and the lookups' tile model (``moetables.tiles``)
read the configuration from here. Assumed, as on the measuring hosts: no
``VLLM_TUNED_CONFIG_FOLDER`` override, ``VLLM_BATCH_INVARIANT`` off, CUDA (not ROCm).
"""

from __future__ import annotations

import functools
import json
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

__all__ = [
    "EMBEDDED_DEVICES",
    "KERNEL_STEPS_RULE",
    "KERNEL_STEPS_RULES",
    "KERNEL_STEPS_RULE_V3",
    "KERNEL_STEPS_RULE_V4",
    "VLLM_VERSION",
    "KernelShape",
    "KernelSwitches",
    "TritonConfig",
    "TritonConfigError",
    "config_dtype",
    "config_file_name",
    "default_config",
    "device_family",
    "tuned_files",
]

VLLM_VERSION = "0.26.0"
# The kernel-step rule: which kernel runs for each row count is `KernelSwitches.kernel`. The
# planner records it in a contract (``expert_sampling.kernel_steps.rule``) and the lookups split
# such a table into segments by it. v2: every tuned H200 file of vLLM 0.26.0 (v1 knew
# E=128,N=768 bf16 only) and block FP8. (The name predates v3/v4: the acquisition's default rule
# is v4, `acquisition.options.resolve.DEFAULT_KERNEL_STEPS_RULE`.)
KERNEL_STEPS_RULE = "vllm-0.26.0-triton-config-steps-v2"
# v3: v2's switches (the same segments: a v3 table is split exactly as a v2 table) plus both
# edges of every block-padding ramp in M (acquisition.plan.kernel, "v3"). Plans name the rule they
# used; the lookups read either.
KERNEL_STEPS_RULE_V3 = "vllm-0.26.0-triton-config-steps-v3"
# v4: v3 plus A values at EP1's 16-row rows (acquisition.plan.kernel, "v4"); again v2's switches,
# so the same segments.
KERNEL_STEPS_RULE_V4 = "vllm-0.26.0-triton-config-steps-v4"
KERNEL_STEPS_RULES = (KERNEL_STEPS_RULE, KERNEL_STEPS_RULE_V3, KERNEL_STEPS_RULE_V4)
DATA = Path(__file__).parent / "data" / "vllm-0.26.0-fused-moe-h200.json"
# Devices whose complete set of tuned files is embedded: for them "no file" means vLLM's default.
EMBEDDED_DEVICES = ("NVIDIA_H200",)
_UNQUANTIZED = frozenset({"bf16", "bfloat16", "fp16", "float16"})


class TritonConfigError(ValueError):
    """A shape or dtype whose kernel configuration is not modelled (named in the message)."""


@dataclass(frozen=True, slots=True)
class TritonConfig:
    """One configuration of ``fused_moe_kernel``: every key that changes the compiled kernel."""

    block_m: int
    block_n: int
    block_k: int
    group_m: int
    num_warps: int
    num_stages: int


def device_family(hardware: str) -> str:
    """vLLM's device name in config files for a hardware label (every H200 is ``NVIDIA_H200``).

    vLLM replaces spaces and slashes of the CUDA device name by ``_`` and maps any name with an
    ``H200`` part to ``NVIDIA_H200`` (``get_config_file_name``); the project's labels (``H200``,
    ``NVIDIA H200 NVL``) get the same answer.
    """
    parts = re.split(r"[\s/_-]+", hardware.strip().upper())
    if "H200" in parts:
        return "NVIDIA_H200"
    return re.sub(r"[\s/]+", "_", hardware.strip())


def config_dtype(
    dtype: str, quantization: str | None = None, weight_block: tuple[int, int] | None = None
) -> tuple[str | None, tuple[int, int] | None]:
    """(config dtype, block shape) of vLLM's file name for a model's experts.

    bf16/fp16 weights: (None, None). Block FP8 (``quant_method: fp8`` with a weight block):
    ("fp8_w8a8", block), run by the Triton kernel where DeepGEMM is off. Anything else (fp32,
    per-tensor FP8, whose H200 expert backend vLLM may choose otherwise, other quantizations) is
    not modelled.
    """
    if quantization is None:
        if dtype not in _UNQUANTIZED:
            raise TritonConfigError(
                f"dtype {dtype!r}: only bf16/fp16 and block FP8 expert kernels are modelled"
            )
        return None, None
    if quantization == "fp8" and weight_block is not None:
        return "fp8_w8a8", (int(weight_block[0]), int(weight_block[1]))
    raise TritonConfigError(
        f"quantization {quantization!r}"
        + ("" if weight_block is not None else " without a weight block")
        + ": only bf16/fp16 and block FP8 expert kernels are modelled"
    )


def config_file_name(
    local_experts: int,
    width: int,
    device: str,
    dtype: str | None = None,
    block_shape: tuple[int, int] | None = None,
) -> str:
    """``get_config_file_name(E, N, dtype, block_shape)`` of vLLM 0.26.0."""
    dtype_part = f",dtype={dtype}" if dtype else ""
    block_part = (
        f",block_shape=[{block_shape[0]},{block_shape[1]}]"
        if block_shape and all(block_shape)
        else ""
    )
    return f"E={local_experts},N={width},device_name={device}{dtype_part}{block_part}.json"


@functools.cache
def tuned_files() -> Mapping[str, Mapping[int, TritonConfig]]:
    """The embedded tuned files: file name -> key -> configuration, keys in file order."""
    raw: dict[str, Any] = json.loads(DATA.read_text())
    fields = raw["fields"]
    if fields != [
        "BLOCK_SIZE_M", "BLOCK_SIZE_N", "BLOCK_SIZE_K", "GROUP_SIZE_M", "num_warps", "num_stages"
    ]:  # fmt: skip
        raise TritonConfigError(f"{DATA.name}: unexpected fields {fields}")
    return {
        name: {int(key): TritonConfig(*values) for key, values in table.items()}
        for name, table in raw["files"].items()
    }


def default_config(
    rows: int,
    local_experts: int,
    dtype: str | None = None,
    block_shape: tuple[int, int] | None = None,
) -> TritonConfig:
    """``get_default_config(M=rows, E=local_experts, ...)`` of vLLM 0.26.0 on CUDA."""
    if rows < 1:
        raise TritonConfigError(f"rows must be >= 1, got {rows}")
    if dtype == "fp8_w8a8" and block_shape is not None:
        # Block FP8: a 64-wide N tile for the smallest batches (deeper pipeline up to M = 4).
        if rows <= 8 and block_shape[0] % 64 == 0:
            block_n, stages = 64, (4 if rows <= 4 else 3)
        else:
            block_n, stages = block_shape[0], 3
        return TritonConfig(
            block_m=16 if rows <= 64 else 64,
            block_n=block_n,
            block_k=block_shape[1],
            group_m=1 if rows <= 16 else 32,
            num_warps=4,
            num_stages=stages,
        )
    if dtype in ("int4_w4a16", "int8_w8a16") and block_shape is not None:
        raise TritonConfigError(f"{dtype} with a block shape runs the WNA16 kernels: not modelled")
    if rows <= 32:
        block_m = 16
    elif rows <= 96:
        block_m = 32
    elif rows <= 512:
        block_m = 64
    else:
        block_m = 128
    return TritonConfig(
        block_m=block_m,
        block_n=64 if rows <= 64 else 128,
        block_k=128 if dtype == "fp8_w8a8" or rows <= 64 else 64,
        group_m=16 if rows // max(local_experts, 1) > 128 else 1,
        num_warps=4 if rows <= 128 else 8,
        num_stages=4 if rows <= 32 else 3,
    )


@dataclass(frozen=True, slots=True)
class KernelShape:
    """What the configuration depends on besides the rows: one rank's expert weights."""

    device: str
    local_experts: int
    width: int
    dtype: str | None = None
    block_shape: tuple[int, int] | None = None

    def __post_init__(self) -> None:
        if self.local_experts < 1 or self.width < 1:
            raise TritonConfigError(
                f"local_experts and width must be >= 1, got {self.local_experts}, {self.width}"
            )

    @property
    def file_name(self) -> str:
        return config_file_name(
            self.local_experts, self.width, self.device, self.dtype, self.block_shape
        )

    @property
    def embedded(self) -> bool:
        """Whether this device's tuned files are all embedded (the choice is then exact)."""
        return self.device in EMBEDDED_DEVICES

    @property
    def tuned(self) -> Mapping[int, TritonConfig] | None:
        return tuned_files().get(self.file_name)

    @property
    def source(self) -> str:
        """The tuned file vLLM reads for this shape, or ``get_default_config``."""
        return self.file_name if self.tuned is not None else "get_default_config"

    def config(self, rows: int) -> TritonConfig:
        """The configuration the kernel runs for ``rows`` token rows, as compiled: block FP8
        clamps BLOCK_SIZE_K to the quantization block (``invoke_fused_moe_triton_kernel``)."""
        if rows < 1:
            raise TritonConfigError(f"rows must be >= 1, got {rows}")
        return _select(self, rows)

    def as_dict(self) -> dict[str, Any]:
        return {
            "vllm_version": VLLM_VERSION,
            "config_source": self.source,
            "device": self.device,
            "local_experts": self.local_experts,
            "expert_width": self.width,
            "config_dtype": self.dtype,
            "block_shape": list(self.block_shape) if self.block_shape is not None else None,
        }


@functools.lru_cache(maxsize=1 << 16)
def _select(shape: KernelShape, rows: int) -> TritonConfig:
    # Planning walks every row up to the largest (16k at DP8): each answer is kept.
    table = shape.tuned
    if table is not None:
        # min() keeps the first of equally near keys, in file order, as vLLM's does.
        found = table[min(table, key=lambda key: abs(key - rows))]
    else:
        found = default_config(rows, shape.local_experts, shape.dtype, shape.block_shape)
    block = shape.block_shape
    if block is not None and found.block_k > min(block):
        return TritonConfig(
            found.block_m, found.block_n, min(block), found.group_m, found.num_warps,
            found.num_stages,
        )  # fmt: skip
    return found


@dataclass(frozen=True, slots=True)
class KernelSwitches:
    """Which kernel vLLM runs for each row count N of one rank: its configuration and whether
    the pairs skip the sort (``naive_block_assignment``). One definition for both readers: the
    planner's kernel-step rule (``acquisition.plan.kernel``) measures both sides of every switch,
    and the lookups (``moetables.lookup.segments``) split such a table at the same switches, so
    plan and lookup agree by construction."""

    shape: KernelShape
    global_experts: int
    top_k: int
    expert_map: bool

    def naive(self, rows: int) -> bool:
        """``_prepare_expert_assignment``: no expert map and ``rows * top_k * 4 <= E_global``."""
        return not self.expert_map and rows * self.top_k * 4 <= self.global_experts

    def kernel(self, rows: int) -> tuple[TritonConfig, bool]:
        return self.shape.config(rows), self.naive(rows)

    def switches(self, maximum: int) -> list[int]:
        """Every t in ``[1, maximum)`` whose kernel differs from t + 1's: the segments are
        ``1..t1``, ``t1+1..t2``, ... (an integer N is never between t and t + 1)."""
        out: list[int] = []
        if maximum < 2:
            return out
        previous = self.kernel(1)
        for n in range(2, maximum + 1):
            current = self.kernel(n)
            if current != previous:
                out.append(n - 1)
            previous = current
        return out
