"""One-dimensional curves: local components over their own row counts (R39).

Linear in raw rows and microseconds between measured points, the stored value at a measured
point, and a refusal outside [first, last]: the same rule the historical tables were read with.
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

from moetables.errors import CoverageError
from moetables.lookup.codes import INVALID, OK, OUT_OF_SUPPORT

__all__ = ["LocalCurve"]


class LocalCurve:
    """Times measured at increasing row counts, answered by piecewise-linear interpolation."""

    __slots__ = ("_exact", "label", "times", "tokens")

    def __init__(
        self, tokens: npt.NDArray[np.int64], times: npt.NDArray[np.float64], label: str
    ) -> None:
        order = np.argsort(tokens, kind="stable")
        self.tokens = tokens[order].astype(np.float64)
        self.times = times[order]
        self.label = label
        self._exact = {int(n): float(t) for n, t in zip(tokens, times, strict=True)}

    @property
    def support(self) -> tuple[int, int]:
        return int(self.tokens[0]), int(self.tokens[-1])

    def time(self, tokens: int) -> float:
        exact = self._exact.get(tokens)
        if exact is not None:
            return exact
        low, high = self.support
        if not low <= tokens <= high:
            raise CoverageError(
                f"{self.label}: tokens {tokens} is outside measured [{low}, {high}]"
            )
        return float(np.interp(tokens, self.tokens, self.times))

    def batch(
        self, tokens: npt.NDArray[np.int64]
    ) -> tuple[npt.NDArray[np.float64], npt.NDArray[np.int8]]:
        x = tokens.astype(np.float64)
        codes = np.full(x.shape, OK, dtype=np.int8)
        codes[(x < self.tokens[0]) | (x > self.tokens[-1])] = OUT_OF_SUPPORT
        codes[tokens < 1] = INVALID
        values = np.interp(x, self.tokens, self.times)
        # Return stored values bit for bit at measured rows (interp's arithmetic may not).
        index = np.clip(np.searchsorted(self.tokens, x), 0, len(self.tokens) - 1)
        hit = self.tokens[index] == x
        values[hit] = self.times[index[hit]]
        values[codes != OK] = np.nan
        return values, codes
