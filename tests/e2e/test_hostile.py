"""Bad input and a shared directory in a hostile state: the documented exit code and one
clear line, never a traceback, nothing run and nothing left held."""

from __future__ import annotations

import errno
import json
import os
import re
import resource
import shlex
import shutil
import signal
import stat
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from helpers import (
    CLI,
    Procs,
    clean_env,
    hold_until,
    lock_file,
    lock_is_free,
    run_cli,
    wait_for,
)
from helpers.otheruser import as_other_user

Run = Callable[[Sequence[str], bytes], "subprocess.CompletedProcess[bytes]"]
has_proc = pytest.mark.skipif(not os.path.isdir("/proc/self/fd"), reason="reads /proc/<pid>")


def _err(r: subprocess.CompletedProcess[bytes]) -> str:
    err = r.stderr.decode("utf-8", "replace")
    assert "Traceback" not in err, err
    return err


def _status(name: str, lock_dir: Path) -> tuple[int, dict[str, Any]]:
    r = run_cli(["status", "--lock-dir", str(lock_dir), "--json", "--", name], timeout=30)
    _err(r)
    data: dict[str, Any] = json.loads(r.stdout)
    return r.returncode, data


@contextmanager
def _held(name: str, lock_dir: Path, env: dict[str, str] | None = None) -> Iterator[str]:
    """A hold taken by this user, always force-released at the end."""
    r = run_cli(["hold", name, "--lock-dir", str(lock_dir)], env=env, timeout=30)
    try:
        assert r.returncode == 0, _err(r)
        yield r.stdout.decode().strip()
    finally:
        run_cli(["release", name, "--lock-dir", str(lock_dir), "--force"], timeout=30)


def _tagged(tag: str) -> list[int]:
    """Live processes started with ``LM_HOSTILE_TAG=<tag>`` in their environment."""
    found = []
    needle = f"LM_HOSTILE_TAG={tag}".encode()
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                environ = Path(f"/proc/{entry}/environ").read_bytes()
            except OSError:
                continue
            if needle in environ.split(b"\0"):
                found.append(int(entry))
    return found


