"""python -m moetables validate|info|lookup: the core's command line."""

from __future__ import annotations

import sys

from moetables.cli import main

sys.exit(main())
