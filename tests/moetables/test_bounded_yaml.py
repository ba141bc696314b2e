"""Issue 17, item 4: bundle YAML is read with bounds (aliases refused, size, depth and node
count capped, UTF-8 only) and contract geometry is bounded, so a few hundred hostile bytes
cannot tie up a worker (R44)."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

import pytest

from moetables.bundle.contract import MAX_GLOBAL_EXPERTS, entry_geometry
from moetables.bundle.safeyaml import load_bounded_yaml
from moetables.errors import BundleError
from moetables.geometry import MoeTarget

if TYPE_CHECKING:
    from collections.abc import Callable

LAUGHS = b"""a: &a ["lol","lol","lol","lol","lol","lol","lol","lol","lol"]
b: &b [*a,*a,*a,*a,*a,*a,*a,*a,*a]
c: &c [*b,*b,*b,*b,*b,*b,*b,*b,*b]
d: &d [*c,*c,*c,*c,*c,*c,*c,*c,*c]
e: &e [*d,*d,*d,*d,*d,*d,*d,*d,*d]
f: &f [*e,*e,*e,*e,*e,*e,*e,*e,*e]
g: &g [*f,*f,*f,*f,*f,*f,*f,*f,*f]
h: &h [*g,*g,*g,*g,*g,*g,*g,*g,*g]
i: &i [*h,*h,*h,*h,*h,*h,*h,*h,*h]
"""


def _quickly(action: Callable[[], Any], seconds: float = 2.0) -> BundleError:
    start = time.perf_counter()
    with pytest.raises(BundleError) as info:
        action()
    assert time.perf_counter() - start < seconds
    return info.value


def test_it_refuses_aliases_at_once() -> None:
    """Issue 17 item 4: a 444-byte billion laughs took 46 s and 3.6 GB and was accepted."""
    error = _quickly(lambda: load_bounded_yaml(LAUGHS, name="meta.yaml"))
    assert "aliases" in str(error) and "meta.yaml" in str(error) and "line 2" in str(error)


def test_it_reads_ordinary_yaml_and_anchors_without_aliases() -> None:
    assert load_bounded_yaml(b"a: &x 1\nb: [1, 2]\n", name="m") == {"a": 1, "b": [1, 2]}
    assert load_bounded_yaml("\ufeffa: é\n".encode(), name="m") == {"a": "é"}


def test_it_bounds_depth_size_and_nodes() -> None:
    """Issue 17 item 4: a 2 MB YAML list took 16 s and 610 MB."""
    deep = b"a: " + b"[" * 200 + b"]" * 200
    assert "deeper than 64" in str(_quickly(lambda: load_bounded_yaml(deep, name="m")))
    big = b"a: [" + b"1," * (3 * 1024 * 1024) + b"1]"
    assert "the limit for YAML" in str(_quickly(lambda: load_bounded_yaml(big, name="m")))
    many = b"a: [" + b"1," * 110_000 + b"1]"
    assert "more than 100000 YAML nodes" in str(
        _quickly(lambda: load_bounded_yaml(many, name="m"), seconds=10.0)
    )


def test_it_refuses_yaml_that_is_not_utf8() -> None:
    """Issue 17 item 5: meta.yaml must be UTF-8 (PyYAML also reads UTF-16)."""
    error = _quickly(lambda: load_bounded_yaml("a: 1\n".encode("utf-16"), name="meta.yaml"))
    assert "is not UTF-8" in str(error)


@pytest.mark.parametrize(
    ("experts", "top_k", "field"),
    [
        (50_000_000, 2, "global_experts"),
        (0, 1, "global_experts"),
        (8, 9, "global_top_k"),
        (MAX_GLOBAL_EXPERTS + 1, 2, "global_experts"),
    ],
)
def test_it_bounds_the_expert_geometry(experts: int, top_k: int, field: str) -> None:
    """Issue 17 item 4: global_experts: 5e7 took 4 s and 2 GB (memory linear in it)."""
    target = MoeTarget.for_rank(1, 1, 0)
    contract = {
        "target": target.as_dict(),
        "global_experts": experts,
        "global_top_k": top_k,
        "local_experts": experts,
        "components": ["gate_routing", "experts"],
        "modes": ["eager"],
    }
    error = _quickly(lambda: entry_geometry(contract, target, where="c"), seconds=0.5)
    assert error.where == f"c.{field}"
