"""``python -m acquisition.adapters.vllm_cli profile|slice ...``: the earlier entry point.

The vLLM adapters are in the selection list of ``acquisition.adapters`` and the component
engine's options (``--engine-attention-backend``, ``--engine-kv-cache-bytes``) are options of
``python -m acquisition`` itself, carried to the adapters on ``RuntimeInfo.limits``; this module
only keeps the command lines of ``docs/h200-runs.md`` working. Same arguments, same exit codes.
"""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from collections.abc import Sequence

__all__ = ["main"]


def main(argv: Sequence[str] | None = None) -> int:
    from acquisition import cli

    return cli.main(list(sys.argv[1:] if argv is None else argv), whole_process=argv is None)


if __name__ == "__main__":
    raise SystemExit(main())
