"""``python -m acquisition``."""

from __future__ import annotations

import sys

from acquisition.cli import main

sys.exit(main())
