"""A git remote given what it cannot take: a branch in the way, a name too long or not UTF-8,
a push the server keeps refusing, an address that is not one. Each ends in one clear line
and an exit status -- never a spin, a traceback or git's boilerplate."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from helpers import Procs, hold_until, run_cli, wait_for
from helpers.gitserver import drop_connection_once, git_daemon, install_hook, lock_state

pytestmark = pytest.mark.timeout(120)

# Before the fix these runs pushed in a tight loop for ever: a run must end well within this.
ENDS_WITHIN = 30.0


class Remote:
    def __init__(self, url: str, repo: Path) -> None:
        self.url, self.repo = url, repo


@pytest.fixture
def remote(tmp_path: Path) -> Iterator[Remote]:
    with git_daemon(tmp_path / "server") as url:
        yield Remote(url, tmp_path / "server" / "locks.git")


def _one_error_line(stderr: bytes) -> str:
    """The error line (after the 'waiting for lock' line a remote lock prints first)."""
    lines = [ln for ln in stderr.decode().splitlines() if "waiting for lock" not in ln]
    assert len(lines) == 1, stderr
    assert "Traceback" not in lines[0]
    return lines[0]


def _spy_on_git(tmp_path: Path) -> tuple[dict[str, str], Path]:
    """An environment whose `git` logs each of its subcommands, then runs the real git."""
    real = shutil.which("git")
    assert real is not None
    spy = tmp_path / "spy"
    spy.mkdir()
    log = tmp_path / "git-calls"
    (spy / "git").write_text(f'#!/bin/sh\necho "$1" >> "{log}"\nexec "{real}" "$@"\n')
    (spy / "git").chmod(0o755)
    return {"PATH": f"{spy}{os.pathsep}{os.environ['PATH']}"}, log


def _pushes(log: Path) -> int:
    return log.read_text().splitlines().count("push") if log.exists() else 0


@pytest.mark.parametrize(
    "how",
    [
        ["run", "--no-wait"],
        ["run", "--wait", "2"],
        ["run"],  # wait for ever
        ["hold", "--no-wait"],
    ],
)
def test_a_branch_in_the_way_is_a_clear_error_not_a_spin(
    remote: Remote, tmp_path: Path, how: list[str]
) -> None:
    assert run_cli(["-q", "--remote", remote.url, "deploy", "true"]).returncode == 0
    env, log = _spy_on_git(tmp_path)
    ran = tmp_path / "ran"
    args = [*how, "--remote", remote.url, "deploy/prod"]
    started = time.monotonic()
    r = run_cli(args + ([f"touch {ran}"] if how[0] == "run" else []), env=env, timeout=ENDS_WITHIN)
    assert r.returncode == 69, r.stderr
    assert time.monotonic() - started < ENDS_WITHIN
    line = _one_error_line(r.stderr)
    assert "'refs/heads/lock__deploy' exists; cannot create 'refs/heads/lock__deploy/prod'" in line
    assert "cannot also be the folder of another" in line
    assert not ran.exists() and r.stdout == b""
    assert _pushes(log) == 1  # git's reason is certain: no second try


def test_a_folder_in_the_way_is_a_clear_error(remote: Remote) -> None:
    assert run_cli(["-q", "--remote", remote.url, "env/prod", "true"]).returncode == 0
    r = run_cli(["--remote", remote.url, "--no-wait", "env", "true"], timeout=ENDS_WITHIN)
    assert r.returncode == 69, r.stderr
    assert "'refs/heads/lock__env/prod' exists; cannot create" in _one_error_line(r.stderr)


def test_a_name_too_long_for_the_servers_file_system_is_a_clear_error(remote: Remote) -> None:
    name = "n" * 300
    r = run_cli(["--remote", remote.url, "--wait", "5", name, "true"], timeout=ENDS_WITHIN)
    assert r.returncode == 69, r.stderr
    assert "File name too long" in _one_error_line(r.stderr)


def test_a_push_the_server_keeps_refusing_honours_wait_and_poll(
    remote: Remote, tmp_path: Path
) -> None:
    # A ref lock file a crashed git left on the server: every push of the branch fails with
    # "File exists", as a concurrent push would, but the branch never moves.
    (remote.repo / "refs" / "heads" / "lock__stuck.lock").write_text("")
    env, log = _spy_on_git(tmp_path)
    r = run_cli(
        ["run", "--remote", remote.url, "--no-wait", "stuck", "echo ran"],
        env=env,
        timeout=ENDS_WITHIN,
    )
    assert r.returncode == 75 and r.stdout == b"", r.stderr
    line = _one_error_line(r.stderr)
    assert "not acquired" in line and "it is free, but a push" in line and "File exists" in line
    assert _pushes(log) == 1
    # Waiting: a push per poll at most, and it gives up with git's reason.
    log.unlink()
    started = time.monotonic()
    r = run_cli(
        ["run", "--remote", remote.url, "--poll", "0.5", "stuck", "echo ran"],
        env=env,
        timeout=ENDS_WITHIN,
    )
    took = time.monotonic() - started
    assert r.returncode == 69 and r.stdout == b"", r.stderr
    line = _one_error_line(r.stderr)
    assert "it is free, but 5 pushes" in line and "File exists" in line
    assert _pushes(log) == 5
    assert took >= 4 * 0.5 * 0.8  # four polls between five pushes, jitter included


def test_a_wait_ceiling_ends_a_refused_push_as_not_acquired(remote: Remote) -> None:
    (remote.repo / "refs" / "heads" / "lock__stuck.lock").write_text("")
    started = time.monotonic()
    r = run_cli(
        ["run", "--remote", remote.url, "--wait", "1", "--poll", "5", "stuck", "echo ran"],
        timeout=ENDS_WITHIN,
    )
    assert r.returncode == 75 and r.stdout == b"", r.stderr
    assert time.monotonic() - started < ENDS_WITHIN
    assert "not acquired after" in _one_error_line(r.stderr)


@pytest.mark.parametrize("verb", ["status", "run", "hold", "release", "history"])
def test_a_name_that_is_not_utf8_is_refused(remote: Remote, verb: str) -> None:
    args: list[str | bytes] = [verb, "--remote", remote.url, "--", b"deploy-\xff"]
    if verb == "run":
        args.append("echo ran")
    r = run_cli(args)
    assert r.returncode == 2, r.stderr
    line = r.stderr.decode("utf-8", "replace").strip()
    assert "Traceback" not in line and "\n" not in line
    assert "'deploy-\\xff' cannot be a git branch name: it is not valid UTF-8" in line
    assert r.stdout == b""


def test_git_errors_show_their_cause_not_the_advice(tmp_path: Path) -> None:
    r = run_cli(["--remote", f"file://{tmp_path}/none.git", "x", "true"])
    assert r.returncode == 69
    line = _one_error_line(r.stderr)
    assert line.endswith(f"fatal: '{tmp_path}/none.git' does not appear to be a git repository")
    # An ssh that cannot resolve its host (a stand-in: no network needed).
    fake_ssh = (
        "sh -c 'echo \"ssh: Could not resolve hostname nowhere.invalid: "
        "Name or service not known\" >&2; exit 255'"
    )
    for address in ("ssh://git@nowhere.invalid/x.git", "git@nowhere.invalid:x.git"):
        r = run_cli(["--remote", address, "x", "true"], env={"GIT_SSH_COMMAND": fake_ssh})
        assert r.returncode == 69, r.stderr
        line = _one_error_line(r.stderr)
        assert line.endswith(
            "ssh: Could not resolve hostname nowhere.invalid: Name or service not known"
        ), line
        assert "repository exists" not in line


@pytest.mark.parametrize(
    "address",
    ["/tmp", "garbage", "postgresq://h/x", "./locks.git", "htps://github.com/a/b.git", "file://"],
)
@pytest.mark.parametrize("verb", ["run", "status", "list"])
def test_an_address_that_is_not_one_is_refused(address: str, verb: str, tmp_path: Path) -> None:
    operands = {"run": ["x", "touch ran"], "status": ["x"]}.get(verb, [])
    args = [verb, "--remote", address, *operands]
    r = run_cli(args, cwd=tmp_path)
    assert r.returncode == 2, r.stderr
    line = r.stderr.decode().strip()
    assert f"--remote '{address}' is not a lock address" in line and "\n" not in line
    for form in ("https://", "ssh://", "file:///path", "user@host:path", "self", "postgresql://"):
        assert form in line
    assert not (tmp_path / "ran").exists()
    # The same from the environment, named as the user gave it.
    r = run_cli(args[:1] + args[3:], env={"LOCAL_MUTEX_REMOTE": address}, cwd=tmp_path)
    assert r.returncode == 2, r.stderr
    line = r.stderr.decode()
    assert f"$LOCAL_MUTEX_REMOTE '{address}' is not a lock address" in line, line
    assert "--remote" not in line


@pytest.mark.parametrize(
    "verb", [["x", "true"], ["status", "x"], ["status", "--json", "x"], ["list", "--json"]]
)
def test_a_password_in_a_git_url_is_never_shown(verb: list[str]) -> None:
    """Messages, status and JSON show the URL with its password masked (git's own words
    included), after one warning that says where the URL is readable."""
    url = "http://user:TOPSECRET99@127.0.0.1:1/locks.git"
    r = run_cli(["--remote", url, *verb], timeout=60)
    assert r.returncode in (3, 69), r.stderr
    out = (r.stdout + r.stderr).decode()
    assert "TOPSECRET99" not in out and "Traceback" not in out, out
    assert "http://user:***@127.0.0.1:1/locks.git" in out, out
    assert "the --remote URL holds a password" in r.stderr.decode()
    # From the environment (a job-wide setting, or an enclosing run's): named so.
    r = run_cli(verb, env={"LOCAL_MUTEX_REMOTE": url}, timeout=60)
    assert r.returncode in (3, 69), r.stderr
    assert "TOPSECRET99" not in (r.stdout + r.stderr).decode()
    assert "the $LOCAL_MUTEX_REMOTE URL holds a password" in r.stderr.decode(), r.stderr
    assert "--remote" not in r.stderr.decode()


@pytest.mark.parametrize("token", ["t0ken", ""], ids=["with-a-token", "without"])
@pytest.mark.parametrize(
    "url", ["http://[::1/locks.git", "https://127.0.0.1:abc/l.git", "git://127.0.0.1:99999/l"]
)
def test_an_unparsable_url_is_a_clear_error(tmp_path: Path, url: str, token: str) -> None:
    """Not a remote that is down (69, or 3 for status): no URL git could reach (2)."""
    env = {"LOCAL_MUTEX_GIT_TOKEN": token, "TMPDIR": str(tmp_path)}
    for verb in (["n", "true"], ["status", "n"]):
        r = run_cli(["--remote", url, *verb], env=env)
        assert r.returncode == 2, r.stderr
        assert "is not a valid URL" in _one_error_line(r.stderr)
    assert list(tmp_path.iterdir()) == []  # no scratch repository left behind


def test_a_lock_push_that_landed_but_lost_its_answer_is_let_go_again(
    remote: Remote, tmp_path: Path
) -> None:
    """The server applies the lock push, then dies before it answers: the push "failed"
    (69), yet the branch was locked -- by a run that ran nothing and that nobody would
    release for a whole lease (a hold: for ever). It is undone as a stopped take's is."""
    armed = tmp_path / "armed"
    drop_connection_once(remote.repo, armed)
    for verb in (["x", f"touch '{tmp_path}/ran'"], ["hold", "x"]):
        armed.touch()
        r = run_cli(["--remote", remote.url, *verb], timeout=60)
        assert r.returncode == 69, r.stderr
        assert b"was undone" in r.stderr, r.stderr
        assert r.stdout == b"" and not (tmp_path / "ran").exists()
        assert lock_state(remote.url, "x") == "free"


