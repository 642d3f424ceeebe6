"""Every bad input: exit 2, a message saying what is wrong, and the command never runs."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from helpers import lock_file, run_cli
from helpers.otheruser import as_other_user


def _assert_refused(
    args: list[str | bytes], marks: Path, needle: str, env: dict[str, str] | None = None
) -> None:
    r = run_cli(args, env=env)
    err = r.stderr.decode("utf-8", "replace")
    assert r.returncode == 2, (r.returncode, err)
    assert needle in err, err
    assert not (marks / "ran").exists()


@pytest.mark.parametrize(
    ("name", "needle"),
    [
        ("", "lock name is empty"),
        ("   ", "only whitespace"),
        ("\u3000", "only whitespace"),
        ("a\nb", "control characters (byte 0x0A)"),
        ("tab\there", "control characters (byte 0x09)"),
        ("del\x7f", "control characters (byte 0x7F)"),
        ("bell\x07", "control characters (byte 0x07)"),
        ("cr\r", "control characters (byte 0x0D)"),
    ],
)
def test_bad_names(lock_dir: Path, marks: Path, name: str, needle: str) -> None:
    _assert_refused([name, f"touch '{marks}/ran'", str(lock_dir)], marks, needle)
    _assert_refused(["run", name, f"touch '{marks}/ran'", str(lock_dir)], marks, needle)
    assert list(lock_dir.iterdir()) == []


@pytest.mark.parametrize("command", ["", " ", "\n\t "])
def test_empty_commands(lock_dir: Path, marks: Path, command: str) -> None:
    _assert_refused(["n", command, str(lock_dir)], marks, "command is")
    assert list(lock_dir.iterdir()) == []


def test_bad_lock_dirs(tmp_path: Path, marks: Path) -> None:
    cmd = f"touch '{marks}/ran'"
    _assert_refused(["n", cmd, "relative/dir"], marks, "must be an absolute path")
    _assert_refused(["n", cmd, "  "], marks, "must be an absolute path")
    _assert_refused(
        ["n", cmd, str(tmp_path / "missing")], marks, "does not exist or is not a directory"
    )
    a_file = tmp_path / "file"
    a_file.write_text("x")
    _assert_refused(["n", cmd, str(a_file)], marks, "does not exist or is not a directory")
    _assert_refused(
        ["n", cmd], marks, "must be an absolute path", env={"LOCAL_MUTEX_LOCK_DIR": "rel"}
    )
    _assert_refused(["--lock-dir", "rel", "n", cmd], marks, "must be an absolute path")


@pytest.mark.skipif(not os.path.isdir("/proc/self"), reason="no /proc")
@pytest.mark.parametrize("verb", [[], ["--shared"], ["--slots", "2"], ["each"], ["hold"]])
def test_a_lock_dir_that_takes_no_new_files_is_refused_at_once(
    marks: Path, verb: list[str]
) -> None:
    """/proc passes root's writability check, yet answers "no such file" to every new
    file: each attempt looked like a race lost to a creator, and the run spun forever,
    deaf to SIGTERM (a stop before the command starts waits for the lock file)."""
    cmd = [] if verb == ["hold"] else [f"touch '{marks}/ran'"]
    r = run_cli([*verb, "--lock-dir", "/proc", "n", *cmd], timeout=30, input=b"item\n")
    err = r.stderr.decode()
    assert r.returncode == 2, err
    assert "lock dir '/proc'" in err, err
    assert ("takes no new files" in err) == (os.geteuid() == 0), err  # else: not writable
    assert not (marks / "ran").exists()


@pytest.mark.parametrize(
    ("mode", "lacks"),
    [(0o555, "write (w)"), (0o666, "search (x)"), (0o444, "write (w) or search (x)")],
)
def test_an_unusable_lock_dir_says_which_permission_it_lacks(
    tmp_path: Path, marks: Path, mode: int, lacks: str
) -> None:
    """A 0666 dir is writable by its mode, but without search permission nobody can
    create a file in it: "not writable" alone had the user look at the wrong bit."""
    needle = f"is not writable: no {lacks} permission for us"
    if os.geteuid() == 0:  # root writes anywhere: the CLI runs as nobody
        with as_other_user() as nobody:
            ran = nobody.shared_dir("marks", 0o777) / "ran"
            locked = nobody.shared_dir("ro", mode)
            r = nobody.run(["n", f"touch '{ran}'", str(locked)], timeout=30)
            assert r.returncode == 2, r.stderr
            assert needle.encode() in r.stderr, r.stderr
            assert not ran.exists()
    else:
        locked = tmp_path / "ro"
        locked.mkdir(mode)
        locked.chmod(mode)
        try:
            _assert_refused(["n", f"touch '{marks}/ran'", str(locked)], marks, needle)
        finally:
            locked.chmod(0o755)


def test_unwritable_lock_dir(tmp_path: Path, marks: Path) -> None:
    locked = tmp_path / "ro"
    locked.mkdir()
    cmd = f"touch '{marks}/ran'"
    if os.geteuid() == 0:
        # root may write anywhere: run the CLI as nobody against a root-owned 0755 dir
        # (pytest's own tmp root is 0700: the helper's dirs are ones nobody can reach).
        with as_other_user() as nobody:
            ran = nobody.shared_dir("marks", 0o777) / "ran"
            locked = nobody.shared_dir("ro", 0o755)
            r = nobody.run(["n", f"touch '{ran}'", str(locked)], timeout=30)
            assert r.returncode == 2, r.stderr
            assert b"is not writable" in r.stderr
            assert not ran.exists() and list(locked.iterdir()) == []
    else:
        locked.chmod(0o555)
        _assert_refused(["n", cmd, str(locked)], marks, "is not writable")


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["only-name"], "missing COMMAND after NAME"),
        (["a", "b", "/tmp", "extra"], "4 arguments where NAME COMMAND [LOCK_DIR] go"),
    ],
)
def test_wrong_argument_count(marks: Path, args: list[str], needle: str) -> None:
    r = run_cli(args)
    assert r.returncode == 2
    assert needle in r.stderr.decode()


@pytest.mark.parametrize(
    ("opts", "needle"),
    [
        (["--wait", "-1"], "--wait"),
        (["--wait", "nan"], "--wait"),
        (["--wait", "soon"], "needs a number of seconds"),
        (["--timeout", "0"], "more than 0"),
        (["--wait", "1", "--no-wait"], "exclude each other"),
        (["--bogus"], "no such option"),
    ],
)
def test_bad_options(lock_dir: Path, marks: Path, opts: list[str], needle: str) -> None:
    _assert_refused([*opts, "n", f"touch '{marks}/ran'", str(lock_dir)], marks, needle)


def test_lock_dir_given_twice_and_different(lock_dir: Path, tmp_path: Path, marks: Path) -> None:
    _assert_refused(
        ["--lock-dir", str(tmp_path), "n", f"touch '{marks}/ran'", str(lock_dir)], marks, "disagree"
    )


def test_a_lock_named_like_a_verb_needs_run(lock_dir: Path) -> None:
    r = run_cli(["run", "status", "echo verb-named", str(lock_dir)])
    assert r.returncode == 0 and r.stdout == b"verb-named\n"
    assert lock_file(lock_dir, "status").exists()


@pytest.mark.parametrize(
    "name",
    ["a/b", "../../etc/passwd", b"\xff\xfe invalid utf-8", "x" * 1000, ".", "..", "名前 ünï"],
)
def test_odd_names_land_at_the_hashed_path(lock_dir: Path, name: str | bytes) -> None:
    r = run_cli([name, "true", str(lock_dir)])
    assert r.returncode == 0, r.stderr
    assert [p.name for p in lock_dir.iterdir()] == [lock_file(lock_dir, name).name]
    raw = name if isinstance(name, bytes) else name.encode()
    assert b"waiting for lock " + raw + b" at " in r.stderr  # the raw name, byte for byte


@pytest.mark.parametrize("value", ["relative/dir", "/no/such/dir"])
def test_a_bad_lock_dir_from_the_environment_says_where_it_came_from(value: str) -> None:
    """Nothing on the command line named it: the message names the variable."""
    r = run_cli(["n", "true"], env={"LOCAL_MUTEX_LOCK_DIR": value})
    assert r.returncode == 2
    assert f"lock dir '{value}'" in r.stderr.decode() and "(from $LOCAL_MUTEX_LOCK_DIR)" in (
        r.stderr.decode()
    )
    r = run_cli(["--lock-dir", value, "n", "true"])
    assert r.returncode == 2 and b"LOCAL_MUTEX_LOCK_DIR" not in r.stderr
