"""Routing profiles: what a real router chose, per MoE layer and per forward step.

A profile is one ``.npz`` file (numpy's zip of ``.npy`` arrays, read with pickles refused):

- ``profile.json``: the metadata as UTF-8 JSON bytes (model, workload, versions, date, the
  command that made it, and the sha256 of every array below);
- ``step_tokens`` int64 (S,): the rows the router saw in each captured forward step;
- ``counts`` int32 (S, layers, E): per step and layer, the token-expert pairs of each expert;
- ``totals`` int64 (layers, E): the same summed over all steps (kept so that a reader of the
  whole-run load needs no pass over the steps; checked against ``counts``).

From the per-step counts any EP size's per-rank (A, M) at any captured N follow exactly through
vLLM's linear expert placement (R4); `moetables.routing`'s ``captured`` policy draws from them.
Everything is validated on read with an error naming the field at fault
(``docs/routing-profile-format.md``).
"""

from __future__ import annotations

import datetime as _dt
import hashlib
import io
import itertools
import json
import os
import struct
import zipfile
import zlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from moetables.errors import BundleError
from moetables.geometry import linear_expert_map

__all__ = [
    "PROFILE_SCHEMA",
    "PROFILE_VERSION",
    "ProfileError",
    "RankStatistics",
    "RoutingProfile",
    "expert_ranges",
    "profile_from_json",
    "read_profile",
    "sha256_of",
    "write_profile",
]

PROFILE_SCHEMA = "moe-routing-profile"
PROFILE_VERSION = 1
ARRAYS = ("step_tokens", "counts", "totals")
_MEMBERS = {"profile.json.npy", *(f"{name}.npy" for name in ARRAYS)}
# A profile is read whole into memory; these bounds keep a hostile file from exhausting it.
MAX_UNCOMPRESSED_BYTES = 1 << 30
MAX_META_BYTES = 1 << 20
MAX_EXPERTS = 4096
MAX_LAYERS = 1024

IntArray = npt.NDArray[np.int64]
# What a damaged zip or .npy member raises inside zipfile, zlib and numpy's reader.
_DAMAGED = (
    zipfile.BadZipFile,
    zlib.error,
    struct.error,
    ValueError,
    OSError,
    EOFError,
    KeyError,
    NotImplementedError,
    RuntimeError,
)


class ProfileError(BundleError):
    """A corrupt or inconsistent routing profile; ``where`` names the member and field."""


@dataclass(frozen=True, slots=True)
class RankStatistics:
    """Per captured step and EP rank: gathered rows N, active experts A, local pairs M."""

    ep: int
    tokens: IntArray  # (S,)
    activated_experts: IntArray  # (S, ep)
    local_assignments: IntArray  # (S, ep)


def expert_ranges(global_experts: int, ep: int) -> list[tuple[int, int]]:
    """[start, stop) of each EP rank's global experts under linear placement (R4)."""
    out = []
    for rank in range(ep):
        owned = [
            e for e, local in enumerate(linear_expert_map(global_experts, ep, rank)) if local >= 0
        ]
        out.append((owned[0], owned[-1] + 1))
    return out


def _digest(array: npt.NDArray[Any]) -> str:
    """sha256 of an array's dtype, shape and C-order bytes (the content, not the zip)."""
    h = hashlib.sha256()
    h.update(f"{array.dtype.str}{list(array.shape)}".encode())
    h.update(np.ascontiguousarray(array).tobytes())
    return h.hexdigest()


def _require(meta: Mapping[str, Any], key: str, kind: type | tuple[type, ...], where: str) -> Any:
    if key not in meta:
        raise ProfileError(where, f"field {key!r} is missing")
    value = meta[key]
    if isinstance(value, bool) and bool not in (kind if isinstance(kind, tuple) else (kind,)):
        raise ProfileError(f"{where}.{key}", f"must be {_kind_name(kind)}, got {value!r}")
    if not isinstance(value, kind):
        raise ProfileError(f"{where}.{key}", f"must be {_kind_name(kind)}, got {value!r}")
    return value


def _kind_name(kind: type | tuple[type, ...]) -> str:
    kinds = kind if isinstance(kind, tuple) else (kind,)
    names = {int: "an integer", str: "a string", dict: "an object", list: "a list"}
    return " or ".join(names.get(k, k.__name__) for k in kinds)


