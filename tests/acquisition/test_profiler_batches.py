"""Several points in one profiler session, checked per set in one read-back (issue 19).

The protocol is unchanged (R15-R19): every timed forward has its own range, attribution is
per forward, each context's forwards own equal activity counts, every weight set is compared
exactly with its reference before any timing, and resume is exact (R9, R36).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from tiny_moe import write_model

from acquisition.cli import main
from acquisition.plan import PlanPoint
from acquisition.protocol.attribution import AttributionError
from acquisition.protocol.measure import (
    PointError,
    PointMeter,
    PointRequest,
    ProtocolSettings,
    ReferenceMismatch,
    context_order,
)
from acquisition.protocol.profiling import ProfilerCapture
from moetables.geometry import ExpertGeometry, MoeTarget

torch = pytest.importorskip("torch")

COMMON = [
    "--hardware", "CPU", "--tp", "1", "--tp-refresh", "1", "--max-num-seqs", "2",
    "--max-num-batched-tokens", "2", "--moe-rounds", "2", "--measurement-iterations", "1",
    "--warmup-cycles", "0", "--backend", "torch-reference", "--device", "cpu",
    "--cache-bytes", "1", "--quality-tolerance", "0.9", "--cudagraph-mode", "NONE",
    "--no-progress-bar", "--dp", "2", "--ep", "2",
]  # fmt: skip


def samples(out: Path, deployment: str) -> list[dict[str, Any]]:
    path = out / "_acquisition/CPU/test/tiny-moe/fp32/tp1/moe_components" / deployment
    return [json.loads(line) for line in (path / "samples.jsonl").read_text().splitlines()]


def shape(records: list[dict[str, Any]]) -> dict[str, list[tuple[Any, ...]]]:
    """What a run recorded per point, in order, without timings: contexts, forwards, checks.

    A batch writes its points' verdicts after all their contexts, so the file interleaves
    points differently; each point's own records keep their order (what a resume replays).
    Retried attempts are left out: a B/2B retry follows this machine's timing noise, which two
    runs do not share (the retry path has its own tests).
    """
    keep: dict[str, list[tuple[Any, ...]]] = {}
    for r in records:
        if r["type"] == "context" and r["attempt"] > 0:
            continue
        if r["type"] == "context":
            item = ("context", r["attempt"], r["arm"], r["round"], r["forwards"])
        elif r["type"] in ("reference_check", "point"):
            item = (r["type"], r.get("slots"), r.get("status"))
        else:
            continue
        keep.setdefault(r["point"], []).append(item)
    return keep


def test_batched_sessions_record_what_one_session_per_point_records(tmp_path: Path) -> None:
    """R9, R15, R19: the same points, contexts, forward counts and reference checks."""
    model = write_model(tmp_path / "tiny-moe")
    runs = {}
    for batch in ("1", "8"):
        out = tmp_path / f"out-{batch}"
        progress = tmp_path / f"progress-{batch}.jsonl"
        args = ["slice", str(model), *COMMON, "--out-root", str(out)]
        assert main([*args, "--profile-batch", batch, "--progress-json", str(progress)]) == 0
        runs[batch] = samples(out, "dp2_ep2_rank0_sp0")
        events = [json.loads(line) for line in progress.read_text().splitlines()]
        measure = [e for e in events if e["phase"] == "measure" and e["eta_s"] is not None]
        assert measure and events[-1]["points_done"] == events[-1]["points_total"]
        # Progress counts points one by one, never past the total.
        done = [e["points_done"] for e in events]
        assert done == sorted(done) and max(done) == events[-1]["points_total"]
    assert shape(runs["1"]) == shape(runs["8"])
    forwards = [r for r in runs["8"] if r["type"] == "forward"]
    assert forwards and all(r["time_us"] > 0 for r in forwards)


class _Local:
    def __init__(self, rows: int, idle: bool) -> None:
        self.x = torch.randn(rows, 8)
        self.idle = idle

    def run(self) -> Any:
        return self.x if self.idle else torch.mm(self.x, self.x.T)

    def reference(self) -> Any:
        return self.run()


class _Session:
    """Local components on CPU; the one at ``idle_rows`` runs no operator at all."""

    def __init__(self, idle_rows: int = -1, wrong_set: int = -1) -> None:
        self.idle_rows = idle_rows
        self.wrong_set = wrong_set
        self.calls = 0

    def local_forward(self, component: str, rows: int) -> _Local:
        return _Local(rows, rows == self.idle_rows)

    def prepare_experts(self, stimulus: Any) -> Any:
        return {"n": stimulus.tokens, "out": torch.ones(stimulus.tokens, 4)}

    def run_experts(self, prepared: Any, bank: int) -> Any:
        return prepared["out"] * 2

    def reference_experts(self, prepared: Any) -> Any:
        self.calls += 1
        wrong = self.calls - 1 == self.wrong_set
        return prepared["out"] * (3 if wrong else 2)

    def synchronize(self) -> None:
        pass


def meter(session: _Session) -> PointMeter:
    target = MoeTarget.for_rank(1, 1, 0)
    geometry = ExpertGeometry.for_target(4, 2, target)
    settings = ProtocolSettings(rounds=2, iterations=2, warmup_cycles=0, local_warmup=1)
    return PointMeter(session, settings, geometry, [0, 1, 2, 3], device="cpu", banks=2)


def requests(*rows: int) -> list[PointRequest]:
    points = [PlanPoint("gate_routing", n, -1, -1) for n in rows]
    return [PointRequest(p, 0, tuple(context_order(p, 2)), verify=True) for p in points]


def test_a_batch_attributes_each_forward_to_its_own_point() -> None:
    done, attribution = meter(_Session()).measure_batch(requests(1, 2, 4))
    assert [m.request.point.tokens for m in done] == [1, 2, 4]
    for m in done:
        assert m.checked == 1 and len(m.results) == 2
        assert all(len(c.forwards_us) == 2 and min(c.forwards_us) > 0 for c in m.results)
    assert len(attribution.per_range_ns) == 3 * 2 * 2  # points x contexts x timed forwards
    assert attribution.attributed_ns + attribution.unattributed_ns == attribution.total_ns


def test_a_failing_point_of_a_batch_is_named_not_its_neighbours() -> None:
    """R15: a range that owns nothing fails attribution, and the failure names its point."""
    with pytest.raises(PointError) as caught:
        meter(_Session(idle_rows=2)).measure_batch(requests(1, 2, 4))
    assert caught.value.request.point.tokens == 2
    assert isinstance(caught.value.cause, AttributionError)
    assert "own no activity" in str(caught.value.cause)


def test_a_time_limit_closes_the_batch_after_a_prefix_of_points() -> None:
    done, _ = meter(_Session()).measure_batch(requests(1, 2, 4), max_seconds=1e-9)
    assert [m.request.point.tokens for m in done] == [1]


def test_every_weight_set_is_still_compared_and_a_wrong_one_is_named() -> None:
    """R19: the read-back is once per point, the verdict still per weight set."""
    point = PlanPoint("experts", 2, 2, 4)
    session = _Session(wrong_set=3)
    with pytest.raises(ReferenceMismatch, match="weight set 3"):
        meter(session).verify(point)
    good = _Session()
    assert meter(good).verify(point) == 4 and good.calls == 4  # 2B sets, each compared


def test_ranges_only_sessions_keep_ranges_and_drop_operators() -> None:
    """The CUDA default records no operators (attribution never reads them there)."""
    x = torch.randn(16, 16)
    windows = {}
    for ranges_only in (False, True):
        capture = ProfilerCapture("cpu", ranges_only=ranges_only)
        with capture:
            for i in range(2):
                with capture.region(f"g.f{i}"):
                    torch.mm(x, x)
        windows[ranges_only] = capture.window()
    assert [r.name for r in windows[True].ranges] == ["g.f0", "g.f1"]
    assert windows[False].operators and not windows[True].operators
    import torch.autograd.profiler as autograd_profiler

    # The private start hook is restored after the session started.
    assert autograd_profiler._enable_profiler is torch._C._autograd._enable_profiler
