"""Quick device probe of the block-FP8 path (issue 20, item 4), about a minute on one H200.

Run on the GPU machine after staging the kit, from the repository root:
``python3 scripts/h200_fp8_probe.py OUT_DIR``. Every step is fail-soft: an error is recorded
with its traceback and the next step still runs, and ``fp8_probe.json`` is rewritten after each
step, so one device call gives what it can even when the adapter path breaks on real vLLM.

Steps: versions and GPU; which optional kernel packages import (flashinfer, deep_gemm); the
modular and FP8 API surfaces; vLLM's FP8 oracle for TP1/DP1 and TP1/DP2/EP2 ranks 0 and 1 (the
selected backend and why the others declined); one built DP1 session (contract fields, one
forward against the eager reference and against a bf16 dequantized product); one built DP2
rank 0 session (the dispatch quantization and one experts forward). Timings here are smoke
checks of one forward, not measurements.
"""

from __future__ import annotations

import importlib
import json
import sys
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

MODEL = "Qwen/Qwen3-30B-A3B-Instruct-2507-FP8"
# This copy of the project, ahead of any installed one (the device runs the working tree).
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def _step(report: dict[str, Any], out: Path, name: str, fn: Callable[[], Any]) -> Any:
    started = time.perf_counter()
    try:
        value = fn()
        report[name] = {"ok": True, "value": value}
    except BaseException as exc:  # fail soft: record and go on
        value = None
        report[name] = {
            "ok": False,
            "error": f"{type(exc).__name__}: {exc}",
            "traceback": traceback.format_exc(),
        }
    report[name]["seconds"] = round(time.perf_counter() - started, 3)
    (out / "fp8_probe.json").write_text(json.dumps(report, indent=1, default=str))
    status = "ok" if report[name]["ok"] else "FAILED " + report[name]["error"][:300]
    print(f"[fp8-probe] {name}: {status} ({report[name]['seconds']} s)", flush=True)
    return value


def _versions() -> dict[str, Any]:
    import torch
    import vllm

    props = torch.cuda.get_device_properties(0)
    return {
        "vllm": vllm.__version__,
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "python": sys.version.split()[0],
        "gpu": props.name,
        "capability": [props.major, props.minor],
    }


def _packages() -> dict[str, str]:
    found = {}
    for name in ("flashinfer", "deep_gemm", "vllm.third_party.deep_gemm"):
        try:
            importlib.import_module(name)
            found[name] = "imports"
        except BaseException as exc:
            found[name] = f"{type(exc).__name__}: {exc}"[:300]
    try:
        from vllm.utils.deep_gemm import is_deep_gemm_supported

        found["vllm.utils.deep_gemm.is_deep_gemm_supported()"] = str(is_deep_gemm_supported())
    except BaseException as exc:
        found["vllm.utils.deep_gemm.is_deep_gemm_supported()"] = f"{type(exc).__name__}: {exc}"
    return found


def _surfaces() -> dict[str, Any]:
    from acquisition.adapters.vllm_capabilities import MODULAR_SYMBOLS, probe_surface
    from acquisition.adapters.vllm_fp8 import FP8_SYMBOLS

    surface = probe_surface({**MODULAR_SYMBOLS, **FP8_SYMBOLS})
    return {"missing": list(surface.missing)}


def _targets() -> dict[str, Any]:
    from moetables.geometry import MoeTarget

    return {
        "dp1": MoeTarget(tp=1, dp=1, ep=1, rank=0, sequence_parallel=False),
        "dp2_rank0": MoeTarget(tp=1, dp=2, ep=2, rank=0, sequence_parallel=False),
        "dp2_rank1": MoeTarget(tp=1, dp=2, ep=2, rank=1, sequence_parallel=False),
    }


def _oracle() -> dict[str, Any]:
    import torch

    from acquisition.adapters.vllm_modular_backend import VllmModularBackend
    from acquisition.adapters.vllm_modular_native import resolve_native, vllm_context
    from acquisition.catalog import resolve_model
    from acquisition.runtime import probe_runtime

    model = resolve_model(MODEL)
    backend = VllmModularBackend()
    runtime = probe_runtime("cuda")
    found: dict[str, Any] = {}
    for label, target in _targets().items():
        admission = backend.admit(model, target, runtime)
        entry: dict[str, Any] = {"admitted": admission.admitted, "reasons": admission.reasons}
        surface = backend.surface(model)
        with vllm_context(surface) as config:
            choice = resolve_native(
                surface,
                model,
                target,
                device=torch.device("cuda"),
                dtype=torch.bfloat16,
                all2all_backend=config.parallel_config.all2all_backend,
            )
        entry["oracle"] = choice.fp8.as_dict() if choice.fp8 is not None else None
        entry["prepare_kind"] = choice.prepare_kind
        found[label] = entry
    return found


