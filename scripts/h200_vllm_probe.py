"""Device probe for the vLLM adapters: which live APIs this vLLM has (writes probe.json).

Run on the GPU machine after staging the kit: ``python3 scripts/h200_vllm_probe.py OUT_DIR``.
Nothing here decides admission; the adapters probe the same things themselves.
"""

from __future__ import annotations

import json
import sys
import traceback
from pathlib import Path

from acquisition.adapters.vllm_capabilities import (
    LIVE_SYMBOLS,
    MODULAR_SYMBOLS,
    import_resolver,
    probe_surface,
    read_deferred_finalize,
)


def main() -> None:
    out = Path(sys.argv[1] if len(sys.argv) > 1 else ".")
    out.mkdir(parents=True, exist_ok=True)
    report: dict[str, object] = {}
    try:
        import torch
        import vllm

        props = torch.cuda.get_device_properties(0)
        report["versions"] = {
            "vllm": vllm.__version__,
            "torch": torch.__version__,
            "cuda": torch.version.cuda,
        }
        report["gpu"] = {
            "name": props.name,
            "capability": [props.major, props.minor],
            "l2_bytes": getattr(props, "L2_cache_size", None),
            "memory": props.total_memory,
        }
        surfaces = {}
        for label, symbols in (("modular", MODULAR_SYMBOLS), ("live", LIVE_SYMBOLS)):
            surface = probe_surface(symbols)
            surfaces[label] = {"missing": list(surface.missing)}
            readings = {}
            for role, obj in surface.symbols.items():
                if isinstance(obj, type):
                    readings[role] = read_deferred_finalize(obj).as_dict()
            surfaces[label]["deferral_on_classes"] = readings
        report["surfaces"] = surfaces
        from vllm.config import VllmConfig

        config = VllmConfig()
        report["default_all2all_backend"] = config.parallel_config.all2all_backend
        import_resolver("vllm.model_executor.layers.fused_moe.modular_kernel:FusedMoEKernel")
    except Exception:
        report["error"] = traceback.format_exc()
    (out / "probe.json").write_text(json.dumps(report, indent=1, default=str))
    print(json.dumps(report, indent=1, default=str)[:4000])


if __name__ == "__main__":
    main()
