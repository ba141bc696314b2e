"""acquisition.deferred_stop: a stop inside the checkpoint-and-count section arrives after it
(R9: a cancelled run's count is the checkpoint's, which the resume counts)."""

from __future__ import annotations

import os
import signal
import threading
from types import FrameType

import pytest

from acquisition.deferred_stop import stop_deferred


class Stopped(Exception):
    pass


def _raise(signum: int, frame: FrameType | None) -> None:
    raise Stopped(signum)


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT])
def test_a_stop_inside_waits_for_the_end_of_the_block(signum: int) -> None:
    previous = signal.signal(signum, _raise)
    done: list[str] = []
    try:
        with pytest.raises(Stopped):
            with stop_deferred():
                os.kill(os.getpid(), signum)
                done.append("after the signal")  # still runs: the stop waits
            done.append("after the block")  # never: the stop arrives at the block's end
        assert done == ["after the signal"]
        assert signal.getsignal(signum) is _raise  # the handler in place is back
    finally:
        signal.signal(signum, previous)


def test_sigint_reaches_pythons_own_handler_as_keyboard_interrupt() -> None:
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
    with pytest.raises(KeyboardInterrupt), stop_deferred():
        os.kill(os.getpid(), signal.SIGINT)
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler


def test_without_a_stop_nothing_happens_and_an_error_passes_through() -> None:
    with stop_deferred():
        pass
    with pytest.raises(ValueError, match="inside"), stop_deferred():
        raise ValueError("inside")
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler


def test_outside_the_main_thread_it_changes_nothing() -> None:
    seen: list[object] = []

    def run() -> None:
        with stop_deferred():
            seen.append(signal.getsignal(signal.SIGINT))

    thread = threading.Thread(target=run)
    thread.start()
    thread.join()
    assert seen == [signal.default_int_handler]
