"""Standard streams that cannot be written: a pipe whose reader went away (EPIPE), a full
disk (/dev/full: ENOSPC), a terminal that hung up (EIO), a closed descriptor.

Diagnostics on stderr are best effort: the command still runs and its status is the exit
status. An answer on stdout (status, list, --version, a hold's token) whose reader went
away ends quietly with the status it would have had; one lost to a full disk is exit 74.
Never a traceback.
"""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from helpers import CLI, Procs, clean_env, hold_until, run_cli, wait_for

pytestmark = pytest.mark.timeout(60)

UNWRITABLE = ["closed pipe", "/dev/full", "hung-up terminal"]


def _unwritable(kind: str) -> int:
    """A descriptor every write to fails, the way ``kind`` does."""
    if kind == "closed pipe":  # EPIPE: the reader is gone
        read_end, write_end = os.pipe()
        os.close(read_end)
        return write_end
    if kind == "/dev/full":  # ENOSPC
        return os.open("/dev/full", os.O_WRONLY)
    main_end, terminal = os.openpty()  # EIO: the terminal's other side hung up
    os.close(main_end)
    return terminal


@pytest.fixture
def fds() -> Iterator[list[int]]:
    """Descriptors a test opens for its child's streams: closed when it ends."""
    opened: list[int] = []
    yield opened
    for fd in opened:
        os.close(fd)


def _env() -> dict[str, str]:
    """Buffered standard streams, as a user's are (PYTHONUNBUFFERED may be set here): a
    failed write then leaves its bytes behind for the flush at exit to fail on again."""
    env = clean_env()
    env.pop("PYTHONUNBUFFERED", None)
    return env


def _start(
    args: list[str], *, stdout: int, stderr: int, stdin: bytes = b""
) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run(
        [*CLI, *args], env=_env(), input=stdin, stdout=stdout, stderr=stderr, timeout=30
    )


@pytest.mark.parametrize("kind", UNWRITABLE)
def test_run_with_stderr_unwritable_runs_the_command_and_keeps_its_status(
    lock_dir: Path, marks: Path, fds: list[int], kind: str
) -> None:
    """The waiting line failed with a traceback and exit 1 before the command ran."""
    fds.append(_unwritable(kind))
    command = f"touch '{marks}/ran'; exit 7"
    r = _start(["x", command, str(lock_dir)], stdout=fds[0], stderr=fds[0])
    assert r.returncode == 7
    assert (marks / "ran").exists()
    assert _state("x", lock_dir) == "free"


def test_run_with_stderr_closed_keeps_the_command_status(lock_dir: Path, marks: Path) -> None:
    script = shlex.join([*CLI, "x", f"touch '{marks}/ran'; exit 7", str(lock_dir)])
    r = subprocess.run(["sh", "-c", f"{script} 2>&-"], env=_env(), timeout=30)
    assert r.returncode == 7
    assert (marks / "ran").exists()


def test_run_whose_stderr_reader_goes_away_mid_run_keeps_the_command_status(
    lock_dir: Path, marks: Path
) -> None:
    """``local-mutex NAME 'slow; exit 7' 2>&1 | head -c1``: the reader took the first line
    and left while the command ran; the release line then failed (traceback, exit 1)."""
    read_end, write_end = os.pipe()
    command = f"while [ ! -e '{marks}/go' ]; do sleep 0.02; done; exit 7"
    p = subprocess.Popen(
        [*CLI, "x", command, str(lock_dir)],
        env=_env(),
        stdin=subprocess.DEVNULL,
        stdout=write_end,
        stderr=write_end,
    )
    os.close(write_end)
    with os.fdopen(read_end, "rb") as reader:
        assert reader.readline().startswith(b"local-mutex: waiting for lock x")
    (marks / "go").touch()  # the reader is gone: the lines after the command go nowhere
    assert p.wait(30) == 7
    assert _state("x", lock_dir) == "free"


