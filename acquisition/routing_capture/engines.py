"""The seam between the capture loop and a serving engine.

An engine says what it routes (`RouterDescription`), hooks every MoE layer's router with a
capture function, and runs a batch of prompts (prefill and decode) through its model. The
capture loop (`capture.run_capture`) knows nothing else of it.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

__all__ = [
    "Prompt",
    "PromptError",
    "RouterDescription",
    "RoutingEngine",
    "find_routers",
    "read_prompts",
]

# layer index, tokens the router saw in this forward, pairs per expert (numpy, length E)
CaptureFn = Callable[[int, int, Any], None]


class PromptError(ValueError):
    """A prompt file that cannot be read; names the line."""


@dataclass(frozen=True, slots=True)
class Prompt:
    text: str | None
    token_ids: tuple[int, ...] | None


@dataclass(frozen=True, slots=True)
class RouterDescription:
    model: str
    global_experts: int
    top_k: int
    layers: tuple[int, ...]
    router: str  # what chose the experts: "native", "normal_routing", "zipf(s=1.2)", ...
    versions: dict[str, str]


class RoutingEngine(Protocol):
    def describe(self) -> RouterDescription: ...

    def install(self, capture: CaptureFn) -> None:
        """Hook every MoE layer's router so that ``capture(layer, tokens, counts)`` sees every
        forward, layers in order (an engine that counts on a device may deliver them after
        each ``generate``)."""

    def generate(self, prompts: list[Prompt], max_tokens: int) -> tuple[int, int]:
        """Run the prompts to ``max_tokens`` new tokens each; (prompt tokens, generated tokens)."""


def find_routers(model: Any) -> dict[int, Any]:
    """Layer index -> router of every MoE layer: the ``router`` attribute (with a
    ``set_capture_fn``) of a module under ``...layers.<i>...``, as vLLM's ``MoERunner``
    (``model.layers[i].mlp.experts``) holds its ``FusedTopKRouter``; the router need not be a
    module itself. The first module of a layer that holds one wins."""
    routers: dict[int, Any] = {}
    for name, module in model.named_modules():
        router = getattr(module, "router", None)
        if router is None or not callable(getattr(router, "set_capture_fn", None)):
            continue
        parts = name.split(".")
        if "layers" not in parts[:-1]:
            continue
        index = parts[parts.index("layers") + 1]
        if index.isdigit():
            routers.setdefault(int(index), router)
    return dict(sorted(routers.items()))


def read_prompts(path: Path) -> tuple[list[Prompt], str]:
    """Prompts and the file's sha256. JSON lines with ``prompt`` (text) or
    ``prompt_token_ids`` (integers), or plain text lines (one prompt each); blank lines skip."""
    try:
        raw = path.read_bytes()
    except OSError as exc:
        raise PromptError(f"{path}: cannot read ({exc.strerror})") from None
    digest = hashlib.sha256(raw).hexdigest()
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        raise PromptError(f"{path}: not UTF-8 text") from None
    prompts: list[Prompt] = []
    for number, line in enumerate(text.splitlines(), start=1):
        stripped = line.strip()
        if not stripped:
            continue
        if stripped.startswith("{"):
            try:
                obj = json.loads(stripped)
            except ValueError as exc:
                raise PromptError(f"{path}:{number}: not JSON ({exc})") from None
            ids = obj.get("prompt_token_ids") if isinstance(obj, dict) else None
            prompt = obj.get("prompt") if isinstance(obj, dict) else None
            if ids is not None:
                if (
                    not isinstance(ids, list)
                    or not ids
                    or any(isinstance(i, bool) or not isinstance(i, int) or i < 0 for i in ids)
                ):
                    raise PromptError(
                        f"{path}:{number}: prompt_token_ids must be non-negative integers"
                    )
                prompts.append(Prompt(None, tuple(ids)))
            elif isinstance(prompt, str) and prompt:
                prompts.append(Prompt(prompt, None))
            else:
                raise PromptError(
                    f"{path}:{number}: a JSON line needs prompt (text) or prompt_token_ids"
                )
        else:
            prompts.append(Prompt(line, None))
    if not prompts:
        raise PromptError(f"{path}: no prompts")
    return prompts, digest
