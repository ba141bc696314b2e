"""bench/modular_host_cost.py's step timing on CPU with the vLLM fakes: every step of
``VllmModularSession._experts`` is reached by the names the GPU run uses (DP1 and DP+EP)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import vllm_fakes as fv
from tiny_moe import write_model

from acquisition.adapters.vllm_modular_backend import VllmModularBackend
from acquisition.catalog import resolve_model
from acquisition.protocol.stimulus import routing_stimulus
from moetables.geometry import ExpertGeometry, MoeTarget, linear_expert_map

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))

import modular_host_cost


@pytest.mark.parametrize(
    ("target", "steps"),
    [
        (MoeTarget(1, 1, 1, 0, False), ["prepare", "moe_problem_size", "allocate_buffers",
                                        "experts_apply", "finalize"]),
        (MoeTarget(1, 2, 2, 1, False), ["moe_problem_size", "allocate_buffers", "experts_apply",
                                        "reduction"]),
    ],
    ids=["dp1", "dp2_rank1"],
)  # fmt: skip
def test_every_step_of_an_experts_forward_is_timed(
    tmp_path: Path, target: MoeTarget, steps: list[str]
) -> None:
    model = resolve_model(str(write_model(tmp_path / "tiny", num_experts=8)))
    backend = VllmModularBackend(
        resolve=fv.resolver(fv.modular_namespace()), activities=fv.activities
    )
    session = backend.build(model, target, fv.fake_runtime(), "float32")
    try:
        session.allocate_banks(2)
        geometry = ExpertGeometry.for_target(model.global_experts, model.top_k, target)
        mapping = linear_expert_map(model.global_experts, target.ep, target.rank)
        prepared = session.prepare_experts(
            routing_stimulus(geometry, mapping, 4, 2, 8 if target.dp == 1 else 4, seed=1)
        )
        timed = modular_host_cost._steps(session, prepared, 3, lambda: None)
        reuse = ["forward_reusing_workspace", "reused_output_equal"]
        assert list(timed) == [*steps[:-1], *reuse, steps[-1]]
        assert timed["reused_output_equal"] == 1.0
        assert all(v > 0 for v in timed.values())
        # The forward as a measured context runs it (hold_workspace); a CPU build never
        # allows the hold (host operators are timed there), so allow it as CUDA's check would.
        session.workspace_views["held_per_context"] = True
        requested = session.workspace_reuse[0]
        held = modular_host_cost._held(session, prepared, 3, lambda: None)
        assert held["held_allowed"] == 1.0 and held["held_output_equal"] == 1.0
        assert held["held_forward_us"] > 0
        assert session.workspace_reuse[0] == requested + 1  # one vLLM request for 4 forwards
        top = modular_host_cost._top_functions(session, prepared, count=3, top=5)
        assert any("tottime" in line for line in top)
    finally:
        session.close()


def test_it_refuses_without_cuda() -> None:
    assert modular_host_cost.main([]) == 2
