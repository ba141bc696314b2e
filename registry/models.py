"""The registry app's models, gathered here so that Django finds them: each feature keeps its
own in its package or module (bundles: registry/bundles/models.py; jobs: registry/jobs/models.py).
"""

from __future__ import annotations

from registry.bundles.models import Bundle, DeploymentTable

__all__ = ["Bundle", "DeploymentTable"]

# Acquisition jobs live in their own module (registry/jobs/) and are part of this app.
# Who changed what, and who may publish under a name (issue 17): their own modules.
from registry.audit import StateChange
from registry.jobs.models import AcquisitionJob
from registry.namespaces import Namespace, NamespaceGrant

__all__ += ["AcquisitionJob", "Namespace", "NamespaceGrant", "StateChange"]

# Coverage requests and worker presence (registry/coverage_models.py).
from registry.coverage_models import CoverageRequest, WorkerPresence  # noqa: E402

__all__ += ["CoverageRequest", "WorkerPresence"]

# Routing profiles (registry/profile_models.py).
from registry.profile_models import RoutingProfileRecord  # noqa: E402

__all__ += ["RoutingProfileRecord"]