@dataclass(frozen=True, eq=False)
class RoutingProfile:
    """A validated routing profile. Build one with `read_profile`, `profile_from_json` or
    `RoutingProfile.create` (which fills in the digests); the constructor checks everything."""

    meta: dict[str, Any]
    step_tokens: IntArray
    counts: npt.NDArray[np.int32]
    totals: IntArray

    def __post_init__(self) -> None:
        _validate(self.meta, self.step_tokens, self.counts, self.totals)

    # ---- construction ------------------------------------------------------------------------

    @classmethod
    def create(
        cls,
        *,
        model: Mapping[str, Any],
        workload: Mapping[str, Any],
        step_tokens: Sequence[int] | IntArray,
        counts: Any,
        versions: Mapping[str, str] | None = None,
        command: str = "",
        router: str = "native",
        source: str = "vllm",
        captured_at: str | None = None,
    ) -> RoutingProfile:
        """A new profile from captured arrays; ``model`` needs ``name``, ``global_experts``,
        ``top_k`` and ``layers`` (the captured MoE layers' indices, in ``counts`` order)."""
        tokens = np.asarray(step_tokens, dtype=np.int64).reshape(-1)
        raw = np.asarray(counts)
        if raw.size and raw.dtype.kind not in "iu":
            raise ProfileError("counts", f"must hold integers, got dtype {raw.dtype}")
        if raw.size and (raw.min() < 0 or raw.max() > np.iinfo(np.int32).max):
            raise ProfileError("counts", "values must lie in [0, 2^31)")
        arr = raw.astype(np.int32)
        totals = arr.sum(axis=0, dtype=np.int64) if arr.ndim == 3 else np.zeros((0, 0), np.int64)
        meta: dict[str, Any] = {
            "schema": PROFILE_SCHEMA,
            "version": PROFILE_VERSION,
            "model": dict(model),
            "workload": dict(workload),
            "versions": dict(versions or {}),
            "router": router,
            "source": source,
            "captured_at": captured_at
            or _dt.datetime.now(_dt.UTC).replace(microsecond=0).isoformat(),
            "command": command,
            "steps": int(tokens.shape[0]),
            "content": {
                "step_tokens": _digest(tokens),
                "counts": _digest(arr),
                "totals": _digest(totals),
            },
        }
        return cls(meta, tokens, arr, totals)

    # ---- what it says ------------------------------------------------------------------------

    @property
    def global_experts(self) -> int:
        return int(self.meta["model"]["global_experts"])

    @property
    def top_k(self) -> int:
        return int(self.meta["model"]["top_k"])

    @property
    def layers(self) -> list[int]:
        return [int(v) for v in self.meta["model"]["layers"]]

    @property
    def steps(self) -> int:
        return int(self.step_tokens.shape[0])

    def layer_position(self, layer: int) -> int:
        """Index into ``counts`` of a model layer index; a clear error for one not captured."""
        layers = self.layers
        if isinstance(layer, bool) or not isinstance(layer, (int, np.integer)):
            raise ProfileError("layer", f"must be an integer, got {layer!r}")
        if int(layer) not in layers:
            raise ProfileError("layer", f"layer {layer} is not in this profile; it has {layers}")
        return layers.index(int(layer))

    def load_shares(self, layer: int | None = None) -> npt.NDArray[np.float64]:
        """Per expert, the chance that one token picks it (pairs / tokens, adds up to k):
        one layer's, or the mean over all layers."""
        total_tokens = float(self.step_tokens.sum())
        if total_tokens == 0:
            raise ProfileError("step_tokens", "the profile holds no tokens")
        if layer is None:
            shares: npt.NDArray[np.float64] = self.totals.mean(axis=0) / total_tokens
        else:
            shares = self.totals[self.layer_position(layer)] / total_tokens
        return shares

    def imbalance(self) -> npt.NDArray[np.float64]:
        """Per layer, the busiest expert's pairs over the mean expert's (1 = perfectly even)."""
        mean = self.totals.mean(axis=1)
        out = np.ones(self.totals.shape[0], dtype=np.float64)
        busy = mean > 0
        out[busy] = self.totals[busy].max(axis=1) / mean[busy]
        return out

    def rank_statistics(self, ep: int, layer: int | None = None) -> RankStatistics:
        """Every captured step's per-rank (A, M) at EP ``ep`` (one layer, or every layer's
        steps one after the other when ``layer`` is None)."""
        if isinstance(ep, bool) or not isinstance(ep, int) or not 1 <= ep <= self.global_experts:
            raise ProfileError(
                "ep", f"must be an integer in [1, {self.global_experts}], got {ep!r}"
            )
        if layer is None:
            tokens = np.tile(self.step_tokens, self.counts.shape[1])
            counts = self.counts.transpose(1, 0, 2).reshape(-1, self.global_experts)
        else:
            counts = self.counts[:, self.layer_position(layer), :]
            tokens = self.step_tokens.copy()
        starts = np.array([s for s, _ in expert_ranges(self.global_experts, ep)], dtype=np.intp)
        c64 = counts.astype(np.int64)
        pairs = np.add.reduceat(c64, starts, axis=1) if c64.size else np.zeros((0, ep), np.int64)
        active = (
            np.add.reduceat((c64 > 0).astype(np.int64), starts, axis=1)
            if c64.size
            else np.zeros((0, ep), np.int64)
        )
        return RankStatistics(ep, tokens, active, pairs)

    def summary(self) -> dict[str, Any]:
        """The metadata a listing shows (no arrays)."""
        return {
            "model": self.meta["model"],
            "workload": self.meta["workload"],
            "versions": self.meta["versions"],
            "router": self.meta["router"],
            "source": self.meta["source"],
            "captured_at": self.meta["captured_at"],
            "command": self.meta["command"],
            "steps": self.steps,
            "tokens": int(self.step_tokens.sum()),
            "max_step_tokens": int(self.step_tokens.max()) if self.steps else 0,
            "imbalance": [round(float(v), 4) for v in self.imbalance()],
        }

    def to_json(self) -> dict[str, Any]:
        """The inline form (for a REST request): metadata plus the arrays as lists."""
        return {
            "meta": self.meta,
            "step_tokens": self.step_tokens.tolist(),
            "counts": self.counts.tolist(),
        }


