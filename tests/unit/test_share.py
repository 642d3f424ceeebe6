"""How a holder tells a run that ended from one whose keeper died (``share``), on real
unix sockets: only a goodbye before the end of the connection says the command is over."""

from __future__ import annotations

import os
import socket
import struct
import sys
from pathlib import Path

import pytest

from local_mutex.backends.flock.share import (
    Sharing,
    _hear,
    address,
    goodbye,
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


def test_a_run_that_says_much_is_still_inside() -> None:
    """More than the holder reads in a tick (4 KiB, a same-user peer's flood) was taken
    for the end of the connection: a run gone without its goodbye, whose hold then never
    unlocks its lock."""
    holder, run = socket.socketpair()
    with holder, run:
        run.send(b"x" * 8192)
        assert _said_goodbye(holder) is None
        assert _said_goodbye(holder) is None  # the rest, the next tick
        leave(run)
        assert _said_goodbye(holder) is True


def test_leaving_a_holder_that_is_gone_is_quiet() -> None:
    holder, run = socket.socketpair()
    holder.close()
    leave(run)  # no BrokenPipeError, no SIGPIPE
    assert run.fileno() == -1


def _joined(sharing: Sharing, lock: int) -> tuple[socket.socket, str]:
    """A run that joined the hold (with its token): its connection, and the name the holder
    gave it."""
    run = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    run.connect(address(os.getpid(), sharing.token_sha256))
    run.sendall(b"token " + b"t" * 32 + b"\n")
    sharing.serve([lock])
    msg, ancdata, _, _ = run.recvmsg(64, socket.CMSG_SPACE(16 * 4))
    for _level, _kind, data in ancdata:
        for fd in struct.unpack(f"{len(data) // 4}i", data):
            os.close(fd)
    said, name = msg.decode().split()
    assert said == "ok"
    return run, name


@pytest.mark.parametrize("ticks", [1, 2])
def test_the_holder_knows_which_runs_left_without_a_goodbye(tmp_path: Path, ticks: int) -> None:
    """The holder names each run as it joins (it writes the names down before the run has
    the lock: ``joining``); so it can tell a nested call whether its run left without a
    goodbye -- and only that run: one that said goodbye is not counted."""
    sharing = Sharing("t" * 32, None)
    lock = os.open(tmp_path / "lock", os.O_RDWR | os.O_CREAT, 0o644)
    try:
        (dropped, a), (finished, b) = _joined(sharing, lock), _joined(sharing, lock)
        assert a != b and all(len(n) == 24 and int(n, 16) >= 0 for n in (a, b))
        assert sharing.runs_inside() == [a, b]
        if ticks == 2:
            assert sharing.in_use()  # both still inside
        dropped.close()
        leave(finished)
        assert sharing.in_use()  # one left without its goodbye: never unlocked
        assert list(sharing.dropped_runs) == [a]
        assert sharing.runs_inside() == []
    finally:
        sharing.close()
        os.close(lock)


@pytest.mark.parametrize(
    "asked",
    [b"left \xc2\xb2", b"left ", b"left", b"left \xff\xfe", b"left 12345", b"\x00" * 100],
)
def test_a_question_the_holder_cannot_read_is_answered_no(asked: bytes) -> None:
    """A same-user process that asks in garbage ("left \u00b2": a digit to isdigit(), not
    to int()) gets "no"; the holder answered with a ValueError and died, ending the hold."""
    sharing = Sharing("t" * 32, None)
    try:
        sharing.dropped_runs["ab" * 12] = None
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as asker:
            asker.connect(address(os.getpid(), sharing.token_sha256))
            asker.sendall(asked + b"\n")
            sharing.serve([])
            assert asker.recv(16) == b"no\n"
    finally:
        sharing.close()


def test_a_run_named_by_the_holder_is_known_by_that_name_only(tmp_path: Path) -> None:
    sharing = Sharing("t" * 32, None)
    lock = os.open(tmp_path / "lock", os.O_RDWR | os.O_CREAT, 0o644)
    try:
        run, name = _joined(sharing, lock)
        run.close()
        for asked, answer in ((name, b"yes\n"), ("cd" * 12, b"no\n")):
            with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as asker:
                asker.connect(address(os.getpid(), sharing.token_sha256))
                asker.sendall(f"left {asked}\n".encode())
                sharing.serve([])
                assert asker.recv(16) == answer
    finally:
        sharing.close()
        os.close(lock)
