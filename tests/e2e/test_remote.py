"""Remote locks against a real git server on loopback (git daemon, started per test)."""

from __future__ import annotations

import json
import os
import re
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from helpers import CLI, Procs, clean_env, hold_until, run_cli, wait_for
from helpers.gitserver import branch_message, git_daemon

pytestmark = pytest.mark.timeout(180)


@pytest.fixture
def remote(tmp_path: Path) -> Iterator[str]:
    with git_daemon(tmp_path / "server") as url:
        yield url


def _status(name: str, url: str) -> dict[str, object]:
    r = run_cli(["status", name, "--remote", url, "--json"])
    assert r.returncode in (0, 1), r.stderr
    data: dict[str, object] = json.loads(r.stdout)
    return data


def test_ten_concurrent_holds_exactly_one_wins(remote: str) -> None:
    procs = [
        subprocess.Popen(
            [*CLI, "hold", "one", "--no-wait", "--remote", remote],
            env=clean_env(),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )
        for _ in range(10)
    ]
    codes = [p.wait(120) for p in procs]
    assert sorted(codes) == [0] + [75] * 9, [p.stderr.read() for p in procs if p.stderr]
    assert _status("one", remote)["state"] == "held"


def test_two_runs_never_overlap(procs: Procs, remote: str, tmp_path: Path) -> None:
    log = tmp_path / "log"
    cmd = f'echo "start $$" >> "{log}"; sleep 1; echo "end $$" >> "{log}"'
    ps = [
        procs.start(["run", "--remote", remote, "--poll", "0.2", "shared-db", cmd])
        for _ in range(2)
    ]
    assert [p.wait(120) for p in ps] == [0, 0], [procs.stderr(p) for p in ps]
    lines = log.read_text().splitlines()
    assert len(lines) == 4
    for k in (0, 2):
        assert lines[k].startswith("start") and lines[k + 1] == lines[k].replace("start", "end")
    # The bookends, as a local lock prints them; the one that waited says when it got it.
    errs = [procs.stderr(p) for p in ps]
    for err in errs:
        assert "waiting for lock shared-db at" in err and "released shared-db at" in err, err
    assert sum("acquired lock shared-db at" in err for err in errs) == 1, errs


def test_lock_action_locks_are_respected(remote: str, tmp_path: Path) -> None:
    # A lock written exactly as lock-action writes it, by hand with plain git.
    repo = tmp_path / "hand.git"
    subprocess.run(["git", "init", "--quiet", "--bare", str(repo)], check=True)
    git = ["git", "--git-dir", str(repo)]
    tree = subprocess.run(
        [*git, "mktree"], input="", capture_output=True, text=True, check=True
    ).stdout.strip()
    body = {
        "message": "test",
        "state": "lock",
        "actor": "suzuki-shunsuke",
        "github_actions_workflow_run_url": "https://github.com/o/r/actions/runs/1",
        "pull_request_number": 237,
    }
    msg = "lock by suzuki-shunsuke: test\n" + json.dumps(body, indent=2) + "\n"
    env = clean_env(
        {
            "GIT_AUTHOR_NAME": "t",
            "GIT_AUTHOR_EMAIL": "t@localhost",
            "GIT_COMMITTER_NAME": "t",
            "GIT_COMMITTER_EMAIL": "t@localhost",
        }
    )
    oid = subprocess.run(
        [*git, "commit-tree", tree, "-m", msg], capture_output=True, text=True, check=True, env=env
    ).stdout.strip()
    subprocess.run([*git, "push", "--quiet", remote, f"{oid}:refs/heads/lock__foo"], check=True)
    r = run_cli(["status", "foo", "--remote", remote])
    assert r.returncode == 1 and b"suzuki-shunsuke" in r.stdout
    r = run_cli(["run", "--remote", remote, "--no-wait", "foo", "echo never"])
    assert r.returncode == 75 and r.stdout == b""
    # lock-action's own lock has no lease: only --force ends it.
    assert run_cli(["release", "foo", "--remote", remote]).returncode == 77
    assert run_cli(["release", "foo", "--remote", remote, "--force"]).returncode == 0