@pytest.mark.parametrize("value", ["", "  "])
@pytest.mark.parametrize("verb", [["n", "touch ran"], ["status", "n"], ["hold", "n"]])
def test_an_empty_remote_is_refused_not_taken_for_this_machine(
    value: str, verb: list[str], tmp_path: Path
) -> None:
    """``--remote "$REMOTE"`` with the variable unset ran under this machine's lock, even
    with $LOCAL_MUTEX_REMOTE naming a remote: the exclusion across machines, quietly lost."""
    env = {
        "LOCAL_MUTEX_REMOTE": "git://127.0.0.1:1/locks.git",
        "LOCAL_MUTEX_LOCK_DIR": str(tmp_path),
    }
    r = run_cli(["--remote", value, *verb], env=env, cwd=tmp_path)
    assert r.returncode == 2, r.stderr
    assert "--remote is empty" in _one_error_line(r.stderr)
    assert sorted(p.name for p in tmp_path.iterdir()) == []  # no lock file, nothing ran


def test_a_renewal_that_landed_but_lost_its_answer_is_still_ours(
    remote: Remote, tmp_path: Path
) -> None:
    """The server applies a renewal, then dies before it answers. The next renewal's
    compare-and-swap then found our own renewal on the branch and took it for a takeover:
    a healthy command stopped (69), and the lock left held by the dead run for a lease."""
    armed = tmp_path / "armed"
    drop_connection_once(remote.repo, armed)
    # --kill-after 1 allows a 9 s lease, renewed every 3 s; the first renewal loses its
    # answer, the next look (a second later) finds it on the branch.
    cmd = f"touch '{armed}'; sleep 5; echo done"
    r = run_cli(["--remote", remote.url, "--lease", "9", "--kill-after", "1", "x", cmd], timeout=60)
    assert r.returncode == 0, r.stderr
    assert r.stdout == b"done\n" and not armed.exists(), r.stderr  # the hook did fire
    assert b"lost" not in r.stderr and b"changed hands" not in r.stderr, r.stderr
    assert lock_state(remote.url, "x") == "free"


