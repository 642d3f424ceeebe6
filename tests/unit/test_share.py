"""How a holder tells a run that ended from one whose keeper died (``share``), on real
unix sockets: only a goodbye before the end of the connection says the command is over."""

from __future__ import annotations

import os
import socket
import sys

import pytest

from local_mutex.backends.flock.share import (
    Sharing,
    _hear,
    address,
    goodbye,
    introduce,
    leave,
)

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
def test_the_holder_knows_which_runs_left_without_a_goodbye(ticks: int) -> None:
    """A run names itself once it joined; what it said is kept from tick to tick, so the
    holder can tell a nested call whether its run left without a goodbye -- and only that
    run: one that said goodbye is not counted."""
    sharing = Sharing("t" * 32, None)
    try:
        pairs = [socket.socketpair() for _ in range(2)]
        for holder, _ in pairs:
            sharing.inside.append(holder)
        (_, dropped), (_, finished) = pairs
        assert introduce(dropped) != introduce(finished)
        if ticks == 2:
            assert sharing.in_use()  # both still inside: what they said is kept
        dropped.close()
        leave(finished)
        assert sharing.in_use()  # one left without its goodbye: never unlocked
        assert len(sharing.dropped_runs) == 1
        (name,) = sharing.dropped_runs
        assert len(name) == 24 and int(name, 16) >= 0
    finally:
        sharing.close()


@pytest.mark.parametrize(
    "asked",
    [b"left \xc2\xb2", b"left ", b"left", b"left \xff\xfe", b"left 12345", b"\x00" * 100],
)
def test_a_question_the_holder_cannot_read_is_answered_no(asked: bytes) -> None:
    """A same-user process that asks in garbage ("left \u00b2": a digit to isdigit(), not
    to int()) gets "no"; the holder answered with a ValueError and died, ending the hold."""
    sharing = Sharing("t" * 32, None)
    try:
        sharing.dropped_runs.add("ab" * 12)
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as asker:
            asker.connect(address(os.getpid(), sharing.token_sha256))
            asker.sendall(asked + b"\n")
            sharing.serve([])
            assert asker.recv(16) == b"no\n"
    finally:
        sharing.close()


def test_a_run_named_to_the_holder_is_known_by_that_name_only() -> None:
    sharing = Sharing("t" * 32, None)
    try:
        holder, run = socket.socketpair()
        sharing.inside.append(holder)
        name = introduce(run)
        run.close()
        for asked, answer in ((name, b"yes\n"), ("cd" * 12, b"no\n")):
            with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as asker:
                asker.connect(address(os.getpid(), sharing.token_sha256))
                asker.sendall(f"left {asked}\n".encode())
                sharing.serve([])
                assert asker.recv(16) == answer
    finally:
        sharing.close()


@pytest.mark.parametrize(
    "said",
    [b"run ABCDEF0123456789abcdef01", b"run 0123456789abcdef0123456g", b"run \xb2\xb2", b"run 12"],
)
def test_only_a_name_as_runs_give_them_is_kept(said: bytes) -> None:
    """What a run says goes into the hold's record once it left without a goodbye: a
    same-user process that names itself in anything but lowercase hex of the right length
    (upper case, a letter past f, other bytes, too short) is kept out of it."""
    sharing = Sharing("t" * 32, None)
    run = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        run.connect(address(os.getpid(), sharing.token_sha256))
        conn, _ = sharing.listener.accept()
        sharing.inside.append(conn)
        run.sendall(said + b"\nrun " + b"ab" * 12 + b"\n")
        run.close()
        assert sharing.in_use() is True
        assert sharing.dropped_runs == {"ab" * 12}
    finally:
        sharing.close()
