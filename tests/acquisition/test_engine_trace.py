"""The MoE block's activity inside a running engine (issue 11 part 5; R44, R45).

`acquisition.engine_trace` attributes a Chrome trace's device activities to the MoE block's
ranges by launch correlation; `scripts/h200x2_estimate_validation.py` hooks a model's MoE block
and router in the engine's worker. Both are checked here on CPU: the attribution on a trace shaped
like Kineto's export (runtime and driver launches, kernels, memcpy, an excluded capture range),
and the worker-side hooks on a small stand-in model under the real CPU profiler.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from typing import Any

import pytest

from acquisition.engine_trace import EngineTraceError, attribute_blocks, last_arriver_transfer_us

ROOT = Path(__file__).resolve().parents[2]


def _range(name: str, ts: float, dur: float, tid: int = 7) -> dict[str, Any]:
    return {
        "ph": "X",
        "cat": "user_annotation",
        "name": name,
        "pid": 1,
        "tid": tid,
        "ts": ts,
        "dur": dur,
    }


def _launch(corr: int, ts: float, cat: str = "cuda_runtime", tid: int = 7) -> dict[str, Any]:
    return {
        "ph": "X",
        "cat": cat,
        "name": "cudaLaunchKernel",
        "pid": 1,
        "tid": tid,
        "ts": ts,
        "dur": 2,
        "args": {"correlation": corr},
    }


def _kernel(name: str, corr: int, ts: float, dur: float, cat: str = "kernel") -> dict[str, Any]:
    return {
        "ph": "X",
        "cat": cat,
        "name": name,
        "pid": 0,
        "tid": 9,
        "ts": ts,
        "dur": dur,
        "args": {"correlation": corr, "stream": 9},
    }


def _trace() -> list[dict[str, Any]]:
    return [
        _range("gpuest.moe_block#3", 100, 50),
        _launch(1, 101),
        _kernel("gemm", 1, 200, 10.0),
        _range("gpuest.capture#3", 104, 5),
        _launch(2, 105),
        _kernel("scatter_add", 2, 211, 3.0),  # observation: excluded
        _launch(3, 112, cat="cuda_driver"),
        _kernel("ncclDevKernel_Broadcast_RING_LL", 3, 215, 40.0),
        _launch(4, 120, cat="cuda_driver"),
        _kernel("fused_moe_kernel", 4, 256, 100.0),
        _launch(5, 130),
        _kernel("Memcpy DtoD", 5, 357, 2.5, cat="gpu_memcpy"),
        _launch(6, 140),
        _kernel("ncclDevKernel_Reduce_Sum_bf16_RING_LL", 6, 360, 30.0),
        _launch(7, 160),
        _kernel("attention", 7, 400, 50.0),  # after the block: not its own
        _range("gpuest.moe_block#4", 300, 20),
        _launch(8, 301),
        _kernel("gemm", 8, 500, 9.0),
        {"ph": "f", "cat": "ac2g", "name": "ac2g", "id": 1, "ts": 101},  # flow events are ignored
    ]


def test_it_attributes_kernels_by_launch_correlation_and_excludes_the_capture_range() -> None:
    """R44/R45: compute = the block's kernels minus NCCL; NCCL kernels listed apart; observation excluded."""
    blocks = attribute_blocks(_trace(), prefix="gpuest.moe_block", exclude_prefix="gpuest.capture")
    assert [b.index for b in blocks] == [3, 4]
    b = blocks[0]
    assert [a.name for a in b.activities] == [
        "gemm",
        "ncclDevKernel_Broadcast_RING_LL",
        "fused_moe_kernel",
        "Memcpy DtoD",
        "ncclDevKernel_Reduce_Sum_bf16_RING_LL",
    ]
    assert b.compute_us == pytest.approx(10.0 + 100.0 + 2.5)
    assert [a.duration_us for a in b.nccl] == [40.0, 30.0]
    assert b.excluded == 1
    assert blocks[1].compute_us == 9.0 and blocks[1].nccl == ()
    rec = b.to_json()
    assert rec["nccl_us"] == [40.0, 30.0] and rec["compute_us"] == 112.5


def test_it_keeps_the_capture_kernels_when_nothing_is_excluded() -> None:
    blocks = attribute_blocks(_trace(), prefix="gpuest.moe_block")
    assert blocks[0].compute_us == pytest.approx(115.5) and blocks[0].excluded == 0