def test_a_waiter_rides_out_a_server_blip(remote: Remote, procs: Procs, marks: Path) -> None:
    """The repository gone for a moment (a server restarting): a waiter's poll failing
    once ended its wait with 69 at once, while the holder rode the same blip out."""
    holder = procs.start(["--remote", remote.url, "x", hold_until(marks)])
    wait_for(marks / "h.held", 30, "the holder's command")
    waiter = procs.start(
        ["--remote", remote.url, "--poll", "0.5", "--wait", "60", "x", "echo mine"]
    )
    procs.wait_stderr(waiter, "waiting for lock x")
    away = remote.repo.with_name("away.git")
    remote.repo.rename(away)
    time.sleep(1.0)  # the blip: a poll or two finds no repository
    away.rename(remote.repo)
    (marks / "h.go").touch()
    assert holder.wait(30) == 0, procs.stderr(holder)
    assert waiter.wait(30) == 0, procs.stderr(waiter)
    assert procs.stdout(waiter) == "mine\n"


def test_a_lock_push_the_server_reported_before_the_connection_dropped_is_taken(
    remote: Remote, tmp_path: Path
) -> None:
    """The server applies the lock push and reports it, then the connection drops (git
    exits 1): that push landed. It was taken for a refusal -- nothing ran (69), no token,
    and the branch stayed locked for good (a hold) or for a lease (a run)."""
    armed = tmp_path / "armed"
    drop_connection_once(remote.repo, armed, "post-receive")
    armed.touch()
    r = run_cli(["--remote", remote.url, "x", "echo ran"], timeout=60)
    assert (r.returncode, r.stdout) == (0, b"ran\n"), r.stderr
    assert not armed.exists()  # the hook did drop the connection
    armed.touch()
    held = run_cli(["hold", "--remote", remote.url, "x"], timeout=60)
    assert held.returncode == 0 and len(held.stdout.strip()) == 32, held.stderr
    token = held.stdout.decode().strip()
    r = run_cli(["release", "--remote", remote.url, "x", "--token", token], timeout=60)
    assert r.returncode == 0, r.stderr
    assert lock_state(remote.url, "x") == "free"


