"""The shipped cluster descriptions (``clusters/<name>.yaml``) as the clusters API lists them.

The files are the ones the estimate reads by name (`registry.services.estimate.named_cluster`),
read through the same loader and cache, so the list never names a cluster the estimate would
refuse without saying so: a file that does not validate is listed with its error.
"""

from __future__ import annotations

import hashlib
from typing import Any

from moetables.comm import Cluster, ClusterError
from moetables.errors import QueryError
from registry.services.estimate import cluster_dir, named_cluster

__all__ = ["ClusterFault", "cluster_detail", "cluster_names", "cluster_summaries"]


class ClusterFault(Exception):
    """A shipped cluster file that does not validate (the message names the file and field)."""


def cluster_names() -> list[str]:
    """The names the estimate accepts as ``cluster``, sorted."""
    folder = cluster_dir()
    return sorted(p.stem for p in folder.glob("*.yaml")) if folder.is_dir() else []


def _summary(name: str, cluster: Cluster) -> dict[str, Any]:
    version = (cluster.raw or {}).get("version")
    return {
        "name": name,
        "version": version,
        "description": cluster.description,
        "provenance": dict(cluster.provenance),
        "ranks": sorted(cluster.ranks()),
        "link_classes": sorted(cluster.link_classes),
        "groups": [{"link": g.link, "ranks": sorted(g.ranks)} for g in cluster.groups],
        "sha256": hashlib.sha256((cluster_dir() / f"{name}.yaml").read_bytes()).hexdigest(),
        "error": None,
    }


def cluster_summaries() -> list[dict[str, Any]]:
    """Every shipped cluster; one that does not validate carries ``error`` and no fields."""
    found = []
    for name in cluster_names():
        try:
            found.append(_summary(name, named_cluster(name)))
        except (QueryError, ClusterError, OSError) as exc:
            found.append(
                {
                    "name": name,
                    "version": None,
                    "description": "",
                    "provenance": {},
                    "ranks": [],
                    "link_classes": [],
                    "groups": [],
                    "sha256": None,
                    "error": str(exc),
                }
            )
    return found


def cluster_detail(name: str) -> dict[str, Any] | None:
    """One cluster: its summary and the whole validated description (``document``), or None
    when no shipped file has this name. Raises ClusterFault for a file that does not validate."""
    if name not in cluster_names():
        return None
    try:
        cluster = named_cluster(name)
        summary = _summary(name, cluster)
    except (QueryError, ClusterError, OSError) as exc:
        raise ClusterFault(str(exc)) from None
    return {**summary, "document": dict(cluster.raw or {})}