@pytest.mark.parametrize("kind", ["closed pipe", "/dev/full"])
def test_each_with_stderr_unwritable_keeps_the_batch_status(
    lock_dir: Path, marks: Path, fds: list[int], kind: str
) -> None:
    fds.append(_unwritable(kind))
    command = f'touch "{marks}/$LOCAL_MUTEX_ITEM"; exit 3'
    args = ["each", "--lock-dir", str(lock_dir), "e-{}", command]
    r = _start(args, stdout=fds[0], stderr=fds[0], stdin=b"a\nb\n")
    assert r.returncode == 3  # the first item's status: it stopped there
    assert (marks / "a").exists() and not (marks / "b").exists()
    r = _start(["each", "--keep-going", *args[1:]], stdout=fds[0], stderr=fds[0], stdin=b"a\nb\n")
    assert r.returncode == 2  # two items failed
    assert (marks / "b").exists()


def test_each_whose_stderr_reader_goes_away_mid_batch_runs_every_item(
    lock_dir: Path, marks: Path
) -> None:
    read_end, write_end = os.pipe()
    command = (
        f'touch "{marks}/$LOCAL_MUTEX_ITEM"; [ "$LOCAL_MUTEX_ITEM" = a ] && exit 3; '
        f"while [ ! -e '{marks}/go' ]; do sleep 0.02; done; exit 3"
    )
    p = subprocess.Popen(
        [*CLI, "each", "--keep-going", "--lock-dir", str(lock_dir), "e-{}", command],
        env=_env(),
        stdin=subprocess.PIPE,
        stdout=write_end,
        stderr=write_end,
    )
    os.close(write_end)
    assert p.stdin is not None
    p.stdin.write(b"a\nb\n")
    p.stdin.close()
    with os.fdopen(read_end, "rb") as reader:
        assert b"released e-a" in reader.readline()
    (marks / "go").touch()
    assert p.wait(30) == 2
    assert (marks / "b").exists()


@pytest.mark.parametrize("held", [False, True])
def test_status_whose_reader_went_away_still_answers_by_its_status(
    procs: Procs, lock_dir: Path, marks: Path, fds: list[int], held: bool
) -> None:
    """``status NAME | true`` said 1 ("held") with a traceback for a free lock."""
    if held:
        procs.start(["x", hold_until(marks), str(lock_dir)])
        wait_for(marks / "h.held")
    fds.append(_unwritable("closed pipe"))
    for json_flag in ([], ["--json"]):
        args = ["status", "x", "--lock-dir", str(lock_dir), *json_flag]
        r = _start(args, stdout=fds[0], stderr=subprocess.PIPE)
        assert (r.returncode, r.stderr) == (1 if held else 0, b"")
    (marks / "h.go").touch()


@pytest.mark.parametrize(
    "args",
    [["status", "x"], ["status", "x", "--json"], ["list", "--all"], ["list", "--json"]],
)
def test_an_answer_lost_to_a_full_disk_is_exit_74(
    lock_dir: Path, fds: list[int], args: list[str]
) -> None:
    """A full disk is not a reader that left: the answer someone meant to keep is lost,
    which must not pass for a free lock (status 0) or an empty list."""
    fds.append(_unwritable("/dev/full"))
    r = _start([*args, "--lock-dir", str(lock_dir)], stdout=fds[0], stderr=subprocess.PIPE)
    assert r.returncode == 74
    assert r.stderr == b"local-mutex: could not write the answer to standard output " + (
        b"(No space left on device)\n"
    )


@pytest.mark.parametrize("args", [["list", "--all"], ["list", "--json"], ["--version"]])
def test_an_answer_whose_reader_went_away_ends_quietly(
    lock_dir: Path, fds: list[int], args: list[str]
) -> None:
    """``list --all | true``, ``--version | true``: a traceback and exit 1."""
    for name in ("a", "b"):  # two lock files: something to list
        assert run_cli([name, "true", str(lock_dir)]).returncode == 0
    fds.append(_unwritable("closed pipe"))
    where = ["--lock-dir", str(lock_dir)] if args[0] == "list" else []
    r = _start([*args, *where], stdout=fds[0], stderr=subprocess.PIPE)
    assert (r.returncode, r.stderr) == (0, b"")