def test_our_locks_parse_as_lock_action_expects(remote: str, tmp_path: Path) -> None:
    r = run_cli(
        ["hold", "bar", "--remote", remote, "--message", "deploying"],
        env={"GITHUB_ACTOR": "octo", "GITHUB_RUN_ID": "9", "GITHUB_REPOSITORY": "o/r"},
    )
    assert r.returncode == 0, r.stderr
    text = branch_message(remote, "lock__bar", tmp_path)
    first, _, rest = text.partition("\n")
    assert re.fullmatch(r"lock by octo: deploying", first)
    body = json.loads(rest)
    assert body["state"] == "lock" and body["actor"] == "octo" and body["message"] == "deploying"
    assert body["github_actions_workflow_run_url"] == "https://github.com/o/r/actions/runs/9"
    assert "pull_request_number" in body and body["host"] and body["holder_id"]


def test_release_by_non_holder_force_and_history(remote: str) -> None:
    job_a = {"GITHUB_RUN_ID": "1", "GITHUB_RUN_ATTEMPT": "1", "GITHUB_JOB": "a", "RUNNER_NAME": "r"}
    token = run_cli(["hold", "h", "--remote", remote], env=job_a).stdout.decode().strip()
    r = run_cli(["release", "h", "--remote", remote], env={**job_a, "GITHUB_JOB": "b"})
    assert r.returncode == 77 and b"--force" in r.stderr
    assert run_cli(["release", "h", "--remote", remote], env=job_a).returncode == 0
    assert run_cli(["release", "h", "--remote", remote]).returncode == 0  # free: no-op
    run_cli(["hold", "h", "--remote", remote])
    shown = run_cli(["status", "h", "--remote", remote]).stdout.decode()
    assert f"\n  branch: {remote} refs/heads/lock__h\n" in shown, shown  # no "lock file"
    assert "('local-mutex hold'" in shown  # its pid is the `hold` that took it, long gone
    assert run_cli(["release", "h", "--remote", remote, "--token", token]).returncode == 77
    assert run_cli(["release", "h", "--remote", remote, "--force"]).returncode == 0
    run_cli(["hold", "h", "--remote", remote])
    r = run_cli(["release", "h", "--remote", remote, "--force", "--delete-branch"])
    assert r.returncode == 0 and _status("h", remote)["detail"]["state"] == "absent"  # type: ignore[index]
    r = run_cli(["history", "h", "--remote", remote])
    assert r.returncode == 0 and b"no history" in r.stdout  # the branch is gone with it
    run_cli(["hold", "h2", "--remote", remote])
    run_cli(["release", "h2", "--remote", remote, "--force"])
    events = [
        e["event"]
        for e in json.loads(run_cli(["history", "h2", "--remote", remote, "--json"]).stdout)
    ]
    assert events == ["lock", "unlock"]


def test_remote_down_or_refusing_is_a_clear_error(tmp_path: Path) -> None:
    r = run_cli(["hold", "x", "--remote", "git://127.0.0.1:9/none.git"])
    assert r.returncode == 69 and b"cannot read refs/heads/lock__x" in r.stderr
    r = run_cli(["run", "--remote", "git://127.0.0.1:9/none.git", "x", "touch ran"], cwd=tmp_path)
    assert r.returncode == 69 and not (tmp_path / "ran").exists()
    assert run_cli(["status", "x", "--remote", "git://127.0.0.1:9/none.git"]).returncode == 3
    with git_daemon(tmp_path / "ro", writable=False) as url:
        r = run_cli(["hold", "x", "--remote", url])
        assert r.returncode == 69 and b"push" in r.stderr
        assert _status("x", url)["detail"]["state"] == "absent"  # type: ignore[index]  # nothing half-taken
        # The daemon refused the service before anything was sent: nothing may stay held.
        r = run_cli(["run", "--remote", url, "x", "touch ran"], cwd=tmp_path)
        assert r.returncode == 69 and b"service not enabled" in r.stderr, r.stderr
        assert b"may stay held" not in r.stderr and not (tmp_path / "ran").exists()


def test_bad_remote_names_are_refused_not_mangled(remote: str) -> None:
    for name in ("has space", "a..b", "x.lock", "a:b", "trailing/", "@{x}"):
        r = run_cli(["hold", "--remote", remote, "--", name])
        assert r.returncode == 2 and b"cannot be a git branch" in r.stderr, name
    r = run_cli(["run", "--remote", remote, "--shared", "x", "true"])
    assert r.returncode == 2 and b"cannot be used with git remotes" in r.stderr


