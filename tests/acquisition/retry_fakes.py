"""Injected B/2B failures and kills for the retry tests (test_retry_order.py).

``fail_controls`` wraps ``PointMeter.measure_batch``: for the chosen (point, attempt) pairs the
2B arm's attributed forward times come back four times longer, so that attempt's pooled-median
control fails at any tolerance below 3 (R18); every other attempt keeps its measured times.
``kill_after`` wraps ``SampleLog.extend``: once a written batch of records holds a matching
record, the process kills itself with SIGKILL, as ``kill -9`` would, after the write.
Both run in a child process too: ``python tests/acquisition/retry_fakes.py SPEC_JSON ARGS...``.
"""

from __future__ import annotations

import dataclasses
import json
import os
import signal
import sys
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from collections.abc import Callable, Mapping, Sequence

# Far past any tolerance the tests use even when one B forward runs slow on a loaded CI host
# (x4 was seen to read as a change of 0.8 there, so the control passed and no retry ran).
SLOWER_2B = 20.0


def fail_controls(
    failing: Mapping[str, Sequence[int]], setattr_: Callable[[Any, str, Any], None] = setattr
) -> None:
    from acquisition.protocol.measure import PointMeter

    original = PointMeter.measure_batch

    def measure_batch(self: Any, requests: Any, *, max_seconds: float | None = None) -> Any:
        done, attribution = original(self, requests, max_seconds=max_seconds)
        out = []
        for measurement in done:
            request = measurement.request
            if request.attempt in failing.get(request.point.key, ()):
                results = [
                    dataclasses.replace(r, forwards_us=tuple(t * SLOWER_2B for t in r.forwards_us))
                    if r.arm == "2B"
                    else r
                    for r in measurement.results
                ]
                measurement = dataclasses.replace(measurement, results=results)
            out.append(measurement)
        return out, attribution

    setattr_(PointMeter, "measure_batch", measure_batch)


def kill_after(
    match: Mapping[str, Any], setattr_: Callable[[Any, str, Any], None] = setattr
) -> None:
    from acquisition.protocol.samples import SampleLog

    original = SampleLog.extend

    def extend(self: Any, records: list[dict[str, Any]]) -> None:
        original(self, records)
        if any(all(r.get(k) == v for k, v in match.items()) for r in records):
            os.kill(os.getpid(), signal.SIGKILL)

    setattr_(SampleLog, "extend", extend)


if __name__ == "__main__":
    spec = json.loads(sys.argv[1])
    fail_controls({k: tuple(v) for k, v in spec["fail"].items()})
    if spec.get("kill"):
        kill_after(spec["kill"])
    from acquisition.cli import main

    sys.exit(main(sys.argv[2:]))
