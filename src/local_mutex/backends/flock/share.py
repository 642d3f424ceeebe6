"""A hold's lock, shared with the runs inside it (``run --reentrant``).

A run inside a hold holds nothing of its own, so the hold's end -- ``release``, its TTL,
its holder killed -- would let the next holder in while the run's command still runs.
The holder therefore listens on an abstract unix socket named after its pid; a run
inside the hold proves it may join (the hold's token, or the same job, and the same user)
and gets the holder's open file descriptions of the lock (SCM_RIGHTS). The run's keeper
and supervisor keep them, and its command inherits them as a plain run's command inherits
its own; the kernel holds the lock until the last of them is closed. The connection stays
open for the run's life and ends with a goodbye once the command is over. A holder that
ends while a run is inside, or after a run's connection closed without its goodbye (its
keeper and supervisor killed: the command may run on), closes its descriptions without
unlocking them; otherwise it unlocks them, so nothing a finished command left behind keeps
the lock. The holder names each run as it joins (a random name, which its command gets
too) and writes the names down in its record before the run has the descriptions (where
the disk takes them), so that
the command's own nested calls of the lock can tell whether their run left so -- asking
the holder, or once it is gone, its record: then the lock is their command's (they hold
it, through the description), and they run inside rather than wait for it -- for
themselves.

Linux only (abstract sockets, SO_PEERCRED); elsewhere a run inside a hold holds nothing,
as before.
"""

from __future__ import annotations

import os
import socket
import struct
import sys
import time

from ..._proc import peer
from ...identity import token_hash
from .lockdir import file_id

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable, Mapping, Sequence

SUPPORTED = sys.platform.startswith("linux")
_REQUEST_LIMIT = 4096
TIMEOUT = 2.0  # for a run: how long the holder may take to answer
_SERVE_TIMEOUT = 0.2  # for the holder: a peer that connects and says nothing stalls it no longer
# All the holder gives runs per tick: the rest wait for the next one. A release (SIGTERM,
# held back while the holder serves) then never waits on a crowd of silent connections.
_SERVE_BUDGET = 0.25
# What a run says on its connection once its command is over, before closing it.
BYE = b"bye\n"
_RUN_NAME = 12  # random bytes of a run's name: no other run's, whatever pids get reused
_HEX = set(b"0123456789abcdef")
# What a nested call asks, of the run its LOCAL_MUTEX_HOLD_RUN names: "left NAME".
_LEFT = "left"


def address(holder_pid: int, token_sha256: str) -> str:
    return f"\0local-mutex-hold-{holder_pid}-{token_sha256[:16]}"


