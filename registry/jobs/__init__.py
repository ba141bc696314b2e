"""Acquisition jobs: a job row, the services that queue and cancel it, and the runner a worker
calls. Names are loaded lazily so that ``registry.models`` can import the model while the app
registry is still loading.
"""

from __future__ import annotations

from importlib import import_module
from typing import Any

__all__ = [
    "AcquisitionJob",
    "BrokerUnavailable",
    "JobParameterError",
    "JobState",
    "JobStateError",
    "cancel_job",
    "job_parameter_fields",
    "queue_job",
    "retry_job",
]

_WHERE = {
    "AcquisitionJob": "registry.jobs.models",
    "JobState": "registry.jobs.choices",
    "BrokerUnavailable": "registry.jobs.services",
    "JobStateError": "registry.jobs.services",
    "cancel_job": "registry.jobs.services",
    "queue_job": "registry.jobs.services",
    "retry_job": "registry.jobs.services",
    "JobParameterError": "registry.jobs.parameters",
    "job_parameter_fields": "registry.jobs.parameters",
}


def __getattr__(name: str) -> Any:
    if name in _WHERE:
        return getattr(import_module(_WHERE[name]), name)
    raise AttributeError(f"module 'registry.jobs' has no attribute {name!r}")
