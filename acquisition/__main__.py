"""``python -m acquisition``."""

from __future__ import annotations

import sys

if sys.argv[1:2] == ["routing"]:
    from acquisition.routing_capture.cli import main as capture_routing

    sys.exit(capture_routing())

from acquisition.cli import main

sys.exit(main())
