"""Counting what a router chose, per forward step and MoE layer (no torch needed here).

Every MoE layer's router calls its capture function once per forward with the step's top-k ids
``[tokens, k]``. Layers run in order, so the first captured layer opens a new step; every other
layer must see the same token count in that step, or the capture is refused (a hook that missed
a layer would otherwise shift every later count).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
import numpy.typing as npt

__all__ = ["CaptureError", "StepRecorder"]


class CaptureError(RuntimeError):
    """The capture does not add up (a layer missed, a token count disagrees, an id out of range)."""


@dataclass
class StepRecorder:
    """Per step: the rows the router saw and each layer's per-expert pair counts."""

    layers: list[int]
    global_experts: int
    top_k: int
    step_tokens: list[int] = field(default_factory=list)
    counts: list[npt.NDArray[np.int32]] = field(default_factory=list)
    _seen: list[bool] = field(default_factory=list)

    def capture(self, layer: int, tokens: int, counts: Any) -> None:
        """One layer's forward: ``tokens`` rows routed, ``counts[e]`` pairs of expert e (the
        engine's hook counts the top-k ids, on the device where it can)."""
        if layer not in self.layers:
            raise CaptureError(f"layer {layer} is not one of the captured layers {self.layers}")
        position = self.layers.index(layer)
        row = np.asarray(counts).astype(np.int64)
        if row.shape != (self.global_experts,):
            raise CaptureError(
                f"layer {layer}: counts need one entry per expert ({self.global_experts}), got "
                f"shape {list(row.shape)}"
            )
        if position == 0:
            self._close()
            self.step_tokens.append(tokens)
            self.counts.append(np.zeros((len(self.layers), self.global_experts), np.int32))
            self._seen = [False] * len(self.layers)
        elif not self.counts:
            raise CaptureError(f"layer {layer} captured before the first layer of a step")
        step = len(self.step_tokens) - 1
        if tokens != self.step_tokens[-1]:
            raise CaptureError(
                f"step {step}: layer {layer} saw {tokens} tokens, the first layer "
                f"{self.step_tokens[-1]}"
            )
        if self._seen[position]:
            raise CaptureError(f"step {step}: layer {layer} captured twice")
        if row.min() < 0 or row.max() > tokens or int(row.sum()) != tokens * self.top_k:
            raise CaptureError(
                f"step {step}: layer {layer}: counts add up to {int(row.sum())} (want "
                f"{tokens} x {self.top_k}) or exceed the step's {tokens} tokens"
            )
        self.counts[-1][position] = row.astype(np.int32)
        self._seen[position] = True

    def _close(self) -> None:
        if self._seen and not all(self._seen):
            missing = [self.layers[i] for i, seen in enumerate(self._seen) if not seen]
            raise CaptureError(
                f"step {len(self.step_tokens) - 1}: layers {missing} captured nothing"
            )

    def take(self) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.int32]]:
        """The finished steps as arrays (steps,), (steps, layers, E); the recorder empties."""
        self._close()
        tokens = np.array(self.step_tokens, dtype=np.int64)
        counts = (
            np.stack(self.counts)
            if self.counts
            else np.zeros((0, len(self.layers), self.global_experts), np.int32)
        )
        self.step_tokens, self.counts, self._seen = [], [], []
        return tokens, counts