def test_remote_from_the_environment(remote: str, tmp_path: Path) -> None:
    r = run_cli(["envlock", "echo via env"], env={"LOCAL_MUTEX_REMOTE": remote})
    assert r.returncode == 0 and r.stdout == b"via env\n"
    events = [
        e["event"]
        for e in json.loads(
            run_cli(["history", "envlock", "--json"], env={"LOCAL_MUTEX_REMOTE": remote}).stdout
        )
    ]
    assert events[0] == "lock" and events[-1] == "unlock"


def test_a_token_reaches_git_through_its_environment_only(remote: str, tmp_path: Path) -> None:
    import base64
    import os
    import shutil

    real_git = shutil.which("git")
    assert real_git is not None
    spy_dir = tmp_path / "spy"
    spy_dir.mkdir()
    log = tmp_path / "git-calls"
    (spy_dir / "git").write_text(
        "#!/bin/sh\n"
        f'printf "argv:%s\\n" "$*" >> "{log}"\n'
        f'printf "env:%s=%s\\n" "$GIT_CONFIG_KEY_0" "$GIT_CONFIG_VALUE_0" >> "{log}"\n'
        f'exec "{real_git}" "$@"\n'
    )
    (spy_dir / "git").chmod(0o755)
    token = "s3cr3t-token-value"
    env = {"PATH": f"{spy_dir}{os.pathsep}{os.environ['PATH']}", "LOCAL_MUTEX_GIT_TOKEN": token}
    r = run_cli(["hold", "tok", "--remote", remote], env=env)
    assert r.returncode == 0, r.stderr
    calls = log.read_text().splitlines()
    argv = [line for line in calls if line.startswith("argv:")]
    assert any(line.startswith("argv:push ") for line in argv)
    encoded = base64.b64encode(f"x-access-token:{token}".encode()).decode()
    assert not any(token in line or encoded in line for line in argv)
    assert any(line == f"env:http.extraheader=AUTHORIZATION: basic {encoded}" for line in calls)
    assert token.encode() not in r.stderr + r.stdout


def test_release_never_ends_a_running_commands_lock(remote: str, marks: Path) -> None:
    """Not from the same job, not with --force: its command still runs, and a newcomer
    would run beside it (PostgreSQL already refused)."""
    job = {"GITHUB_RUN_ID": "1", "GITHUB_RUN_ATTEMPT": "1", "GITHUB_JOB": "j", "RUNNER_NAME": "r"}
    with subprocess.Popen(
        [*CLI, "run", "--remote", remote, "--lease", "30", "busy", hold_until(marks)],
        env=clean_env(job),
        stderr=subprocess.DEVNULL,
    ) as run:
        try:
            wait_for(marks / "h.held", 30)
            for extra in ([], ["--force"], ["--force", "--delete-branch"]):
                r = run_cli(["release", "busy", "--remote", remote, *extra], env=job)
                assert r.returncode == 77 and b"running command" in r.stderr, (extra, r.stderr)
            newcomer = run_cli(["--no-wait", "--remote", remote, "busy", "true"])
            assert newcomer.returncode == 75, newcomer.stderr
        finally:
            (marks / "h.go").touch()
    assert run.returncode == 0


def test_list_names_the_branches_it_leaves_out(remote: str, tmp_path: Path) -> None:
    """A branch under the prefix whose tip is no lock commit blocks its name for good (it
    is refused to take, rewrite or delete); ``list`` left it out without a word, so the
    one lock a stuck job waited for was the one nobody could see."""
    assert run_cli(["run", "--remote", remote, "fine", "true"]).returncode == 0
    repo = tmp_path / "plain"
    subprocess.run(["git", "init", "--quiet", str(repo)], check=True)
    env = clean_env({"GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@localhost"})
    env.update(GIT_COMMITTER_NAME="t", GIT_COMMITTER_EMAIL="t@localhost")
    git = ["git", "-C", str(repo)]
    subprocess.run(
        [*git, "commit", "-q", "--allow-empty", "-m", "just a commit"], env=env, check=True
    )
    subprocess.run([*git, "push", "-q", remote, "HEAD:refs/heads/lock__odd"], env=env, check=True)
    r = run_cli(["list", "--all", "--remote", remote, "--json"])
    assert r.returncode == 0, r.stderr
    assert [s["name"] for s in json.loads(r.stdout)] == ["fine"]
    err = r.stderr.decode()
    assert "branch refs/heads/lock__odd (" in err and "is not a lock" in err, err
    assert err.endswith("; not listed\n") and err.count("\n") == 1, err
    # Still refused when someone tries to take it: the warning is about a real block.
    r = run_cli(["run", "--remote", remote, "--no-wait", "odd", "true"])
    assert r.returncode != 0 and b"is not a lock" in r.stderr