def test_one_branch_with_an_untrustworthy_body_does_not_hide_the_others(
    remote: Remote, tmp_path: Path
) -> None:
    """``list`` skipped only branches that are no locks at all: one lock branch whose
    body cannot be trusted (written by anyone who can push) made it exit 2, listing
    nothing. ``status`` of that very name still says what is wrong with it."""
    git = ["git", "-c", "user.name=a", "-c", "user.email=a@b", "--git-dir", str(tmp_path / "w")]

    def out(*args: str) -> str:
        return subprocess.run([*git, *args], capture_output=True, text=True, check=True).stdout

    out("init", "-q", "--bare")
    empty_tree = "4b825dc642cb6eb9a060e54bf8d69288fbee4904"
    junk = out("commit-tree", empty_tree, "-m", 'lock by x: junk\n\n{"expires_at": "soon"}')
    out("push", "-q", remote.url, f"{junk.strip()}:refs/heads/lock__junk")
    assert run_cli(["hold", "--remote", remote.url, "good"]).returncode == 0
    r = run_cli(["list", "--remote", remote.url, "--json"])
    assert r.returncode == 0, r.stderr
    assert [lock["name"] for lock in json.loads(r.stdout)] == ["good"]
    r = run_cli(["status", "--remote", remote.url, "junk"])
    assert r.returncode == 2 and b"has a lease end that is not a time" in r.stderr, r.stderr