def _validate(
    meta: Any, tokens: npt.NDArray[Any], counts: npt.NDArray[Any], totals: npt.NDArray[Any]
) -> None:
    if not isinstance(meta, dict):
        raise ProfileError("profile.json", "must be a JSON object")
    schema = _require(meta, "schema", str, "profile.json")
    if schema != PROFILE_SCHEMA:
        raise ProfileError("profile.json.schema", f"must be {PROFILE_SCHEMA!r}, got {schema!r}")
    version = _require(meta, "version", int, "profile.json")
    if version != PROFILE_VERSION:
        raise ProfileError(
            "profile.json.version", f"this reader knows version {PROFILE_VERSION}, got {version}"
        )
    model = _require(meta, "model", dict, "profile.json")
    name = _require(model, "name", str, "profile.json.model")
    if not name.strip() or len(name) > 200:
        raise ProfileError("profile.json.model.name", "must be 1 to 200 characters")
    e = _require(model, "global_experts", int, "profile.json.model")
    k = _require(model, "top_k", int, "profile.json.model")
    if not 1 <= e <= MAX_EXPERTS:
        raise ProfileError(
            "profile.json.model.global_experts", f"must lie in [1, {MAX_EXPERTS}], got {e}"
        )
    if not 1 <= k <= e:
        raise ProfileError("profile.json.model.top_k", f"must lie in [1, E={e}], got {k}")
    layers = _require(model, "layers", list, "profile.json.model")
    if (
        not layers
        or len(layers) > MAX_LAYERS
        or any(isinstance(v, bool) or not isinstance(v, int) or v < 0 for v in layers)
        or any(b <= a for a, b in itertools.pairwise(layers))
    ):
        raise ProfileError(
            "profile.json.model.layers",
            f"must be 1 to {MAX_LAYERS} increasing non-negative layer indices, got {layers!r}",
        )
    workload = _require(meta, "workload", dict, "profile.json")
    for key in ("prompts_sha256",):
        _require(workload, key, str, "profile.json.workload")
    for key in ("prompts", "prompt_tokens", "generated_tokens"):
        value = _require(workload, key, int, "profile.json.workload")
        if value < 0:
            raise ProfileError(f"profile.json.workload.{key}", f"must be >= 0, got {value}")
    versions = _require(meta, "versions", dict, "profile.json")
    if any(not isinstance(v, str) for v in versions.values()):
        raise ProfileError("profile.json.versions", "every version must be a string")
    for key in ("router", "source", "captured_at", "command"):
        _require(meta, key, str, "profile.json")
    steps = _require(meta, "steps", int, "profile.json")
    content = _require(meta, "content", dict, "profile.json")

    if tokens.dtype != np.int64 or tokens.ndim != 1:
        raise ProfileError(
            "step_tokens", f"must be int64 of shape (S,), got {tokens.dtype} {list(tokens.shape)}"
        )
    if tokens.shape[0] != steps:
        raise ProfileError(
            "step_tokens", f"has {tokens.shape[0]} steps, profile.json.steps says {steps}"
        )
    if steps < 1:
        raise ProfileError("step_tokens", "a profile needs at least one captured step")
    if tokens.min() < 1:
        raise ProfileError("step_tokens", f"step {int(np.argmin(tokens))} has no tokens")
    want = (steps, len(layers), e)
    if counts.dtype != np.int32 or counts.shape != want:
        raise ProfileError(
            "counts",
            f"must be int32 of shape (steps, layers, E) = {list(want)}, got "
            f"{counts.dtype} {list(counts.shape)}",
        )
    if totals.dtype != np.int64 or totals.shape != want[1:]:
        raise ProfileError(
            "totals",
            f"must be int64 of shape (layers, E) = {list(want[1:])}, got "
            f"{totals.dtype} {list(totals.shape)}",
        )
    for array_name, array in (("step_tokens", tokens), ("counts", counts), ("totals", totals)):
        digest = content.get(array_name)
        if not isinstance(digest, str):
            raise ProfileError(f"profile.json.content.{array_name}", "the sha256 is missing")
        if digest != _digest(array):
            raise ProfileError(
                array_name,
                "checksum mismatch (profile.json.content says "
                f"{digest[:12]}..., the array is {_digest(array)[:12]}...)",
            )
    if counts.min() < 0:
        step, layer, expert = (int(v) for v in np.argwhere(counts < 0)[0])
        raise ProfileError(
            "counts", f"step {step} layer {layers[layer]} expert {expert} is negative"
        )
    over = counts > tokens[:, None, None]
    if over.any():
        step, layer, expert = (int(v) for v in np.argwhere(over)[0])
        raise ProfileError(
            "counts",
            f"step {step} layer {layers[layer]} expert {expert} has "
            f"{int(counts[step, layer, expert])} pairs but the step has only "
            f"{int(tokens[step])} tokens (a token picks an expert once)",
        )
    sums = counts.sum(axis=2, dtype=np.int64)
    wrong = sums != tokens[:, None] * k
    if wrong.any():
        step, layer = (int(v) for v in np.argwhere(wrong)[0])
        raise ProfileError(
            "counts",
            f"step {step} layer {layers[layer]} adds up to {int(sums[step, layer])} "
            f"pairs, not tokens x top_k = {int(tokens[step])} x {k}",
        )
    if not np.array_equal(totals, counts.sum(axis=0, dtype=np.int64)):
        raise ProfileError("totals", "is not the sum of counts over the steps")


