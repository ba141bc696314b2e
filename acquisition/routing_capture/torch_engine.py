"""A small torch MoE with a synthetic skewed router: the CPU side of the capture seam.

The model has vLLM's module layout where the capture reaches it
(``model.layers[i].mlp.experts.router`` with ``set_capture_fn``), real expert MLPs, and a gate
whose logits carry a Zipf-like bias per layer (expert of popularity rank r gets
``-s * log(r + 1)``, ranks permuted per layer) plus the token's own projection, so routing is
skewed, differs by layer and still depends on the tokens. Generation is vLLM-like: one prefill
forward of the batch's prompt tokens, then one decode forward per new token of the batch.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

from acquisition.routing_capture.engines import CaptureFn, Prompt, RouterDescription

__all__ = ["TorchRoutingEngine"]


def _build(config: dict[str, Any], layers: int, zipf_s: float, seed: int) -> Any:
    import torch

    hidden = int(config["hidden_size"])
    width = int(config.get("moe_intermediate_size", hidden))
    experts = int(config["num_experts"])
    top_k = int(config["num_experts_per_tok"])
    vocab = int(config.get("vocab_size", 4096))
    gen = torch.Generator().manual_seed(seed)

    class Router(torch.nn.Module):
        """Top-k over the gate's logits; calls the capture function like vLLM's router."""

        def __init__(self, layer: int) -> None:
            super().__init__()
            self.gate = torch.nn.Linear(hidden, experts, bias=False)
            torch.nn.init.normal_(self.gate.weight, std=0.5 / math.sqrt(hidden), generator=gen)
            popularity = torch.randperm(experts, generator=gen)
            bias = -zipf_s * torch.log(popularity.to(torch.float32) + 1.0)
            self.register_buffer("bias", bias)
            self.top_k = top_k
            self.capture_fn: Any = None

        def set_capture_fn(self, fn: Any) -> None:
            self.capture_fn = fn

        def forward(self, x: Any) -> tuple[Any, Any]:
            logits = self.gate(x) + self.bias
            weights, ids = torch.topk(torch.softmax(logits, dim=-1), self.top_k, dim=-1)
            if self.capture_fn is not None:
                self.capture_fn(ids)
            return weights / weights.sum(dim=-1, keepdim=True), ids

    class Experts(torch.nn.Module):
        def __init__(self, layer: int) -> None:
            super().__init__()
            self.router = Router(layer)
            self.w_in = torch.nn.Parameter(torch.randn(experts, hidden, width, generator=gen) * 0.1)
            self.w_out = torch.nn.Parameter(
                torch.randn(experts, width, hidden, generator=gen) * 0.1
            )

        def forward(self, x: Any) -> Any:
            weights, ids = self.router(x)
            out = torch.zeros_like(x)
            for e in ids.unique().tolist():
                rows, slot = (ids == e).nonzero(as_tuple=True)
                h = torch.nn.functional.silu(x[rows] @ self.w_in[e]) @ self.w_out[e]
                out.index_add_(0, rows, h * weights[rows, slot, None])
            return out

    class Block(torch.nn.Module):
        def __init__(self, layer: int) -> None:
            super().__init__()
            # vLLM's path to the router: layers[i].mlp.experts.router
            self.mlp = torch.nn.Module()
            self.experts = Experts(layer)
            self.mlp.experts = self.experts

        def forward(self, x: Any) -> Any:
            return x + self.experts(torch.nn.functional.layer_norm(x, (hidden,)))

    class Model(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.embed = torch.nn.Embedding(vocab, hidden)
            torch.nn.init.normal_(self.embed.weight, generator=gen)
            self.layers = torch.nn.ModuleList(Block(i) for i in range(layers))
            self.head = torch.nn.Linear(hidden, vocab, bias=False)
            self.vocab = vocab

        def forward(self, ids: Any) -> Any:
            x = self.embed(ids)
            for block in self.layers:
                x = block(x)
            return self.head(x)

    return Model()


class TorchRoutingEngine:
    """The tiny torch MoE as a `RoutingEngine` (CPU; deterministic for a seed)."""

    def __init__(
        self, model_dir: Path, *, zipf_s: float = 1.2, layers: int | None = None, seed: int = 0
    ) -> None:
        import torch

        config = json.loads((model_dir / "config.json").read_text())
        self.config = config
        self.layer_count = int(layers or config.get("num_hidden_layers", 2))
        self.zipf_s = zipf_s
        self.name = str(config.get("_name_or_path") or model_dir.name)
        torch.manual_seed(seed)
        self.model = _build(config, self.layer_count, zipf_s, seed)
        self.model.eval()
        self.seed = seed

    def describe(self) -> RouterDescription:
        import torch

        return RouterDescription(
            model=self.name,
            global_experts=int(self.config["num_experts"]),
            top_k=int(self.config["num_experts_per_tok"]),
            layers=tuple(range(self.layer_count)),
            router=f"synthetic zipf(s={self.zipf_s:g}) over gate logits (torch engine)",
            versions={"torch": str(torch.__version__)},
        )

    def install(self, capture: CaptureFn) -> None:
        import torch

        from acquisition.routing_capture.engines import find_routers

        experts = int(self.config["num_experts"])

        def hook(layer: int, ids: Any) -> None:
            counts = torch.bincount(ids.reshape(-1), minlength=experts)
            capture(layer, int(ids.shape[0]), counts.numpy())

        for layer, router in find_routers(self.model).items():
            router.set_capture_fn(lambda ids, layer=layer: hook(layer, ids))

    def _ids(self, prompt: Prompt) -> list[int]:
        if prompt.token_ids is not None:
            return [i % self.model.vocab for i in prompt.token_ids]
        assert prompt.text is not None
        return [b % self.model.vocab for b in prompt.text.encode("utf-8")]

    def generate(self, prompts: list[Prompt], max_tokens: int) -> tuple[int, int]:
        import torch

        batch = [self._ids(p) for p in prompts]
        prompt_tokens = sum(len(ids) for ids in batch)
        with torch.no_grad():
            logits = self.model(torch.tensor([i for ids in batch for i in ids]))
            ends = torch.tensor([len(ids) for ids in batch]).cumsum(0) - 1
            last = logits[ends].argmax(dim=-1)
            for _ in range(max_tokens - 1):
                last = self.model(last).argmax(dim=-1)
        return prompt_tokens, len(batch) * max_tokens