def test_history_shows_a_commit_it_cannot_trust_and_every_other(tmp_path: Path) -> None:
    """One commit on a lock branch whose body cannot be trusted made ``history`` exit 2,
    printing nothing -- for good, since the branch's history cannot be rewritten. It is
    shown as unreadable (its first line, escaped, and why), the other entries as ever."""
    repo = tmp_path / "r.git"
    git = ["git", "-c", "user.name=x", "-c", "user.email=x@x", "--git-dir", str(repo)]

    def out(*args: str, text: str | None = None) -> str:
        return subprocess.run(
            [*git, *args], input=text, capture_output=True, text=True, check=True
        ).stdout.strip()

    out("init", "-q", "--bare")
    url = f"file://{repo}"
    assert run_cli(["run", "--remote", url, "h", "true"]).returncode == 0
    tip, tree = out("rev-parse", "refs/heads/lock__h"), "4b825dc642cb6eb9a060e54bf8d69288fbee4904"
    said = 'lock by other-tool: x\x1b[2J\n\n{"state": "lock", "expires_at": 1e400}'
    bad = out("commit-tree", tree, "-p", tip, text=said)
    after = out("commit-tree", tree, "-p", bad, text='unlock by other-tool: y\n\n{"message": "y"}')
    out("update-ref", "refs/heads/lock__h", after)
    r = run_cli(["history", "h", "--remote", url, "--json"])
    assert r.returncode == 0, r.stderr
    rows = json.loads(r.stdout)
    assert [(e["event"], e["actor"], e["message"]) for e in rows] == [
        ("lock", rows[0]["actor"], None),
        ("unlock", rows[0]["actor"], None),
        ("unreadable", "other-tool", "x\x1b[2J"),
        ("unlock", "other-tool", "y"),
    ]
    why = f"branch refs/heads/lock__h ({bad[:12]}) has a lease end that is not a time: 'inf'"
    assert [e["error"] for e in rows] == [None, None, why, None]
    assert (rows[2]["oid"], rows[2]["host"], rows[2]["holder_id"]) == (bad, None, None)
    r = run_cli(["history", "h", "--remote", url])
    lines = r.stdout.decode().splitlines()
    assert r.returncode == 0 and len(lines) == 4, r
    assert lines[2].endswith(f"  unreadable other-tool: x\\x1b[2J, body not read: {why}")
    assert lines[3].endswith("  unlock   other-tool: y")


