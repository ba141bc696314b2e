"""Measuring MoE component timings on a GPU (or CPU) into moetables bundles.

Importing this package, the catalog, the deployment checks and the plan never imports torch:
a registry worker validates jobs and follows runs without it. torch is imported by the
protocol's profiler capture and by the adapters only.
"""

from __future__ import annotations

__version__ = "0.1.0"
