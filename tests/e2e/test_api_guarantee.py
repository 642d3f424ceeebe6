"""The holder guarantee through the Python API, where the host program is the keeper: runs
inside its own hold, children it forks inside a block, a tmp cleaner racing the block's
end, and the host's own signal mask. Real processes, real locks, real signals."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

import local_mutex
from helpers import clean_env, lock_file, lock_is_free, wait_for

SRC = Path(__file__).resolve().parents[2] / "src"


def _host(code: str) -> subprocess.Popen[str]:
    """A Python program embedding the API."""
    return subprocess.Popen(
        [sys.executable, "-c", textwrap.dedent(code)],
        env=clean_env({"PYTHONPATH": str(SRC)}),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def _children(pid: int) -> list[int]:
    with open(f"/proc/{pid}/task/{pid}/children") as f:
        return [int(p) for p in f.read().split()]


def _taken_by_another(lock_dir: Path, name: str) -> bool:
    """Can a third process take the lock right now? (It lets go at once.)"""
    try:
        with local_mutex.hold(name, lock_dir=str(lock_dir), wait=0):
            return True
    except local_mutex.NotAcquired:
        return False


@pytest.mark.timeout(60)
def test_a_run_inside_its_hosts_hold_keeps_the_lock_when_host_and_supervisor_die(
    lock_dir: Path, tmp_path: Path
) -> None:
    """The command of a run inside the same process's hold inherited no locked description:
    with the host and its supervisor SIGKILLed together, another process took the lock
    while the command ran on (a plain run keeps it, and so must this one)."""
    started, go, pidfile = tmp_path / "started", tmp_path / "go", tmp_path / "cmd.pid"
    cmd = f"echo $$ > {pidfile}; touch {started}; while [ ! -e {go} ]; do sleep 0.02; done"
    host = _host(f"""
        import local_mutex as lm
        with lm.hold("both", lock_dir={str(lock_dir)!r}):
            lm.run("both", command={cmd!r}, lock_dir={str(lock_dir)!r})
    """)
    try:
        wait_for(started, 20, "the command")
        command = int(pidfile.read_text())
        supervisors = [p for p in _children(host.pid) if p != command]
        assert supervisors, "no supervisor found"
        # Together: killed one after the other, the supervisor may see the host die and
        # stop the command (as it must) before its own SIGKILL lands -- the lock is then
        # rightly free. So the host is frozen first, its supervisor killed, then the host.
        os.kill(host.pid, signal.SIGSTOP)
        for pid in (*supervisors, host.pid):
            os.kill(pid, signal.SIGKILL)
        host.wait(10)
        time.sleep(0.3)  # what a newcomer would have needed to get in
        assert not _taken_by_another(lock_dir, "both")  # the command still holds it
        os.kill(command, 0)
    finally:
        go.touch()
    wait_for(lambda: lock_is_free(lock_file(lock_dir, "both")), 20, "the lock to be free")


@pytest.mark.timeout(60)
def test_a_child_forked_inside_a_hold_holds_nothing_and_frees_nothing(
    lock_dir: Path, tmp_path: Path
) -> None:
    """A child forked inside ``with hold()`` took itself for the holder (a run there ran
    "inside", with no lock, beside the next holder), and its own leaving of the block
    unlocked the parent's lock while the parent was still in its block."""
    left, go = tmp_path / "child-left", tmp_path / "go"
    host = _host(f"""
        import os, sys, time
        import local_mutex as lm
        D = {str(lock_dir)!r}
        with lm.hold("forked", lock_dir=D):
            child = os.fork()
            if child == 0:
                try:
                    r = lm.run("forked", command="true", lock_dir=D, wait=0)
                    print("child ran, reentrant", r.reentrant, flush=True)
                except lm.NotAcquired:
                    print("child waits its turn", flush=True)
                with lm.hold("other", lock_dir=D):  # a block of its own, left as usual
                    pass
                open({str(left)!r}, "w").close()
                sys.exit(0)  # leaves the parent's block too, as any exception would
            os.waitpid(child, 0)
            while not os.path.exists({str(go)!r}):
                time.sleep(0.02)
    """)
    try:
        wait_for(left, 20, "the child to leave the block")
        time.sleep(0.2)
        assert not _taken_by_another(lock_dir, "forked")  # the parent holds it still
    finally:
        go.touch()
    out, err = host.communicate(timeout=30)
    assert host.returncode == 0, err
    assert out.splitlines() == ["child waits its turn"], out
    assert lock_is_free(lock_file(lock_dir, "forked"))


