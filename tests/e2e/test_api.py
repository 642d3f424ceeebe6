"""The Python API: the same lock as the CLI, typed errors, nothing printed by default."""

from __future__ import annotations

import math
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

import local_mutex
from helpers import (
    CLI,
    Procs,
    clean_env,
    hold_file,
    hold_until,
    lock_file,
    pyenv_python,
    wait_for,
)


def test_lock_path_matches_the_cli(lock_dir: Path) -> None:
    assert local_mutex.lock_path("x/y", str(lock_dir)) == str(lock_file(lock_dir, "x/y"))
    assert local_mutex.lock_path(b"\xff", str(lock_dir)) == str(lock_file(lock_dir, b"\xff"))
    with pytest.raises(local_mutex.InvalidName):
        local_mutex.lock_path("", str(lock_dir))
    with pytest.raises(local_mutex.InvalidLockDir):
        local_mutex.lock_path("x", "relative")


def test_run_returns_the_status_and_prints_nothing(
    lock_dir: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    result = local_mutex.run("api", command="exit 4", lock_dir=str(lock_dir))
    assert result.status == 4
    assert capfd.readouterr().err == ""
    # Printed, it says what it holds (it was ``<local_mutex.runspec.RunResult object …>``).
    assert repr(result).startswith("RunResult(acquired=True, held=")
    assert "status=4, stop_signal=0, timed_out=False, waited=" in repr(result)


def test_run_takes_an_argv_verbatim(lock_dir: Path, marks: Path) -> None:
    weird = "it's $HOME; `x`"
    result = local_mutex.run(
        "api",
        argv=["sh", "-c", 'printf %s "$1" > "$2"', "sh", weird, str(marks / "out")],
        lock_dir=str(lock_dir),
    )
    assert result.status == 0
    assert (marks / "out").read_text() == weird


def test_the_old_positional_call_fails_loudly(lock_dir: Path) -> None:
    """run(command, name) was the 1.x signature: it must not run anything now."""
    with pytest.raises(TypeError):
        local_mutex.run("touch x", "api", lock_dir=str(lock_dir))  # type: ignore[call-arg]
    with pytest.raises(local_mutex.ValidationError):
        local_mutex.run("api", lock_dir=str(lock_dir))  # neither command nor argv


def test_run_raises_typed_errors(lock_dir: Path) -> None:
    with pytest.raises(local_mutex.InvalidCommand):
        local_mutex.run("api", command=" ", lock_dir=str(lock_dir))
    with pytest.raises(local_mutex.InvalidName):
        local_mutex.run("a\nb", command="true", lock_dir=str(lock_dir))
    with pytest.raises(local_mutex.ValidationError):
        local_mutex.run("api", command="true", lock_dir="/nonexistent/dir")


@pytest.mark.parametrize(
    "bad",
    [
        {"timeout": math.inf},
        {"timeout": math.nan},
        {"timeout": 1e10},
        {"timeout": 0},
        {"timeout": -5},
        {"wait": -1},
        {"wait": math.nan},
        {"kill_after": -1},
        {"kill_after": "5"},
        {"command": "echo a\0b"},
        {"argv": ["echo", "a\0b"]},
        {"argv": "true"},
    ],
    ids=repr,
)
def test_run_refuses_what_the_cli_refuses_before_taking_the_lock(
    lock_dir: Path, marks: Path, bad: dict[str, Any]
) -> None:
    """Each used to start the command (or take the lock) and end in 70 or 124."""
    kwargs: dict[str, Any] = {"command": f"touch '{marks}/ran'", **bad}
    if "argv" in bad:
        del kwargs["command"]
    with pytest.raises(local_mutex.ValidationError):
        local_mutex.run("api", lock_dir=str(lock_dir), **kwargs)
    assert not (marks / "ran").exists()
    assert not list(lock_dir.iterdir())


def test_run_takes_the_remote_from_the_environment_as_the_cli_does(
    lock_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """$LOCAL_MUTEX_REMOTE: the same name locks in the same place whoever takes it."""
    repo = tmp_path / "locks.git"
    subprocess.run(["git", "init", "-q", "--bare", str(repo)], check=True)
    monkeypatch.setenv("LOCAL_MUTEX_REMOTE", f"file://{repo}")
    assert local_mutex.run("api", argv=["true"], lock_dir=str(lock_dir)).status == 0
    assert not list(lock_dir.iterdir())  # not this machine's lock dir
    refs = subprocess.run(
        ["git", "--git-dir", str(repo), "for-each-ref", "--format=%(refname)"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert refs.strip(), "no lock branch on the remote"
    with pytest.raises(local_mutex.ValidationError):
        local_mutex.run("api", argv=["true"], remote=" ")


def test_hold_serializes_against_the_cli(lock_dir: Path, marks: Path) -> None:
    with local_mutex.hold("api", lock_dir=str(lock_dir), message="migrating") as held:
        assert held.path == str(lock_file(lock_dir, "api"))
        r = subprocess.run(
            [*CLI, "--no-wait", "api", f"touch '{marks}/ran'", str(lock_dir)],
            env=clean_env(),
            capture_output=True,
            timeout=20,
        )
        assert r.returncode == 75
        assert b"migrating" in r.stderr
        # Inside the block a run on the same name is reentrant instead of deadlocking.
        assert local_mutex.run("api", command="exit 0", lock_dir=str(lock_dir)).status == 0
    assert not (marks / "ran").exists()
    assert local_mutex.run("api", command="exit 0", lock_dir=str(lock_dir), wait=0).status == 0


def test_hold_waits_for_the_cli_and_gives_up_with_not_acquired(
    procs: Procs, lock_dir: Path, marks: Path
) -> None:
    holder = procs.start(["api", hold_until(marks), str(lock_dir)])
    wait_for(marks / "h.held")
    with (
        pytest.raises(local_mutex.NotAcquired) as info,
        local_mutex.hold("api", lock_dir=str(lock_dir), wait=0.3),
    ):
        pass
    assert isinstance(info.value.holder, dict) and info.value.holder["pid"] == holder.pid
    (marks / "h.go").touch()
    with local_mutex.hold("api", lock_dir=str(lock_dir), wait=20) as held:
        assert held.waited >= 0
    assert holder.wait(20) == 0


def test_run_reports_numbers(lock_dir: Path) -> None:
    result = local_mutex.run("api", command="sleep 0.2", lock_dir=str(lock_dir))
    assert result.status == 0 and result.acquired and not result.timed_out
    assert result.held >= 0.15 and result.waited < 5  # spawn is stamped once it returns


def _script(
    code: str, *args: Path, python: list[str] | None = None, src: Path | None = None
) -> subprocess.CompletedProcess[str]:
    """Run ``code`` in a Python of its own (``src``: import the package from there); it
    must succeed."""
    out = subprocess.run(
        [*(python or [sys.executable]), "-c", code, *map(str, args)],
        env=clean_env({"PYTHONPATH": str(src)} if src else None),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 0, out.stderr
    return out


REAPED = """
import os, sys
import local_mutex
lock_dir = sys.argv[1]
assert local_mutex.run("api", command="exit 3", lock_dir=lock_dir).status == 3
try:
    local_mutex.run("api", argv=["/nonexistent/program"], lock_dir=lock_dir)
except local_mutex.SpawnError:
    pass
else:
    raise SystemExit("a program that does not exist ran")
try:
    os.waitpid(-1, os.WNOHANG)
except ChildProcessError:
    print("no children left")
"""


def test_run_leaves_no_child_behind_not_even_a_zombie(lock_dir: Path) -> None:
    """The lock is let go while the supervisor still exits, but the supervisor is reaped
    before run() returns, also when the command could not start."""
    assert _script(REAPED, lock_dir).stdout == "no children left\n"


RAISING_HANDLER = """
import os, signal, sys
import local_mutex
lock_dir, marks = sys.argv[1], sys.argv[2]
class Limit(Exception):
    pass
def on_alarm(signum, frame):
    raise Limit()
signal.signal(signal.SIGALRM, on_alarm)
# The limit runs out once the command runs (a timer ran out before it started, under load).
command = f"echo $$ > {marks}/pid; kill -ALRM {os.getpid()}; exec sleep 1000"
try:
    local_mutex.run("api", command=command, lock_dir=lock_dir)
except Limit:
    pass
pid = int(open(f"{marks}/pid").read())
try:
    os.kill(pid, 0)
    print("the command still runs")
except ProcessLookupError:
    pass
try:
    os.waitpid(-1, os.WNOHANG)
    print("a child is left")
except ChildProcessError:
    print("stopped and reaped")
"""


def test_an_exception_mid_run_stops_the_command_and_returns(lock_dir: Path, marks: Path) -> None:
    """A caller's own signal handler raises while run() waits (a time limit around the
    call): the exception comes back once the command has been stopped, not when it ends."""
    assert _script(RAISING_HANDLER, lock_dir, marks).stdout == "stopped and reaped\n"
    free = subprocess.run([*CLI, "--no-wait", "api", "true", str(lock_dir)], env=clean_env())
    assert free.returncode == 0


NO_FORK_WARNING = """
import sys
import local_mutex
lock_dir = sys.argv[1]
with local_mutex.hold("api", lock_dir=lock_dir):  # its watcher is a thread of its own
    assert local_mutex.run("api", command="exit 0", lock_dir=lock_dir).status == 0
print("quiet")
"""


def _python_312_or_newer() -> str | None:
    if sys.version_info >= (3, 12):
        return sys.executable
    return pyenv_python("3.13") or pyenv_python("3.12")


@pytest.mark.skipif(_python_312_or_newer() is None, reason="no Python 3.12 or newer here")
def test_a_run_inside_a_hold_forks_without_a_deprecation_warning(lock_dir: Path) -> None:
    """Python 3.12+ warns about fork() in a process with threads, counting the kernel's
    threads: hold()'s watcher counts, and our fork is one of the safe kind."""
    python = _python_312_or_newer()
    assert python is not None
    src = Path(local_mutex.__file__).resolve().parent.parent
    out = _script(
        NO_FORK_WARNING, lock_dir, python=[python, "-W", "always::DeprecationWarning"], src=src
    )
    assert out.stdout == "quiet\n" and "DeprecationWarning" not in out.stderr


def test_hold_with_a_wait_ceiling_works_off_the_main_thread(lock_dir: Path) -> None:
    import threading

    outcome: list[object] = []

    def worker() -> None:
        try:
            with local_mutex.hold("thread", lock_dir=str(lock_dir), wait=0.2):
                outcome.append("held")
        except Exception as exc:  # reported to the main thread below
            outcome.append(exc)

    with local_mutex.hold("thread", lock_dir=str(lock_dir)):
        t = threading.Thread(target=worker)
        t.start()
        t.join(20)
    assert len(outcome) == 1 and isinstance(outcome[0], local_mutex.NotAcquired)
    t = threading.Thread(target=worker)
    t.start()
    t.join(20)
    assert outcome[1] == "held"


def test_run_off_the_main_thread_is_refused_before_anything_runs(
    lock_dir: Path, marks: Path
) -> None:
    import threading

    caught: list[BaseException] = []

    def go() -> None:
        try:
            local_mutex.run("api", command=f"touch {marks}/ran", lock_dir=str(lock_dir))
        except BaseException as exc:  # handed to the main thread
            caught.append(exc)

    thread = threading.Thread(target=go)
    thread.start()
    thread.join(30)
    assert len(caught) == 1 and isinstance(caught[0], local_mutex.ValidationError)
    assert "main thread" in str(caught[0])
    assert not (marks / "ran").exists()
    assert not lock_file(lock_dir, "api").exists()  # not even opened


THREADING_FROM_A_WORKER = """
import _thread, sys, time
import local_mutex
done = []
def worker():
    import threading  # a library imported lazily off the main thread, e.g. logging
    done.append(1)
_thread.start_new_thread(worker, ())
while not done:
    time.sleep(0.01)
print(local_mutex.run("api", command="exit 5", lock_dir=sys.argv[1]).status)
"""


def test_run_on_the_main_thread_works_whoever_imported_threading(lock_dir: Path) -> None:
    """Before 3.13, threading.main_thread() names the thread that imported threading
    first; the main thread must not be refused because a worker did."""
    assert _script(THREADING_FROM_A_WORKER, lock_dir).stdout == "5\n"


CLOSED_STDOUT = """
import os, sys
import local_mutex
lock_dir, marks = sys.argv[1], sys.argv[2]
os.close(1)  # the caller's stdout is closed: the lock file takes descriptor 1
probe = "import os, sys; open(sys.argv[1], 'w').write('closed' if sys.stdout is None else 'open')"
program = [sys.executable, "-c", probe + "; os.write(1, b'GARBAGE')", f"{marks}/fd1"]
status = local_mutex.run("api", argv=program, lock_dir=lock_dir).status
sys.stderr.write(f"{status}\\n")
"""


def test_run_never_hands_the_lock_file_to_the_command_as_a_standard_stream(
    lock_dir: Path, marks: Path
) -> None:
    out = _script(CLOSED_STDOUT, lock_dir, marks)
    assert out.stderr.splitlines()[-1] == "1"  # its write to stdout failed: EBADF
    assert (marks / "fd1").read_text() == "closed"  # for the command, as for its caller
    assert b"GARBAGE" not in lock_file(lock_dir, "api").read_bytes()


def test_a_wait_with_a_ceiling_keeps_the_callers_own_alarm(lock_dir: Path, marks: Path) -> None:
    """The wait ceiling is a SIGALRM timer; it replaced an embedding program's own
    (``signal.alarm``), which then never fired. The caller's timer comes back after."""
    import signal
    import time

    from local_mutex.backends.flock import kernel

    path = lock_dir / "busy.lock"
    path.touch()
    holder = hold_file(path, marks / "held", marks / "go")
    fired: list[float] = []
    previous = signal.signal(signal.SIGALRM, lambda signum, frame: fired.append(time.monotonic()))
    fd = os.open(path, os.O_RDONLY)
    try:
        wait_for(marks / "held")
        signal.setitimer(signal.ITIMER_REAL, 0.2)
        assert kernel.wait_lock(fd, timeout=0.5) is False
        done = time.monotonic()
        wait_for(lambda: bool(fired), 5, "the caller's own alarm")
        assert fired[0] - done < 1.0
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
        os.close(fd)
        (marks / "go").touch()
        assert holder.wait(20) == 0


NESTED_IN_API_HOLD = """
import sys
import local_mutex
lock_dir, shared = sys.argv[1], sys.argv[2] == "shared"
nested = '"$LOCAL_MUTEX_CLI" --no-wait {} api true ' + lock_dir
with local_mutex.hold("api", lock_dir=lock_dir, shared=shared):
    for mode in ("--shared", ""):
        r = local_mutex.run("api", command=nested.format(mode), lock_dir=lock_dir, shared=shared)
        print(mode or "exclusive", r.status)
"""


@pytest.mark.parametrize("mode", ["exclusive", "shared"])
def test_a_nested_cli_call_inside_a_run_inside_a_hold_runs_within_it(
    lock_dir: Path, mode: str
) -> None:
    """``with hold(n): run(n, command='"$LOCAL_MUTEX_CLI" n ...')``: the run runs within the
    hold, and so must the command's own call, in the hold's mode. It waited for the hold
    (here: --no-wait failed with 75); an exclusive call inside a shared hold is refused (2)."""
    out = _script(NESTED_IN_API_HOLD, lock_dir, Path(mode))
    exclusive = "0" if mode == "exclusive" else "2"
    assert out.stdout.splitlines() == ["--shared 0", f"exclusive {exclusive}"], out.stderr


SPELLINGS_IN_API_HOLD = """
import sys
import local_mutex
lock_dir = sys.argv[1]
with local_mutex.hold("api", lock_dir=lock_dir + "//"):
    for spelled in (lock_dir, lock_dir + "/./", lock_dir + ".link"):
        r = local_mutex.run("api", command="true", lock_dir=spelled, wait=0)
        print(r.status, r.reentrant)
"""


def test_a_run_inside_a_hold_finds_it_however_the_lock_dir_is_spelled(lock_dir: Path) -> None:
    """The hold's lock dir given as ``d//``, the run's as ``d``, ``d/./`` or a symlink to
    ``d``: one lock file, so the run runs within the hold. It waited for the hold (here:
    wait=0 failed with NotAcquired)."""
    Path(f"{lock_dir}.link").symlink_to(lock_dir)
    out = _script(SPELLINGS_IN_API_HOLD, lock_dir)
    assert out.stdout.splitlines() == ["0 True"] * 3, out.stderr


PUT_BACK_IN_API_HOLD = """
import os, sys
import local_mutex
lock_dir = sys.argv[1]
path = local_mutex.lock_path("api", lock_dir=lock_dir)
busy = 'import fcntl, os, sys; fcntl.flock(os.open(sys.argv[1], 0), fcntl.LOCK_EX | fcntl.LOCK_NB)'
command = (
    'rm "$LOCK"; '  # a tmp cleaner; the hold puts a locked file back
    'until [ -e "$LOCK" ] && ! "$LOCAL_MUTEX_PYTHON" -c "$BUSY" "$LOCK" 2>/dev/null; do '
    'sleep 0.05; done; '
    '"$LOCAL_MUTEX_CLI" --no-wait api true'
)
env = {**os.environ, "LOCK": path, "BUSY": busy}
with local_mutex.hold("api", lock_dir=lock_dir):
    r = local_mutex.run("api", command=command, lock_dir=lock_dir, env=env)
    print(r.status)
"""


def test_a_nested_call_finds_a_python_hold_after_its_file_was_put_back(lock_dir: Path) -> None:
    """``with hold(n): run(n, ...)`` whose command's own call comes after a tmp cleaner
    deleted the lock file: the hold put a locked file back (in the Python process, not the
    run's supervisor that the call's entry names), and the call still runs within the
    hold. It waited for the hold (here: --no-wait failed with 75)."""
    out = _script(PUT_BACK_IN_API_HOLD, lock_dir)
    assert out.stdout.splitlines() == ["0"], out.stderr


SIGNAL_AT_THE_FORK = """
import os, signal, sys, threading
import local_mutex
lock_dir, marks, inside = sys.argv[1], sys.argv[2], sys.argv[3] == "inside"
idle = threading.Event()
other = threading.Thread(target=idle.wait, daemon=True)
other.start()
sent = []
def to_the_other_thread():
    # The main thread has the stop signals blocked across the fork; another thread takes
    # this one, and Python runs its handler in the main thread at the next bytecode.
    if not sent:
        sent.append(1)
        signal.pthread_kill(other.ident, signal.SIGTERM)
os.register_at_fork(after_in_parent=to_the_other_thread)
command = (
    f"trap 'touch {marks}/stopped; exit 7' TERM; touch {marks}/started; "
    f"i=0; while [ $i -lt 400 ]; do sleep 0.05; i=$((i+1)); done"
)
if inside:
    with local_mutex.hold("fork", lock_dir=lock_dir):
        r = local_mutex.run("fork", command=command, lock_dir=lock_dir)
else:
    r = local_mutex.run("fork", command=command, lock_dir=lock_dir)
print(r.status)
"""


@pytest.mark.parametrize("where", ["plain", "inside"])
def test_a_signal_at_the_fork_taken_by_another_thread_reaches_the_command(
    lock_dir: Path, marks: Path, where: str
) -> None:
    """A stop signal that arrives as the supervisor is forked, taken by another thread of
    the process (a hold's watcher is one), is the command's: it must not end the run with
    "did not run" and let go of the lock while the supervisor starts the command anyway."""
    out = _script(SIGNAL_AT_THE_FORK, lock_dir, marks, Path(where))
    # 143: the signal came before the command's trap was set; 7: after.
    assert out.stdout.splitlines() in (["7"], ["143"]), out.stderr


SIGNAL_TO_ANOTHER_THREAD_MID_RUN = """
import os, signal, sys, threading, time
import local_mutex
lock_dir, marks, inside = sys.argv[1], sys.argv[2], sys.argv[3] == "inside"
started = os.path.join(marks, "started")
def send_once_started():
    # A signal this thread takes while the keeper sleeps: only the main thread runs the
    # handler, and nothing else would wake it before the command's end.
    while not os.path.exists(started):
        time.sleep(0.01)
    time.sleep(0.2)
    signal.pthread_kill(threading.get_ident(), signal.SIGTERM)
    time.sleep(60)
threading.Thread(target=send_once_started, daemon=True).start()
command = f"trap 'exit 7' TERM; touch {started}; sleep 8 & wait"
if inside:
    with local_mutex.hold("mid", lock_dir=lock_dir):
        r = local_mutex.run("mid", command=command, lock_dir=lock_dir)
else:
    r = local_mutex.run("mid", command=command, lock_dir=lock_dir)
print(r.status, round(r.held))
"""


@pytest.mark.parametrize("where", ["plain", "inside"])
def test_a_signal_another_thread_takes_mid_run_reaches_the_command_at_once(
    lock_dir: Path, marks: Path, where: str
) -> None:
    """A stop signal taken by a thread other than the main one while the command runs
    (Linux picks another thread when the main one has a signal pending or blocked) is
    relayed then, not when the command ends by itself."""
    out = _script(SIGNAL_TO_ANOTHER_THREAD_MID_RUN, lock_dir, marks, Path(where))
    status, held = out.stdout.split()
    assert status == "7", out.stderr
    assert int(held) < 6, "the signal was handled only once the command was over"


THEIR_WAKEUP_FD = """
import os, signal, sys
import local_mutex
lock_dir = sys.argv[1]
r, w = os.pipe()
os.set_blocking(w, False)
signal.signal(signal.SIGUSR2, lambda *_: None)  # as an event loop's add_signal_handler does
signal.set_wakeup_fd(w)
run = local_mutex.run("wake", command=f"kill -USR2 {os.getpid()}", lock_dir=lock_dir)
os.set_blocking(r, False)
try:
    got = os.read(r, 16)
except BlockingIOError:
    got = b""
print(run.status, signal.set_wakeup_fd(-1) == w, got == bytes([signal.SIGUSR2]))
"""


def test_the_callers_wakeup_fd_gets_its_signals_and_comes_back(lock_dir: Path) -> None:
    """The keeper borrows the interpreter's wakeup fd while the command runs; an event
    loop's signals that arrive meanwhile still reach its wakeup fd, which is its own again
    afterwards."""
    assert _script(THEIR_WAKEUP_FD, lock_dir).stdout.split() == ["0", "True", "True"]


STALE_WAKEUP_FD = """
import os, signal, socket, sys
import local_mutex
lock_dir = sys.argv[1]
a, b = socket.socketpair()
b.setblocking(False)
signal.set_wakeup_fd(b.fileno())
a.close()
b.close()  # left set, now closed: the run's own descriptors may take its number
fds = len(os.listdir("/proc/self/fd"))
run = local_mutex.run("stale", command="true", lock_dir=lock_dir)
print(run.status, len(os.listdir("/proc/self/fd")) - fds, signal.set_wakeup_fd(-1))
"""


def test_a_stale_wakeup_fd_of_the_callers_does_not_break_the_run(lock_dir: Path) -> None:
    """The caller's wakeup fd, closed since it was set, cannot be put back: the run still
    ends normally, leaks nothing, and leaves no wakeup fd of ours behind."""
    assert _script(STALE_WAKEUP_FD, lock_dir).stdout.split() == ["0", "0", "-1"]


ERROR_AT_THE_FORK = """
import os, signal, sys, time
import local_mutex
lock_dir, marks = sys.argv[1], sys.argv[2]
r, w = os.pipe()
os.set_blocking(w, False)
signal.set_wakeup_fd(w)
class Alarm(Exception):
    pass
def alarm(*_):
    raise Alarm
signal.signal(signal.SIGALRM, alarm)
sent = []
def at_fork():
    # Blocked across the fork: the caller's handler runs, and raises, as the keeper sets
    # up the relay.
    if not sent:
        sent.append(1)
        os.kill(os.getpid(), signal.SIGALRM)
os.register_at_fork(after_in_parent=at_fork)
fds = len(os.listdir("/proc/self/fd"))
try:
    local_mutex.run("fork", command=f"echo $$ > {marks}/pid; sleep 5; touch {marks}/ran",
                    lock_dir=lock_dir)
except Alarm:
    print("Alarm")
state = local_mutex.status("fork", lock_dir=lock_dir).state
for _ in range(100):  # a command still running has written its pid by then
    if os.path.exists(os.path.join(marks, "pid")):
        break
    time.sleep(0.01)
try:
    with open(os.path.join(marks, "pid")) as f:
        os.kill(int(f.read()), 0)
    command = "running"
except (FileNotFoundError, ValueError, ProcessLookupError):
    command = "gone"  # never started, or stopped
print(state, command, len(os.listdir("/proc/self/fd")) - fds, signal.set_wakeup_fd(-1) == w)
"""


def test_an_error_as_the_relay_is_set_up_stops_the_command_before_the_release(
    lock_dir: Path, marks: Path
) -> None:
    """An exception from the caller's own handler just after the supervisor was forked
    ends the run only once the command is stopped (never a free lock with the command
    still running), with nothing leaked and the caller's wakeup fd back."""
    out = _script(ERROR_AT_THE_FORK, lock_dir, marks)
    lines = out.stdout.splitlines()
    assert lines[0] == "Alarm", out.stderr
    assert lines[1].split() == ["free", "gone", "0", "True"], out.stderr


QUIET_WAKEUP_FD = """
import os, signal, sys
import local_mutex
lock_dir = sys.argv[1]
r, w = os.pipe()
os.set_blocking(w, False)
try:
    while True:
        os.write(w, b"x" * 4096)
except BlockingIOError:
    pass
signal.signal(signal.SIGUSR2, lambda *_: None)
signal.set_wakeup_fd(w, warn_on_full_buffer=False)  # a full pipe is no news to this caller
local_mutex.run("quiet", command="true", lock_dir=lock_dir)
signal.raise_signal(signal.SIGUSR2)
print("done")
"""


def test_a_callers_quiet_wakeup_fd_stays_quiet(lock_dir: Path) -> None:
    out = _script(QUIET_WAKEUP_FD, lock_dir)
    assert out.stdout == "done\n" and out.stderr == "", out.stderr


SUPERVISOR_SIGNALS = """
import os, signal, sys
import local_mutex
lock_dir = sys.argv[1]
r, w = os.pipe()
os.set_blocking(r, False)
os.set_blocking(w, False)
signal.set_wakeup_fd(w)
run = local_mutex.run("alarm", command="sleep 5", timeout=0.3, lock_dir=lock_dir)
try:
    heard = os.read(r, 64)
except BlockingIOError:
    heard = b""
print(run.status, list(heard))
"""


def test_the_supervisors_own_signals_stay_out_of_the_callers_wakeup_fd(lock_dir: Path) -> None:
    """The supervisor is a fork of the caller: its --timeout alarm (and the stop signals it
    handles) must not wake the caller's event loop for signals the caller never got."""
    assert _script(SUPERVISOR_SIGNALS, lock_dir).stdout.split() == ["124", "[]"]


SIGNAL_AT_THE_RELEASE = """
import os, signal, sys, threading, time
import local_mutex
lock_dir, marks = sys.argv[1], sys.argv[2]
idle = threading.Event()
other = threading.Thread(target=idle.wait, daemon=True)
other.start()
done, sent = os.path.join(marks, "done"), os.path.join(marks, "sent")
def at_release(event, args):
    # The record is cleared as the lock is released: the command is over by then.
    if event == "os.truncate" and os.path.exists(done) and not os.path.exists(sent):
        open(sent, "w").close()
        signal.pthread_kill(other.ident, signal.SIGINT)
sys.addaudithook(at_release)
late = threading.Event()
try:
    r = local_mutex.run("rel", command=f"touch {marks}/done", lock_dir=lock_dir)
    # The handler may not have run yet (the signal went to the other thread, which the
    # kernel may not have scheduled): from here on it is the caller's own business.
    signal.signal(signal.SIGINT, lambda *_: late.set())
    print("returned", r.status)
    # Polled: a handler runs in the main thread between bytecodes, and a signal the other
    # thread took does not wake this one from a blocking wait.
    for _ in range(3000):
        if late.is_set():
            break
        time.sleep(0.01)
    print("late" if late.is_set() else "lost")
except KeyboardInterrupt:
    print("KeyboardInterrupt")
except local_mutex.Interrupted as exc:
    print("Interrupted", exc)
"""


def test_a_signal_during_the_release_is_not_a_did_not_run(lock_dir: Path, marks: Path) -> None:
    """The command ran; a Ctrl-C taken by another thread while the lock is released waits
    until it is, then acts as the caller's own handler says (KeyboardInterrupt, or the
    handler the caller has by the time the signal is handled) -- never "stopped before the
    command started ... did not run", and never lost."""
    out = _script(SIGNAL_AT_THE_RELEASE, lock_dir, marks)
    assert (marks / "done").exists() and (marks / "sent").exists(), out.stderr
    lines = out.stdout.splitlines()
    assert lines in (["KeyboardInterrupt"], ["returned 0", "late"]), out.stdout


def test_list_locks_says_what_it_left_out(lock_dir: Path) -> None:
    """A FIFO at a lock path was dropped from the list without a word (the CLI warns)."""
    os.mkfifo(lock_file(lock_dir, "fifo"))
    found = local_mutex.list_locks(str(lock_dir), include_free=True)
    assert found == [] and isinstance(found, list)
    (why,) = found.unlisted
    assert why.endswith("is not a regular file; refusing to use it; not listed"), why
    assert local_mutex.list_locks(str(lock_dir)).unlisted == [why]
