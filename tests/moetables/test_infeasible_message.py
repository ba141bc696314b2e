"""An infeasible N/A/M query says which bound failed, in words (R5)."""

from __future__ import annotations

from pathlib import Path

import pytest

from moetables.errors import QueryError
from moetables.geometry import ExpertGeometry, MoeTarget
from moetables.lookup import ComponentTables


@pytest.mark.parametrize(
    ("query", "words"),
    [
        ((4, 2, 1), "every active expert has at least one token-expert pair"),
        ((4, 2, 40), "picks at most min(k=4, A=2) = 2 of the active local experts: M <= 8"),
        ((4, 70, 80), "this rank owns only 8 experts"),
        ((4, 0, 3), "need at least one active local expert"),
    ],
)
def test_it_names_the_failed_bound(
    current_bundle: Path, query: tuple[int, int, int], words: str
) -> None:
    deployment = ComponentTables(current_bundle).deployment(1, 2, 0)
    with pytest.raises(QueryError, match="is infeasible: ") as caught:
        deployment.time_us("experts", *query)
    assert words in str(caught.value)


def test_it_explains_the_remote_floor() -> None:
    """With few remote experts, each token must keep some of its k choices local."""
    geometry = ExpertGeometry.for_target(8, 6, MoeTarget.for_rank(1, 2, 0))
    assert geometry.infeasibility(4, 4, 4).endswith("at least 2 per token are local: M >= 8")
    assert "only 4 of the 8 experts live on other ranks" in geometry.infeasibility(4, 0, 0)
    assert geometry.infeasibility(4, 4, 8) == ""
