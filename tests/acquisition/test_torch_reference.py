"""The plain PyTorch reference backend: admission, outputs, banks (CPU)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from acquisition.adapters import AdmissionError, select_backend  # noqa: E402
from acquisition.adapters.base import RuntimeInfo  # noqa: E402
from acquisition.adapters.torch_reference import (  # noqa: E402
    TorchReferenceBackend,
    TorchReferenceSession,
)
from acquisition.catalog import resolve_model  # noqa: E402
from acquisition.protocol.measure import PointMeter, ProtocolSettings  # noqa: E402
from acquisition.protocol.stimulus import RoutingStimulus, routing_stimulus  # noqa: E402
from acquisition.runtime import probe_runtime  # noqa: E402
from moetables.geometry import ExpertGeometry, MoeTarget  # noqa: E402


@pytest.fixture(scope="module")
def runtime() -> RuntimeInfo:
    return probe_runtime("cpu", cache_bytes=1)


def test_it_admits_plain_moe_and_declines_what_it_cannot_run(runtime: RuntimeInfo) -> None:
    target = MoeTarget.for_rank(1, 1, 0)
    backend = TorchReferenceBackend()
    assert backend.admit(
        resolve_model("Qwen/Qwen3-30B-A3B-Instruct-2507"), target, runtime
    ).admitted
    oss = backend.admit(resolve_model("openai/gpt-oss-20b"), target, runtime)
    assert not oss.admitted
    assert any("biased experts" in r for r in oss.reasons)
    assert any("mxfp4" in r for r in oss.reasons)


def test_auto_never_substitutes_the_reference(runtime: RuntimeInfo) -> None:
    model = resolve_model("Qwen/Qwen3-30B-A3B-Instruct-2507")
    with pytest.raises(AdmissionError, match="--backend torch-reference"):
        select_backend("auto", model, MoeTarget.for_rank(1, 1, 0), runtime)
    with pytest.raises(AdmissionError, match="declined: biased experts") as declined:
        select_backend(
            "torch-reference",
            resolve_model("openai/gpt-oss-20b"),
            MoeTarget.for_rank(1, 1, 0),
            runtime,
        )
    assert declined.value.report.selected is None


def _naive_experts(
    session: TorchReferenceSession, stimulus: RoutingStimulus, hidden: torch.Tensor
) -> torch.Tensor:
    """Token by token, choice by choice: what the looped experts must compute."""
    out = torch.zeros_like(hidden)
    mapping = session.expert_map_list
    for t in range(stimulus.tokens):
        for j in range(session.top_k):
            local = mapping[int(stimulus.topk_ids[t, j])]
            if local < 0:
                continue
            gate_up = hidden[t] @ session.w13[local].T
            act = torch.nn.functional.silu(gate_up[: session.width]) * gate_up[session.width :]
            out[t] += float(stimulus.topk_weights[t, j]) * (act @ session.w2[local].T)
    return out


def test_experts_compute_the_routed_mixture_on_this_rank_only(
    tiny_model: Path, runtime: RuntimeInfo
) -> None:
    model = resolve_model(str(tiny_model))
    target = MoeTarget.for_rank(1, 2, 1)  # owns experts 2 and 3 of 4
    session = TorchReferenceBackend().build(model, target, runtime, "float32")
    geometry = ExpertGeometry.for_target(4, 2, target)
    stimulus = routing_stimulus(geometry, session.expert_map_list, 6, 2, 5, seed=3)
    prepared = session.prepare_experts(stimulus)
    session.allocate_banks(2)
    output = session.run_experts(prepared, 1)
    assert output is prepared.output  # the caller's buffer
    expected = _naive_experts(session, stimulus, prepared.hidden)
    assert torch.allclose(output, expected, atol=1e-5)
    assert torch.equal(output, session.reference_experts(prepared))


def test_gate_routing_returns_normalized_top_k(tiny_model: Path, runtime: RuntimeInfo) -> None:
    session = TorchReferenceBackend().build(
        resolve_model(str(tiny_model)), MoeTarget.for_rank(1, 1, 0), runtime, "float32"
    )
    weights, ids = session.local_forward("gate_routing", 5).run()
    assert ids.shape == (5, 2) and weights.dtype == torch.float32
    assert torch.allclose(weights.sum(dim=-1), torch.ones(5))


def test_every_bank_matches_the_reference_before_timing(
    tiny_model: Path, runtime: RuntimeInfo
) -> None:
    model = resolve_model(str(tiny_model))
    target = MoeTarget.for_rank(1, 2, 0)
    session = TorchReferenceBackend().build(model, target, runtime, "float32")
    session.allocate_banks(4)
    meter = PointMeter(
        session,
        ProtocolSettings(rounds=1, iterations=1),
        ExpertGeometry.for_target(4, 2, target),
        session.expert_map_list,
        banks=2,
        device="cpu",
    )
    from acquisition.plan import PlanPoint

    assert meter.verify(PlanPoint("experts", 4, 2, 6)) == 4
    # A bank that drifted from its clone is caught, not timed.
    session.banks[3][0].add_(1.0)
    from acquisition.protocol.measure import ReferenceMismatch

    with pytest.raises(ReferenceMismatch, match=r"weight set 3 \(bank 3\)"):
        meter.verify(PlanPoint("experts", 4, 2, 6))


def test_its_contract_description_is_truthful(tiny_model: Path, runtime: RuntimeInfo) -> None:
    session = TorchReferenceBackend().build(
        resolve_model(str(tiny_model)), MoeTarget.for_rank(1, 2, 0), runtime, "float32"
    )
    described = session.describe()
    assert described["name"] == "torch-reference" and described["native"] is False
    assert described["device"] == "cpu"
    assert described["attribution"].startswith("cpu_operator_events")
    assert session.components == ("gate_routing", "experts", "finalize_copy")
    assert session.expert_bank_bytes() == 2 * (2 * 8 * 16 + 16 * 8) * 4
    assert np.isfinite(described["gate_weight_bytes"])
