"""The measuring loop runs with the heap that existed before it frozen (issue 19).

Host-side only: the cyclic collector skips the old objects while points are measured, and the
heap is unfrozen before the target's memory is released (the later targets of one process
must start from the same device state, see ``release_target_memory``).
"""

from __future__ import annotations

import gc
import json
from pathlib import Path
from typing import Any

import pytest
from tiny_moe import write_model

from acquisition.acquire import frozen_heap
from acquisition.cli import main
from acquisition.protocol.measure import PointMeter
from tests.acquisition.test_acquisition_phases import COMMON  # the same CPU run

pytest.importorskip("torch")


def test_it_freezes_inside_and_unfreezes_after_even_on_errors() -> None:
    assert gc.get_freeze_count() == 0
    with frozen_heap() as stats:
        assert gc.get_freeze_count() > 0 and stats.frozen > 0
        kept = [[i] for i in range(1000)]  # new objects the loop keeps
        gc.collect(1)
    assert gc.get_freeze_count() == 0
    assert stats.collections[1] >= 1 and stats.seconds > 0  # what the phase log notes
    assert stats.grown >= len(kept)
    assert stats.callback not in gc.callbacks
    with pytest.raises(RuntimeError), frozen_heap():
        raise RuntimeError("a failed batch")
    assert gc.get_freeze_count() == 0


def test_a_process_that_froze_its_own_objects_is_left_alone() -> None:
    gc.freeze()
    try:
        # Not an equality with the count before: a frozen object whose last reference goes
        # (here or on another thread) leaves the permanent generation, one fewer.
        with frozen_heap() as stats:
            pass
        assert gc.get_freeze_count() > 0  # not unfrozen behind the host's back
        assert stats.frozen == 0  # and nothing frozen on top of the host's own
    finally:
        gc.unfreeze()


def test_points_are_measured_frozen_and_the_target_released_unfrozen(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    seen: list[int] = []
    released: list[int] = []
    measure_batch = PointMeter.measure_batch

    def spy(self: PointMeter, *args: Any, **kwargs: Any) -> Any:
        seen.append(gc.get_freeze_count())
        return measure_batch(self, *args, **kwargs)

    def release(device: str) -> None:
        released.append(gc.get_freeze_count())

    monkeypatch.setattr(PointMeter, "measure_batch", spy)
    monkeypatch.setattr("acquisition.acquire.release_target_memory", release)
    model = write_model(tmp_path / "tiny-moe")
    log = tmp_path / "phases.jsonl"
    args = ["slice", str(model), *COMMON, "--out-root", str(tmp_path / "out")]
    assert main([*args, "--phase-log", str(log)]) == 0
    assert seen and all(count > 0 for count in seen)
    (record,) = [json.loads(line) for line in log.read_text().splitlines()]
    note = record["targets"]["tp1/dp1_ep1_rank0_sp0"]["notes"]["gc"]
    assert note["frozen_objects"] > 0 and len(note["collections"]) == 3
    assert gc.get_freeze_count() == 0
    assert released and all(count == 0 for count in released)
    capsys.readouterr()


def test_the_loop_cost_bench_times_the_loop_and_the_collector_on_cpu() -> None:
    from bench.acquisition_loop_cost import gc_costs, loop_costs

    loop = loop_costs(200)
    assert set(loop) == {f"{n}{p}_us" for n in ("warmup", "timed", "lean_timed")
                         for p in ("", "_profiled")}  # fmt: skip
    assert all(v > 0 for v in loop.values())
    heap = gc_costs(1000, batches=2, repeats=1)
    assert heap["tracked_objects"] >= 3000 and heap["as_is_s"] > 0 and heap["frozen_s"] > 0
    assert gc.get_freeze_count() == 0