@pytest.mark.timeout(120)
def test_a_tmp_cleaner_as_a_block_ends_leaves_no_lock_held(lock_dir: Path) -> None:
    """The watcher put a deleted file back while the block was ending: the put-back came
    after the release, and its locked file (and guardian) stayed with the host until it
    exited -- every later hold of the name, its own too, waited for good."""
    host = _host(f"""
        import os, random, time
        import local_mutex as lm
        D = {str(lock_dir)!r}
        random.seed(7)
        for i in range(25):
            with lm.hold("race", lock_dir=D) as h:
                os.unlink(h.path)  # a tmp cleaner
                time.sleep(0.1 + random.uniform(0, 0.03))  # about when the watcher looks
            try:
                with lm.hold("race", lock_dir=D, wait=2):
                    pass
            except lm.NotAcquired:
                print("held after the block, round", i, flush=True)
                break
        print("fds", sorted(os.listdir("/proc/self/fd")), flush=True)
    """)
    out, err = host.communicate(timeout=100)
    assert host.returncode == 0, err
    assert "held after the block" not in out, out
    assert out.strip().splitlines()[-1] == "fds ['0', '1', '2', '3']", out  # nothing leaked


@pytest.mark.timeout(60)
def test_run_leaves_the_hosts_signal_mask_as_it_was(lock_dir: Path) -> None:
    """A host that blocks SIGTERM to take it with sigwait() found it unblocked after a run
    (and died of the next SIGTERM, 143, instead of shutting down its own way)."""
    host = _host(f"""
        import os, signal, sys, threading
        import local_mutex as lm
        signal.pthread_sigmask(signal.SIG_BLOCK, {{signal.SIGTERM, signal.SIGUSR1}})
        def shut_down():
            signal.sigwait({{signal.SIGTERM}})
            print("clean shutdown", flush=True)
            os._exit(0)
        threading.Thread(target=shut_down, daemon=True).start()
        lm.run("mask", command="true", lock_dir={str(lock_dir)!r})
        try:
            with lm.hold("mask", lock_dir={str(lock_dir)!r}, wait=0):
                lm.run("mask", command="true", lock_dir={str(lock_dir)!r})  # inside it
        finally:
            print(sorted(signal.pthread_sigmask(signal.SIG_BLOCK, [])), flush=True)
        os.kill(os.getpid(), signal.SIGTERM)
        signal.pause()
    """)
    out, err = host.communicate(timeout=30)
    lines = out.splitlines()
    assert lines[0] == str(sorted([signal.SIGTERM, signal.SIGUSR1])), (out, err)
    assert lines[1:] == ["clean shutdown"] and host.returncode == 0, (out, err)


@pytest.mark.timeout(120)
def test_a_ctrl_c_on_any_line_of_a_blocks_start_or_end_leaves_nothing_held(
    lock_dir: Path,
) -> None:
    """A SIGINT (Python's own KeyboardInterrupt) landing on some lines of ``hold``'s
    entry or exit left the lock held by the host and this thread taking itself for its
    holder: every later hold of the name raised NestingError, every run ran "inside" with
    no lock. Each line of them in turn gets a real SIGINT (``settrace`` picks the moment),
    but the first of ``__exit__``: one that lands as the ``with`` statement calls it is
    raised before any of its code runs, which no Python code can guard (CPython's own
    bpo-29988; ``threading.Lock`` has the same window)."""
    host = _host(f"""
        import inspect, os, signal, sys, time
        import local_mutex as lm
        from local_mutex import held, lifecycle
        D = {str(lock_dir)!r}
        lines = set()
        for fn in (held.Held.__enter__, held.Held.__exit__, held.Held._end, lm.hold.__enter__,
                   lm.hold.__exit__):
            body, first = inspect.getsourcelines(fn)
            lines |= {{(fn.__code__.co_filename, first + i) for i in range(len(body))}}
        body, first = inspect.getsourcelines(lm.hold.__exit__)
        lines.discard((lm.hold.__exit__.__code__.co_filename, first + 1))
        fired, leaks = [], []
        for where in sorted(lines):
            fired.clear()
            def tracer(frame, event, arg):
                if frame.f_code.co_filename != where[0]:
                    return None
                def on_line(frame, event, arg):
                    if event == "line" and frame.f_lineno == where[1] and not fired:
                        fired.append(where)
                        os.kill(os.getpid(), signal.SIGINT)
                    return on_line
                return on_line
            sys.settrace(tracer)
            try:
                try:
                    with lm.hold("k", lock_dir=D):
                        pass
                finally:
                    sys.settrace(None)
                time.sleep(0)  # one sent on a last line may be taken only at the next call
            except KeyboardInterrupt:
                pass
            if fired and (lifecycle._held_here or lm.status("k", D).state != "free"):
                leaks.append(where[1])
                lifecycle._held_here.clear()
                break
        print("leaks", leaks, "of", len(lines), "lines", flush=True)
    """)
    out, err = host.communicate(timeout=100)
    assert host.returncode == 0, err
    assert out.startswith("leaks [] of "), out


