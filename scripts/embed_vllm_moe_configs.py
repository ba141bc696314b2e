"""Write moetables/data/vllm-0.26.0-fused-moe-h200.json from vLLM's own tuned config files.

    python scripts/embed_vllm_moe_configs.py [--configs DIR]

DIR defaults to /work/vllm-src/vllm/model_executor/layers/fused_moe/configs (vLLM 0.26.0's
wheel, unpacked). Every ``*device_name=NVIDIA_H200*.json`` is copied with its keys in file order
(vLLM resolves ties between keys by that order) and without ``triton_version`` (vLLM drops it
before use). tests/moetables/test_triton_config.py checks the embedding against the source
where the source exists.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DEFAULT = Path("/work/vllm-src/vllm/model_executor/layers/fused_moe/configs")
FIELDS = ("BLOCK_SIZE_M", "BLOCK_SIZE_N", "BLOCK_SIZE_K", "GROUP_SIZE_M", "num_warps", "num_stages")


def embedded(configs: Path, device: str = "NVIDIA_H200") -> dict[str, object]:
    files: dict[str, dict[str, list[int]]] = {}
    for path in sorted(configs.glob(f"*device_name={device}*.json")):
        if (
            f"device_name={device}," not in path.name
            and f"device_name={device}.json" not in path.name
        ):
            continue
        raw = json.loads(path.read_text())
        raw.pop("triton_version", None)
        files[path.name] = {key: [int(c[f]) for f in FIELDS] for key, c in raw.items()}
    return {
        "vllm_version": "0.26.0",
        "source": "vllm/model_executor/layers/fused_moe/configs",
        "device": device,
        "fields": list(FIELDS),
        "files": files,
    }


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--configs", type=Path, default=DEFAULT)
    args = parser.parse_args()
    out = ROOT / "moetables/data/vllm-0.26.0-fused-moe-h200.json"
    data = embedded(args.configs)
    out.write_text(json.dumps(data, separators=(",", ":")) + "\n")
    print(f"{out}: {len(data['files'])} files")  # type: ignore[arg-type]


if __name__ == "__main__":
    main()
