"""Plan points where vLLM's Triton expert kernel changes its work, from configuration only.

vLLM 0.26.0's ``TritonExperts`` runs one kernel configuration per call, picked from the rows N
it is given (``try_get_optimal_moe_config``): the tuned file ``E={local experts},N={expert
width},device_name=...json`` if vLLM ships one (the key nearest to N, ties to the smaller key),
else ``get_default_config``. Each configuration (BLOCK_SIZE_M/N/K, GROUP_SIZE_M, warps, stages)
is its own kernel, so the expert time is a different smooth surface on every N segment of one
configuration, with a step between segments (docs/benchmarks.md, "Large errors next to a tile
step"). Without an expert map and with ``N * top_k * 4 <= E_global`` the token sort is skipped
and every pair is its own block (``naive_block_assignment``): one more switch in N.

Inside a segment, ``moe_align_block_size`` pads each expert's pairs to a multiple of
BLOCK_SIZE_M = B. Under the balanced stimulus the row tiles at fixed (N, A) are piecewise linear
in M with corners at M = A*B*j (flat part ends) and A*B*j + A (every expert one pair into its
next tile), j >= 1; the step's share of the time falls as 1/j.

The rule adds, before anything is measured (R10):

- the rows on both sides of every switch in N (t and t + 1), so that no interpolation in N
  spans two kernels;
- at every planned (N, A), the corners A*B*j and A*B*j + A for j = 1 .. ``assignment_steps``
  that lie in the feasible M range (sorted pairs only; naive assignment has no padding).
- at EP1, where M = N k leaves no M axis, the same corners as rows: for every A of the axis and
  every j, the last row before and the first row after each ramp (cheap: one target, and the
  staircase of a few experts' tiles is the largest error there).

Only configurations this module embeds are modelled: the H200 tuned file for 128 experts of
width 768 in bf16 (Qwen3-30B-A3B at EP1) and vLLM's bf16/fp16 default elsewhere on the H200
(no tuned H200 file exists in vLLM 0.26.0 for 64, 32 or 16 experts of width 768). Other
hardware and dtypes are declined (`KernelStepsError`): their tuned files are not embedded.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

__all__ = [
    "KERNEL_STEPS_RULE",
    "KernelSteps",
    "KernelStepsError",
    "TritonConfig",
    "default_config",
    "tuned_config",
]

KERNEL_STEPS_RULE = "vllm-0.26.0-triton-config-steps-v1"
# Corners A*B*j, A*B*j + A for j up to this: the first steps are 100 %, 50 %, 33 % of the tiles
# before them; later ones are within what the geometric grid already resolves.
DEFAULT_ASSIGNMENT_STEPS = 3


class KernelStepsError(ValueError):
    """The kernel's configuration for this target is not modelled (named in the message)."""


@dataclass(frozen=True, slots=True)
class TritonConfig:
    """One kernel configuration of ``fused_moe_kernel`` (every key that changes the kernel)."""

    block_m: int
    block_n: int
    block_k: int
    group_m: int
    num_warps: int
    num_stages: int


def _c(bm: int, bn: int, bk: int, gm: int, w: int, s: int) -> TritonConfig:
    return TritonConfig(bm, bn, bk, gm, w, s)


# vllm/model_executor/layers/fused_moe/configs/E=128,N=768,device_name=NVIDIA_H200.json (0.26.0),
# key -> (BLOCK_SIZE_M, BLOCK_SIZE_N, BLOCK_SIZE_K, GROUP_SIZE_M, num_warps, num_stages).
_H200_E128_N768_BF16: dict[int, TritonConfig] = {
    1: _c(16, 64, 64, 1, 4, 5),
    2: _c(16, 64, 64, 1, 4, 4),
    4: _c(16, 64, 128, 16, 4, 2),
    8: _c(16, 64, 128, 1, 4, 3),
    16: _c(16, 64, 256, 1, 4, 2),
    24: _c(16, 64, 128, 1, 4, 4),
    32: _c(16, 64, 128, 16, 4, 2),
    48: _c(16, 128, 128, 16, 4, 3),
    64: _c(16, 256, 128, 1, 8, 2),
    96: _c(16, 128, 128, 1, 4, 2),
    128: _c(16, 128, 128, 1, 4, 2),
    256: _c(32, 256, 128, 16, 4, 2),
    512: _c(64, 128, 64, 1, 4, 3),
    1024: _c(128, 256, 64, 16, 8, 4),
    1536: _c(128, 256, 64, 1, 8, 4),
    2048: _c(128, 256, 64, 1, 8, 4),
    3072: _c(128, 256, 64, 1, 8, 4),
    4096: _c(128, 256, 64, 16, 8, 4),
}

# (device family, local experts, expert width, config dtype) -> tuned configurations.
_TUNED: dict[tuple[str, int, int, str | None], dict[int, TritonConfig]] = {
    ("NVIDIA_H200", 128, 768, None): _H200_E128_N768_BF16,
}
# Device families whose complete set of tuned bf16 files for the modelled shapes is known.
_MODELLED_DEVICES = ("NVIDIA_H200",)
_UNQUANTIZED = {"bf16", "bfloat16", "fp16", "float16"}


def tuned_config(
    rows: int, local_experts: int, width: int, device: str = "NVIDIA_H200"
) -> TritonConfig | None:
    """The tuned file's configuration for ``rows`` (nearest key, ties to the smaller), if any."""
    table = _TUNED.get((device, local_experts, width, None))
    if table is None:
        return None
    # vLLM: configs[min(configs.keys(), key=lambda x: abs(x - M))], keys in ascending order.
    return table[min(table, key=lambda key: abs(key - rows))]