def _openers(path: Path) -> list[int]:
    """Processes with ``path`` open (any fd)."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            fds = os.listdir(f"/proc/{entry}/fd")
        except OSError:
            continue
        for fd in fds:
            try:
                if os.readlink(f"/proc/{entry}/fd/{fd}") == str(path):
                    found.append(int(entry))
                    break
            except OSError:
                continue
    return found


# -- list of a directory it cannot read ------------------------------------------------------


@contextmanager
def _dir_for_someone_else(tmp_path: Path) -> Iterator[tuple[Path, Path, Run]]:
    """A lock dir, a marks dir, and a way to run the CLI as someone the lock dir's mode
    applies to (root bypasses permissions, so as root that someone is uid 65534)."""
    if os.geteuid() == 0:
        with as_other_user() as nobody:
            yield (
                nobody.shared_dir("locks"),
                nobody.shared_dir("marks", 0o777),
                lambda args, stdin: nobody.run(args, timeout=30, input=stdin),
            )
    else:
        d, marks = tmp_path / "locks-for-mode", tmp_path / "marks-for-mode"
        d.mkdir()
        marks.mkdir()
        try:
            yield d, marks, lambda args, stdin: run_cli(args, timeout=30, input=stdin)
        finally:
            d.chmod(0o755)


@pytest.mark.parametrize(
    "mode",
    [0o000, 0o311, 0o744],
    ids=["unreadable", "searchable-not-readable", "readable-not-searchable"],
)
def test_list_of_a_lock_dir_it_cannot_read_cannot_tell(tmp_path: Path, mode: int) -> None:
    with _dir_for_someone_else(tmp_path) as (d, _, run):
        assert run_cli(["run", "there", "true", str(d)]).returncode == 0
        # The mode is for others (the uid 65534 root runs it as); run as its owner, the
        # same bits go to the owner.
        d.chmod(mode if os.geteuid() == 0 else (mode & 0o7) << 6)
        for extra in ([], ["--all"], ["--json"], ["--all", "--json"]):
            r = run(["list", "--lock-dir", str(d), *extra], b"")
            err = _err(r)
            assert r.returncode == 3, (extra, r.returncode, err, r.stdout)
            assert f"cannot read lock dir '{d}'" in err, err
            assert b"no lock files" not in r.stdout + r.stderr


# -- release ---------------------------------------------------------------------------------


@has_proc
def test_release_by_another_user_with_the_right_token_is_a_clear_refusal() -> None:
    """The refusal names the holder's real user, not the $USER its record keeps (anybody
    can set that: "belongs to user admin, ask them")."""
    with as_other_user() as nobody:
        d = nobody.shared_dir("locks")
        with _held("theirs", d, env={"USER": "someone-else"}) as token:
            _, st = _status("theirs", d)
            pid = st["holders"][0]["pid"]
            for how in (["--token", token], ["--force"]):
                r = nobody.run(["release", "theirs", "--lock-dir", str(d), *how], timeout=30)
                err = _err(r)
                assert r.returncode == 77, (how, r.returncode, err)
                assert re.search(
                    r"belongs to user (uid 0|root); only that user or root can end it", err
                ), err
                assert token not in err
                code, st = _status("theirs", d)
                assert code == 1 and st["holders"][0]["pid"] == pid
            r = run_cli(["release", "theirs", "--lock-dir", str(d), "--token", token])
            assert r.returncode == 0, _err(r)
            assert _status("theirs", d)[0] == 0


def test_release_in_the_wrong_lock_dir_says_where_it_looked(lock_dir: Path, tmp_path: Path) -> None:
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    with _held("deploy", lock_dir) as token:
        for args, env in [
            (["--lock-dir", str(elsewhere), "--token", token], None),
            (["--force"], {"LOCAL_MUTEX_LOCK_DIR": str(elsewhere)}),
            (["--lock-dir", str(elsewhere)], {"LOCAL_MUTEX_HOLD_TOKEN": token}),
        ]:
            r = run_cli(["release", "deploy", *args], env=env)
            err = _err(r)
            assert r.returncode == 2, (args, r.returncode, err)
            assert str(elsewhere) in err and "another lock dir" in err, err
            assert list(elsewhere.iterdir()) == []
            assert _status("deploy", lock_dir)[0] == 1  # the hold is untouched
        # The right dir, a name that was never used there: the same clear answer.
        r = run_cli(["release", "never-held", "--lock-dir", str(lock_dir)])
        assert r.returncode == 2 and str(lock_dir) in _err(r)
        assert not lock_file(lock_dir, "never-held").exists()
        r = run_cli(["release", "deploy", "--lock-dir", str(lock_dir), "--token", token])
        assert r.returncode == 0, _err(r)
    # A lock file that exists and is free (a hold that ran out its --ttl, an
    # `if: always()` release step): still a no-op, with a warning.
    r = run_cli(["release", "deploy", "--lock-dir", str(lock_dir), "--token", token])
    assert r.returncode == 0 and "not held; nothing to release" in _err(r)


# -- the hold token --------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("actions", "name"),
    [(False, "it's held"), (True, "it's held"), (False, "-x")],
    ids=["terminal", "github-actions", "a-name-like-an-option"],
)
def test_hold_prints_its_token_on_stdout_only(tmp_path: Path, actions: bool, name: str) -> None:
    d = tmp_path / "lock dir"
    d.mkdir()
    summary = tmp_path / "summary.md"
    env = {"GITHUB_ACTIONS": "true", "GITHUB_STEP_SUMMARY": str(summary)} if actions else {}
    r = run_cli(["hold", "--lock-dir", str(d), "--", name], env=env, timeout=30)
    try:
        err = _err(r)
        assert r.returncode == 0, err
        token = r.stdout.decode().strip()
        assert re.fullmatch(r"[0-9a-f]{32}", token) and r.stdout == f"{token}\n".encode()
        assert token not in err and "::add-mask::" not in err
        assert not summary.exists() or token not in summary.read_text()
        (hint,) = [line for line in err.splitlines() if "release with: " in line]
        assert hint.startswith("::notice::") == actions, hint
        assert f"--lock-dir {shlex.quote(str(d))}" in hint
        # The hint, with the token filled in, is a working release command.
        argv = shlex.split(
            hint.split("release with: ", 1)[1].replace("<the token printed above>", token)
        )
        # The token goes in the environment: a command line is anybody's to read.
        assert argv[0] == f"LOCAL_MUTEX_HOLD_TOKEN={token}" and "--token" not in argv, hint
        if name.startswith("-"):
            assert argv[-2:] == ["--", name], hint
        else:
            assert argv[1:4] == ["local-mutex", "release", name]
        rel = subprocess.run(
            [*CLI, *argv[2:]],
            env=clean_env({**env, "LOCAL_MUTEX_HOLD_TOKEN": token}),
            capture_output=True,
            timeout=30,
            input=b"",
        )
        assert rel.returncode == 0, _err(rel)
        assert token not in _err(rel) and rel.stdout == b""
        assert _status(name, d)[0] == 0
    finally:
        run_cli(["release", "--lock-dir", str(d), "--force", "--", name])


# -- a holder record that cannot be written --------------------------------------------------


def _limit_file_size() -> None:
    # Python ignores SIGXFSZ, so an over-limit write fails with EFBIG instead of killing it.
    resource.setrlimit(resource.RLIMIT_FSIZE, (0, 0))


def _assert_74_and_nothing_held(
    lock_dir: Path, marks: Path, tag: str, preexec_fn: Callable[[], None] | None = None
) -> None:
    try:
        env = clean_env({"LM_HOSTILE_TAG": tag})
        ran = marks / "ran"
        for args in (
            ["hold", "full", "--lock-dir", str(lock_dir)],
            ["hold", "full", "--ttl", "600", "--message", "m" * 200, "--lock-dir", str(lock_dir)],
            ["run", "full", f"touch '{ran}'", str(lock_dir)],
            ["run", "--no-wait", "full", f"touch '{ran}'", str(lock_dir)],
        ):
            r = subprocess.run(
                [*CLI, *args],
                env=env,
                capture_output=True,
                timeout=60,
                input=b"",
                preexec_fn=preexec_fn,
            )
            err = _err(r)
            assert r.returncode == 74, (args, r.returncode, err)
            assert r.stdout == b"" and err.strip(), (args, r.stdout)
            assert not ran.exists()
            path = lock_file(lock_dir, "full")
            assert lock_is_free(path)
            code, st = _status("full", lock_dir)
            assert code == 0 and st["state"] == "free" and st["holders"] == [], st
            wait_for(lambda: not _tagged(tag), 20, f"no process left from {args}")
            assert _openers(path) == []
            # Nothing to release, nothing wedged.
            r = run_cli(["release", "full", "--lock-dir", str(lock_dir), "--force"])
            assert r.returncode == 0 and "nothing to release" in _err(r)
    finally:
        for pid in _tagged(tag):  # only if the product misbehaved: no hold outlives the test
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass


@has_proc
def test_hold_and_run_fail_74_when_the_file_size_limit_stops_the_record(
    lock_dir: Path, marks: Path
) -> None:
    tag = f"fsize-{os.getpid()}-{time.monotonic_ns()}"
    # The tag is visible in a real holder (so "no tagged process" below means something).
    with _held("seen", lock_dir, env={"LM_HOSTILE_TAG": tag}):
        assert len(_tagged(tag)) == 1
    wait_for(lambda: not _tagged(tag), 20, "the released holder to exit")
    _assert_74_and_nothing_held(lock_dir, marks, tag, _limit_file_size)
    r = run_cli(["run", "full", f"touch '{marks}/after'", str(lock_dir)])
    assert r.returncode == 0 and (marks / "after").exists()


@has_proc
@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to mount a small tmpfs")
def test_hold_and_run_fail_74_on_a_full_filesystem(tmp_path: Path, marks: Path) -> None:
    with _small_tmpfs(tmp_path, "size=4k") as small:
        fd = os.open(small / "filler", os.O_WRONLY | os.O_CREAT, 0o644)
        try:
            while True:
                os.write(fd, b"x" * 512)
        except OSError as exc:
            assert exc.errno == errno.ENOSPC
        finally:
            os.close(fd)
        tag = f"enospc-{os.getpid()}-{time.monotonic_ns()}"
        _assert_74_and_nothing_held(small, marks, tag)


@contextmanager
def _small_tmpfs(tmp_path: Path, size: str) -> Iterator[Path]:
    """A tmpfs of that size (``size=4k``, ``nr_inodes=8``) on a directory of ours: a full
    file system without filling the machine's; unmounted after."""
    if shutil.which("mount") is None or shutil.which("umount") is None:
        pytest.skip("needs mount(8) and umount(8)")
    small = tmp_path / "small"
    small.mkdir()
    m = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"{size},mode=0755", "tmpfs", str(small)],
        capture_output=True,
    )
    if m.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {m.stderr.decode().strip()}")
    try:
        yield small
    finally:
        if subprocess.run(["umount", str(small)], capture_output=True).returncode != 0:
            subprocess.run(["umount", "-l", str(small)], capture_output=True)
    assert not os.path.ismount(small)


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to mount a small tmpfs")
def test_no_inode_left_for_a_lock_file_is_74_too(tmp_path: Path, marks: Path) -> None:
    """Out of inodes the lock file itself cannot be created: that was exit 2 (bad usage),
    while a full disk under the record was 74."""
    with _small_tmpfs(tmp_path, "nr_inodes=8") as small:
        try:
            for i in range(64):
                (small / f"filler{i}").touch()
        except OSError as exc:
            assert exc.errno == errno.ENOSPC
        r = run_cli(["inodes", f"touch '{marks}/ran'", str(small)])
        assert r.returncode == 74, r.stderr
        assert b"cannot create lock file" in r.stderr and b"No space left" in r.stderr
        assert not (marks / "ran").exists()