# ---- files -----------------------------------------------------------------------------------


def write_profile(profile: RoutingProfile, path: str | os.PathLike[str]) -> Path:
    """Write atomically (a temporary file renamed into place); returns the path."""
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    meta = np.frombuffer(
        json.dumps(profile.meta, sort_keys=True, separators=(",", ":")).encode(), dtype=np.uint8
    )
    tmp = target.with_name(f".{target.name}.tmp-{os.getpid()}")
    members: dict[str, Any] = {
        "profile.json": meta,
        "step_tokens": profile.step_tokens,
        "counts": profile.counts,
        "totals": profile.totals,
    }
    with tmp.open("wb") as fh:
        np.savez_compressed(fh, **members)
    tmp.replace(target)
    return target


def read_profile(
    source: str | os.PathLike[str] | bytes, *, max_unpacked: int = MAX_UNCOMPRESSED_BYTES
) -> RoutingProfile:
    """Read and validate a profile file (a path, or its bytes); `ProfileError` names the
    member and field at fault. ``max_unpacked`` bounds the bytes its members unpack to (a
    server reading uploads sets its own)."""
    if isinstance(source, bytes):
        fh: Any = io.BytesIO(source)
        where = "profile"
    else:
        path = Path(source)
        if not path.is_file():
            raise ProfileError(str(path), "no such profile file")
        fh = path.open("rb")
        where = str(path)
    try:
        try:
            archive = zipfile.ZipFile(fh)
        except _DAMAGED:
            raise ProfileError(where, "not a routing profile (an .npz zip archive)") from None
        with archive:
            infos = archive.infolist()
            names = {i.filename for i in infos}
            if names != _MEMBERS or len(infos) != len(_MEMBERS):
                raise ProfileError(
                    where, f"members must be exactly {sorted(_MEMBERS)}, got {sorted(names)[:10]}"
                )
            if sum(i.file_size for i in infos) > max_unpacked:
                raise ProfileError(where, f"unpacks to more than {max_unpacked} bytes")
            arrays: dict[str, npt.NDArray[Any]] = {}
            for info in infos:
                member = info.filename[: -len(".npy")]
                try:
                    with archive.open(info) as raw:
                        data = raw.read(max_unpacked + 1)
                    arrays[member] = np.load(io.BytesIO(data), allow_pickle=False)
                except _DAMAGED as exc:
                    raise ProfileError(f"{where}: {member}", f"unreadable ({exc})") from None
    finally:
        fh.close()
    meta_bytes = arrays["profile.json"]
    if meta_bytes.dtype != np.uint8 or meta_bytes.ndim != 1 or meta_bytes.size > MAX_META_BYTES:
        raise ProfileError("profile.json", f"must be at most {MAX_META_BYTES} UTF-8 bytes")
    try:
        meta = json.loads(meta_bytes.tobytes().decode("utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError) as exc:
        raise ProfileError("profile.json", f"not valid JSON ({type(exc).__name__})") from None
    return RoutingProfile(meta, arrays["step_tokens"], arrays["counts"], arrays["totals"])


def profile_from_json(raw: Any) -> RoutingProfile:
    """The inline form (`RoutingProfile.to_json`): ``meta``, ``step_tokens``, ``counts``;
    the digests in ``meta.content`` are checked as in a file."""
    if not isinstance(raw, Mapping):
        raise ProfileError("profile", "an inline profile must be a JSON object")
    missing = [k for k in ("meta", "step_tokens", "counts") if k not in raw]
    if missing:
        raise ProfileError("profile", f"field(s) {missing} missing")
    arrays = []
    for key, dtype in (("step_tokens", np.int64), ("counts", np.int32)):
        value = raw[key]
        if not isinstance(value, list):
            raise ProfileError(f"profile.{key}", "must be a (nested) list of integers")
        try:
            arr = np.asarray(value)
        except ValueError:
            raise ProfileError(f"profile.{key}", "must be a rectangular list of integers") from None
        if arr.size and arr.dtype.kind not in "iu":
            raise ProfileError(f"profile.{key}", "must hold integers only")
        if arr.size and (arr.min() < 0 or arr.max() > np.iinfo(np.int32).max):
            raise ProfileError(f"profile.{key}", "values must lie in [0, 2^31)")
        arrays.append(arr.astype(dtype))
    tokens: IntArray = arrays[0].astype(np.int64)
    counts: npt.NDArray[np.int32] = arrays[1].astype(np.int32)
    if counts.ndim != 3:
        raise ProfileError(
            "profile.counts", f"must be (steps, layers, E), got shape {list(counts.shape)}"
        )
    return RoutingProfile(
        dict(raw["meta"]) if isinstance(raw["meta"], Mapping) else raw["meta"],
        tokens,
        counts,
        counts.sum(axis=0, dtype=np.int64),
    )


def sha256_of(path: str | os.PathLike[str]) -> str:
    """The file's sha256 (what the registry addresses a profile by)."""
    h = hashlib.sha256()
    with Path(path).open("rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()
