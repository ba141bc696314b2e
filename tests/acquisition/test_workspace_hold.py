"""vllm-modular asks vLLM for a context's workspace views once, not per forward (issue 19).

What must not change (R15-R19, R21): every experts forward still gets exactly the workspace
views vLLM's own ``_allocate_buffers`` would hand it at that moment (pointer, shape, strides,
dtype), the same forwards run in the same order, and a workspace call that launches device
work is never skipped. The fake below behaves as vLLM's ``WorkspaceManager``: views of one
buffer at offsets computed from the requested shapes, the buffer replaced only when a request
needs more bytes.
"""

from __future__ import annotations

from math import prod
from pathlib import Path
from typing import Any

import pytest
import torch
import vllm_fakes as fv
from tiny_moe import write_model

from acquisition.adapters.vllm_modular_backend import VllmModularBackend
from acquisition.catalog import MoeModel, resolve_model
from acquisition.plan import PlanPoint
from acquisition.protocol.measure import PointMeter, PointRequest, ProtocolSettings, context_order
from moetables.geometry import ExpertGeometry, MoeTarget, linear_expert_map

DP1 = MoeTarget(tp=1, dp=1, ep=1, rank=0, sequence_parallel=False)
DP2_RANK1 = MoeTarget(tp=1, dp=2, ep=2, rank=1, sequence_parallel=False)


