"""The supervisor acts on a stop whenever it came: also one whose handler the interpreter
marked due without waking the supervisor's sleep while it waits for the command. Such a
signal landed a moment before the sleep began (after an adopted orphan was reaped, say) --
a race no test can time; here it lands, as it would then, on a thread that is not the
one asleep. Before, the command then ran on to its own end: past its ``--timeout``, past a
stop relayed from the caller, and, once the caller was killed, past its death with the
lock still held. Real processes, a real lock, real signals."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from helpers import SRC, clean_env, lock_file, lock_is_free, read_pid, wait_for

# The CLI in-process, traced: in the supervisor (a fork of this program), as it begins to
# wait for the command, the main thread blocks THE_SIGNAL and a new thread takes them instead
# -- the interpreter then marks their handlers due and nothing ends the main thread's sleep.
HOST = """
import os, signal, sys, threading, time
from local_mutex.cli import main

HOST = os.getpid()
SIGNALS = {THE_SIGNAL}

def take_them():
    signal.pthread_sigmask(signal.SIG_UNBLOCK, SIGNALS)
    open(READY, "w").close()
    time.sleep(600)

def tracer(frame, event, arg):
    if event == "call" and frame.f_code.co_name == "_wait_command" and os.getpid() != HOST:
        sys.settrace(None)
        signal.pthread_sigmask(signal.SIG_BLOCK, SIGNALS)
        threading.Thread(target=take_them, daemon=True).start()
    return None

sys.settrace(tracer)
sys.exit(main(ARGV))
"""

CASES = {
    # the run ceiling's alarm
    "timeout": ("SIGALRM", ["--timeout", "1"], None, 124),
    # a stop the caller relays (a runner's cancel)
    "relayed stop": ("SIGTERM", [], signal.SIGTERM, 143),
    # the caller killed outright: the supervisor's own watcher says "stop now" (SIGUSR1)
    "caller killed": ("SIGUSR1", [], signal.SIGKILL, -9),
}


@pytest.mark.timeout(90)
@pytest.mark.parametrize("case", sorted(CASES))
def test_a_stop_the_interpreter_marked_due_ends_the_command_at_once(
    case: str, lock_dir: Path, tmp_path: Path
) -> None:
    name, options, send, code = CASES[case]
    ready, pid_file = tmp_path / "ready", tmp_path / "cmd.pid"
    argv = [*options, "db", f"echo $$ > {pid_file}; exec sleep 60", str(lock_dir)]
    program = (
        HOST.replace("THE_SIGNAL", f"signal.{name}")
        .replace("READY", repr(str(ready)))
        .replace("ARGV", repr(argv))
    )
    host = subprocess.Popen(
        [sys.executable, "-c", textwrap.dedent(program)],
        env=clean_env({"PYTHONPATH": str(SRC)}),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert host.stderr is not None
    command = read_pid(pid_file)
    try:
        wait_for(ready)
        if send is not None:
            host.send_signal(send)
        # Before, the command slept out its 60 s (and the lock stayed held).
        assert host.wait(30) == code, host.stderr.read()
        wait_for(lambda: not _runs(command), 20, "the command to end")
        wait_for(lambda: lock_is_free(lock_file(lock_dir, "db")), 20, "the lock to be free")
        err = host.stderr.read()
        assert "Traceback" not in err, err
    finally:
        host.kill()
        host.wait()
        host.stderr.close()
        if _runs(command):
            os.kill(command, signal.SIGKILL)


def _runs(pid: int) -> bool:
    """Alive and not a zombie (the supervisor may not have reaped it yet)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return False
