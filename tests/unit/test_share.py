"""How a holder tells a run that ended from one whose keeper died (``share``), on real
unix sockets: only a goodbye before the end of the connection says the command is over."""

from __future__ import annotations

import socket
import sys

import pytest

from local_mutex.backends.flock.share import HELLO, Sharing, _hear, goodbye, leave

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="holds share on Linux")


def _said_goodbye(holder: socket.socket) -> bool | None:
    return goodbye(*_hear(holder))


def test_an_open_silent_connection_is_a_run_still_inside() -> None:
    holder, run = socket.socketpair()
    with holder, run:
        assert _said_goodbye(holder) is None


def test_a_goodbye_then_the_end_is_a_run_whose_command_is_over() -> None:
    holder, run = socket.socketpair()
    with holder:
        leave(run)
        assert _said_goodbye(holder) is True


def test_a_goodbye_is_read_even_before_the_run_closed() -> None:
    holder, run = socket.socketpair()
    with holder, run:
        run.send(b"bye\n")
        assert _said_goodbye(holder) is True


def test_an_end_without_a_goodbye_is_a_run_whose_keeper_died() -> None:
    holder, run = socket.socketpair()
    with holder:
        run.close()
        assert _said_goodbye(holder) is False


def test_a_goodbye_survives_the_reset_of_a_close_with_unread_data() -> None:
    """A run never reads what the holder sends after it joined (a file put back): its
    close then resets the connection, after the goodbye it sent."""
    holder, run = socket.socketpair()
    with holder:
        holder.send(b"+\n")
        leave(run)
        assert _said_goodbye(holder) is True
    holder, run = socket.socketpair()
    with holder:
        holder.send(b"+\n")
        run.close()
        assert _said_goodbye(holder) is False


def test_leaving_a_holder_that_is_gone_is_quiet() -> None:
    holder, run = socket.socketpair()
    holder.close()
    leave(run)  # no BrokenPipeError, no SIGPIPE
    assert run.fileno() == -1


@pytest.mark.parametrize("ticks", [1, 2])
def test_the_holder_knows_which_supervisors_runs_left_without_a_goodbye(ticks: int) -> None:
    """A supervisor names itself as it starts; what it said is kept from tick to tick, so
    the holder can tell a nested call whether its run left without a goodbye -- and only
    that run: one that said goodbye is not counted, nor a line that names no pid."""
    sharing = Sharing("t" * 32, None)
    try:
        pairs = [socket.socketpair() for _ in range(2)]
        for holder, _ in pairs:
            sharing.inside.append(holder)
        (_, dropped), (_, finished) = pairs
        dropped.send(HELLO % 4242 + b"run x\n")
        finished.send(HELLO % 4343)
        if ticks == 2:
            assert sharing.in_use()  # both still inside: what they said is kept
        dropped.close()
        leave(finished)
        assert sharing.in_use()  # one left without its goodbye: never unlocked
        assert sharing.dropped_runs == {4242}
    finally:
        sharing.close()