class Sharing:
    """The holder's side: a listening socket, and the runs inside the hold."""

    def __init__(self, token: str, identity: Mapping[str, str] | None) -> None:
        """Bound before the hold's record is written: the name holds a digest of the token
        that nobody can know before, so nobody can take the name first."""
        self.token_sha256 = token_hash(token)
        self.identity = dict(identity) if identity else None
        self.listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.listener.bind(address(os.getpid(), self.token_sha256))
        self.listener.listen(64)
        self.listener.setblocking(False)
        self.inside: list[socket.socket] = []
        # The files (device, inode) each run inside joined with: its command holds them.
        self.files: dict[socket.socket, set[tuple[int, int]]] = {}
        # A run's connection closed without its goodbye: its command may still hold the lock,
        # and the files it joined with.
        self.dropped = False
        self.dropped_files: set[tuple[int, int]] = set()
        self.heard: dict[socket.socket, bytes] = {}  # what each run inside said so far
        self.names: dict[socket.socket, str] = {}  # the name we gave each run inside
        # The names of the runs that left so, oldest first.
        self.dropped_runs: dict[str, None] = {}

    def fileno(self) -> int:
        return self.listener.fileno()

    def serve(self, fds: Sequence[int], joining: Callable[[], object] = lambda: None) -> None:
        """Answer the runs that knocked (for a quarter second at most; the rest next tick):
        the lock's descriptions and a name for the run, or a refusal. Another user's
        connection is closed unread; our own user's gets a fraction of a second to ask (our
        user could end the hold anyway). ``joining``: called once a run is counted inside,
        named, and before it has the descriptions (the holder writes the name down)."""
        budget = time.monotonic() + _SERVE_BUDGET
        while time.monotonic() < budget:
            try:
                conn, _ = self.listener.accept()
            except OSError:  # nobody else waiting (or out of descriptors): next tick
                return
            try:
                if not _same_user(peer(conn)[1]):
                    conn.close()
                    continue
                asked = _read_line(conn, min(time.monotonic() + _SERVE_TIMEOUT, budget))
                if asked.startswith(f"{_LEFT} "):
                    self._answer_left(conn, asked)
                    continue
                if not fds or not self._may_join(asked):  # no file at the path: nothing to give
                    conn.sendall(b"no\n")
                    conn.close()
                    continue
                # Counted inside before it has the descriptions: a stop (``release``'s
                # SIGTERM raises in the holder) right after the send must still hand
                # the lock over rather than unlock what this run now shares.
                self.inside.append(conn)
                self.files[conn] = {file_id(fd) for fd in fds}
                self.names[conn] = name = os.urandom(_RUN_NAME).hex()
                joining()
                socket.send_fds(conn, [b"ok %s\n" % name.encode()], list(fds))
            except OSError:
                if conn in self.inside:
                    self.inside.remove(conn)
                    self.files.pop(conn, None)
                    self.names.pop(conn, None)
                conn.close()

    def share_more(self, fds: Sequence[int]) -> None:
        """At the hold's end, the file at the path (put back since some runs joined) for the
        runs inside. A run never reads it: queued on its socket it keeps the lock all the
        same, until the run closes the connection as it ends. Sent once, not at every
        put-back: queued descriptors count against the user's limit of open files."""
        for conn in self.inside if fds else ():
            try:
                socket.send_fds(conn, [b"+\n"], list(fds))
            except OSError:
                pass  # that run is gone

    def _answer_left(self, conn: socket.socket, request: str) -> None:
        """Did the run of that name leave without its goodbye? Looked at now: the
        connection of a run killed a moment ago is closed, and may not have been read."""
        self.in_use()
        left = request.partition(" ")[2] in self.dropped_runs
        conn.sendall(b"yes\n" if left else b"no\n")
        conn.close()

    def _may_join(self, request: str) -> bool:
        kind, _, value = request.partition(" ")
        if kind == "token":
            return token_hash(value) == self.token_sha256
        if kind == "job" and self.identity is not None:
            return value == _job_text(self.identity)
        return False

    def in_use(self) -> bool:
        """Must the hold's end leave the lock to the runs that joined it (close without
        unlocking)? Yes while a run is inside, and once a run has gone without saying its
        command was over: its keeper and supervisor died, and the command may run on."""
        still = []
        for conn in self.inside:
            ended, heard = _hear(conn)
            heard = self.heard.pop(conn, b"") + heard
            said = goodbye(ended, heard)
            if said is None:
                self.heard[conn] = heard[-_REQUEST_LIMIT:]
                still.append(conn)
                continue
            files, name = self.files.pop(conn, set()), self.names.pop(conn, None)
            if not said:
                self.dropped = True
                self.dropped_files |= files
                if name:
                    self.dropped_runs[name] = None
            conn.close()
        self.inside = still
        return bool(still) or self.dropped

    def runs_inside(self) -> list[str]:
        return [self.names[conn] for conn in self.inside if conn in self.names]

    def joined_with(self) -> set[tuple[int, int]]:
        """The files the commands of runs that joined may hold (the runs inside, and those
        gone without a goodbye). What a run was sent later (``share_more``) stays queued on
        its connection and goes with it: its command never has it."""
        return self.dropped_files.union(*self.files.values())

    def close(self) -> None:
        self.listener.close()
        for conn in self.inside:
            conn.close()
        self.inside, self.files, self.heard, self.names = [], {}, {}, {}


