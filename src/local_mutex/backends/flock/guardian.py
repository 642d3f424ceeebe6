"""A guardian for a lock file put back while the command runs (Linux).

The command holds the description of the file it was started under. Once a tmp cleaner
deleted that file, the file put back at the path is held by the keeper and the supervisor
alone: were both killed (``kill -9`` of both, ``pkill -9 -f local-mutex``), a newcomer would
take the path's file while the command still ran. The guardian is a tiny interpreter that
inherits the description put back, opens a description of its own of the deleted file and
asks the kernel for an exclusive flock on it: granted the instant the last holder of the
command's lock on that file is gone, the guardian then exits and lets the file put back go.
No polling, and no view of /proc/locks (a container's pid namespace hides a dead owner's
locks there); holding the deleted inode open also keeps its number from being reused.

It runs the base interpreter (not a virtualenv's, whose path may name local-mutex, so
``pkill -f local-mutex`` leaves it be), in a session of its own (no job-control signal or
hangup meant for the command's terminal reaches it, and it is no group of the command's),
with /dev/null for its standard streams (a reader of our output gets its end of file) and
no descriptor of ours but the two it needs.
"""

from __future__ import annotations

import fcntl
import os
import sys

from ..._fastsignal import STOP_SIGNALS, signal
from ..._proc import PROC, USE_PROC

# fd 3: the file put back (held); fd 4: our own description of the command's deleted file.
_WAIT = "import fcntl\nfcntl.flock(4, fcntl.LOCK_EX)"
_FIRST_FREE = 10  # dup2 sources above the targets, so neither clobbers the other


def _interpreter() -> str:
    base = getattr(sys, "_base_executable", None) or sys.executable
    return os.path.realpath(base)


def replace(previous: int | None, put_back: int, watched: int) -> int | None:
    """End the guardian of an earlier put-back, if any, and start one that holds
    ``put_back`` while the command's lock on ``watched``'s file lives: its pid, or None
    where it cannot (no /proc to open a deleted file through, out of processes)."""
    end(previous)
    if not USE_PROC:
        return None
    opened: list[int] = []
    try:
        # A description of our own of the (deleted) file: /proc/self/fd reopens it.
        fresh = os.open(f"{PROC}/self/fd/{watched}", os.O_RDONLY | os.O_CLOEXEC)
        opened.append(fresh)
        sources = [fcntl.fcntl(fd, fcntl.F_DUPFD_CLOEXEC, _FIRST_FREE) for fd in (put_back, fresh)]
        opened += sources
        return os.posix_spawn(
            _interpreter(),
            [os.path.basename(_interpreter()), "-I", "-S", "-c", _WAIT],
            {},
            file_actions=[
                (os.POSIX_SPAWN_OPEN, 0, os.devnull, os.O_RDONLY, 0),
                (os.POSIX_SPAWN_OPEN, 1, os.devnull, os.O_WRONLY, 0),
                (os.POSIX_SPAWN_OPEN, 2, os.devnull, os.O_WRONLY, 0),
                (os.POSIX_SPAWN_DUP2, sources[0], 3),
                (os.POSIX_SPAWN_DUP2, sources[1], 4),
                *((os.POSIX_SPAWN_CLOSE, fd) for fd in _inherited()),
            ],
            setsid=True,
            setsigmask=(),
            setsigdef=(*STOP_SIGNALS, signal.SIGPIPE),
        )
    except OSError:
        return None  # the keeper and the supervisor still hold it
    finally:
        for fd in opened:
            os.close(fd)


def _inherited() -> list[int]:
    """Descriptors above 4 a spawned process would inherit (our caller's, without
    close-on-exec): the guardian must not keep a pipe or a socket of theirs open."""
    found = []
    for name in os.listdir(f"{PROC}/self/fd"):
        fd = int(name)
        try:
            if fd > 4 and os.get_inheritable(fd):
                found.append(fd)
        except OSError:
            continue  # the listing's own descriptor, closed by now
    return found


def end(pid: int | None) -> None:
    """Stop a guardian and collect it. Only while it is our uncollected child: then its pid
    is no one else's (one that ended by itself may have been collected, and its pid
    reused, by ``each``'s collecting of strays or an embedding program's own wait())."""
    if pid is None:
        return
    try:
        if os.waitpid(pid, os.WNOHANG)[0] == 0:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
    except ChildProcessError:
        pass
