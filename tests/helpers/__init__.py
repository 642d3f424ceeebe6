"""Shared helpers: real CLI processes, real locks, markers instead of sleeps."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

TYPE_CHECKING = False
if TYPE_CHECKING:
    import pytest

CLI = [sys.executable, "-m", "local_mutex"]
SCRUB = (
    "GITHUB_ACTIONS",
    "LOCAL_MUTEX_LOCK_DIR",
    "LOCAL_MUTEX_HELD",
    "LOCAL_MUTEX_CLI",
    "LOCAL_MUTEX_ALLOW_OTHER_OWNER",
    "LOCAL_MUTEX_PROGRESS_SECONDS",
)


_scratch: list[str] = []


def scratch_tmpdir() -> str:
    """TMPDIR for the processes the tests start: what a process killed on purpose leaves
    behind (a remote lock's scratch repository) goes there, and goes when the tests end.
    World-writable and sticky, as /tmp, so another uid's processes can use it too."""
    if not _scratch:
        import atexit
        import shutil
        import tempfile

        path = tempfile.mkdtemp(prefix="lm-tests-tmp-")
        os.chmod(path, 0o1777)
        atexit.register(shutil.rmtree, path, True)
        _scratch.append(path)
    return _scratch[0]


def clean_env(extra: Mapping[str, str] | None = None) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in SCRUB}
    env["TMPDIR"] = scratch_tmpdir()
    env.update(extra or {})
    return env


def delete_until_put_back(path: Path) -> None:
    """Delete a held lock file (a tmp cleaner) and wait until its (exclusive) holder put one
    back: a new file at the path with the holder's record in it. The file is there a moment
    before the record is: a `run --reentrant` or a `release` that looks in between finds a
    lock without a hold."""
    before = os.stat(path).st_ino

    def put_back() -> bool:
        try:
            st = os.stat(path)
        except FileNotFoundError:
            return False
        return st.st_ino != before and st.st_size > 0

    path.unlink()
    wait_for(put_back, what=f"{path} put back")


def hold_file(path: Path, held: Path, go: Path) -> subprocess.Popen[bytes]:
    """Another program (no record of its own) holding ``path``'s flock: it touches
    ``held`` once it does, and lets go when ``go`` exists."""
    return subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import fcntl, os, sys, time\n"
            "fd = os.open(sys.argv[1], os.O_RDONLY); fcntl.flock(fd, fcntl.LOCK_EX)\n"
            "open(sys.argv[2], 'w').close()\n"
            "while not os.path.exists(sys.argv[3]): time.sleep(0.02)\n",
            str(path),
            str(held),
            str(go),
        ]
    )


def start_each(args: Sequence[str], items: bytes) -> subprocess.Popen[bytes]:
    """``local-mutex each ARGS`` with ITEMS on its stdin (closed after them), its stderr
    piped for the test to read."""
    p = subprocess.Popen(
        [*CLI, "each", *args], stdin=subprocess.PIPE, stderr=subprocess.PIPE, env=clean_env()
    )
    assert p.stdin is not None
    p.stdin.write(items)
    p.stdin.close()
    return p


def pyenv_python(version: str) -> str | None:
    """The newest pyenv interpreter of ``version`` (e.g. "3.6", "2.7"), if this machine has one."""
    root = Path(os.environ.get("PYENV_ROOT") or Path.home() / ".pyenv") / "versions"
    try:  # $PYENV_ROOT may be another user's (root's, for a test run as nobody)
        found = sorted(
            root.glob(f"{version}.*/bin/python{version[0]}"),
            key=lambda p: tuple(int(x) for x in p.parts[-3].split(".") if x.isdigit()),
        )
    except OSError:
        return None
    return str(found[-1]) if found else None


def needs_pyenv(version: str) -> pytest.MarkDecorator:
    import pytest  # here: processes the tests start import this package without pytest

    return pytest.mark.skipif(
        pyenv_python(version) is None,
        reason=f"no pyenv Python {version} here (~/.pyenv/versions/{version}.*)",
    )


def old_pythons(*, python2: bool = True) -> list[Any]:
    """Parameters for each interpreter older than ours, skipped where pyenv has none."""
    import pytest

    versions = ("2.7", "3.6", "3.7", "3.8") if python2 else ("3.6", "3.7", "3.8")
    return [pytest.param(v, marks=needs_pyenv(v)) for v in versions]


def version_of(python: str) -> str:
    """What ``python`` says its version is (``3.6.15``)."""
    code = "import sys; print(sys.version.split()[0])"
    return subprocess.run(
        [python, "-c", code], capture_output=True, text=True, check=True
    ).stdout.strip()