def join(
    holder_pid: int,
    token_sha256: str,
    token: str | None,
    identity: Mapping[str, str] | None,
    within: float = TIMEOUT,
) -> tuple[socket.socket, list[int], str | None] | None:
    """The run's side: the hold's descriptions of the lock (non-inheritable), the
    connection to keep open while inside, and the name the holder gave the run (which its
    command's nested calls know it by); None when the holder cannot be asked or says no
    (or does not answer ``within`` seconds: a stopped holder)."""
    if not SUPPORTED or not (token or identity):
        return None
    request = f"token {token}" if token else f"job {_job_text(identity or {})}"
    conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        _reach(conn, holder_pid, token_sha256, within)
        conn.sendall(request.encode("utf-8", "surrogateescape") + b"\n")
        # MSG_CMSG_CLOEXEC: the descriptions must never reach a command we spawn.
        msg, ancdata, _, _ = conn.recvmsg(64, socket.CMSG_SPACE(16 * 4), socket.MSG_CMSG_CLOEXEC)
    except OSError:
        conn.close()
        return None
    fds: list[int] = []
    for level, kind, data in ancdata:
        if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
            usable = len(data) - len(data) % 4
            fds += list(struct.unpack(f"{usable // 4}i", data[:usable]))
    said, _, name = msg.rstrip(b"\n").partition(b" ")
    if said != b"ok" or not msg.endswith(b"\n") or not fds:
        for fd in fds:
            os.close(fd)
        conn.close()
        return None
    return conn, fds, name.decode() if len(name) == 2 * _RUN_NAME and set(name) <= _HEX else None


def leave(conn: socket.socket) -> None:
    """The run's side, once its command is over (or never started): say so, then close."""
    try:
        conn.send(BYE, socket.MSG_DONTWAIT | socket.MSG_NOSIGNAL)
    except OSError:
        pass  # the holder is gone: nobody to tell
    conn.close()


def _hear(conn: socket.socket) -> tuple[bool, bytes]:
    """(Has the run's connection ended, what it said since we last looked): what came
    before its end of file, or before the reset a close with unread data gives."""
    said = b""
    try:
        conn.setblocking(False)
        while len(said) < _REQUEST_LIMIT:
            chunk = conn.recv(_REQUEST_LIMIT)
            if not chunk:
                break
            said += chunk
        else:
            return False, said  # more than a tick's share: the rest next tick
    except BlockingIOError:  # still connected
        return False, said
    except OSError:
        pass
    return True, said


def goodbye(ended: bool, heard: bytes) -> bool | None:
    """None while the run is inside (connected, no goodbye yet); else whether it said
    goodbye (its command is over) before its connection ended."""
    return True if BYE in heard else None if not ended else False


def left_without_goodbye(holder_pid: int, token_sha256: str, run: str) -> bool | None:
    """A nested call's side: did the run named ``run`` inside the hold of ``holder_pid``
    leave without its goodbye (its keeper and supervisor killed)? The holder then never
    unlocks the lock, which is that run's command's. None when it cannot be asked."""
    if not SUPPORTED:
        return None
    conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        _reach(conn, holder_pid, token_sha256, TIMEOUT)
        conn.sendall(f"{_LEFT} {run}\n".encode("utf-8", "surrogateescape"))
        answer = _read_line(conn, time.monotonic() + TIMEOUT)
    except OSError:
        return None
    finally:
        conn.close()
    return answer == "yes" if answer in ("yes", "no") else None


def _reach(conn: socket.socket, holder_pid: int, token_sha256: str, within: float) -> None:
    """Connect to the holder, or raise OSError. Never tell anything to anyone but the
    holder's own process, of our own user (or root): a hold of another user's is none of
    ours to run inside, root's runs included (whoever listens there may have planted the
    lock it points us to)."""
    conn.settimeout(within)
    _connect(conn, address(holder_pid, token_sha256), within)
    pid, uid = peer(conn)
    if pid != holder_pid or not _same_user(uid):
        raise OSError("not the holder")


def _connect(conn: socket.socket, name: str, within: float) -> None:
    """Connect, retrying while the holder's queue is full (it empties it every tick)."""
    deadline = time.monotonic() + within
    while True:
        try:
            conn.connect(name)
            return
        except (BlockingIOError, InterruptedError):
            if time.monotonic() > deadline:
                raise
            time.sleep(0.01)


def _same_user(uid: int) -> bool:
    """As ``release``: only the hold's own user (or root) may join it, or be joined."""
    return uid in (os.geteuid(), 0)


def _read_line(conn: socket.socket, deadline: float) -> str:
    data = b""
    while b"\n" not in data and len(data) < _REQUEST_LIMIT:
        left = deadline - time.monotonic()
        if left <= 0:
            raise TimeoutError("the request took too long")
        conn.settimeout(left)
        chunk = conn.recv(_REQUEST_LIMIT)
        if not chunk:
            break
        data += chunk
    return data.split(b"\n", 1)[0].decode("utf-8", "surrogateescape")


def _job_text(identity: Mapping[str, str]) -> str:
    return "\t".join(f"{key}={identity[key]}" for key in sorted(identity))
