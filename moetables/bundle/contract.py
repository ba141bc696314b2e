"""What every contract must say, whichever layout carries it, and its identity hash."""

from __future__ import annotations

import hashlib
import json
from typing import Any

from moetables.bundle.model import COMPONENTS, EXPERTS, MODES
from moetables.errors import BundleError
from moetables.geometry import ExpertGeometry, MoeTarget, linear_expert_map

__all__ = ["MAX_GLOBAL_EXPERTS", "MAX_TOP_K", "contract_id", "entry_geometry", "require"]

# Bounds that keep validation cheap whatever a contract says: the work of checking a contract
# grows with its expert count (issue 17, item 4: 5e7 experts took 4 s and 2 GB). The largest
# MoE models published have a few hundred experts per layer.
MAX_GLOBAL_EXPERTS = 65_536
MAX_TOP_K = 1_024


def contract_id(contract: dict[str, Any]) -> str:
    """The historical layout's contract identity: sha256 of canonical JSON."""
    text = json.dumps(contract, sort_keys=True, separators=(",", ":"), allow_nan=False)
    return hashlib.sha256(text.encode()).hexdigest()


def require(mapping: dict[str, Any], key: str, kind: type | tuple[type, ...], *, where: str) -> Any:
    if key not in mapping:
        raise BundleError(f"{where}.{key}", "is required")
    value = mapping[key]
    # bool is an int in Python, but a flag is never a count.
    if isinstance(value, bool) and bool not in (kind if isinstance(kind, tuple) else (kind,)):
        raise BundleError(f"{where}.{key}", f"must be {_kind_name(kind)}, got {value!r}")
    if not isinstance(value, kind):
        raise BundleError(f"{where}.{key}", f"must be {_kind_name(kind)}, got {value!r}")
    return value


def _kind_name(kind: type | tuple[type, ...]) -> str:
    kinds = kind if isinstance(kind, tuple) else (kind,)
    return " or ".join(k.__name__ for k in kinds)


def _names(
    contract: dict[str, Any], key: str, allowed: tuple[str, ...], *, where: str
) -> tuple[str, ...]:
    values = require(contract, key, list, where=where)
    if not values or not all(isinstance(v, str) for v in values):
        raise BundleError(f"{where}.{key}", f"must be a non-empty list of names, got {values!r}")
    unknown = [v for v in values if v not in allowed]
    if unknown:
        raise BundleError(f"{where}.{key}", f"unknown {unknown}; known are {list(allowed)}")
    if len(set(values)) != len(values):
        raise BundleError(f"{where}.{key}", f"lists a name twice: {values!r}")
    return tuple(values)


def entry_geometry(
    contract: dict[str, Any], target: MoeTarget, *, where: str
) -> tuple[ExpertGeometry, tuple[str, ...], tuple[str, ...]]:
    """Check the fields both layouts share; return the geometry, components and modes.

    The contract's own target must be the entry's, and its expert ownership must be the
    linear placement of that rank: a table measured for another rank is never reused.
    """
    if not isinstance(contract, dict):
        raise BundleError(where, "contract must be a mapping")
    own_target = MoeTarget.from_dict(contract.get("target"), where=f"{where}.target")
    if own_target != target:
        raise BundleError(
            f"{where}.target",
            f"contract target {own_target.as_dict()} differs from the entry's {target.as_dict()}",
        )
    experts = require(contract, "global_experts", int, where=where)
    top_k = require(contract, "global_top_k", int, where=where)
    local = require(contract, "local_experts", int, where=where)
    if not 1 <= experts <= MAX_GLOBAL_EXPERTS:
        raise BundleError(
            f"{where}.global_experts", f"must be within 1..{MAX_GLOBAL_EXPERTS}, got {experts}"
        )
    if not 1 <= top_k <= min(experts, MAX_TOP_K):
        raise BundleError(
            f"{where}.global_top_k", f"must be within 1..{min(experts, MAX_TOP_K)}, got {top_k}"
        )
    try:
        geometry = ExpertGeometry.for_target(experts, top_k, target)
    except ValueError as exc:
        raise BundleError(where, str(exc)) from None
    if geometry.local_experts != local:
        raise BundleError(
            f"{where}.local_experts",
            f"rank {target.rank} of EP{target.ep} owns {geometry.local_experts} of {experts} "
            f"experts under linear placement, the contract says {local}",
        )
    placement = contract.get("placement", "linear")
    if placement != "linear":
        raise BundleError(
            f"{where}.placement", f"only linear placement is supported, got {placement!r}"
        )
    if "expert_map" in contract and contract["expert_map"] != linear_expert_map(
        experts, target.ep, target.rank
    ):
        raise BundleError(
            f"{where}.expert_map", f"differs from linear placement for rank {target.rank}"
        )
    for key in ("local_token_budget", "maximum_expert_tokens"):
        if key in contract:
            value = require(contract, key, int, where=where)
            if value < 1:
                raise BundleError(f"{where}.{key}", f"must be positive, got {value}")
    components = _names(contract, "components", COMPONENTS, where=where)
    if EXPERTS not in components:
        raise BundleError(f"{where}.components", "must include experts")
    modes = _names(contract, "modes", MODES, where=where)
    return geometry, components, modes
