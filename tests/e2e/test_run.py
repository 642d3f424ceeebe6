"""The plain run: exit status, stdio, environment, working directory, bookends."""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest

from helpers import lock_file, run_cli

STAMP = r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ"


@pytest.mark.parametrize("code", [0, 3, 42])
def test_exit_status_is_the_commands(lock_dir: Path, code: int) -> None:
    r = run_cli(["n", f"exit {code}", str(lock_dir)])
    assert r.returncode == code


def test_command_killed_by_signal_gives_128_plus_n(lock_dir: Path) -> None:
    r = run_cli(["n", "kill -9 $$", str(lock_dir)])
    assert r.returncode == 137
    r = run_cli(["n", "kill -TERM $$", str(lock_dir)])
    assert r.returncode == 143


@pytest.mark.parametrize("command", ["+e; echo ran", "-x; echo ran"])
def test_a_command_starting_with_a_dash_or_plus_is_a_command_not_shell_options(
    lock_dir: Path, command: str
) -> None:
    """sh -c would read "-x; ..." as its own options ("Illegal option"). (The CLI takes a
    word that starts with a dash for an option of its own: the API and the action only.)"""
    if command.startswith("+"):
        r = run_cli(["run", "--lock-dir", str(lock_dir), "n", command])
        assert r.returncode == 0 and r.stdout == b"ran\n", r.stderr
        assert b"not found" in r.stderr and b"llegal option" not in r.stderr, r.stderr
    import local_mutex

    result = local_mutex.run("n", command=f"{command} >/dev/null", lock_dir=str(lock_dir))
    assert result.status == 0


def test_stdout_and_stderr_are_separate_and_untouched(lock_dir: Path) -> None:
    r = run_cli(["n", "printf 'out\\n\\001raw'; printf 'err-line\\n' >&2", str(lock_dir)])
    assert r.stdout == b"out\n\x01raw"
    lines = r.stderr.decode().splitlines()
    assert "err-line" in lines
    assert all(line.startswith("local-mutex: ") for line in lines if line != "err-line")


def test_stdin_is_the_callers(lock_dir: Path) -> None:
    r = run_cli(["n", "cat", str(lock_dir)], input=b"piped\x00bytes")
    assert r.stdout == b"piped\x00bytes"


def test_bookends_on_success_and_failure(lock_dir: Path) -> None:
    for cmd, code in (("true", 0), ("exit 7", 7)):
        r = run_cli(["my lock", cmd, str(lock_dir)])
        err = r.stderr.decode()
        assert re.search(rf"^local-mutex: waiting for lock my lock at {STAMP}$", err, re.M), err
        assert re.search(
            rf"^local-mutex: released my lock at {STAMP} \(waited \S+, held \S+, exit {code}\)$",
            err,
            re.M,
        ), err


def test_release_bookend_survives_a_callers_exit_trap_and_a_signal(lock_dir: Path) -> None:
    r = run_cli(["n", "trap 'echo bye' EXIT; exit 5", str(lock_dir)])
    assert r.returncode == 5
    assert r.stdout == b"bye\n"
    assert b"local-mutex: released n at " in r.stderr
    assert b"exit 5)" in r.stderr
    r = run_cli(["n", "kill -INT $$", str(lock_dir)])
    assert r.returncode == 130
    assert b"exit 130)" in r.stderr


def test_github_actions_uses_workflow_commands(lock_dir: Path) -> None:
    r = run_cli(["n", "true", str(lock_dir)], env={"GITHUB_ACTIONS": "true"})
    err = r.stderr.decode()
    assert re.search(rf"^::notice::local-mutex: waiting for lock n at {STAMP}$", err, re.M), err
    assert re.search(rf"^::notice::local-mutex: released n at {STAMP} \(", err, re.M), err
    r = run_cli(["", "true", str(lock_dir)], env={"GITHUB_ACTIONS": "true"})
    assert r.stderr.decode().startswith("::error::local-mutex: lock name is empty")


