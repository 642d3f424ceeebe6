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

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Sequence

# fd 3: the file put back (held); fd 4: a pipe to say it runs (it could not import, start or
# find its libraries otherwise) -- to a starter that may have died meanwhile, which must not
# end the guardian; fds 5 on: descriptions of our own of each deleted file the command's
# processes may hold the lock of (argv[1] says how many), waited for in turn.
_WAIT = (
    "import fcntl, os, sys\ntry:\n    os.write(4, b'.')\nexcept OSError:\n    pass\n"
    "os.close(4)\nfor fd in range(5, 5 + int(sys.argv[1])):\n    fcntl.flock(fd, fcntl.LOCK_EX)"
)
_STARTED_WITHIN = 5.0  # seconds; an interpreter starts in ~10 ms
SUPPORTED = USE_PROC  # Linux: a deleted file can be opened again through /proc/self/fd


def is_guardian(command: str) -> bool:
    """Is this (as ``_proc.cmdline`` joins it) a guardian's command line?"""
    return f" -I -S -c {_WAIT} " in command


def _interpreter() -> str | None:
    """The base interpreter, by its full path: argv[0] is where it looks for its own
    library, and a bare name would have it look in the working directory. None inside a
    program that embeds Python (its executable is that program)."""
    for candidate in (getattr(sys, "_base_executable", None), sys.executable):
        if candidate:
            real = os.path.realpath(candidate)
            if os.path.basename(real).startswith("python") and os.access(real, os.X_OK):
                return real
    return None


def start(put_back: int, watched: Sequence[int]) -> int | None:
    """A guardian that holds ``put_back`` while a lock on any of the ``watched`` (deleted)
    files lives -- the command's own, and those of files put back earlier that runs inside
    a hold joined with: its pid once it runs, or None where it cannot (no /proc to
    open a deleted file through, no interpreter to run, out of processes, or it did not
    start)."""
    python = _interpreter()
    if not SUPPORTED or python is None:
        return None
    opened: list[int] = []
    try:
        # Descriptions of our own of the (deleted) files: /proc/self/fd reopens them.
        fresh = []
        for fd in watched:
            fresh.append(os.open(f"{PROC}/self/fd/{fd}", os.O_RDONLY | os.O_CLOEXEC))
            opened.append(fresh[-1])
        said, says = os.pipe()
        opened += [said, says]
        given = (put_back, says, *fresh)
        last = 2 + len(given)  # the highest descriptor the guardian is given: 3, 4, 5...
        # The dup2 sources above every target, so that no step clobbers a later source.
        sources = [fcntl.fcntl(fd, fcntl.F_DUPFD_CLOEXEC, last + 1) for fd in given]
        opened += sources
        pid = os.posix_spawn(
            python,
            [python, "-I", "-S", "-c", _WAIT, str(len(fresh))],
            dict(os.environ),  # -I ignores PYTHON*; what the interpreter itself needs stays
            file_actions=[
                (os.POSIX_SPAWN_OPEN, 0, os.devnull, os.O_RDONLY, 0),
                (os.POSIX_SPAWN_OPEN, 1, os.devnull, os.O_WRONLY, 0),
                (os.POSIX_SPAWN_OPEN, 2, os.devnull, os.O_WRONLY, 0),
                *((os.POSIX_SPAWN_DUP2, src, 3 + i) for i, src in enumerate(sources)),
                *((os.POSIX_SPAWN_CLOSE, fd) for fd in _inherited(last)),
            ],
            setsid=True,
            setsigmask=(),
            setsigdef=(*STOP_SIGNALS, signal.SIGPIPE),
        )
        os.close(says)
        opened.remove(says)
        if _said_it_runs(said):
            return pid
        end(pid)
        return None
    except OSError:
        return None  # the keeper and the supervisor still hold it
    finally:
        for fd in opened:
            os.close(fd)


def _said_it_runs(said: int) -> bool:
    import select

    poller = select.poll()  # retried on a signal, with the time left (PEP 475)
    poller.register(said, select.POLLIN)
    return bool(poller.poll(_STARTED_WITHIN * 1000)) and os.read(said, 1) == b"."  # b"": died


def _inherited(last: int) -> list[int]:
    """Descriptors above ``last`` a spawned process would inherit (our caller's, without
    close-on-exec): the guardian must not keep a pipe or a socket of theirs open."""
    found = []
    for name in os.listdir(f"{PROC}/self/fd"):
        fd = int(name)
        try:
            if fd > last and os.get_inheritable(fd):
                found.append(fd)
        except OSError:
            continue  # the listing's own descriptor, closed by now
    return found


def ended(pid: int) -> int | None:
    """None while our guardian runs; else how it ended (a wait status; -1 if no child of
    ours has that pid any more). Collected now, if it was ours to collect."""
    try:
        done, status = os.waitpid(pid, os.WNOHANG)
    except ChildProcessError:
        return -1
    return None if done == 0 else status


def replace(previous: int | None, put_back: int, watched: Sequence[int]) -> int | None:
    """End the guardian of an earlier put-back, if any, and start one for this one."""
    end(previous)
    return start(put_back, watched)


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