@pytest.mark.timeout(60)
def test_one_hold_object_serves_several_threads(lock_dir: Path) -> None:
    """Used as a threading.Lock is (one object, ``with LOCK:`` in each thread): a shared
    hold's second thread overwrote the first's state, and once both blocks had ended the
    lock stayed held by the program, with a descriptor left open."""
    host = _host(f"""
        import os, threading, time
        import local_mutex as lm
        D = {str(lock_dir)!r}
        for shared in (True, False):
            LOCK = lm.hold("one-object", lock_dir=D, shared=shared)
            inside = []
            def work(seconds):
                with LOCK:
                    inside.append(1)
                    time.sleep(seconds)
                    inside.remove(1)
            threads = [threading.Thread(target=work, args=(s,)) for s in (0.3, 0.6)]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
            print(shared, lm.status("one-object", D).state, flush=True)
        print("fds", sorted(os.listdir("/proc/self/fd")), flush=True)
    """)
    out, err = host.communicate(timeout=30)
    assert host.returncode == 0, err
    assert out.splitlines() == ["True free", "False free", "fds ['0', '1', '2', '3']"], out


FORKED_CHILD_LEAVES = """
import os, subprocess, sys, threading, time
import local_mutex as lm
where = {where}
LOCK = lm.hold("forked-remote", **where)
with LOCK:
    held = LOCK._held[threading.get_ident()]
    if {take_turn}:
        held._turn.acquire()  # as the watcher has it while it looks (a git renewal: seconds)
    child = os.fork()
    if child == 0:  # leaves the block: must neither hang on the turn nor end the lock
        sys.exit(0)
    if {take_turn}:
        held._turn.release()
    for _ in range(200):
        if os.waitpid(child, os.WNOHANG)[0]:
            break
        time.sleep(0.05)
    else:
        print("child stuck leaving the block", flush=True)
        os.kill(child, 9)
    print("still held:", lm.status("forked-remote", **where).held, flush=True)
    other = subprocess.run([sys.executable, "-c",
        "import local_mutex as lm; lm.run('forked-remote', command='echo OTHER', wait=0, **"
        + repr(where) + ")"], capture_output=True, text=True)
    print("outsider:", "NotAcquired" in other.stderr, flush=True)
print("released:", not lm.status("forked-remote", **where).held, flush=True)
"""


@pytest.mark.timeout(120)
@pytest.mark.parametrize("take_turn", [False, True], ids=["at rest", "watcher looking"])
@pytest.mark.parametrize("kind", ["flock", "git"])
def test_a_forked_child_leaving_a_block_ends_nothing_of_the_parents(
    kind: str, take_turn: bool, lock_dir: Path, tmp_path: Path
) -> None:
    """A child forked inside ``hold()`` that left the block: on a git remote it removed the
    parent's git work tree (its release then failed, the branch stayed locked); and with any
    lock, a fork while the watcher looked left the child's copy of the turn taken, and the
    child hung for good leaving the block. (PostgreSQL: ``test_postgres``.)"""
    if kind == "git":
        remote = tmp_path / "locks.git"
        subprocess.run(["git", "init", "-q", "--bare", str(remote)], check=True)
        where = {"remote": f"file://{remote}"}
    else:
        where = {"lock_dir": str(lock_dir)}
    host = _host(FORKED_CHILD_LEAVES.format(where=where, take_turn=take_turn))
    out, err = host.communicate(timeout=100)
    assert host.returncode == 0, err
    assert out.splitlines() == ["still held: True", "outsider: True", "released: True"], (out, err)