class ManagedImpl:
    """``_allocate_buffers`` over a vLLM-like workspace manager (one growing buffer)."""

    launches = False

    def __init__(self) -> None:
        self.buffer: torch.Tensor | None = None
        self.calls = 0
        self.replaced = 0

    def views(self, dtype: Any, m: int, n: int, k: int, top_k: int) -> tuple[Any, Any]:
        shapes = [(m * top_k, max(n, k)), (m * top_k, max(n // 2, k))]
        size = torch.empty((), dtype=dtype).element_size()
        actual = [prod(s) * size for s in shapes]
        aligned = [-(-a // 256) * 256 for a in actual]
        if self.buffer is None or self.buffer.numel() < sum(aligned):
            self.buffer = torch.empty(sum(aligned), dtype=torch.uint8)
            self.replaced += 1
        offsets = [0, aligned[0]]
        first, second = (
            self.buffer[o : o + a].view(dtype).reshape(s)
            for o, a, s in zip(offsets, actual, shapes, strict=True)
        )
        return first, second

    def _allocate_buffers(
        self, out_dtype: Any, device: Any, m_chunk: int, m_full: int, n: int, k: int,
        top_k: int, global_num_experts: int, local_num_experts: int, meta: Any, activation: Any,
    ) -> tuple[Any, Any, Any]:  # fmt: skip
        self.calls += 1
        if self.launches:
            fv.launch("workspace_fill")
        first, second = self.views(out_dtype, m_full, n, k, top_k)
        return first, second, None


class LaunchingImpl(ManagedImpl):
    launches = True


def _signature(tensor: Any) -> tuple[Any, ...]:
    return (tensor.data_ptr(), tuple(tensor.shape), tuple(tensor.stride()), tensor.dtype)


@pytest.fixture
def model(tmp_path: Path) -> MoeModel:
    return resolve_model(str(write_model(tmp_path / "tiny", num_experts=8)))


def _session(model: MoeModel, target: MoeTarget, impl: type[ManagedImpl]) -> Any:
    """A CPU session whose build-time workspace check ran as on CUDA (the fakes' launches
    stand in for device activities). On CPU itself a forward is timed by its host operators,
    which the workspace request adds, so a CPU build never holds (checked below)."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(fv, "_Impl", impl)
        backend = VllmModularBackend(
            resolve=fv.resolver(fv.modular_namespace()), activities=fv.activities
        )
        session = backend.build(model, target, fv.fake_runtime(), "float32")
        assert session.workspace_views["held_per_context"] is False
        assert "host operators" in session.workspace_views["reason"]
        probe = session.prepare_experts(session._probe_stimulus())
        device = session.device
        session.device = torch.device("cuda")  # only the check's first line reads it
        try:
            session._check_workspace_views(probe)
        finally:
            session.device = device
    session.allocate_banks(4)
    return session


def _recorded_applies(session: Any) -> list[tuple[Any, ...]]:
    """Every experts ``apply`` from now on: its workspace views next to the views vLLM's call
    would return at that moment, and the other tensors it was given."""
    impl, experts = session.kernel.impl, session.experts
    calls: list[tuple[Any, ...]] = []
    original = experts.apply

    def apply(**kwargs: Any) -> Any:
        top_k = kwargs["topk_ids"].shape[1]
        m = kwargs["hidden_states"].shape[0]
        _, _, n, k, _ = experts.moe_problem_size(
            kwargs["hidden_states"], kwargs["w1"], kwargs["w2"], kwargs["topk_ids"]
        )
        fresh = impl.views(session.dtype, m, n, k, top_k)
        calls.append(
            (
                _signature(kwargs["workspace13"]),
                _signature(kwargs["workspace2"]),
                _signature(fresh[0]),
                _signature(fresh[1]),
                kwargs["w1"].data_ptr(),
                kwargs["hidden_states"].data_ptr(),
                kwargs["output"].data_ptr(),
            )
        )
        return original(**kwargs)

    experts.apply = apply
    return calls


def _meter(session: Any, model: MoeModel, target: MoeTarget) -> PointMeter:
    geometry = ExpertGeometry.for_target(model.global_experts, model.top_k, target)
    mapping = linear_expert_map(model.global_experts, target.ep, target.rank)
    settings = ProtocolSettings(rounds=2, iterations=1)
    return PointMeter(session, settings, geometry, mapping, banks=2, device="cpu")


@pytest.mark.parametrize("target", [DP1, DP2_RANK1], ids=["dp1", "dp2-rank1"])
def test_every_forward_gets_the_views_vllm_would_return_once_per_context(
    model: MoeModel, target: MoeTarget
) -> None:
    session = _session(model, target, ManagedImpl)
    try:
        assert session.workspace_views["held_per_context"] is True
        meter = _meter(session, model, target)
        # Small, large, small again: the second point grows vLLM's buffer (the views of the
        # first are then stale), the third must get views into the grown buffer.
        points = [PlanPoint("experts", 2, 2, 4), PlanPoint("experts", 8, 2, 16),
                  PlanPoint("experts", 2, 2, 4)]  # fmt: skip
        requests = [PointRequest(p, 0, tuple(context_order(p, 2)), True) for p in points]
        impl = session.kernel.impl
        impl.buffer, impl.replaced = None, 0  # as if the build's 32-row probes never ran
        before = impl.calls
        calls = _recorded_applies(session)
        done, _ = meter.measure_batch(requests)
        # Each point: 4 weight sets checked (bank + reference forward each) and 4 contexts
        # of 4 warmup and 4 timed forwards.
        assert [m.checked for m in done] == [4, 4, 4]
        assert len(calls) == 3 * (2 * 4 + 4 * 8)
        for got13, got2, want13, want2, *_ in calls:
            assert (got13, got2) == (want13, want2)  # pointer, shape, strides, dtype
        assert impl.replaced == 2  # the large point really replaced the buffer
        # vLLM's workspace call: once per context (the reference check shares the first).
        assert impl.calls - before == 3 * 4
        assert session.workspace_reuse == [12, len(calls) - 12]
    finally:
        session.close()


def test_holding_changes_no_forward_and_no_argument(model: MoeModel) -> None:
    # The same point measured with and without the hold: identical apply arguments (views,
    # weights, inputs, outputs) in identical order, and identical outputs.
    session = _session(model, DP2_RANK1, ManagedImpl)
    try:
        meter = _meter(session, model, DP2_RANK1)
        point = PlanPoint("experts", 4, 2, 6)
        held = _recorded_applies(session)
        meter.measure(point, context_order(point, 2), verify=True)
        slots = meter._expert_slots(point)
        held_out = [session.run_experts(p, b).clone() for b, p in slots]
        session.experts.apply = type(session.experts).apply.__get__(session.experts)
        session.workspace_views["held_per_context"] = False
        plain = _recorded_applies(session)
        meter.measure(point, context_order(point, 2), verify=True)
        plain_out = [session.run_experts(p, b).clone() for b, p in slots]
        # The inputs and outputs of each measure() are the point's own fresh buffers, so
        # compare what does not depend on them: the views and weights, forward by forward.
        assert [c[:5] for c in held] == [c[:5] for c in plain]
        assert all(torch.equal(a, b) for a, b in zip(held_out, plain_out, strict=True))
    finally:
        session.close()


def test_a_workspace_call_that_launches_work_is_never_skipped(model: MoeModel) -> None:
    session = _session(model, DP1, LaunchingImpl)
    try:
        assert session.workspace_views["held_per_context"] is False
        assert "launches 2 device activities (workspace_fill)" in session.workspace_views["reason"]
        meter = _meter(session, model, DP1)
        point = PlanPoint("experts", 2, 2, 4)
        before = session.kernel.impl.calls
        calls = _recorded_applies(session)
        meter.measure(point, context_order(point, 2), verify=True)
        assert session.kernel.impl.calls - before == len(calls) == 2 * 4 + 4 * 8
        assert session.workspace_reuse == [0, 0]
    finally:
        session.close()


def test_forwards_outside_a_context_ask_vllm_every_time(model: MoeModel) -> None:
    session = _session(model, DP1, ManagedImpl)
    try:
        meter = _meter(session, model, DP1)
        slots = meter._expert_slots(PlanPoint("experts", 2, 2, 4))
        before = session.kernel.impl.calls
        for bank, prepared in slots:
            session.run_experts(prepared, bank)
        assert session.kernel.impl.calls - before == len(slots)
        with session.hold_workspace():
            for bank, prepared in slots:
                session.run_experts(prepared, bank)
            with session.hold_workspace():  # nested: the outer hold stays in charge
                session.run_experts(*reversed(slots[0]))
        assert session.kernel.impl.calls - before == len(slots) + 1
    finally:
        session.close()
