"""Shows what torch.profiler's kineto events carry on this machine (CUDA launch correlation).

Run: python bench/acquisition_profiler_probe.py. It prints every event of two small ranges so
that the attribution in acquisition.protocol.attribution can be checked against a real trace.
"""

from __future__ import annotations

import json
import sys

import torch
from torch.profiler import ProfilerActivity, profile, record_function


def main() -> None:
    device = "cuda" if torch.cuda.is_available() else "cpu"
    activities = [ProfilerActivity.CPU]
    if device == "cuda":
        activities.append(ProfilerActivity.CUDA)
        props = torch.cuda.get_device_properties(0)
        print("device", props.name, "L2", getattr(props, "L2_cache_size", None), torch.version.cuda)
    x = torch.randn(64, 64, device=device)
    w = torch.randn(64, 64, device=device)
    torch.nn.functional.linear(x, w)
    if device == "cuda":
        torch.cuda.synchronize()
    with profile(activities=activities) as prof:
        for i in range(2):
            with record_function(f"moe:gate_routing:{i}"):
                y = torch.nn.functional.linear(x, w)
                p = torch.softmax(y, -1)
                _, idx = torch.topk(p, 2)
                z = idx.to("cpu", non_blocking=False) if device == "cuda" else idx
                del z
        if device == "cuda":
            torch.cuda.synchronize()
    print("torch", torch.__version__)
    for e in prof.profiler.kineto_results.events():
        row = {
            "name": e.name(),
            "device_type": str(e.device_type()),
            "activity_type": e.activity_type() if hasattr(e, "activity_type") else None,
            "start_ns": e.start_ns(),
            "duration_ns": e.duration_ns(),
            "correlation_id": e.correlation_id(),
            "linked_correlation_id": e.linked_correlation_id(),
            "external_id": e.external_id() if hasattr(e, "external_id") else None,
            "thread": e.start_thread_id(),
            "is_user_annotation": e.is_user_annotation()
            if hasattr(e, "is_user_annotation")
            else None,
        }
        print(json.dumps(row))
    prof.export_chrome_trace("/tmp/probe_trace.json")
    with open("/tmp/probe_trace.json") as handle:
        trace = json.load(handle)
    cats = sorted({ev.get("cat", "") for ev in trace.get("traceEvents", [])})
    print("chrome categories", cats)
    for ev in trace.get("traceEvents", []):
        if ev.get("cat") in ("kernel", "cuda_runtime", "gpu_memcpy", "cuda_driver"):
            print(
                "chrome",
                json.dumps({k: ev.get(k) for k in ("name", "cat", "ts", "dur", "tid", "args")}),
            )
    sys.stdout.flush()


if __name__ == "__main__":
    main()