def test_a_branch_whose_tip_is_no_commit_is_named_as_such(tmp_path: Path) -> None:
    """A branch pointing at a blob (written by hand on the server; git's own commands
    refuse to) was ``git cat-file failed: … bad file`` for every verb, and ``list``
    failed altogether (exit 3) for that one branch."""
    repo = tmp_path / "r.git"
    subprocess.run(["git", "init", "--quiet", "--bare", str(repo)], check=True)
    blob = (
        subprocess.run(
            ["git", "--git-dir", str(repo), "hash-object", "-w", "--stdin"],
            input=b"not a commit\n",
            capture_output=True,
            check=True,
        )
        .stdout.decode()
        .strip()
    )
    (repo / "refs" / "heads" / "lock__b").write_text(blob + "\n")
    url = f"file://{repo}"
    says = (
        f"branch refs/heads/lock__b ({blob[:12]}) is not a lock: its tip is a blob, not a "
        "commit; refusing to take, rewrite or delete it"
    )
    for verb in (["status", "b"], ["run", "--no-wait", "b", "true"], ["release", "b", "--force"]):
        r = run_cli([verb[0], "--remote", url, *verb[1:]])
        assert (r.returncode, r.stderr.decode()) == (2, f"local-mutex: {says}\n"), verb
    r = run_cli(["history", "b", "--remote", url])
    assert (r.returncode, r.stdout, r.stderr.decode()) == (2, b"", f"local-mutex: {says}\n")
    r = run_cli(["list", "--all", "--remote", url])
    assert (r.returncode, r.stderr.decode()) == (0, f"local-mutex: {says}; not listed\n")


def test_list_takes_the_key_prefix_every_other_verb_takes(tmp_path: Path) -> None:
    """Locks under a prefix of one's own could be taken, held, released and asked about,
    but not listed: ``list`` refused ``--key-prefix``."""
    repo = tmp_path / "r.git"
    subprocess.run(["git", "init", "--quiet", "--bare", str(repo)], check=True)
    url = f"file://{repo}"
    assert run_cli(["run", "--remote", url, "--key-prefix", "team/", "a", "true"]).returncode == 0
    assert run_cli(["run", "--remote", url, "b", "true"]).returncode == 0
    for prefix, names in ((["--key-prefix", "team/"], ["a"]), ([], ["b"])):
        r = run_cli(["list", "--all", "--json", "--remote", url, *prefix])
        assert r.returncode == 0, r.stderr
        assert [s["name"] for s in json.loads(r.stdout)] == names


def _seen_while_held(
    remote: str, procs: Procs, marks: Path, cwd: Path, name: str, cmd: str, message: str = ""
) -> tuple[dict[str, Any], subprocess.CompletedProcess[bytes]]:
    """Run ``cmd`` (which may ``sh hold.sh``) under NAME; while it holds the lock, its
    holder as ``status`` shows it and a ``--no-wait`` newcomer's outcome."""
    (cwd / "hold.sh").write_text(hold_until(marks))
    said = ["--message", message] if message else []
    run = procs.start(["run", "--remote", remote, *said, name, cmd], cwd=cwd)
    try:
        wait_for(marks / "h.held")
        holder: dict[str, Any] = _status(name, remote)["holders"][0]  # type: ignore[index]
        waiter = run_cli(["--no-wait", "--remote", remote, name, "true"])
    finally:
        (marks / "h.go").touch()
    assert run.wait(60) == 0, procs.stderr(run)
    return holder, waiter