# -- status of what run refuses --------------------------------------------------------------


def _plant_fifo(path: Path, tmp_path: Path) -> None:
    os.mkfifo(path)


def _plant_symlink(path: Path, tmp_path: Path) -> None:
    (tmp_path / "victim").write_text("keep me\n")
    path.symlink_to(tmp_path / "victim")


def _plant_hard_link(path: Path, tmp_path: Path) -> None:
    (tmp_path / "victim").write_text("keep me\n")
    os.link(tmp_path / "victim", path)


def _plant_directory(path: Path, tmp_path: Path) -> None:
    path.mkdir()


@pytest.mark.parametrize(
    "plant",
    [_plant_fifo, _plant_symlink, _plant_hard_link, _plant_directory],
    ids=["fifo", "symlink", "hard-link", "directory"],
)
def test_status_refuses_what_run_refuses_with_the_same_message(
    lock_dir: Path, tmp_path: Path, marks: Path, plant: Callable[[Path, Path], None]
) -> None:
    plant(lock_file(lock_dir, "odd"), tmp_path)
    ran = run_cli(["run", "odd", f"touch '{marks}/ran'", str(lock_dir)], timeout=30)
    assert ran.returncode == 2, _err(ran)
    assert not (marks / "ran").exists()
    refusal = _err(ran).strip()
    assert refusal.count("\n") == 0 and str(lock_file(lock_dir, "odd")) in refusal
    for extra in ([], ["--json"]):
        r = run_cli(["status", "odd", "--lock-dir", str(lock_dir), *extra], timeout=30)
        assert r.returncode == 2, (extra, r.returncode, _err(r), r.stdout)
        assert _err(r).strip() == refusal
        assert b"free" not in r.stdout
    if (tmp_path / "victim").exists():
        assert (tmp_path / "victim").read_text() == "keep me\n"


