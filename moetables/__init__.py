"""moetables: measured MoE component timings, their bundle format and exact lookups.

Pure Python on numpy, scipy and pyyaml: no Django, no torch, no vLLM, so that a simulator can
import it anywhere.
"""

from __future__ import annotations

from moetables.bundle import Bundle, TableEntry, open_bundle, validate_bundle, write_bundle
from moetables.comm import Cluster, ClusterError, load_cluster
from moetables.errors import BundleError, CoverageError, QueryError
from moetables.estimate import BatchEstimate, LayerEstimate, pad_to_capture
from moetables.geometry import ExpertGeometry, MoeTarget, TokenDomain, linear_expert_map
from moetables.lookup import ComponentTables, DeploymentTables
from moetables.profiles import ProfileError, RoutingProfile, read_profile, write_profile

__all__ = [
    "BatchEstimate",
    "Bundle",
    "BundleError",
    "Cluster",
    "ClusterError",
    "ComponentTables",
    "CoverageError",
    "DeploymentTables",
    "ExpertGeometry",
    "LayerEstimate",
    "MoeTarget",
    "ProfileError",
    "QueryError",
    "RoutingProfile",
    "TableEntry",
    "TokenDomain",
    "linear_expert_map",
    "load_cluster",
    "open_bundle",
    "pad_to_capture",
    "read_profile",
    "validate_bundle",
    "write_bundle",
    "write_profile",
]
__version__ = "0.1.0"
