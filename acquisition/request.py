"""One acquisition command, resolved: what to measure, how, and where its files go.

Two trees under ``--out-root``, kept apart on purpose:

- ``<out-root>/<hardware>/<model>/<variant>/``: the bundle, runtime files only (meta.yaml and
  components.csv), written with ``moetables.bundle.write_bundle``; publishable as it is.
- ``<out-root>/_acquisition/<hardware>/<model>/<variant>/tp<N>/moe_components/<deployment>/``:
  one target's work directory: samples.jsonl (the resumable checkpoint), writer.lock,
  plan.json, and on failure failures.jsonl and Chrome traces. Never inside a bundle (R36, R37).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from pathlib import Path

    from acquisition.catalog import MoeModel
    from acquisition.plan import CaptureSizes, CudagraphMode
    from acquisition.protocol.measure import ProtocolSettings
    from moetables.geometry import MoeTarget

__all__ = ["WORK_FOLDER", "AcquisitionRequest"]

WORK_FOLDER = "_acquisition"


@dataclass(frozen=True, slots=True)
class AcquisitionRequest:
    command: str
    model: MoeModel
    hardware: str
    dtype: str
    variant: str
    out_root: Path
    backend: str
    device: str
    settings: ProtocolSettings
    max_num_batched_tokens: int
    max_num_seqs: int
    grid_factor: float
    cudagraph_mode: CudagraphMode
    captures: CaptureSizes
    cache_bytes: int | None
    command_line: str
    # The kernel-step plan rule (auto, on, off, v2, v3, v4):
    # `acquisition.options.resolve.kernel_steps_for`.
    kernel_steps: str = "off"
    # Options of a component engine (vllm-live), carried to it on RuntimeInfo.limits.
    engine_attention_backend: str | None = None
    engine_kv_cache_bytes: int | None = None

    @property
    def bundle_dir(self) -> Path:
        return self.out_root / self.hardware / self.model.name / self.variant

    def work_dir(self, target: MoeTarget) -> Path:
        return (
            self.out_root
            / WORK_FOLDER
            / self.hardware
            / self.model.name
            / self.variant
            / f"tp{target.tp}"
            / "moe_components"
            / target.deployment
        )
