"""``python -m acquisition.adapters.vllm_cli profile|slice ...``: the acquisition CLI with the
vLLM adapters registered and the live adapter's engine limits supplied.

Same arguments as ``python -m acquisition``, plus the component engine's options that the
acquisition CLI does not have (they only matter to ``vllm-live``):

- ``--engine-attention-backend NAME`` (default: vLLM's choice; the trimmed H200 kit needs
  ``TRITON_ATTN``);
- ``--engine-kv-cache-bytes N`` (default 1 GiB, R31).

``register`` makes sure the selection list of the process carries the vLLM adapters first
(modular, then live); ``acquisition.adapters`` lists them itself now, so it adds nothing there.
The command's token and sequence limits reach the adapters on ``RuntimeInfo.limits``.
"""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING

from acquisition.adapters.base import EngineLimits
from acquisition.adapters.vllm_live import (
    DEFAULT_KV_CACHE_BYTES,
    VllmLiveBackend,
    configure_engine_limits,
)
from acquisition.adapters.vllm_modular import VllmModularBackend

if TYPE_CHECKING:
    from collections.abc import Sequence

__all__ = ["main", "register"]

_ENGINE_OPTIONS = ("--engine-attention-backend", "--engine-kv-cache-bytes")


def register() -> None:
    """Put the vLLM adapters at the head of the selection list of this process."""
    import acquisition.adapters as adapters

    names = {b.name for b in adapters.NATIVE_BACKENDS}
    added = tuple(b for b in (VllmModularBackend(), VllmLiveBackend()) if b.name not in names)
    adapters.NATIVE_BACKENDS = added + tuple(adapters.NATIVE_BACKENDS)
    adapters.BACKENDS = adapters.NATIVE_BACKENDS + tuple(adapters.REFERENCE_BACKENDS)


def _split_engine_options(argv: list[str]) -> tuple[list[str], dict[str, str]]:
    rest: list[str] = []
    options: dict[str, str] = {}
    i = 0
    while i < len(argv):
        arg = argv[i]
        name, eq, value = arg.partition("=")
        if name in _ENGINE_OPTIONS:
            if not eq:
                if i + 1 >= len(argv):
                    raise SystemExit(f"{name} needs a value")
                value = argv[i + 1]
                i += 1
            options[name] = value
        else:
            rest.append(arg)
        i += 1
    return rest, options


def main(argv: Sequence[str] | None = None) -> int:
    from acquisition import cli

    raw = list(sys.argv[1:] if argv is None else argv)
    rest, options = _split_engine_options(raw)
    register()
    args, _ = cli.build_parser().parse_known_args(rest)
    configure_engine_limits(
        EngineLimits(
            max_num_batched_tokens=args.max_num_batched_tokens,
            max_num_seqs=args.max_num_seqs,
            kv_cache_memory_bytes=int(
                options.get("--engine-kv-cache-bytes", DEFAULT_KV_CACHE_BYTES)
            ),
            attention_backend=options.get("--engine-attention-backend"),
        )
    )
    # Refusals found while building (CapabilityError is an AdapterRefusal) exit 3 in cli.main.
    return cli.main(rest, whole_process=argv is None)


if __name__ == "__main__":
    raise SystemExit(main())