def test_a_runs_message_command_and_cwd_are_in_its_lock_commit(
    remote: str, procs: Procs, marks: Path, tmp_path: Path
) -> None:
    """They were kept for the run's first lease renewal (a third of the lease, 20 s by
    default): until then -- for a shorter run, for good -- status, the waiting lines and
    history said message 'run', with no command or cwd."""
    cmd = "sh hold.sh"
    holder, waiter = _seen_while_held(remote, procs, marks, tmp_path, "gm", cmd, "deploying v2")
    cwd = os.path.realpath(tmp_path)
    assert (holder["message"], holder["command"], holder["cwd"]) == ("deploying v2", cmd, cwd)
    said = waiter.stderr.decode()
    assert waiter.returncode == 75 and "message 'deploying v2'" in said, said
    assert f"{cmd!r}, in {cwd}, " in said, said
    rows = json.loads(run_cli(["history", "gm", "--remote", remote, "--json"]).stdout)
    assert [(r["event"], r["message"]) for r in rows] == [
        ("lock", "deploying v2"),
        ("unlock", "deploying v2"),
    ]
    assert (rows[0]["command"], rows[0]["cwd"]) == (cmd, cwd)
    shown = run_cli(["history", "gm", "--remote", remote]).stdout.decode()
    assert (
        f" lock     {rows[0]['actor']} on " in shown
        and f": deploying v2, {cmd!r}, in {cwd}\n" in shown
    )


def test_no_message_given_is_no_message_shown(remote: str, tmp_path: Path) -> None:
    """A run or a hold without --message was shown as message 'run' or 'hold', words the
    user never said. What the run ran is shown instead, escaped once."""
    assert run_cli(["run", "--remote", remote, "r", "true \x1b"], cwd=tmp_path).returncode == 0
    rows = json.loads(run_cli(["history", "r", "--remote", remote, "--json"]).stdout)
    assert [r["message"] for r in rows] == [None, None]
    assert [r.get("command") for r in rows] == ["true \x1b", None]  # where 'run' was
    lines = run_cli(["history", "r", "--remote", remote]).stdout.decode().splitlines()
    cwd = os.path.realpath(tmp_path)
    assert lines[0].endswith(f" on {rows[0]['host']}: 'true \\x1b', in {cwd}"), lines
    assert lines[1].endswith(f" on {rows[1]['host']}"), lines
    assert run_cli(["hold", "h", "--remote", remote]).returncode == 0
    r = run_cli(["status", "h", "--remote", remote, "--json"])
    assert json.loads(r.stdout)["holders"][0]["message"] is None
    status = run_cli(["status", "h", "--remote", remote])
    waiter = run_cli(["--no-wait", "--remote", remote, "h", "true"])
    assert status.returncode == 1 and waiter.returncode == 75
    assert b"message" not in status.stdout + waiter.stderr, (status.stdout, waiter.stderr)


def test_a_lock_commit_too_long_to_read_is_cut_so_the_lock_works(
    remote: str, procs: Procs, marks: Path, tmp_path: Path
) -> None:
    """Bodies are read up to 64 KiB: a run whose 100 KB command went into its lock commit
    could not read its own branch back (exit 2, "not usable JSON"), and a newcomer took
    the lock beside it; a hold's 8192-emoji message (98 KB of JSON) was as unreadable."""
    cmd = f": {'x' * 100_000}; sh hold.sh"
    holder, waiter = _seen_while_held(remote, procs, marks, tmp_path, "big", cmd)
    assert holder["command"].startswith(": xxx") and holder["command"].endswith("…")
    assert waiter.returncode == 75, waiter.stderr
    message = "\U0001f600" * 8192
    token = run_cli(["hold", "h", "--remote", remote, "--message", message]).stdout.strip()
    assert len(token) == 32
    held = _status("h", remote)["holders"][0]  # type: ignore[index]
    assert held["message"].startswith("\U0001f600" * 100) and held["message"].endswith("…")
    r = run_cli(["release", "h", "--remote", remote, "--token", token.decode()])
    assert r.returncode == 0, r.stderr


def test_a_message_with_raw_bytes_takes_a_remote_lock(remote: str, tmp_path: Path) -> None:
    """An argument from a Latin-1 terminal holds lone surrogates, which the lock commit's
    first line could not encode: a traceback, exit 1, nothing run (hold: the same)."""
    message = os.fsdecode(b"caf\xe9")
    r = run_cli(["--remote", remote, "--message", message, "g", "touch ran"], cwd=tmp_path)
    assert r.returncode == 0 and (tmp_path / "ran").exists(), r.stderr
    r = run_cli(["hold", "h", "--remote", remote, "--message", message])
    assert r.returncode == 0, r.stderr
    holder = _status("h", remote)["holders"][0]  # type: ignore[index]
    assert holder["message"] == message  # the body keeps the byte
    r = run_cli(["release", "h", "--remote", remote, "--token", r.stdout.decode().strip()])
    assert r.returncode == 0, r.stderr