def _session(label: str) -> Any:
    from acquisition.adapters.vllm_modular_backend import VllmModularBackend
    from acquisition.catalog import resolve_model
    from acquisition.runtime import probe_runtime

    model = resolve_model(MODEL)
    return VllmModularBackend().build(model, _targets()[label], probe_runtime("cuda"), "bfloat16")


def _forward(session: Any, label: str, n: int, a: int, m: int) -> dict[str, Any]:
    import torch

    from acquisition.protocol.stimulus import routing_stimulus
    from moetables.geometry import ExpertGeometry, linear_expert_map

    target = _targets()[label]
    model = session.model
    geometry = ExpertGeometry.for_target(model.global_experts, model.top_k, target)
    mapping = linear_expert_map(model.global_experts, target.ep, target.rank)
    prepared = session.prepare_experts(routing_stimulus(geometry, mapping, n, a, m, seed=n))
    session.allocate_banks(2)
    reference = session.reference_experts(prepared).clone()
    out = session.run_experts(prepared, 1)
    torch.cuda.synchronize()
    start = torch.cuda.Event(enable_timing=True)  # type: ignore[no-untyped-call]
    end = torch.cuda.Event(enable_timing=True)  # type: ignore[no-untyped-call]
    start.record()
    session.run_experts(prepared, 0)
    end.record()
    torch.cuda.synchronize()
    result: dict[str, Any] = {
        "tokens": n,
        "bank_equals_reference": bool(torch.equal(out, reference)),
        "one_forward_ms_smoke": start.elapsed_time(end),
        "output_abs_mean": float(out.float().abs().mean()),
    }
    if label == "dp1":
        result["vs_bf16_dequantized"] = _dequantized_error(session, prepared, out)
    return result


def _dequantized_error(session: Any, prepared: Any, out: Any) -> dict[str, float]:
    """The FP8 kernel's output against a float32 product of the dequantized weights: a sanity
    check of the scale layout (a wrong layout gives errors of order 1, FP8 rounding ~1e-2)."""
    import torch

    block = session.choice.fp8.block_shape

    def dequantize(q: Any, scale: Any) -> Any:
        s = scale.repeat_interleave(block[0], dim=1).repeat_interleave(block[1], dim=2)
        return q.float() * s[:, : q.shape[1], : q.shape[2]]

    w13 = dequantize(session.w13, session.w13_scale)
    w2 = dequantize(session.w2, session.w2_scale)
    hidden = prepared.hidden.float()
    ids = prepared.topk_ids.long()
    weights = prepared.topk_weights.float()
    width = w2.shape[2]
    expected = torch.zeros_like(hidden)
    for slot in range(ids.shape[1]):
        for expert in torch.unique(ids[:, slot]).tolist():
            rows = (ids[:, slot] == expert).nonzero().squeeze(1)
            up = hidden[rows] @ w13[expert].t()
            act = torch.nn.functional.silu(up[:, :width]) * up[:, width:]
            expected.index_add_(0, rows, (act @ w2[expert].t()) * weights[rows, slot, None])
    error = (out.float() - expected).norm() / expected.norm().clamp(min=1e-12)
    return {"relative_l2_error": float(error)}


def _build_and_run(label: str, n: int, a: int, m: int) -> dict[str, Any]:
    session = _session(label)
    try:
        described = session.describe()
        result = {
            "components": list(session.components),
            "expert_class": described["expert_class"],
            "native_backend": described["native_backend"],
            "dtypes": described["dtypes"],
            "quantization": described["quantization"],
            "local_execution": described.get("local_execution"),
            "experts_activities_per_forward": described.get("experts_activities_per_forward"),
            "expert_weight_bytes": session.expert_weight_bytes(),
            "forward": _forward(session, label, n, a, m),
        }
        if "dispatch_quant" in session.components:
            quant = session.local_forward("dispatch_quant", 64)
            values, scale = quant.run()
            same = all(
                bool(x.equal(y)) for x, y in zip((values, scale), quant.reference(), strict=True)
            )
            result["dispatch_quant"] = {
                "values": [str(values.dtype), list(values.shape)],
                "scales": [str(scale.dtype), list(scale.shape)],
                "equals_reference": same,
            }
        return result
    finally:
        session.close()


def main() -> None:
    out = Path(sys.argv[1] if len(sys.argv) > 1 else ".")
    out.mkdir(parents=True, exist_ok=True)
    report: dict[str, Any] = {"model": MODEL}
    _step(report, out, "versions", _versions)
    _step(report, out, "packages", _packages)
    _step(report, out, "surfaces", _surfaces)
    _step(report, out, "oracle", _oracle)
    _step(report, out, "dp1_session", lambda: _build_and_run("dp1", 256, 64, 2048))
    _step(report, out, "dp2_rank0_session", lambda: _build_and_run("dp2_rank0", 256, 32, 1024))
    failed = [k for k, v in report.items() if isinstance(v, dict) and not v.get("ok", True)]
    print(f"[fp8-probe] done; failed steps: {failed or 'none'}", flush=True)


if __name__ == "__main__":
    main()
