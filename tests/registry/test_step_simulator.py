"""Issue 13.4: examples/step_simulator.py gives identical totals in process and through
RemoteTables against a live registry holding the shipped H200 bundles."""

from __future__ import annotations

import importlib.util
import math
import sys
from pathlib import Path
from typing import Any

import pytest

from moetables import ComponentTables
from moetables.client import RemoteTables
from registry.bundles.services import publish_bundle

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "step_simulator.py"


def _example() -> Any:
    spec = importlib.util.spec_from_file_location("step_simulator", EXAMPLE)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["step_simulator"] = module  # dataclasses look their module up
    spec.loader.exec_module(module)
    return module


@pytest.mark.django_db(transaction=True)
def test_the_example_totals_are_identical_in_process_and_remote(live_server: Any) -> None:
    example = _example()
    root = EXAMPLE.parents[1] / "bundles"
    for folder in ("H200-vllm-live", "H200-torch-reference", "H200"):  # modular not last
        publish_bundle(root / folder / "Qwen/Qwen3-30B-A3B-Instruct-2507/bf16")
    local = example.simulate(ComponentTables(example.BUNDLE), steps=200, seed=3)
    with RemoteTables(live_server.url, **example.NAME) as tables:
        remote = example.simulate(tables, steps=200, seed=3)
    assert remote == local
    assert local.refused == 0 and local.decode_us > 0 and not math.isnan(local.prefill_us)
    assert local.prefill_us > local.decode_us  # prefill steps carry 2-16x the tokens
    # The layer estimate of the same steps, equal over REST (Totals compares it too), answered.
    assert remote.estimate_us == local.estimate_us and math.isfinite(local.estimate_us)
    assert local.estimate_us > 0
