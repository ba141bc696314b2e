"""Conservation evidence of the vllm-modular path on CPU (R15, R22, R26): traced forwards of
the whole path, each activity owned by one component scope or shown outside the scopes.

``vllm_fakes.trace`` stands in for the CUDA profiler: every fake launch inside a traced call
becomes a host launch and a device activity of a known duration (``DURATIONS_NS``).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import vllm_fakes as fv
from tiny_moe import write_model

from acquisition.adapters.base import EngineLimits
from acquisition.adapters.vllm_modular_backend import VllmModularBackend
from acquisition.adapters.vllm_modular_forward import trace_tokens
from acquisition.catalog import MoeModel, resolve_model
from acquisition.evidence import conservation_evidence
from moetables.bundle.quality import format_conservation
from moetables.geometry import MoeTarget

DP1 = MoeTarget(tp=1, dp=1, ep=1, rank=0, sequence_parallel=False)
DP2_RANK1 = MoeTarget(tp=1, dp=2, ep=2, rank=1, sequence_parallel=False)
LIMITS = EngineLimits(max_num_batched_tokens=300, max_num_seqs=8)
GATE_NS = fv.DURATIONS_NS["gemm"] + fv.DURATIONS_NS["topk_softmax"]


@pytest.fixture
def model(tmp_path: Path) -> MoeModel:
    return resolve_model(str(write_model(tmp_path / "tiny", num_experts=8)))


def build(model: MoeModel, target: MoeTarget, **overrides: Any) -> Any:
    backend = VllmModularBackend(
        resolve=fv.resolver(fv.modular_namespace(**overrides)),
        activities=fv.activities,
        trace=fv.trace,
    )
    return backend.build(model, target, fv.fake_runtime(limits=LIMITS), "float32")


def test_it_traces_one_row_a_decode_step_and_the_budget() -> None:
    assert trace_tokens(2048) == (1, 256, 2048)
    assert trace_tokens(64) == (1, 64)
    assert trace_tokens(1) == (1,)


@pytest.mark.parametrize("target", [DP1, MoeTarget.for_rank(2, 1, 1)], ids=["tp1", "tp2_rank1"])
def test_a_dp1_rank_traces_vllms_own_kernel_apply(model: MoeModel, target: MoeTarget) -> None:
    """DP1 (also TP2/DP1/EP2, whose prepare/finalize is DP1's): gate + router, then
    FusedMoEKernel.apply with prepare, experts.apply and finalize scoped as the experts
    boundary (R22); the sums conserve the forward's whole activity."""
    session = build(model, target)
    try:
        traced = session.describe()["launch_ownership"]
    finally:
        session.close()
    assert [f["tokens"] for f in traced] == [1, 256, 300]
    for f in traced:
        assert f["forward"] == "native FusedMoEKernel.apply"
        assert f["expert_rows"] == f["tokens"]
        assert f["gate_routing_us"] == GATE_NS / 1000
        # the experts kernel and the no-op reduction's copy inside vLLM's finalize
        assert f["experts_us"] == (fv.DURATIONS_NS["fused_moe_kernel"] + 70) / 1000
        assert f["activities"]["finalize"] == {"copy": 1}
        assert f["outside_scopes_us"] == 0.0 and "finalize_copy_us" not in f
        assert f["native_forward_total_us"] == f["gate_routing_us"] + f["experts_us"]


class _FillingKernel(fv.FusedMoEKernel):
    """A kernel whose apply launches work of its own outside prepare, experts and finalize."""

    def apply(self, *args: Any, **kwargs: Any) -> Any:
        fv.launch("fill")
        return super().apply(*args, **kwargs)


def test_work_outside_the_component_scopes_is_shown_not_hidden(model: MoeModel) -> None:
    kernel = "vllm.model_executor.layers.fused_moe.modular_kernel:FusedMoEKernel"
    session = build(model, DP1, **{kernel: _FillingKernel})
    try:
        traced = session.describe()["launch_ownership"]
    finally:
        session.close()
    for f in traced:
        assert f["outside_scopes_us"] == 0.01 and f["activities"]["outside"] == {"fill": 1}
        attributed = f["gate_routing_us"] + f["experts_us"]
        assert f["native_forward_total_us"] == pytest.approx(attributed + 0.01)


def test_a_dp_ep_rank_composes_its_components_without_the_collectives(model: MoeModel) -> None:
    """DP+EP (R23): gate/routing on local rows, experts on the gathered rows, the finalize
    copy; the all-gather and reduce-scatter never run on one GPU."""
    session = build(model, DP2_RANK1)
    try:
        traced = session.describe()["launch_ownership"]
        # the patched instance methods are gone after the traces
        assert "apply" not in vars(session.experts)
    finally:
        session.close()
    assert [(f["tokens"], f["expert_rows"]) for f in traced] == [(1, 2), (256, 512), (300, 600)]
    for f in traced:
        assert f["forward"] == "composed (collectives excluded)"
        assert f["gate_routing_us"] == GATE_NS / 1000
        assert f["experts_us"] == fv.DURATIONS_NS["fused_moe_kernel"] / 1000
        assert "finalize_copy_us" in f and f["outside_scopes_us"] == 0.0


def test_the_traces_become_the_bundles_conservation_rows(model: MoeModel) -> None:
    """The contract's traces are what conservation.csv publishes, and they validate."""
    session = build(model, DP2_RANK1)
    try:
        rows, absent = conservation_evidence(session.describe())
    finally:
        session.close()
    assert absent is None and [r.tokens for r in rows] == [1, 256, 300]
    for r in rows:
        assert set(r.components_us) == {"gate_routing", "experts", "finalize_copy"}
        assert r.attributed_us + r.outside_scopes_us == pytest.approx(r.native_total_us)
    text = format_conservation(rows).decode()
    assert text.splitlines()[0].startswith("forward,tokens,native_total_us,outside_scopes_us")
    assert len(text.splitlines()) == 4


def test_a_cpu_session_without_a_tracer_says_its_evidence_is_absent(model: MoeModel) -> None:
    backend = VllmModularBackend(
        resolve=fv.resolver(fv.modular_namespace()), activities=fv.activities
    )
    session = backend.build(model, DP1, fv.fake_runtime(limits=LIMITS), "float32")
    try:
        rows, absent = conservation_evidence(session.describe())
    finally:
        session.close()
    assert rows == [] and absent is not None and "vllm-modular" in absent


# -- the torch reference ---------------------------------------------------------------------


def _reference(model: MoeModel, target: MoeTarget) -> Any:
    """A CPU reference session whose component calls launch fake kernels (the CPU has no
    launch correlation); traced afterwards with the fake tracer."""
    from acquisition.adapters.torch_reference import TorchReferenceBackend

    session = TorchReferenceBackend().build(model, target, fv.fake_runtime(), "float32")
    assert session.ownership == []  # CPU without a tracer: no traced forward
    for name, kernel in (("gate_routing", "gemm"), ("experts", "fused_moe_kernel")):
        original = getattr(session, name)

        def call(*args: Any, _f: Any = original, _k: str = kernel) -> Any:
            fv.launch(_k)
            return _f(*args)

        setattr(session, name, call)
    return session


def test_the_reference_traces_its_layer_forward(model: MoeModel) -> None:
    session = _reference(model, DP1)
    f = session.traced_forward(8, fv.trace)
    assert (f["tokens"], f["expert_rows"], f["forward"]) == (8, 8, "reference layer")
    assert f["gate_routing_us"] == 0.3 and f["experts_us"] == 2.0
    assert f["native_forward_total_us"] == 2.3 and f["outside_scopes_us"] == 0.0
    assert "finalize_copy_us" not in f


def test_a_dp_ep_reference_rank_routes_its_gathered_rows_outside_the_window(
    model: MoeModel,
) -> None:
    session = _reference(model, DP2_RANK1)
    f = session.traced_forward(8, fv.trace)
    assert (f["tokens"], f["expert_rows"]) == (8, 16)
    # one gate launch in the window: the gathered rows' routing ran before it
    assert f["activities"]["gate_routing"] == {"gemm": 1}
    assert f["finalize_copy_us"] == 0.0 and f["gate_routing_us"] == 0.3
    session.ownership = [f]
    rows, absent = conservation_evidence(session.describe())
    assert absent is None and set(rows[0].components_us) == {
        "gate_routing",
        "experts",
        "finalize_copy",
    }


def test_an_acquisition_publishes_the_traces_as_conservation_csv(
    model: MoeModel, tmp_path: Path
) -> None:
    """End to end on CPU (fake vLLM, fake tracer): the published bundle's conservation.csv
    holds the build's traced forwards per target, checksummed and validated by the reader."""
    import dataclasses

    from acquisition.acquire import acquire_target
    from acquisition.adapters import AdmissionReport
    from acquisition.adapters.base import Admission
    from acquisition.cli import build_parser
    from acquisition.options import from_namespace, prepare
    from acquisition.progress import ProgressReporter
    from moetables.bundle import validate_bundle

    args = [
        "slice",
        str(tmp_path / "tiny"),
        "--hardware",
        "CPU-TEST",
        "--tp-refresh",
        "1",
        "--dp",
        "1,2",
        "--max-num-seqs",
        "2",
        "--max-num-batched-tokens",
        "4",
        "--moe-rounds",
        "1",
        "--measurement-iterations",
        "1",
        "--warmup-cycles",
        "0",
        "--backend",
        "vllm-modular",
        "--device",
        "cpu",
        "--cache-bytes",
        "1",
        "--quality-tolerance",
        "0.9",
        "--cudagraph-mode",
        "NONE",
        "--no-progress-bar",
        "--out-root",
        str(tmp_path / "out"),
    ]
    request, plans = prepare(from_namespace(build_parser().parse_args(args)), "")
    backend = VllmModularBackend(
        resolve=fv.resolver(fv.modular_namespace()), activities=fv.activities, trace=fv.trace
    )
    # The serving limits travel with the runtime, as the CLI sets them.
    runtime = fv.fake_runtime(limits=EngineLimits(max_num_batched_tokens=4, max_num_seqs=2))
    progress = ProgressReporter(None, bar=False, total=0)
    try:
        for plan in plans:
            report = AdmissionReport(plan.target, "vllm-modular", (Admission.accept(backend.name),))
            few = [next(p for p in plan.points if p.component == c) for c in plan.components]
            small = dataclasses.replace(plan, points=tuple(few))
            assert acquire_target(request, small, backend, runtime, report, progress).published
    finally:
        progress.close()
    validated = validate_bundle(request.bundle_dir)
    assert validated.ok, validated.problems
    assert len(validated.quality) == 3  # DP1, DP2 ranks 0 and 1
    for path, evidence in validated.quality.items():
        assert evidence.conservation is not None, path
        assert [r.tokens for r in evidence.conservation] == [1, 4]
        expected = {"gate_routing", "experts"} | ({"finalize_copy"} if "dp2" in path else set())
        assert all(set(r.components_us) == expected for r in evidence.conservation)
    assert len(list(request.bundle_dir.rglob("conservation.csv"))) == 3
