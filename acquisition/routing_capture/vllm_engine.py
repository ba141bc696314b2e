"""vLLM as a `RoutingEngine` (GPU host; vLLM imported here only).

The engine runs in-process (``VLLM_ENABLE_V1_MULTIPROCESSING=0``) and eager
(``enforce_eager=True``: a CUDA graph replays without calling Python hooks). ``apply_model``
reaches the model; every MoE layer's router (``model.layers[i].mlp.experts.router``, vLLM 0.26.0's
``FusedTopKRouter`` or, under ``VLLM_MOE_ROUTING_SIMULATION_STRATEGY``, its
``RoutingSimulatorRouter``) gets ``set_capture_fn``. The hook counts the top-k ids per expert on
the device (``scatter_add_``: no read-back inside the forward) and keeps the counts there; after
each ``generate`` they come to the host once and go to the capture in layer order.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from acquisition.routing_capture.engines import (
    CaptureFn,
    Prompt,
    RouterDescription,
    find_routers,
)

__all__ = ["VllmRoutingEngine"]


class VllmRoutingEngine:
    def __init__(self, model_dir: Path, engine_args: dict[str, Any], router: str) -> None:
        os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
        if router == "native":
            os.environ.pop("VLLM_MOE_ROUTING_SIMULATION_STRATEGY", None)
        else:
            os.environ["VLLM_MOE_ROUTING_SIMULATION_STRATEGY"] = router
        import vllm
        from vllm import LLM

        self.router = router
        self.config = json.loads((model_dir / "config.json").read_text())
        self.name = str(self.config.get("_name_or_path") or model_dir.name)
        args = {"enforce_eager": True, **engine_args}
        if not args["enforce_eager"]:
            raise ValueError("routing capture needs enforce_eager (graphs skip Python hooks)")
        self.llm = LLM(model=str(model_dir), **args)
        self.versions = {"vllm": str(vllm.__version__)}
        self._pending: list[tuple[int, int, Any]] = []
        found = self.llm.apply_model(_layers_of)
        self._layers = tuple(found[0] if isinstance(found, list) else found)

    def describe(self) -> RouterDescription:
        import torch

        experts = int(self.config.get("num_experts") or self.config.get("n_routed_experts"))
        return RouterDescription(
            model=self.name,
            global_experts=experts,
            top_k=int(self.config["num_experts_per_tok"]),
            layers=self._layers,
            router="native" if self.router == "native" else f"vllm simulator {self.router}",
            versions={**self.versions, "torch": str(torch.__version__)},
        )

    def install(self, capture: CaptureFn) -> None:
        pending = self._pending
        experts = self.describe().global_experts

        def install_in(model: Any) -> int:
            import torch

            routers = find_routers(model)
            for layer, router in routers.items():

                def hook(ids: Any, layer: int = layer) -> None:
                    flat = ids.reshape(-1).to(torch.int64)
                    counts = torch.zeros(experts, dtype=torch.int64, device=flat.device)
                    counts.scatter_add_(0, flat, torch.ones_like(flat))
                    pending.append((layer, int(ids.shape[0]), counts))

                router.set_capture_fn(hook)
            return len(routers)

        self.llm.apply_model(install_in)
        self._capture = capture

    def generate(self, prompts: list[Prompt], max_tokens: int) -> tuple[int, int]:
        from vllm import SamplingParams

        params = SamplingParams(max_tokens=max_tokens, ignore_eos=True, detokenize=False)
        inputs: list[Any] = [
            {"prompt_token_ids": list(p.token_ids)} if p.token_ids is not None else p.text
            for p in prompts
        ]
        outputs = self.llm.generate(inputs, params, use_tqdm=False)
        prompt_tokens = sum(len(o.prompt_token_ids or []) for o in outputs)
        generated = sum(len(o.outputs[0].token_ids) for o in outputs if o.outputs)
        import torch

        drained = list(self._pending)
        self._pending.clear()
        if drained:
            host = torch.stack([c for _, _, c in drained]).cpu().numpy()
            for (layer, tokens, _), row in zip(drained, host, strict=True):
                self._capture(layer, tokens, row)
        return prompt_tokens, generated


def _layers_of(model: Any) -> list[int]:
    return list(find_routers(model))
