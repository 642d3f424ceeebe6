"""The keeper hands new descriptions of the lock down to the supervisor.

Both hold the lock's open file descriptions so that neither death frees the lock while the
command runs. A description the keeper opens mid-run -- a lock file it put back at the path
after someone deleted ours -- would be the keeper's alone: killed then, it would free the
file at the path while the supervisor still stops the command. So the keeper passes it on
(SCM_RIGHTS): it listens on an abstract unix socket of a random name, tells the supervisor
the name over the pipe the supervisor watches, and sends the descriptions to that process
only (its pid, checked on the socket). Rare, so nothing here loads before it is needed.
"""

from __future__ import annotations

import os

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Sequence

# Long enough for a busy machine; the keeper's checks wait meanwhile.
_TIMEOUT = 2.0
_LOOK = 0.05  # how often the keeper looks whether the supervisor ended meanwhile
_MAX_FDS = 16


def give(supervisor: int, life: int, fds: Sequence[int]) -> bool:
    """Keeper side: True once the supervisor holds ``fds`` too, or has ended (then so has
    the command: nothing is left to keep the lock for); False if it did not take them."""
    import socket
    import struct
    import time

    name = f"\0local-mutex-handdown-{os.getpid()}-{os.urandom(8).hex()}"
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as listener:
        try:
            listener.bind(name)  # abstract names are Linux's: elsewhere, the keeper's alone
            listener.listen(4)
            os.write(life, f"fds {name[1:]}\n".encode())
        except OSError:
            return _ended(supervisor)
        deadline = time.monotonic() + _TIMEOUT
        while True:
            if _ended(supervisor):
                return True
            if time.monotonic() > deadline:
                return False  # a supervisor that is frozen or too busy, or a flood of others
            listener.settimeout(_LOOK)
            try:
                conn, _ = listener.accept()
            except OSError:
                continue
            with conn:
                creds = conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, 12)
                if struct.unpack("3i", creds)[0] != supervisor:
                    continue  # not our supervisor: it gets nothing
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
    import struct

    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as conn:
        conn.settimeout(_TIMEOUT)
        try:
            conn.connect("\0" + name)
            creds = conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, 12)
            if struct.unpack("3i", creds)[0] != keeper:
                return []
            _, fds, _, _ = socket.recv_fds(conn, 1, _MAX_FDS, socket.MSG_CMSG_CLOEXEC)
            conn.sendall(b"k")
        except OSError:
            return []
    return list(fds)