# -- lock file modes -------------------------------------------------------------------------


@pytest.mark.parametrize("umask", [0o000, 0o077], ids=["umask-0", "umask-077"])
def test_lock_files_are_0644_whatever_the_umask(lock_dir: Path, umask: int) -> None:
    def cli(args: list[str], stdin: bytes = b"") -> None:
        r = subprocess.run(
            [*CLI, *args],
            env=clean_env(),
            capture_output=True,
            timeout=30,
            input=stdin,
            umask=umask,
        )
        assert r.returncode == 0, (args, _err(r))

    cli(["run", "plain", "true", str(lock_dir)])
    cli(["run", "--shared", "reader", "true", str(lock_dir)])
    cli(["run", "--slots", "2", "pool", "true", str(lock_dir)])
    cli(["each", "--lock-dir", str(lock_dir), "item-{}", "true"], stdin=b"a\nb\n")
    try:
        cli(["hold", "kept", "--lock-dir", str(lock_dir)])
    finally:
        run_cli(["release", "kept", "--lock-dir", str(lock_dir), "--force"])
    for name in ("plain", "reader", "item-a", "item-b", "kept"):
        assert lock_file(lock_dir, name).exists(), name
    modes = {p.name: oct(stat.S_IMODE(p.stat().st_mode)) for p in lock_dir.iterdir()}
    assert len(modes) >= 6 and set(modes.values()) == {"0o644"}, modes


# -- the seed's phrases ----------------------------------------------------------------------


def _verb_args(verb: str, name: str, lock_dir: str, command: str) -> list[str]:
    return {
        "plain": [name, command, lock_dir],
        "run": ["run", name, command, "--lock-dir", lock_dir],
        "each": ["each", name + "{}", command, "--lock-dir", lock_dir],
        "status": ["status", name, "--lock-dir", lock_dir],
        "hold": ["hold", name, "--lock-dir", lock_dir],
        "release": ["release", name, "--lock-dir", lock_dir],
        "list": ["list", "--lock-dir", lock_dir],
    }[verb]


VERBS = ["plain", "run", "each", "status", "hold", "release", "list"]