@pytest.mark.parametrize("kind", UNWRITABLE)
def test_hold_with_stderr_unwritable_holds_and_exits_0(
    lock_dir: Path, fds: list[int], kind: str
) -> None:
    """The token reached stdout, so the hold is good; the release hint on stderr is the
    one thing lost. It used to exit 1 (a traceback) with the hold left running."""
    fds.append(_unwritable(kind))
    r = _start(["hold", "h", "--lock-dir", str(lock_dir)], stdout=subprocess.PIPE, stderr=fds[0])
    token = r.stdout.decode().strip()
    try:
        assert r.returncode == 0
        assert len(token) == 32
        assert _state("h", lock_dir) == "held"
    finally:
        done = run_cli(["release", "h", "--lock-dir", str(lock_dir), "--token", token])
    assert done.returncode == 0, done.stderr
    assert _state("h", lock_dir) == "free"


def test_hold_with_stdout_and_stderr_a_closed_pipe_ends_the_hold_with_74(
    lock_dir: Path, fds: list[int]
) -> None:
    """``hold NAME 2>&1 | true``: the token is lost, so the hold is ended (exit 74); the
    line saying so, on the same dead pipe, used to end it all in a traceback (exit 1)."""
    fds.append(_unwritable("closed pipe"))
    r = _start(["hold", "h", "--lock-dir", str(lock_dir)], stdout=fds[0], stderr=fds[0])
    assert r.returncode == 74
    assert _state("h", lock_dir) == "free"


def _state(name: str, lock_dir: Path) -> str:
    r = run_cli(["status", name, "--lock-dir", str(lock_dir), "--json"])
    return str(json.loads(r.stdout)["state"])


@pytest.mark.parametrize(("kind", "status"), [("closed pipe", 0), ("/dev/full", 74)])
def test_output_left_for_the_final_flush(fds: list[int], kind: str, status: int) -> None:
    """What is still buffered on stdout at exit (text that bypassed ``answer``, as click's
    help does): a reader that went away leaves the status alone -- it was turned from 0
    into 1 -- and output lost to a full disk is 74. Nothing is printed about it."""
    fds.append(_unwritable(kind))
    code = (
        "import sys; from local_mutex.cli import run_and_exit; "
        "run_and_exit(lambda: sys.stdout.buffer.write(b'unflushed') and 0)"
    )
    r = subprocess.run(
        [sys.executable, "-c", code],
        env=_env(),
        stdout=fds[0],
        stderr=subprocess.PIPE,
        timeout=30,
    )
    assert (r.returncode, r.stderr) == (status, b"")


def test_help_lost_to_a_full_disk_is_exit_74(fds: list[int]) -> None:
    """click ends quietly on EPIPE alone (exit 1): a full disk was a traceback."""
    fds.append(_unwritable("/dev/full"))
    r = _start(["run", "--help"], stdout=fds[0], stderr=subprocess.PIPE)
    assert r.returncode == 74
    assert r.stderr == b"local-mutex: could not print the help or completions " + (
        b"(No space left on device)\n"
    )
    fds.append(_unwritable("closed pipe"))
    r = _start(["--help"], stdout=fds[1], stderr=subprocess.PIPE)
    assert (r.returncode, r.stderr) == (1, b"")  # click's own way with a reader gone


ANSWER_LOST = "could not write the answer to standard output (closed by the caller)"


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (["status", "x"], ANSWER_LOST),
        (["list", "--json"], ANSWER_LOST),
        (["--version"], ANSWER_LOST),
        (
            ["run", "--help"],
            "could not print the help or completions (stdout closed by the caller)",
        ),
    ],
)
def test_an_answer_to_a_stdout_the_caller_closed_is_exit_74(
    lock_dir: Path, args: list[str], says: str
) -> None:
    """``local-mutex status x >&-``: the answer went to the /dev/null standing in for the
    closed stdout, and its verdict (exit 0: free) passed for one somebody had read."""
    where = ["--lock-dir", str(lock_dir)] if args[0] in ("status", "list") else []
    script = shlex.join([*CLI, *args, *where])
    r = subprocess.run(["sh", "-c", f"{script} >&-"], env=_env(), capture_output=True, timeout=30)
    assert (r.returncode, r.stderr.decode()) == (74, f"local-mutex: {says}\n")
