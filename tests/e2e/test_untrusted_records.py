"""A lock file's record is written by whoever can write the file (in a shared /tmp: any
user, or flock(1) users' own tools): what `status`, `list` and a waiting run print from it
stays inert -- no traceback, no line of its own, no workflow command, no borrowed name."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from helpers import CLI, clean_env, hold_file, hold_until, lock_file, run_cli, wait_for

pytestmark = pytest.mark.skipif(not os.path.exists("/proc/locks"), reason="needs /proc/locks")


@contextmanager
def planted(path: Path, marks: Path, record: str) -> Iterator[int]:
    """``path`` held by another program, with ``record`` (``PID``: that program's pid)."""
    path.touch()
    holder = hold_file(path, marks / "held", marks / "go")
    try:
        wait_for(marks / "held")
        path.write_text(record.replace("PID", str(holder.pid)))
        yield holder.pid
    finally:
        (marks / "go").touch()
        holder.wait(20)


def _every_view(name: str, lock_dir: Path) -> list[subprocess.CompletedProcess[bytes]]:
    where = ["--lock-dir", str(lock_dir)]
    return [
        run_cli(["status", *where, name]),
        run_cli(["status", *where, "--json", name]),
        run_cli(["list", *where]),
        run_cli(["--no-wait", *where, name, "true"]),
    ]


def test_a_surrogate_that_stands_for_no_byte_is_printed_escaped(
    lock_dir: Path, marks: Path
) -> None:
    rec = '{"v":1,"pid":PID,"name":"sur\\ud800","command":"c\\udfff","cwd":"\\ud800"}'
    with planted(lock_file(lock_dir, "sur"), marks, rec):
        views = _every_view("sur", lock_dir)
    for r in views:
        assert b"Traceback" not in r.stderr and r.returncode in (0, 1, 75), r.stderr
    assert b"\\ud800" in views[0].stdout and b"\\udfff" in views[3].stderr


def test_newlines_and_workflow_commands_in_a_record_stay_inside_their_line(
    lock_dir: Path, marks: Path
) -> None:
    name = "inj"
    rec = json.dumps(
        {
            "v": 1,
            "pid": 0,
            "name": name,
            "command": "make\n::error title=x::from the command",
            "cwd": "/src\n::warning::from the cwd",
            "host": "h\x1b[2J\x9b2J\u2028\u2029",
        }
    ).replace('"pid": 0', '"pid": PID')
    with planted(lock_file(lock_dir, name), marks, rec):
        views = _every_view(name, lock_dir)
    for r in views:
        assert b"Traceback" not in r.stderr, r.stderr
        for line in (r.stdout + r.stderr).splitlines():
            assert not line.lstrip().startswith(b"::"), line
            assert b"\x1b" not in line and b"\x9b" not in line and "\x9b".encode() not in line
            assert "\u2028".encode() not in line and "\u2029".encode() not in line
    assert b"'make ::error title=x::from the command'" in views[0].stdout


def test_a_name_that_starts_a_workflow_command_does_not_start_a_line(
    lock_dir: Path, marks: Path
) -> None:
    name = "::warning file=x::planted"
    with subprocess.Popen(
        [*CLI, "--lock-dir", str(lock_dir), "--", name, hold_until(marks)],
        env=clean_env(),
        stderr=subprocess.DEVNULL,
    ) as run:
        try:
            wait_for(marks / "h.held")
            listed = run_cli(["list", "--lock-dir", str(lock_dir)])
            status = run_cli(["status", "--lock-dir", str(lock_dir), "--", name])
        finally:
            (marks / "h.go").touch()
    assert run.returncode == 0
    for r in (listed, status):
        assert r.returncode in (0, 1) and b"planted: held" in r.stdout, r.stderr
        assert not any(ln.lstrip().startswith(b"::") for ln in r.stdout.splitlines())


def test_list_does_not_take_a_records_word_for_the_name(lock_dir: Path, marks: Path) -> None:
    """The file is ``notdeploy``'s; its record claims ``deploy``."""
    with planted(lock_file(lock_dir, "notdeploy"), marks, '{"v":1,"pid":PID,"name":"deploy"}'):
        listed = run_cli(["list", "--lock-dir", str(lock_dir)])
        status = run_cli(["status", "--lock-dir", str(lock_dir), "deploy"])
    assert listed.returncode == 0 and b"deploy: held" not in listed.stdout, listed.stdout
    assert b": free" in status.stdout


def test_a_waiter_names_the_holder_and_not_a_dead_one_from_a_leftover_record(
    lock_dir: Path, marks: Path
) -> None:
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    rec = f'{{"v":1,"pid":{gone.pid},"name":"stale","command":"the old command"}}'
    with planted(lock_file(lock_dir, "stale"), marks, rec) as holder:
        r = run_cli(["--no-wait", "--lock-dir", str(lock_dir), "stale", "true"])
    assert r.returncode == 75
    assert f"pid {holder}".encode() in r.stderr, r.stderr
    assert b"the old command" not in r.stderr and f"pid {gone.pid} ".encode() not in r.stderr