def test_nested_calls_under_actions_print_plain_lines(lock_dir: Path) -> None:
    r = run_cli(
        ["outer", 'sh "$LOCAL_MUTEX_CLI" inner true', str(lock_dir)], env={"GITHUB_ACTIONS": "true"}
    )
    err = r.stderr.decode().splitlines()
    assert any(line.startswith("::notice::local-mutex: waiting for lock outer") for line in err)
    assert any(line.startswith("local-mutex: waiting for lock inner") for line in err), err
    assert any(line.startswith("local-mutex: released inner") for line in err), err


def test_environment_and_cwd_propagate(lock_dir: Path, tmp_path: Path) -> None:
    work = tmp_path / "work dir"
    work.mkdir()
    r = run_cli(
        [
            "n",
            'printf "%s|%s|%s|%s" "$PWD" "$MY_VAR" "$LOCAL_MUTEX_LOCK_DIR" "$LOCAL_MUTEX_CLI"',
            str(lock_dir),
        ],
        env={"MY_VAR": "a b\tc"},
        cwd=work,
    )
    pwd, var, ldir, cli = r.stdout.decode().split("|")
    assert os.path.samefile(pwd, work)
    assert var == "a b\tc"
    assert ldir == str(lock_dir)
    assert os.path.isabs(cli) and os.access(cli, os.X_OK)


def test_lock_file_is_the_sha256_of_the_name_and_survives(lock_dir: Path) -> None:
    run_cli(["build-cache", "true", str(lock_dir)])
    assert lock_file(lock_dir, "build-cache").is_file()
    assert [p.name for p in lock_dir.iterdir()] == [lock_file(lock_dir, "build-cache").name]
    # The holder record is cleared on release.
    assert lock_file(lock_dir, "build-cache").read_bytes() == b""


def test_default_lock_dir_is_env_then_tmp(lock_dir: Path, tmp_path: Path) -> None:
    r = run_cli(
        ["envdir", 'printf %s "$LOCAL_MUTEX_LOCK_DIR"'], env={"LOCAL_MUTEX_LOCK_DIR": str(lock_dir)}
    )
    assert r.stdout == str(lock_dir).encode()
    assert lock_file(lock_dir, "envdir").exists()
    r = run_cli(
        ["envdir-default", 'printf %s "$LOCAL_MUTEX_LOCK_DIR"'], env={"LOCAL_MUTEX_LOCK_DIR": ""}
    )
    assert r.stdout == b"/tmp"
    other = tmp_path / "explicit"
    other.mkdir()
    r = run_cli(
        ["--lock-dir", str(other), "envdir", 'printf %s "$LOCAL_MUTEX_LOCK_DIR"'],
        env={"LOCAL_MUTEX_LOCK_DIR": str(lock_dir)},
    )
    assert r.stdout == str(other).encode()


def test_sigpipe_behaves_normally_in_the_command(lock_dir: Path) -> None:
    r = run_cli(["n", "yes | head -n 2", str(lock_dir)], timeout=20)
    assert r.returncode == 0
    assert r.stdout == b"y\ny\n"


def test_version_and_help() -> None:
    r = run_cli(["--version"])
    assert r.returncode == 0 and b"local-mutex" in r.stdout
    r = run_cli(["--help"])
    assert r.returncode == 0 and b"NAME COMMAND [LOCK_DIR]" in r.stdout
    r = run_cli(["run", "--help"])
    assert r.returncode == 0 and b"--timeout" in r.stdout


def test_out_of_descriptors_for_the_supervisor_is_one_line_and_125(lock_dir: Path) -> None:
    """Under a tiny descriptor limit the pipes to the supervisor cannot be made: one line,
    exit 125 ("could not be started"), the lock let go -- not a traceback and exit 1."""
    import subprocess
    import sys

    argv = [sys.executable, "-m", "local_mutex", "fds", "true", str(lock_dir)]
    statuses = []
    for limit in (5, 6, 7):
        r = subprocess.run(
            ["sh", "-c", f'ulimit -n {limit} && exec "$@"', "sh", *argv],
            capture_output=True,
            timeout=60,
        )
        assert b"Traceback" not in r.stderr, r.stderr
        assert r.returncode in (0, 125), r.stderr
        statuses.append(r.returncode)
    assert 125 in statuses  # the limit was really hit
    assert run_cli(["--no-wait", "fds", "true", str(lock_dir)]).returncode == 0
