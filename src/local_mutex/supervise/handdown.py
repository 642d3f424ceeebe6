"""The keeper hands new descriptions of the lock down to the supervisor.

Both hold the lock's open file descriptions so that neither death frees the lock while the
command runs. A description the keeper opens mid-run -- a lock file it put back at the path
after someone deleted ours -- would be the keeper's alone: killed then, it would free the
file at the path while the supervisor still stops the command. So the keeper passes it on
(SCM_RIGHTS): it listens on a unix socket in a fresh 0700 directory (no other user can
connect to it, or even find it), tells the supervisor where over the pipe the supervisor
watches, and sends the descriptions to that process only (its pid, checked on the socket).
Rare, so nothing here loads before it is needed.
"""

from __future__ import annotations

import os

from .._proc import peer

TYPE_CHECKING = False
if TYPE_CHECKING:
    import socket
    from collections.abc import Sequence

# Long enough for a busy machine; the keeper's checks wait meanwhile.
_TIMEOUT = 2.0
_LOOK = 0.05  # how often the keeper looks whether the supervisor ended meanwhile
_MAX_FDS = 16


def give(supervisor: int, life: int, fds: Sequence[int]) -> bool:
    """Keeper side: True once the supervisor holds ``fds`` too, or has ended (then so has
    the command: nothing is left to keep the lock for); False if it did not take them."""
    import socket

    try:
        home = _private_dir()
    except OSError:
        return _ended(supervisor)
    name = os.path.join(home, "s")
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as listener:
            try:
                listener.bind(name)
                listener.listen(4)
                os.write(life, f"fds {name}\n".encode())
            except OSError:
                return _ended(supervisor)
            return _serve(listener, supervisor, fds)
    finally:
        _remove(name, home)


def _remove(name: str, home: str) -> None:
    try:
        os.unlink(name)
    except OSError:
        pass
    try:
        os.rmdir(home)
    except OSError:
        pass


def _private_dir() -> str:
    """A new directory only we can enter, with a path short enough for a socket."""
    for root in (os.environ.get("TMPDIR", ""), "/tmp"):
        if root and os.path.isabs(root) and len(root) < 60:
            path = os.path.join(root, f"local-mutex-{os.getpid()}-{os.urandom(6).hex()}")
            try:
                os.mkdir(path, 0o700)
                return path
            except OSError:
                continue
    raise OSError("no directory for the hand-down socket")


def _serve(listener: socket.socket, supervisor: int, fds: Sequence[int]) -> bool:
    import socket
    import time

    deadline = time.monotonic() + _TIMEOUT
    while True:
        if _ended(supervisor):
            return True
        if time.monotonic() > deadline:
            return False  # a supervisor that is frozen or too busy to answer
        listener.settimeout(_LOOK)
        try:
            conn, _ = listener.accept()
        except OSError:
            continue
        with conn:
            if peer(conn)[0] != supervisor:
                continue  # not our supervisor (our own user, or root): it gets nothing
            conn.settimeout(max(deadline - time.monotonic(), 0.001))
            try:
                socket.send_fds(conn, [b"f"], list(fds))
                return conn.recv(1) == b"k"  # it holds them now
            except OSError:
                return False


def _ended(child: int) -> bool:
    """Has our child exited? (Not reaped: its waiter still gets its status.)"""
    try:
        return os.waitid(os.P_PID, child, os.WEXITED | os.WNOHANG | os.WNOWAIT) is not None
    except ChildProcessError:
        return True


def take(name: str, keeper: int) -> list[int]:
    """Supervisor side: the descriptions the keeper (pid ``keeper``) hands down, kept open
    until we exit (never inherited by anything we spawn)."""
    import socket

    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as conn:
        conn.settimeout(_TIMEOUT)
        try:
            conn.connect(name)
            if peer(conn)[0] != keeper:
                return []
            _, fds, _, _ = socket.recv_fds(conn, 1, _MAX_FDS, socket.MSG_CMSG_CLOEXEC)
            conn.sendall(b"k")
        except OSError:
            return []
    return list(fds)
