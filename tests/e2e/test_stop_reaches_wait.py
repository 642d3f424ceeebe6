"""A stop signal ends a wait in flock() whenever it came: also one whose handler the
interpreter marked due without waking the main thread's sleep -- caught a moment before
the sleep began (the race a busy machine or the holder's own watcher thread hits, which no
test can time), or, as here, caught on another thread of the program (which a test can).
Real processes, a real lock held by another, real signals."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from helpers import (
    CLI,
    SRC,
    Procs,
    clean_env,
    hold_until,
    lock_file,
    lock_is_free,
    run_program,
    signal_in_import_callback,
    wait_for,
)

# A host program: a helper thread waits until the main thread sleeps in flock(), then
# takes a SIGTERM itself -- the interpreter marks the handler due, and nothing wakes the
# main thread. It must stop waiting at once, not when the lock comes free (60 s later).
HOST = """
import os, signal, sys, threading, time
import local_mutex as lm

MAIN = os.getpid()

def asleep_in_flock():
    with open(f"/proc/self/task/{MAIN}/wchan") as f:
        return "lock" in f.read()  # locks_lock_inode_wait (flock_lock_inode_wait before 5.x)

def poke():
    while not asleep_in_flock():
        time.sleep(0.01)
    print("poked", flush=True)
    signal.pthread_kill(threading.get_ident(), signal.SIGUSR1)  # the program's own
    signal.pthread_kill(threading.get_ident(), signal.SIGTERM)

usr1 = []
signal.signal(signal.SIGUSR1, lambda signum, frame: usr1.append(signum))

host_r, host_w = os.pipe()
os.set_blocking(host_w, False)
signal.set_wakeup_fd(host_w)  # the program's own (asyncio has one): it keeps working
fds = sorted(os.listdir("/proc/self/fd"))
threading.Thread(target=poke, daemon=True).start()
try:
    CALL
    print("not interrupted", flush=True)
except lm.Interrupted as exc:
    print("interrupted", exc.signum, flush=True)
print("wakeup fd back:", signal.set_wakeup_fd(-1) == host_w, flush=True)
print("the program's fd got:", list(os.read(host_r, 64)), usr1, flush=True)
end = time.monotonic() + 10
while time.monotonic() < end and (
    sorted(os.listdir("/proc/self/fd")) != fds or len(os.listdir("/proc/self/task")) > 1
):
    time.sleep(0.02)
print("fds as before:", sorted(os.listdir("/proc/self/fd")) == fds, flush=True)
print("threads left:", len(os.listdir("/proc/self/task")) - 1, flush=True)
"""

CALLS = {
    "hold, no ceiling": 'with lm.hold("db", lock_dir=LOCK_DIR): pass',
    "run, a ceiling": 'lm.run("db", command="true", lock_dir=LOCK_DIR, wait=120)',
}


@pytest.mark.timeout(90)
@pytest.mark.parametrize("call", sorted(CALLS))
def test_a_stop_the_interpreter_marked_due_ends_the_wait_at_once(
    call: str, procs: Procs, lock_dir: Path, marks: Path
) -> None:
    procs.start(["db", hold_until(marks), str(lock_dir)])
    wait_for(marks / "h.held")
    code = HOST.replace("CALL", CALLS[call].replace("LOCK_DIR", repr(str(lock_dir))))
    # The holder lets go after 60 s: only then did the wait end before.
    host = run_program(code, timeout=45)
    lines = host.stdout.splitlines()
    assert lines[:2] == ["poked", "interrupted 15"], (host.stdout, host.stderr)
    assert lines[2:] == [
        "wakeup fd back: True",
        "the program's fd got: [10, 15] [10]",  # both, as before; not what was sent again
        "fds as before: True",
        "threads left: 0",
    ]
    assert "Traceback" not in host.stderr, host.stderr


# The CLI itself, run by a program with one more thread, which takes a SIGTERM once the
# main thread sleeps where WHERE says: the verbs' other blocking waits.
CLI_HOST = """
import os, signal, sys, threading, time
from local_mutex.cli import main

MAIN = os.getpid()

def asleep():
    with open(f"/proc/self/task/{MAIN}/wchan") as f:
        return WHERE in f.read()

def poke():
    while not asleep():
        time.sleep(0.01)
    signal.pthread_kill(threading.get_ident(), signal.SIGTERM)

