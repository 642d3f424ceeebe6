"""A guardian for a lock file put back while the command runs (Linux).

The command holds the description of the file it was started under. Once a tmp cleaner
deleted that file, the file put back at the path is held by the keeper and the supervisor
alone: were both killed (``kill -9`` of both, ``pkill -9 -f local-mutex``), a newcomer would
take the path's file while the command still ran. The guardian is a small shell loop that
inherits the description put back and lives as long as the deleted file's lock does: until
the run lets go, or the command's last process ends (then half a second more at most: it
looks at /proc/locks every half second). It has a session of its own (no job-control signal
or hangup meant for the command's terminal reaches it, and it is no group of the
command's), /dev/null for its standard streams (a reader of our output gets its end of
file), and a command line that names no local-mutex, so ``pkill -f local-mutex`` leaves it
be.
"""

from __future__ import annotations

import os

from ..._fastsignal import STOP_SIGNALS, signal
from ..._proc import PROC, USE_PROC

# $1: the deleted file's MAJ:MIN:INODE as /proc/locks prints it. Only granted locks count
# (a waiter's line has "->" where FLOCK is). Read by the shell itself: only `sleep` is
# started, every half second, without the lock's descriptor (3 or 4).
_LOOP = (
    'held() { while read -r _ kind rest; do case "$kind $rest" in "FLOCK "*" $1 "*) return 0'
    ";; esac; done < /proc/locks; return 1; }; "
    'while held "$1"; do sleep 0.5 3>&- 4>&- || sleep 1 3>&- 4>&-; done'
)


def replace(previous: int | None, put_back: int, watched: int) -> int | None:
    """End the guardian of an earlier put-back, if any, and start one that holds
    ``put_back`` while the lock on ``watched``'s file (the command's) lives: its pid, or
    None where there is no /proc/locks to watch or it could not start."""
    end(previous)
    if not USE_PROC or not os.path.exists(os.path.join(PROC, "locks")):
        return None
    st = os.fstat(watched)
    key = f"{os.major(st.st_dev):02x}:{os.minor(st.st_dev):02x}:{st.st_ino}"
    actions = [
        (os.POSIX_SPAWN_OPEN, 0, os.devnull, os.O_RDONLY, 0),
        (os.POSIX_SPAWN_OPEN, 1, os.devnull, os.O_WRONLY, 0),
        (os.POSIX_SPAWN_OPEN, 2, os.devnull, os.O_WRONLY, 0),
        # dup2 onto another number clears close-on-exec; onto the same one it may not.
        (os.POSIX_SPAWN_DUP2, put_back, 3 if put_back != 3 else 4),
    ]
    try:
        return os.posix_spawn(
            "/bin/sh",
            ["sh", "-c", _LOOP, "sh", key],
            {"PATH": os.environ.get("PATH") or os.defpath},
            file_actions=actions,
            setsid=True,
            setsigmask=(),
            setsigdef=(*STOP_SIGNALS, signal.SIGPIPE),
        )
    except OSError:
        return None  # out of processes: the keeper and the supervisor still hold it


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