def test_it_ignores_launches_on_another_thread() -> None:
    events = [
        _range("gpuest.moe_block#0", 100, 50),
        _launch(1, 110, tid=8),
        _kernel("gemm", 1, 200, 10.0),
    ]
    assert attribute_blocks(events, prefix="gpuest.moe_block")[0].activities == ()


def test_it_refuses_two_ranges_of_one_index_and_activities_without_correlation() -> None:
    with pytest.raises(EngineTraceError, match="two ranges"):
        attribute_blocks(
            [_range("gpuest.moe_block#1", 0, 5), _range("gpuest.moe_block#1", 10, 5)],
            prefix="gpuest.moe_block",
        )
    bad = _kernel("gemm", 1, 0, 1)
    del bad["args"]["correlation"]
    with pytest.raises(EngineTraceError, match="no correlation"):
        attribute_blocks([bad], prefix="gpuest.moe_block")


def test_it_takes_the_last_arrivers_kernel_as_the_transfer() -> None:
    """R45: the earlier rank's NCCL kernel holds its wait; the shortest is the transfer."""
    assert last_arriver_transfer_us([[1300.0, 40.0], [45.0, 900.0]]) == [45.0, 40.0]
    with pytest.raises(EngineTraceError, match="different numbers"):
        last_arriver_transfer_us([[1.0], [1.0, 2.0]])


def _probe() -> Any:
    spec = importlib.util.spec_from_file_location(
        "h200x2_estimate_validation", ROOT / "scripts/h200x2_estimate_validation.py"
    )
    assert spec and spec.loader
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod
    spec.loader.exec_module(mod)
    return mod


def test_it_hooks_block_and_router_of_a_stand_in_model_under_the_cpu_profiler(
    tmp_path: Path,
) -> None:
    """The worker side: block ranges by forward, token counts, per-expert counts of the top-k ids."""
    torch = pytest.importorskip("torch")
    probe = _probe()
    experts, top_k = 8, 2

    class Router:
        def __init__(self) -> None:
            self.top_k = top_k
            self.capture_fn: Any = None

        def set_capture_fn(self, fn: Any) -> None:
            self.capture_fn = fn

    class Config:
        num_experts, num_local_experts, ep_size, ep_rank, dp_size, dp_rank = experts, 4, 2, 0, 2, 0

    class MoERunner(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.w = torch.nn.Parameter(torch.ones(4, 4))
            self.router = Router()
            self.moe_config = Config()
            self.expert_map = torch.tensor([0, 1, 2, 3, -1, -1, -1, -1])

        def forward(self, x: Any) -> Any:
            ids = (torch.arange(x.shape[0] * top_k) % experts).reshape(x.shape[0], top_k)
            self.router.capture_fn(ids)
            return x @ self.w

    class Block(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.experts = MoERunner()

        def forward(self, x: Any) -> Any:
            return self.experts(x)

    class Model(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.layers = torch.nn.ModuleList([torch.nn.Module()])
            self.layers[0].mlp = Block()

        def forward(self, x: Any) -> Any:
            return self.layers[0].mlp(x)

    model = Model()
    info = probe.install(model)
    assert info["block"] == "layers.0.mlp" and info["global_experts"] == experts
    assert info["expert_map"] == [0, 1, 2, 3, -1, -1, -1, -1] and info["top_k"] == top_k
    model(torch.ones(3, 4))  # before the profile: not reported
    assert probe.start_profile(model) == 1
    model(torch.ones(5, 4))
    model(torch.ones(2, 4))
    out = probe.stop_profile(model, str(tmp_path / "trace.json"))
    blocks = out["blocks"]
    assert [b["index"] for b in blocks] == [1, 2] and [b["tokens"] for b in blocks] == [5, 2]
    assert (
        blocks[0]["expert_counts"] == [2, 2, 1, 1, 1, 1, 1, 1]
        and sum(blocks[1]["expert_counts"]) == 4
    )
    assert blocks[0]["topk_shape"] == [5, 2]


@pytest.mark.parametrize("dp", [2, 4, 8])
def test_it_plans_equal_and_unequal_steps_for_any_dp_size(dp: int) -> None:
    """Issue 16 (DP4/EP4) runs the same script: at least 12 steps, 4..2048 tokens per rank."""
    plan = _probe().step_plan(dp)
    assert len(plan) >= 12 and all(len(step) == dp for step in plan)
    assert all(4 <= n <= 2048 for step in plan for n in step)
    assert sum(len(set(s)) == 1 for s in plan) >= 5 and sum(len(set(s)) > 1 for s in plan) >= 7
