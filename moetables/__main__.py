"""python -m moetables validate|info|lookup|estimate|export: the core's command line."""

from __future__ import annotations

import os
import sys

from moetables.cli import main

try:
    code = main()
    sys.stdout.flush()
except BrokenPipeError:
    # The reader went away (`... | head`): stop quietly, as a Unix filter does, not with a
    # traceback; stdout goes to devnull so that the interpreter's own final flush cannot fail.
    os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    code = 1
sys.exit(code)