def default_config(rows: int, local_experts: int) -> TritonConfig:
    """``get_default_config(M=rows, E=local_experts, ...)`` for bf16/fp16 on CUDA (0.26.0)."""
    if rows < 1:
        raise KernelStepsError(f"rows must be >= 1, got {rows}")
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
        block_k=128 if rows <= 64 else 64,
        group_m=16 if rows // max(local_experts, 1) > 128 else 1,
        num_warps=4 if rows <= 128 else 8,
        num_stages=4 if rows <= 32 else 3,
    )


def device_family(hardware: str) -> str:
    """vLLM's config file device name for a hardware label (every H200 is ``NVIDIA_H200``)."""
    return "NVIDIA_H200" if "H200" in hardware.upper() else hardware


@dataclass(frozen=True, slots=True)
class KernelSteps:
    """What the kernel's configuration depends on, for one target; derives the added points."""

    device: str
    local_experts: int
    global_experts: int
    top_k: int
    width: int
    expert_map: bool
    assignment_steps: int = DEFAULT_ASSIGNMENT_STEPS

    @classmethod
    def for_target(
        cls,
        *,
        hardware: str,
        dtype: str,
        local_experts: int,
        global_experts: int,
        top_k: int,
        width: int,
        assignment_steps: int = DEFAULT_ASSIGNMENT_STEPS,
    ) -> KernelSteps:
        """The rule for a target, or `KernelStepsError` where its configuration is not known."""
        device = device_family(hardware)
        if device not in _MODELLED_DEVICES:
            raise KernelStepsError(
                f"hardware {hardware!r}: vLLM's tuned Triton configurations for it are not "
                "embedded in the planner"
            )
        if dtype not in _UNQUANTIZED:
            raise KernelStepsError(
                f"dtype {dtype!r}: only the bf16/fp16 Triton configurations are embedded"
            )
        if assignment_steps < 0:
            raise KernelStepsError(f"assignment_steps must be >= 0, got {assignment_steps}")
        return cls(
            device=device,
            local_experts=local_experts,
            global_experts=global_experts,
            top_k=top_k,
            width=width,
            # vLLM builds an expert map whenever experts are split over EP ranks.
            expert_map=local_experts < global_experts,
            assignment_steps=assignment_steps,
        )

    @property
    def source(self) -> str:
        """Which configuration vLLM uses for this shape: a tuned file's name or the default."""
        if (self.device, self.local_experts, self.width, None) in _TUNED:
            return f"E={self.local_experts},N={self.width},device_name={self.device}.json"
        return "get_default_config"

    def config(self, rows: int) -> TritonConfig:
        found = tuned_config(rows, self.local_experts, self.width, self.device)
        return found if found is not None else default_config(rows, self.local_experts)

    def naive(self, rows: int) -> bool:
        """``_prepare_expert_assignment``: no expert map and ``rows * top_k * 4 <= E_global``."""
        return not self.expert_map and rows * self.top_k * 4 <= self.global_experts

    def kernel(self, rows: int) -> tuple[TritonConfig, bool]:
        return self.config(rows), self.naive(rows)

    def row_steps(self, maximum: int) -> list[int]:
        """Rows on both sides of every switch of the kernel in ``[1, maximum]``."""
        rows: set[int] = set()
        previous = self.kernel(1)
        for n in range(2, maximum + 1):
            current = self.kernel(n)
            if current != previous:
                rows.update((n - 1, n))
            previous = current
        return sorted(rows)

    def row_corners(self, maximum: int, actives: Iterable[int]) -> list[int]:
        """At EP1 (M = N k, so the padding corners are rows): for each A, the last row before
        and the first row after every ramp A*B*j .. A*B*j + A of the row tiles, every j."""
        if self.local_experts != self.global_experts:
            return []
        k = self.top_k
        rows: set[int] = set()
        blocks = {self.config(n).block_m for n in range(1, maximum + 1)}
        for active in actives:
            for b in blocks:
                j = 1
                while (first := -(-(active * b * j) // k)) <= maximum:
                    last = (active * b * j) // k
                    after = -(-(active * b * j + active) // k)
                    if self.config(first).block_m == b and not self.naive(first):
                        rows.update(r for r in (last, after) if 1 <= r <= maximum)
                    j += 1
        return sorted(rows)

    def assignment_corners(self, rows: int, active: int, low: int, high: int) -> list[int]:
        """M = A*B*j and A*B*j + A, j = 1 .. assignment_steps, inside ``[low, high]``."""
        if active < 1 or self.naive(rows):
            return []
        tile = active * self.config(rows).block_m
        corners = {
            m
            for j in range(1, self.assignment_steps + 1)
            for m in (tile * j, tile * j + active)
            if low <= m <= high
        }
        return sorted(corners)

    def as_dict(self) -> dict[str, Any]:
        """The rule and its inputs, as plans and contracts record them."""
        return {
            "rule": KERNEL_STEPS_RULE,
            "kernel": "vllm TritonExperts (fused_moe_kernel)",
            "config_source": self.source,
            "device": self.device,
            "local_experts": self.local_experts,
            "global_experts": self.global_experts,
            "top_k": self.top_k,
            "expert_width": self.width,
            "expert_map": self.expert_map,
            "assignment_steps": self.assignment_steps,
            "rows": "t and t+1 at every change of the kernel configuration or of "
            "naive_block_assignment between t and t+1",
            "assignments": "A*B*j and A*B*j+A for j = 1..assignment_steps, B = BLOCK_SIZE_M at N",
        }