def fill_to_the_last_byte(fd: int) -> None:
    """Fill the pipe ``fd`` writes to, to its last byte (a write under PIPE_BUF is all or
    none, so 512-byte chunks, then single bytes): the next line written to it blocks."""
    import fcntl

    flags = fcntl.fcntl(fd, fcntl.F_GETFL)
    fcntl.fcntl(fd, fcntl.F_SETFL, flags | os.O_NONBLOCK)
    for chunk in (b"x" * 512, b"x"):
        try:
            while True:
                os.write(fd, chunk)
        except BlockingIOError:
            pass
    fcntl.fcntl(fd, fcntl.F_SETFL, flags)


# A command that fills its stderr (a pipe nobody reads) as ``fill_to_the_last_byte`` does.
FILL_STDERR = f"""
import os, sys
sys.path.insert(0, {str(Path(__file__).resolve().parent.parent)!r})
from helpers import fill_to_the_last_byte
fill_to_the_last_byte(2)
"""


def start_filling_stderr(lock_dir: Path, marks: Path, name: str) -> subprocess.Popen[bytes]:
    """A run of NAME whose command fills the unread stderr, touches ``marks/full`` and
    sleeps 60 s (exec'd: the command is that process)."""
    script = marks / "fill.py"
    script.write_text(
        FILL_STDERR + f"open({str(marks / 'full')!r}, 'w').close()\nimport time\ntime.sleep(60)\n"
    )
    return subprocess.Popen(
        [*CLI, name, f"exec {sys.executable} {script}", str(lock_dir)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,  # never read
        env=clean_env(),
    )


def full_pipe() -> tuple[int, int]:
    """(read end, write end) of a pipe whose buffer is full: a write to it blocks."""
    read_end, write_end = os.pipe()
    os.set_blocking(write_end, False)
    try:
        while True:
            os.write(write_end, b"x" * 65536)
    except BlockingIOError:
        pass
    os.set_blocking(write_end, True)
    return read_end, write_end


def wait_for(predicate_or_path: object, timeout: float = 20.0, what: str = "") -> None:
    """Wait for a marker file (or a predicate) with a generous ceiling for busy machines."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if isinstance(predicate_or_path, Path):
            if predicate_or_path.exists():
                return
        elif callable(predicate_or_path) and predicate_or_path():
            return
        time.sleep(0.02)
    raise AssertionError(f"timed out waiting for {what or predicate_or_path}")


def concurrently(scenarios: Mapping[str, Callable[[], None]]) -> None:
    """Run each scenario in a thread of its own and wait for all: for variants of a test
    that spend their time waiting out a lease or a deadline. Fails naming every scenario
    that failed (the first failure chained)."""
    failures: dict[str, BaseException] = {}

    def one(name: str, scenario: Callable[[], None]) -> None:
        try:
            scenario()
        except BaseException as e:
            failures[name] = e

    threads = [threading.Thread(target=one, args=item, daemon=True) for item in scenarios.items()]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if failures:
        report = "; ".join(f"{name}: {e!r}" for name, e in failures.items())
        raise AssertionError(f"failed: {report}") from next(iter(failures.values()))


def sleeps_in(pid: int, *where: str) -> bool:
    """Does the kernel say ``pid`` sleeps in one of these functions (/proc/PID/wchan:
    "pipe_write" matches anon_pipe_write too; "0" while it runs)?"""
    try:
        wchan = Path(f"/proc/{pid}/wchan").read_text()
    except OSError:
        return False
    return any(name in wchan for name in where)


def read_written(path: Path, timeout: float = 20.0, what: str = "") -> str:
    """What a shell wrote with ``echo ... > PATH`` (stripped): wait out the file's empty
    instant between its creation and the one write that fills it."""
    wait_for(lambda: path.exists() and path.read_text().strip() != "", timeout, what or str(path))
    return path.read_text().strip()


def read_pid(path: Path, timeout: float = 20.0) -> int:
    """A pid a shell wrote with ``echo $$ > PATH``."""
    return int(read_written(path, timeout))


def left_behind_call(marker_dir: Path, name: str) -> str:
    """A shell command that leaves a job behind (in a session of its own) which, once
    ``go`` exists, calls NAME (``--no-wait``, through ``$LOCAL_MUTEX_CLI``): it writes
    ``ran`` if it ran inside, and its exit status to ``rc``."""
    return (
        f'(setsid sh -c \'while [ ! -e "{marker_dir}/go" ]; do sleep 0.01; done; '
        f'sh "$LOCAL_MUTEX_CLI" --no-wait {name} "touch {marker_dir}/ran"; '
        f'echo $? > "{marker_dir}/rc.tmp"; mv "{marker_dir}/rc.tmp" "{marker_dir}/rc"\' '
        "</dev/null >/dev/null 2>&1 &)"
    )


def run_seen_over(lock_path: Path, run_file: Path) -> None:
    """Wait until the hold's record in ``lock_path`` no longer names the run inside it
    whose LOCAL_MUTEX_HOLD_RUN a job it left behind wrote to ``run_file``. A holder sees a
    run's goodbye a moment after the run ends; one stopped or killed before it did leaves
    its lock to that run -- and so, rightly, to the job, which then runs inside."""
    run = read_written(run_file, 20, "the job's run")
    wait_for(lambda: run not in lock_path.read_text(), 20, "the holder to see the run end")


def left_behind_call_waited(marker_dir: Path) -> None:
    """Let the job ``left_behind_call`` left go: it must have been kept out (75)."""
    (marker_dir / "go").touch()
    assert read_written(marker_dir / "rc", 20, "the left-behind job's call") == "75"
    assert not (marker_dir / "ran").exists()


def hold_until(marker_dir: Path, tag: str = "h") -> str:
    """A shell command that says it holds (``<tag>.held``) and keeps going until ``<tag>.go``.

    Bounded (60 s) so a failed test never leaves it running for long.
    """
    held, go = marker_dir / f"{tag}.held", marker_dir / f"{tag}.go"
    return (
        f"touch '{held}'; i=0; while [ ! -e '{go}' ] && [ $i -lt 1200 ]; "
        f"do sleep 0.05; i=$((i+1)); done"
    )


class Procs:
    """Started CLI processes; whatever is still running at teardown is stopped."""

    def __init__(self, tmp: Path) -> None:
        self.tmp = tmp
        self.started: list[subprocess.Popen[bytes]] = []
        self.logs: dict[int, tuple[Path, Path]] = {}

    def start(
        self,
        args: Sequence[str | bytes],
        env: Mapping[str, str] | None = None,
        cwd: str | Path | None = None,
    ) -> subprocess.Popen[bytes]:
        n = len(self.started)
        out_path, err_path = self.tmp / f"proc{n}.out", self.tmp / f"proc{n}.err"
        with open(out_path, "wb") as out, open(err_path, "wb") as err:
            p = subprocess.Popen(
                [*CLI, *args],
                env=clean_env(env),
                cwd=cwd,
                stdout=out,
                stderr=err,
                stdin=subprocess.DEVNULL,
            )
        self.started.append(p)
        self.logs[p.pid] = (out_path, err_path)
        return p

    def stderr(self, p: subprocess.Popen[bytes]) -> str:
        return self.logs[p.pid][1].read_bytes().decode("utf-8", "replace")

    def stdout(self, p: subprocess.Popen[bytes]) -> str:
        return self.logs[p.pid][0].read_bytes().decode("utf-8", "replace")

    def wait_stderr(self, p: subprocess.Popen[bytes], text: str, timeout: float = 20.0) -> None:
        wait_for(lambda: text in self.stderr(p), timeout, f"{text!r} on stderr of pid {p.pid}")

    def stop_all(self) -> None:
        for p in self.started:
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
        for p in self.started:
            try:
                p.wait(12)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()


def run_cli(
    args: Sequence[str | bytes],
    env: Mapping[str, str] | None = None,
    cwd: str | Path | None = None,
    timeout: float = 60,
    input: bytes | None = None,
) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run(
        [*CLI, *args],
        env=clean_env(env),
        cwd=cwd,
        capture_output=True,
        timeout=timeout,
        input=input if input is not None else b"",
    )


def nobody_can_run_python() -> bool:
    """Whether this interpreter starts as uid 65534 (some builds live under a 0700 home)."""
    import shutil

    setpriv = shutil.which("setpriv")
    if os.geteuid() != 0 or setpriv is None:
        return False
    r = subprocess.run(
        [setpriv, "--reuid=65534", "--regid=65534", "--clear-groups", sys.executable, "-c", "pass"],
        capture_output=True,
        cwd="/",
        check=False,
    )
    return r.returncode == 0


def lock_is_free(path: Path) -> bool:
    """Probe with a non-blocking exclusive flock (held only for an instant if free)."""
    import fcntl

    fd = os.open(path, os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        return True
    except BlockingIOError:
        return False
    finally:
        os.close(fd)


def lock_file(lock_dir: Path, name: str | bytes) -> Path:
    import hashlib

    raw = name.encode("utf-8", "surrogateescape") if isinstance(name, str) else name
    return lock_dir / f"local-mutex-{hashlib.sha256(raw).hexdigest()}.lock"


@contextlib.contextmanager
def stopped(pid: int) -> Iterator[None]:
    """The process SIGSTOPped meanwhile (a debugger, a frozen VM): it cannot act, but
    holds on to everything it has; SIGCONT after, whatever happened."""
    os.kill(pid, signal.SIGSTOP)
    try:
        yield
    finally:
        with contextlib.suppress(ProcessLookupError):  # ended meanwhile
            os.kill(pid, signal.SIGCONT)


SRC = Path(__file__).resolve().parents[2] / "src"


def run_program(code: str, *args: str, timeout: float) -> subprocess.CompletedProcess[str]:
    """A Python program using the package of this tree (``code``, dedented), run to its end."""
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code), *args],
        env=clean_env({"PYTHONPATH": str(SRC)}),
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def signal_in_import_callback(name: str, when: str) -> str:
    """Program text that sends itself signal ``name`` once, from inside the first weakref
    callback of the import system run while ``when`` (an expression) holds -- where Python
    only prints what a handler raises. It prints "sent" as it sends; ``fired`` names the
    callback."""
    return f"""
import os, signal, sys
fired = []
def tracer(frame, event, arg):
    code = frame.f_code
    if (
        event == "call"
        and not fired
        and code.co_filename.startswith("<frozen importlib._bootstrap")
        and code.co_name in ("cb", "remove")
        and ({when})
    ):
        fired.append(code.co_name)
        sys.settrace(None)
        print("sent", flush=True)
        os.kill(os.getpid(), signal.{name})
    return None
sys.settrace(tracer)
"""


def gate(path: Path) -> Path:
    """A FIFO a shell job waits at (``read go < GATE``) until ``let_through``: no fork while
    it waits, so a Ctrl-Z never lands between one of dash's vfork()s and its exec -- that
    child stops, while dash sits in the kernel's vfork wait, never stopped nor seen stopped."""
    os.mkfifo(path)
    return path


def let_through(fifo: Path) -> None:
    """Let the job waiting at ``fifo`` (``gate``) go on."""

    def opened() -> bool:
        try:  # ENXIO until the job opens it (again, once continued)
            fd = os.open(fifo, os.O_WRONLY | os.O_NONBLOCK)
        except OSError:
            return False
        os.write(fd, b"go\n")
        os.close(fd)
        return True

    wait_for(opened, 20, "the job to wait at its gate")


# A shell with job control, as small as it gets: it runs ``sys.argv[2:]`` as a job (a process
# group of its own, given the terminal), writes the job's pid to ``sys.argv[1]``, and exits
# with its status. A run needs one to be stopped by Ctrl-Z: the terminal's stop signals are
# dropped for an orphaned group -- one whose leader is the session's, as with `setsid --ctty`.
_JOB_SHELL = """
import os, signal, sys
pid = os.fork()
if pid == 0:
    os.setpgid(0, 0)
    signal.signal(signal.SIGTTOU, signal.SIG_IGN)
    os.tcsetpgrp(0, os.getpid())
    signal.signal(signal.SIGTTOU, signal.SIG_DFL)
    os.execvp(sys.argv[2], sys.argv[2:])
try:
    os.setpgid(pid, pid)
except OSError:
    pass
with open(sys.argv[1] + ".tmp", "w") as f:
    f.write(str(pid))
os.rename(sys.argv[1] + ".tmp", sys.argv[1])
status = os.waitpid(pid, 0)[1]
code = os.waitstatus_to_exitcode(status)
sys.exit(128 - code if code < 0 else code)
"""


def start_as_a_job(
    argv: Sequence[str], env: Mapping[str, str], tmp: Path, stderr: int | None = None
) -> tuple[subprocess.Popen[bytes], int, int]:
    """``argv`` as a job of a shell with job control (``_JOB_SHELL``) in a terminal of its own:
    (that shell's process, the pty's master, the job's pid)."""
    master, slave = os.openpty()
    pidfile = tmp / "job.pid"
    proc = subprocess.Popen(
        ["setsid", "--ctty", sys.executable, "-S", "-c", _JOB_SHELL, str(pidfile), *argv],
        stdin=slave,
        stdout=slave,
        stderr=slave if stderr is None else stderr,
        env=dict(env),
    )
    os.close(slave)
    wait_for(pidfile, 20, "the job to start")
    return proc, master, int(pidfile.read_text())
