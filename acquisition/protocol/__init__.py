"""The backend-neutral measurement protocol (design: protocol owner).

Rounds, warmup, weight banks and sets, the B/2B control, attribution of profiled activities,
conservation checks, exact output checks and medians; it never knows a vLLM class.
"""

from __future__ import annotations