def test_each_keep_going_goes_on_past_an_item_the_remote_failed(
    remote: Remote, tmp_path: Path
) -> None:
    """The second item's lock push lands but loses its answer (69 for that item): with
    --keep-going the batch used to end there, unsummed, the item unnamed."""
    count = tmp_path / "count"
    # Push 1 locks a, push 2 unlocks it, push 3 locks b: its server dies before answering.
    install_hook(
        remote.repo,
        "reference-transaction",
        f"cat > /dev/null\n[ \"$1\" = committed ] || exit 0\necho x >> '{count}'\n"
        f"[ $(wc -l < '{count}') -eq 3 ] && kill -9 $PPID\nexit 0\n",
    )
    r = run_cli(
        ["each", "--keep-going", "--remote", remote.url, "item-{}", 'echo "ran $LOCAL_MUTEX_ITEM"'],
        input=b"a\nb\nc\n",
        timeout=120,
    )
    assert r.returncode == 1, r.stderr  # one item failed
    assert r.stdout == b"ran a\nran c\n", r.stderr
    assert b"item 'b':" in r.stderr and b"2 items ran, 1 could not run" in r.stderr, r.stderr
    assert lock_state(remote.url, "item-b") == "free"


def test_an_unlock_that_landed_but_lost_its_answer_is_a_release(
    remote: Remote, tmp_path: Path
) -> None:
    """The server applies the unlock, then dies before it answers: a run warned that it
    "could not release cleanly", and `release` of a hold failed with 69, both after the
    lock was released."""
    armed = tmp_path / "armed"
    drop_connection_once(remote.repo, armed)
    r = run_cli(["--remote", remote.url, "x", f"touch '{armed}'"], timeout=60)
    assert r.returncode == 0 and not armed.exists(), r.stderr  # the drop did fire
    assert b"cleanly" not in r.stderr, r.stderr
    assert lock_state(remote.url, "x") == "free"
    token = run_cli(["hold", "--remote", remote.url, "y"], timeout=60)
    assert token.returncode == 0, token.stderr
    armed.touch()
    r = run_cli(["release", "--remote", remote.url, "--token", token.stdout.decode().strip(), "y"])
    assert r.returncode == 0 and not armed.exists(), r.stderr
    assert lock_state(remote.url, "y") == "free"


def test_a_lock_dir_with_a_remote_is_refused_unless_the_remote_is_the_jobs(
    tmp_path: Path, lock_dir: Path
) -> None:
    """A lock dir a remote lock never uses: asked for both on the command line, refused; a
    job-wide $LOCAL_MUTEX_REMOTE moves the job's calls off the machine, LOCK_DIRs and all."""
    url = f"file://{tmp_path}/none.git"
    for args in (
        ["--remote", url, "--lock-dir", str(lock_dir), "g", "touch ran"],
        ["--remote", url, "g", "touch ran", str(lock_dir)],
        ["status", "--remote", url, "--lock-dir", str(lock_dir), "g"],
    ):
        r = run_cli(args, cwd=tmp_path)
        assert r.returncode == 2, r.stderr
        assert b"--lock-dir cannot be used with git remotes" in r.stderr
    assert not (tmp_path / "ran").exists()
    r = run_cli(["g", "touch ran", str(lock_dir)], cwd=tmp_path, env={"LOCAL_MUTEX_REMOTE": url})
    assert b"cannot be used" not in r.stderr  # the remote's own answer (none there): 69
    assert r.returncode == 69, r.stderr
