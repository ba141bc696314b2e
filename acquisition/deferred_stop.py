"""A stop (SIGINT, SIGTERM) that waits for the end of a short section instead of cutting it.

The measuring loop writes a batch's samples to the checkpoint and then counts its points in
the progress events. A stop that lands between the two leaves the checkpoint ahead of the
count: the cancelled event says fewer points than a resume finds. Inside ``stop_deferred()``
a stop is noted and delivered, to the handler that was in place, as soon as the section ends;
the section is a file sync and some bookkeeping, never device work, so the delay is
milliseconds.
"""

from __future__ import annotations

import contextlib
import signal
import threading
from collections.abc import Iterator
from types import FrameType
from typing import Any

__all__ = ["stop_deferred"]

_SIGNALS = (signal.SIGINT, signal.SIGTERM)


@contextlib.contextmanager
def stop_deferred() -> Iterator[None]:
    """Defer SIGINT and SIGTERM to the end of the block (main thread only: elsewhere Python
    delivers no signal to the block anyway, so it runs as it is)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    pending: list[tuple[int, FrameType | None]] = []

    def note(signum: int, frame: FrameType | None) -> None:
        pending.append((signum, frame))

    previous: dict[int, Any] = {}
    try:
        for stop in _SIGNALS:
            previous[stop] = signal.signal(stop, note)
        yield
    finally:
        for number, handler in previous.items():
            signal.signal(number, handler)
        for number, frame in pending[:1]:
            handler = previous.get(number)
            if callable(handler):
                handler(number, frame)
            elif handler == signal.SIG_DFL:
                signal.raise_signal(number)
