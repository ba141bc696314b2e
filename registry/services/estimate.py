"""Layer estimates over REST: `moetables.estimate_query` answers, with the lookup's cached
tables and bundle resolution, and cluster descriptions by name or inline.

A named cluster is a file ``clusters/<name>.yaml`` of this repository (the calibrated
descriptions we ship); an inline one is the same mapping in the request body. Either is
validated by `moetables.comm` and refused with its field named.
"""

from __future__ import annotations

import re
import threading
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml
from django.conf import settings

from moetables.comm import Cluster, ClusterError, parse_cluster
from moetables.errors import BundleError, CoverageError, QueryError
from moetables.estimate_query import (
    EstimateRequestError,
    answer_estimate,
    parse_estimate_request,
)
from moetables.lookup import LookupRequest, RequestError, parse_request
from registry.bundles.services.checkout import BlobDriftError
from registry.lookup.services import LookupFailure, NoCoverage, choose_bundle, tables_for
from registry.services.profiles import published_profile

__all__ = ["cluster_dir", "named_cluster", "run_estimate"]

_BUNDLE_FIELDS = frozenset(
    {
        "bundle",
        "sha256",
        "hardware",
        "model",
        "variant",
        "backend",
        "vllm_version",
        "include_exploratory",
        "cluster",
    }
)
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,99}$")
# A step's answer is about 5 KB of JSON with its events: 10,000 steps make a 50 MB response.
MAX_STEPS = 10_000
_clusters: dict[str, tuple[float, Cluster]] = {}
_lock = threading.Lock()


def cluster_dir() -> Path:
    return Path(settings.REGISTRY.get("CLUSTER_DIR") or Path(settings.BASE_DIR) / "clusters")


def named_cluster(name: str) -> Cluster:
    """``clusters/<name>.yaml``, loaded once per file version."""
    if not _NAME.match(name):
        raise QueryError(f"cluster: {name!r} is not a cluster name")
    path = cluster_dir() / f"{name}.yaml"
    if not path.is_file():
        known = sorted(p.stem for p in cluster_dir().glob("*.yaml"))
        raise QueryError(f"cluster: no cluster named {name!r}; known are {known}")
    stamp = path.stat().st_mtime
    with _lock:
        found = _clusters.get(name)
        if found is not None and found[0] == stamp:
            return found[1]
    # Named by its place in the repository, not the server's absolute path: the name is what
    # a refusal (a rank the cluster does not hold, say) shows the caller.
    shown = f"clusters/{name}.yaml"
    try:
        raw = yaml.safe_load(path.read_text("utf-8"))
    except (OSError, UnicodeDecodeError, yaml.YAMLError) as exc:
        raise ClusterError(shown, f"cannot be read: {exc}") from None
    cluster = parse_cluster(raw, source=shown)
    with _lock:
        _clusters[name] = (stamp, cluster)
    return cluster


def _cluster(raw: Any) -> Cluster | None:
    if raw is None:
        return None
    if isinstance(raw, str):
        return named_cluster(raw)
    if isinstance(raw, dict):
        return parse_cluster(raw, source="cluster")
    raise QueryError("cluster: a shipped cluster's name or an inline description (object)")


def run_estimate(data: Any, pins: Mapping[str, str] | None = None) -> tuple[int, dict[str, Any]]:
    """A whole estimate, from the parsed body (and the query string's ``pins``, merged as the
    lookup merges them) to the HTTP status and the JSON body."""
    if not isinstance(data, dict):
        return 400, {"error": "invalid", "problems": ["the body must be a JSON object"]}
    problems: list[str] = []
    # The bundle is named as for a lookup (id, sha256, or hardware + model + variant, with
    # the same pins), and chosen for the estimate's deployment (its rank 0: issue 13.1).
    envelope = {k: data[k] for k in _BUNDLE_FIELDS if k in data and k != "cluster"}
    tp, dp, sp = data.get("tp"), data.get("dp"), data.get("sequence_parallel", False)
    plain = all(isinstance(v, int) and not isinstance(v, bool) and v >= 1 for v in (tp, dp))
    envelope["target"] = (
        {"tp": tp, "dp": dp, "rank": 0, "sequence_parallel": sp}
        if (plain and isinstance(sp, bool))
        else {"tp": 1, "dp": 1, "rank": 0}
    )
    ref_request: LookupRequest | None = None
    try:
        ref_request = parse_request(envelope, max_queries=0, pins=pins)
    except RequestError as exc:
        problems += exc.problems
    body = {k: v for k, v in data.items() if k not in _BUNDLE_FIELDS}
    profile_id = body.get("profile")
    if isinstance(profile_id, int) and not isinstance(profile_id, bool):
        found = published_profile(profile_id)
        if isinstance(found, str):
            problems.append(found)
            del body["profile"]
        else:
            body["profile"] = found
    request = None
    try:
        request = parse_estimate_request(
            body, max_steps=settings.REGISTRY.get("MAX_ESTIMATE_STEPS", MAX_STEPS)
        )
    except EstimateRequestError as exc:
        # An unknown profile id is named above; the parser, not seeing it, would add that
        # the captured policy needs a profile.
        unnamed = "profile" in data and "profile" not in body
        problems += [
            p for p in exc.problems if not (unnamed and p.startswith("profile: the captured"))
        ]
    cluster = None
    try:
        cluster = _cluster(data.get("cluster"))
    except (QueryError, ClusterError) as exc:
        problems.append(str(exc) if str(exc).startswith("cluster") else f"cluster: {exc}")
    if problems or request is None or ref_request is None:
        return 400, {"error": "invalid", "problems": problems}
    try:
        ref = choose_bundle(ref_request)
    except NoCoverage as exc:
        return 422, {"error": "out_of_support", "message": exc.message}
    except LookupFailure as exc:
        return 404, {"error": exc.code, "message": exc.message}
    try:
        answer = answer_estimate(tables_for(ref.ref), request, cluster)
    except QueryError as exc:
        return 400, {"error": "invalid", "problems": [str(exc)]}
    except CoverageError as exc:
        return 422, {"error": "out_of_support", "message": str(exc)}
    except (BundleError, BlobDriftError) as exc:
        return 409, {"error": "corrupt_bundle", "message": str(exc)}
    bundle = ref.as_dict()
    if isinstance(answer, list):
        return 200, {"bundle": bundle, "answers": answer}
    return 200, {"bundle": bundle, **answer}
