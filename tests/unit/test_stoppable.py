"""A stop signal cuts a ``stoppable`` write short, and only that: real signals, raised in
this process (``signal.raise_signal`` runs the handler before it returns)."""

from __future__ import annotations

import signal
import sys

from local_mutex._fastsignal import break_write, deferred_stops, quiet_stops, stoppable


def test_a_stop_inside_the_call_ends_it_and_the_caller_goes_on() -> None:
    after: list[str] = []

    def write() -> None:
        signal.raise_signal(signal.SIGTERM)  # as if it came while a write blocked here
        after.append("the rest of the write")

    with deferred_stops() as stops:
        stoppable(write)
        assert stops.pending == [signal.SIGTERM]
    assert after == []


def test_a_stop_outside_any_call_is_only_noted() -> None:
    """Just before a call, or just after it: no exception anywhere (it used to escape a
    ``with`` block's entry and exit, and leave every later stop raising)."""
    wrote: list[int] = []
    with deferred_stops() as stops:
        signal.raise_signal(signal.SIGTERM)
        stoppable(wrote.append, 1)
        signal.raise_signal(signal.SIGHUP)
        stoppable(wrote.append, 2)
        assert stops.pending == [signal.SIGTERM, signal.SIGHUP]
    assert wrote == [1, 2]


def test_only_a_frame_inside_the_call_is_cut() -> None:
    break_write(signal.SIGTERM, sys._getframe())  # not inside a stoppable call: nothing
    cut: list[bool] = []

    def inner() -> None:
        try:
            break_write(signal.SIGTERM, sys._getframe())
        except BaseException:
            cut.append(True)
            raise

    stoppable(inner)
    assert cut == [True]


def test_quiet_stops_cut_a_write_too() -> None:
    after: list[str] = []

    def write() -> None:
        signal.raise_signal(signal.SIGINT)
        after.append("the rest")

    with quiet_stops():
        stoppable(write)
    assert after == []