@pytest.mark.parametrize("verb", VERBS)
def test_messages_carry_the_seed_phrases(lock_dir: Path, tmp_path: Path, verb: str) -> None:
    cases = [
        ("relative/locks", "n", "must be an absolute path"),
        (str(tmp_path / "missing"), "n", "does not exist or is not a directory"),
        (str(tmp_path / "a-file"), "n", "does not exist or is not a directory"),
    ]
    if verb != "list":
        cases.append((str(lock_dir), "a\nb", "control characters (byte 0x0A)"))
        cases.append((str(lock_dir), "tab\t", "control characters (byte 0x09)"))
    (tmp_path / "a-file").write_text("x")
    for d, name, phrase in cases:
        args = _verb_args(verb, name, d, f"touch '{tmp_path}/ran'")
        r = run_cli(args, input=b"x\n", timeout=30)
        err = _err(r)
        assert r.returncode == 2, (d, name, r.returncode, err)
        assert phrase in err, (phrase, err)
        assert r.stdout == b""
    assert not (tmp_path / "ran").exists() and list(lock_dir.iterdir()) == []


def test_an_unwritable_lock_dir_is_not_writable_for_every_verb_that_writes(
    tmp_path: Path,
) -> None:
    with _dir_for_someone_else(tmp_path) as (d, marks, run):
        d.chmod(0o755 if os.geteuid() == 0 else 0o555)
        for verb in ("plain", "run", "each", "hold"):
            r = run(_verb_args(verb, "n", str(d), f"touch '{marks}/ran'"), b"x\n")
            err = _err(r)
            assert r.returncode == 2, (verb, r.returncode, err)
            assert "is not writable" in err and str(d) in err, err
            assert r.stdout == b"" and list(marks.iterdir()) == []
        # Reading needs no write access.
        r = run(["status", "n", "--lock-dir", str(d)], b"")
        assert r.returncode == 0, _err(r)
        r = run(["list", "--lock-dir", str(d), "--all"], b"")
        assert r.returncode == 0, _err(r)
        assert list(d.iterdir()) == []


@has_proc
@pytest.mark.parametrize("closed", ["<&-", ">&-", "2>&-", "<&- >&- 2>&-"])
def test_a_closed_standard_stream_stays_closed_for_the_command(
    lock_dir: Path, marks: Path, closed: str
) -> None:
    """`local-mutex NAME CMD >&-`: the command runs with the stream closed, as its caller
    had it (a write fails, EBADF, as without local-mutex) -- never with our lock file in
    its place, where its output would land, nor with the /dev/null standing in for it in
    local-mutex itself, where it would vanish unnoticed."""
    report = marks / "fds"
    # Which of 0, 1, 2 are open, asked before opening anything (a shell's redirection or
    # pipe would take the lowest free number itself).
    probe = (
        "import os, sys\n"
        "fds = [fd for fd in (0, 1, 2) if os.path.exists(f'/proc/self/fd/{fd}')]\n"
        "open(sys.argv[1], 'w').write(' '.join(f'{fd} ' + os.readlink(f'/proc/self/fd/{fd}')"
        " for fd in fds))"
    )
    command = f"{shlex.quote(sys.executable)} -c {shlex.quote(probe)} {report}; "
    command += "echo to-stdout; echo to-stderr >&2; true"
    script = f"{shlex.join([*CLI, 'closed', command, str(lock_dir)])} {closed}"
    out = subprocess.run(["sh", "-c", script], env=clean_env(), capture_output=True, timeout=60)
    assert out.returncode == 0, out.stderr
    words = report.read_text().split()
    targets = dict(zip(words[::2], words[1::2]))
    for fd, redirect in (("0", "<&-"), ("1", ">&-"), ("2", "2>&-")):
        if redirect in closed.split():
            assert fd not in targets, targets
        else:
            assert fd in targets, targets
    record = lock_file(lock_dir, "closed").read_bytes()
    assert b"to-std" not in record


def test_a_waiter_whose_lock_dir_went_away_says_so(
    procs: Procs, lock_dir: Path, marks: Path
) -> None:
    """The lock dir renamed away while a waiter waited: it said "lock file … cannot be
    opened: No such file or directory" instead of the lock dir's own message."""
    sub = lock_dir / "sub"
    sub.mkdir()
    holder = procs.start(["away", hold_until(marks, "a"), str(sub)])
    wait_for(marks / "a.held")
    waiter = procs.start(["away", f"touch '{marks}/waiter.ran'", str(sub)])
    procs.wait_stderr(waiter, "waiting for lock away")
    sub.rename(lock_dir / "moved")
    (marks / "a.go").touch()
    assert holder.wait(30) == 0, procs.stderr(holder)
    assert waiter.wait(30) == 2, procs.stderr(waiter)
    assert f"lock dir '{sub}' does not exist or is not a directory" in procs.stderr(waiter)
    assert not (marks / "waiter.ran").exists()