threading.Thread(target=poke, daemon=True).start()
sys.exit(main(ARGV))
"""

VERBS = {
    # a run waiting for the lock, in flock()
    "run": ("lock", ["db", "touch RAN", "LOCK_DIR"]),
    # hold's caller, reading its holder's answer while the holder waits for the lock
    "hold": ("pipe_read", ["hold", "db", "--lock-dir", "LOCK_DIR"]),
    # each, waiting for its first item from a producer that has none yet
    "each": ("poll_schedule_timeout", ["each", "--lock-dir", "LOCK_DIR", "k-{}", "touch RAN"]),
}


@pytest.mark.timeout(90)
@pytest.mark.parametrize("verb", sorted(VERBS))
def test_a_stop_the_interpreter_marked_due_ends_a_verbs_wait(
    verb: str, procs: Procs, lock_dir: Path, marks: Path, tmp_path: Path
) -> None:
    procs.start(["db", hold_until(marks), str(lock_dir)])
    wait_for(marks / "h.held")
    ran = tmp_path / "ran"
    where, argv = VERBS[verb]
    argv = [a.replace("LOCK_DIR", str(lock_dir)).replace("RAN", str(ran)) for a in argv]
    code = CLI_HOST.replace("WHERE", repr(where)).replace("ARGV", repr(argv))
    host = subprocess.Popen(
        [sys.executable, "-c", textwrap.dedent(code)],
        env=clean_env({"PYTHONPATH": str(SRC)}),
        stdin=subprocess.PIPE,  # each's producer: open, and silent
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert host.stdin is not None and host.stderr is not None
    try:
        # Before, it waited for the lock (60 s away) or for an item (never).
        host.wait(30)
        err = host.stderr.read()
    finally:
        host.kill()
        host.stdin.close()
        host.stderr.close()
        (marks / "h.go").touch()
    assert host.returncode == 143, err
    assert "Traceback" not in err, err
    assert not ran.exists()
    if verb == "hold":  # its holder went with it: the lock is the first run's, then free
        wait_for(lambda: lock_is_free(lock_file(lock_dir, "db")), 30, "the lock to be free")


@pytest.mark.timeout(60)
def test_a_waiter_stopped_as_it_begins_to_wait_does_not_run_its_command(
    procs: Procs, lock_dir: Path, marks: Path, tmp_path: Path
) -> None:
    """Through the CLI: the signal lands on a real waiter (in flock, or just before); it
    leaves with 143 while the lock is still held, and its command never runs."""
    procs.start(["db", hold_until(marks), str(lock_dir)])
    wait_for(marks / "h.held")
    ran = tmp_path / "ran"
    waiter = subprocess.Popen(
        [*CLI, "db", f"touch {ran}", str(lock_dir)],
        env=clean_env(),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    assert waiter.stderr is not None
    assert b"waiting for lock db" in waiter.stderr.readline()
    waiter.terminate()  # as soon as it says it waits: at the edge of the sleep
    assert waiter.wait(20) == 143
    assert not ran.exists()
    (marks / "h.go").touch()


@pytest.mark.timeout(120)
@pytest.mark.parametrize("threads", [1, 2])
def test_a_stop_on_any_line_of_a_waits_edges_leaves_the_program_as_it_was(
    threads: int, procs: Procs, lock_dir: Path, marks: Path
) -> None:
    """A SIGINT on each line of the wait's set-up and take-down (the ceiling's alarm, the
    borrowed wakeup fd and its watcher), the lock busy: whatever line it lands on, the
    program gets back its wakeup fd, its SIGALRM handler, its signal mask and no timer,
    and no descriptor stays open -- but for the first line of an ``__exit__``, which no
    Python code can guard (CPython's bpo-29988). With a second thread in the program the
    kernel gives it the signals the main thread blocks, and the handler runs in the main
    thread all the same: blocking them kept nothing out there (8 lines of 82 left the
    program's wakeup fd ours, or a pipe open)."""
    procs.start(["db", hold_until(marks), str(lock_dir)])
    wait_for(marks / "h.held")
    code = f"""
        import dis, os, signal, sys, threading, time
        import local_mutex as lm
        if {threads} > 1:
            threading.Thread(target=time.sleep, args=(600,), daemon=True).start()
        from local_mutex import nudge, wakeup
        from local_mutex.backends.flock import kernel
        D = {str(lock_dir)!r}
        host_r, host_w = os.pipe()
        os.set_blocking(host_w, False)
        signal.set_wakeup_fd(host_w)
        fns = (kernel._AlarmIn.__enter__, kernel._AlarmIn.__exit__, nudge.Nudge.__enter__,
               nudge.Nudge._start, nudge.Nudge.call, nudge.Nudge.__exit__,
               wakeup.WakeupPipe.install, wakeup.WakeupPipe.uninstall,
               wakeup.WakeupPipe.close_write_end)
        lines = set()
        for fn in fns:
            code = fn.__code__
            starts = sorted({{n for _, n in dis.findlinestarts(code) if n}})
            starts = [n for n in starts if n > code.co_firstlineno]
            if fn.__name__ == "__exit__":
                starts = starts[1:]
            lines |= {{(code, n) for n in starts}}
        fds = sorted(os.listdir("/proc/self/fd"))
        fired, bad = [], []
        for code, line in sorted(lines, key=lambda w: (w[0].co_name, w[1])):
            fired.clear()
            def tracer(frame, event, arg):
                if frame.f_code is not code:
                    return None
                def on_line(frame, event, arg):
                    if event == "line" and frame.f_lineno == line and not fired:
                        fired.append(line)
                        os.kill(os.getpid(), signal.SIGINT)
                    return on_line
                return on_line
            sys.settrace(tracer)
            try:
                try:
                    with lm.hold("db", lock_dir=D, wait=0.2):
                        pass
                finally:
                    sys.settrace(None)
                time.sleep(0)
            except (KeyboardInterrupt, lm.Interrupted, lm.NotAcquired):
                pass
            end = time.monotonic() + 5
            while sorted(os.listdir("/proc/self/fd")) != fds and time.monotonic() < end:
                time.sleep(0.01)
            state = (
                signal.set_wakeup_fd(host_w) == host_w,
                signal.getsignal(signal.SIGALRM) == signal.SIG_DFL,
                signal.pthread_sigmask(signal.SIG_BLOCK, []) == set(),
                signal.getitimer(signal.ITIMER_REAL) == (0.0, 0.0),
                sorted(os.listdir("/proc/self/fd")) == fds,
            )
            if fired and not all(state):
                bad.append((code.co_name, line, state))
        print("bad", bad, "of", len(lines), "lines", flush=True)
    """
    host = run_program(code, timeout=100)
    assert host.stdout.startswith("bad [] of "), (host.stdout, host.stderr)


@pytest.mark.timeout(60)
def test_a_stop_while_the_waiter_asks_who_holds_the_lock_ends_the_wait(
    procs: Procs, lock_dir: Path, marks: Path
) -> None:
    """A waiter reads /proc/locks and the holder's record to say who holds the lock; a stop
    signal then (a Ctrl-C some 100 ms after starting) raised inside that look, whose
    ``except Exception`` took it for an unreadable file: the wait went on until the lock
    came free (8 in 150 real Ctrl-Cs at that moment hung so). A real SIGTERM lands there
    (``settrace`` picks the moment)."""
    procs.start(["db", hold_until(marks), str(lock_dir)])
    wait_for(marks / "h.held")
    code = f"""
        import os, signal, sys, time
        import local_mutex as lm
        from local_mutex.backends.flock import state
        LOOK = state.status_of_path.__code__
        def tracer(frame, event, arg):
            if frame.f_code is LOOK and event == "call":
                sys.settrace(None)
                os.kill(os.getpid(), signal.SIGTERM)
            return None
        sys.settrace(tracer)
        try:
            with lm.hold("db", lock_dir={str(lock_dir)!r}, wait=30):
                print("acquired")
        except lm.Interrupted as exc:
            print("interrupted", exc.signum)
        except lm.NotAcquired:
            print("not acquired")
    """
    host = run_program(code, timeout=25)  # before, it waited out its 30 s
    assert host.stdout == "interrupted 15\n", host.stderr


@pytest.mark.timeout(60)
def test_a_child_forked_while_the_program_waits_keeps_its_signals_to_itself(
    procs: Procs, lock_dir: Path, marks: Path
) -> None:
    """Another thread forks while the main thread waits (a worker pool): the child inherited
    the borrowed wakeup fd, so a SIGTERM to the child (``pool.terminate()``) reached the
    parent's watcher, which sent it on -- the parent stopped waiting, signalled by nobody.
    The child's own signals now go to the program's wakeup fd in the child, as before."""
    procs.start(["db", hold_until(marks), str(lock_dir)])
    wait_for(marks / "h.held")
    code = f"""
        import os, signal, sys, threading, time
        import local_mutex as lm
        host_r, host_w = os.pipe()
        os.set_blocking(host_w, False)
        signal.set_wakeup_fd(host_w)
        PARENT = os.getpid()
        def asleep_in_flock():
            with open(f"/proc/self/task/{{PARENT}}/wchan") as f:
                return "lock" in f.read()
        def forker():
            while not asleep_in_flock():
                time.sleep(0.005)
            if os.fork() == 0:
                signal.signal(signal.SIGTERM, lambda signum, frame: None)
                os.kill(os.getpid(), signal.SIGTERM)
                time.sleep(0.1)
                ok = signal.set_wakeup_fd(-1) == host_w and os.read(host_r, 64) == bytes([15])
                print("child: its signal in the program's fd:", ok, flush=True)
                os._exit(0)
        threading.Thread(target=forker, daemon=True).start()
        try:
            with lm.hold("db", lock_dir={str(lock_dir)!r}, wait=3):
                print("parent: acquired", flush=True)
        except lm.Interrupted:
            print("parent: interrupted, by nobody", flush=True)
        except lm.NotAcquired:
            print("parent: not acquired", flush=True)
        os.wait()
    """
    host = run_program(code, timeout=30)
    assert sorted(host.stdout.splitlines()) == [
        "child: its signal in the program's fd: True",
        "parent: not acquired",
    ], host.stderr


@pytest.mark.timeout(120)
def test_a_stop_on_any_line_as_the_progress_line_starts_ends_the_wait_cleanly(
    procs: Procs, lock_dir: Path, marks: Path
) -> None:
    """A waiter starts a thread that says, now and then, that it still waits -- right as
    a Ctrl-C is most likely (the wait's first moment). A stop signal raising inside
    threading's own code left its locks half-released: exit 1 with ``RuntimeError: release
    unlocked lock`` instead of 130, or a thread that went on saying we wait. The CLI runs
    in-process; each line of the progress thread's start and end (ours and threading's, in
    the main thread; a short ceiling ends the wait) in turn gets a real SIGINT."""
    procs.start(["db", hold_until(marks), str(lock_dir)])
    wait_for(marks / "h.held")
    code = f"""
        import dis, os, signal, sys, threading, time
        from local_mutex.cli import main
        from local_mutex.ui import progress
        WHERE = (progress.__file__, threading.__file__)
        # Not the first line of ``__exit__``, which no Python code can guard (bpo-29988).
        EXIT = progress.Progress.__exit__.__code__
        FIRST = min(n for _, n in dis.findlinestarts(EXIT) if n and n > EXIT.co_firstlineno)
        n, codes = 0, []
        while True:
            n += 1
            lines = [0]
            def tracer(frame, event, arg):
                if frame.f_code.co_filename not in WHERE:
                    return None
                if threading.current_thread() is not threading.main_thread():
                    return None
                def on_line(frame, event, arg):
                    if event == "line" and (frame.f_code, frame.f_lineno) != (EXIT, FIRST):
                        lines[0] += 1
                        if lines[0] == n:
                            sys.settrace(None)
                            os.kill(os.getpid(), signal.SIGINT)
                    return on_line
                return on_line
            sys.settrace(tracer)
            try:
                code = main(["--wait", "0.3", "db", "true", {str(lock_dir)!r}])
            finally:
                sys.settrace(None)
            if lines[0] < n:  # past the last line: the ceiling ended this one
                break
            end = time.monotonic() + 5
            while threading.active_count() > 1 and time.monotonic() < end:
                time.sleep(0.01)
            codes.append((code, threading.active_count()))
        print("lines", n - 1, "bad", [(i + 1, c) for i, c in enumerate(codes) if c != (130, 1)])
    """
    host = run_program(code, timeout=100)
    assert host.stdout.startswith("lines "), (host.stdout, host.stderr[-3000:])
    assert int(host.stdout.split()[1]) > 10, host.stdout  # the tracer saw the start
    assert host.stdout.rstrip().endswith("bad []"), (host.stdout, host.stderr[-3000:])
    assert "Traceback" not in host.stderr and "Exception ignored" not in host.stderr, host.stderr


@pytest.mark.timeout(60)
def test_a_stop_python_dropped_in_a_weakref_callback_still_ends_the_wait(
    procs: Procs, lock_dir: Path, marks: Path
) -> None:
    """What a waiter loads once the lock is busy (who holds it, the progress line) ends,
    as every import does, with a weakref callback of the import system; an ``Interrupted``
    raised in there is only printed ("Exception ignored"), and the waiter went on waiting
    until the lock came free. A real SIGTERM lands in the first such callback."""
    procs.start(["db", hold_until(marks), str(lock_dir)])
    wait_for(marks / "h.held")
    # (The wait's own handler, an ``interruptible``'s, in place: the lock is busy.)
    code = signal_in_import_callback(
        "SIGTERM",
        'type(getattr(signal.getsignal(signal.SIGTERM), "__self__", None)).__name__'
        ' == "interruptible"',
    ) + textwrap.dedent(f"""
        from local_mutex.cli import main
        code = main(["db", "true", {str(lock_dir)!r}])
        print("fired", fired, "exit", code, flush=True)
    """)
    host = run_program(code, timeout=30)  # before, it waited for the lock (60 s)
    assert host.stdout.startswith("sent\nfired ['"), (host.stdout, host.stderr)
    assert host.stdout.rstrip().endswith("exit 143"), (host.stdout, host.stderr)
