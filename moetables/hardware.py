"""Peak memory bandwidth and dense tensor-core rates of the GPUs that shipped tables name.

These are the vendor's peak figures, used only as *lower bounds* on time (issue 20, item 5): no
kernel reads memory faster than the peak bandwidth or multiplies faster than the dense peak. A
figure that is too high only loosens a bound; one that is too low would fail honest rows, so
where variants of a board differ the fastest variant's figure is kept and the choice is said.

Dense means without 2:4 structured sparsity: NVIDIA's datasheets print the sparse figure, twice
the dense one, for the H200; MoE expert GEMMs are dense.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["HARDWARE", "HardwareSpec", "hardware_spec"]


@dataclass(frozen=True, slots=True)
class HardwareSpec:
    """One GPU's peak figures, with where each comes from."""

    label: str
    device_names: tuple[str, ...]
    memory_bandwidth_bytes_per_s: float
    dense_bf16_flops: float
    dense_fp8_flops: float
    sources: tuple[str, ...]

    def dense_flops(self, dtype: str) -> float:
        """The dense tensor-core peak for a weight dtype (16-bit or 8-bit floats)."""
        if dtype in ("bfloat16", "float16"):
            return self.dense_bf16_flops
        if dtype.startswith("float8"):
            return self.dense_fp8_flops
        raise ValueError(
            f"{self.label}: no tensor-core rate known for weights of dtype {dtype!r} "
            "(known: bfloat16, float16, float8_*)"
        )


HARDWARE: dict[str, HardwareSpec] = {
    "H200": HardwareSpec(
        label="H200",
        device_names=("NVIDIA H200",),
        # HBM3e, 141 GB: 4.8 TB/s (SXM and NVL boards alike).
        memory_bandwidth_bytes_per_s=4.8e12,
        # The datasheet's 1,979 TFLOPS BF16 and 3,958 TFLOPS FP8 are "with sparsity"; dense is
        # half. The SXM board's figures (the NVL board's are lower, which only loosens a bound).
        dense_bf16_flops=989.5e12,
        dense_fp8_flops=1979e12,
        sources=(
            "https://www.nvidia.com/en-us/data-center/h200/ (datasheet: GPU memory bandwidth "
            "4.8 TB/s; BF16 Tensor Core 1,979 TFLOPS and FP8 Tensor Core 3,958 TFLOPS, both "
            "with sparsity)",
            "dense = sparse / 2: 132 SMs x 4,096 dense BF16 FLOP/clock x 1.83 GHz = 989 TFLOPS "
            "(Hopper whitepaper's per-SM tensor rate, the H100 SXM's GH100 at the same clock)",
        ),
    ),
    "RTXPRO6000": HardwareSpec(
        label="RTXPRO6000",
        device_names=(
            "NVIDIA RTX PRO 6000 Blackwell Server Edition",
            "NVIDIA RTX PRO 6000 Blackwell Workstation Edition",
        ),
        # GDDR7 on a 512-bit bus at 28 Gbps: 512 / 8 x 28e9 = 1,792 GB/s.
        memory_bandwidth_bytes_per_s=1.792e12,
        # GB202 with 188 SMs at a 2.617 GHz boost: 503.8 TFLOPS dense BF16 (FP32 accumulate),
        # 1,007.6 TFLOPS dense FP8. The Workstation Edition's boost clock, the highest of the
        # three boards (Server Edition, Workstation, Max-Q), so the bound stays a bound.
        dense_bf16_flops=503.8e12,
        dense_fp8_flops=1007.6e12,
        sources=(
            "NVIDIA RTX PRO 6000 Blackwell announcement (GTC 2025): 96 GB GDDR7, 512-bit, "
            "1,792 GB/s (e.g. https://gpu.name/posts/nvidia-unveils-rtx-pro-6000-blackwell-gpu-"
            "with-24-064-cores-and-96gb-memory)",
            "GB202 spec sheet (TechPowerUp database, mirrored at https://hmc-tech.com/gpu/"
            "nvidia-rtx-pro-6000-blackwell-vs-amd-radeon-pro-duo-polaris): BF16 503.8 TFLOPS "
            "tensor dense, FP8 1.01 PFLOPS dense (FP32 accumulate), 2,617 MHz boost",
        ),
    ),
}


def hardware_spec(label: str | None, device_name: str | None = None) -> HardwareSpec:
    """The spec of a bundle's hardware label, checked against a recorded device name.

    An unknown label is an error rather than a guess: the bounds are only as good as the figures.
    """
    if label is None or label not in HARDWARE:
        raise KeyError(
            f"no peak figures for hardware {label!r}; known: {sorted(HARDWARE)} "
            "(add its datasheet figures to moetables/hardware.py)"
        )
    spec = HARDWARE[label]
    if device_name is not None and device_name not in spec.device_names:
        raise KeyError(
            f"hardware {label!r} is recorded as device {device_name!r}, not one of "
            f"{list(spec.device_names)}"
        )
    return spec
