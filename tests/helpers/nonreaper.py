"""A parent that never reaps what it adopts — a container's PID 1 without an init.

    python nonreaper.py plain|subreaper|pid1 RESULT_JSON READY_MARK STDERR_FILE -- PROGRAM ARGS...

``plain`` changes nothing (orphans go wherever this machine sends them); ``subreaper``
makes this process a child subreaper (prctl PR_SET_CHILD_SUBREAPER), so the
orphans of everything below it are re-parented here; ``pid1`` expects to be PID 1 of a fresh
PID namespace already (``unshare -fp --mount-proc``). Either way orphans are adopted here and
left as zombies. Starts PROGRAM, waits for READY_MARK, sends SIGTERM to PROGRAM, collects
only PROGRAM (waitpid on its pid) and writes ``{"status": ..., "elapsed": ...}`` to
RESULT_JSON; then kills whatever is left below it and exits without reaping.
"""

from __future__ import annotations

import ctypes
import json
import os
import signal
import sys
import time

PR_SET_CHILD_SUBREAPER = 36
CEILING = 25.0


def main() -> int:
    mode, result, ready, err_path = sys.argv[1:5]
    if sys.argv[5] != "--":
        raise SystemExit("usage: nonreaper.py MODE RESULT READY STDERR -- PROGRAM ARGS...")
    argv = sys.argv[6:]
    if mode == "subreaper":
        libc = ctypes.CDLL(None, use_errno=True)
        if libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) != 0:
            raise SystemExit(f"prctl: {os.strerror(ctypes.get_errno())}")
    elif mode == "pid1" and os.getpid() != 1:
        raise SystemExit("pid1 mode needs a fresh PID namespace")
    err_fd = os.open(err_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    null = os.open(os.devnull, os.O_RDWR)
    pid = os.posix_spawn(
        argv[0],
        argv,
        dict(os.environ),
        file_actions=[
            (os.POSIX_SPAWN_DUP2, null, 0),
            (os.POSIX_SPAWN_DUP2, null, 1),
            (os.POSIX_SPAWN_DUP2, err_fd, 2),
        ],
    )
    deadline = time.monotonic() + CEILING
    outcome: dict[str, object] = {}
    while not os.path.exists(ready):
        if time.monotonic() > deadline or os.waitpid(pid, os.WNOHANG)[0] == pid:
            outcome["error"] = "the command never got ready"
            break
        time.sleep(0.02)
    if "error" not in outcome:
        t0 = time.monotonic()
        os.kill(pid, signal.SIGTERM)
        status = None
        while time.monotonic() < t0 + CEILING:
            done, st = os.waitpid(pid, os.WNOHANG)  # only our child: adopted zombies stay
            if done == pid:
                status = os.waitstatus_to_exitcode(st)
                break
            time.sleep(0.01)
        outcome.update(status=status, elapsed=time.monotonic() - t0)
    tmp = result + ".tmp"
    with open(tmp, "w") as f:
        json.dump(outcome, f)
    os.rename(tmp, result)
    # Leave nothing running below us (zombies go with us to our own parent).
    for _ in range(2):
        for child in _descendants(os.getpid()):
            try:
                os.kill(child, signal.SIGKILL)
            except OSError:
                pass
        time.sleep(0.05)
    return 0


def _descendants(pid: int) -> list[int]:
    out: list[int] = []
    todo = _children(pid)
    while todo:
        p = todo.pop()
        if p not in out:
            out.append(p)
            todo.extend(_children(p))
    return out


def _children(pid: int) -> list[int]:
    out: list[int] = []
    try:
        tasks = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return out
    for task in tasks:
        try:
            with open(f"/proc/{pid}/task/{task}/children") as f:
                out.extend(int(c) for c in f.read().split())
        except OSError:
            continue
    return out


if __name__ == "__main__":
    sys.exit(main())
