"""LOCAL_MUTEX_CLI, nested calls and loops, and verified reentrancy."""

from __future__ import annotations

import json
import os
import signal
import subprocess
from pathlib import Path

import pytest

from helpers import (
    CLI,
    Procs,
    clean_env,
    hold_until,
    left_behind_call,
    left_behind_call_waited,
    lock_file,
    read_written,
    run_cli,
    start_each,
    wait_for,
)
from helpers import procwatch as pw


def test_cli_shim_runs_with_sh_and_directly(lock_dir: Path) -> None:
    r = run_cli(
        [
            "outer",
            'sh "$LOCAL_MUTEX_CLI" a "echo via-sh" && "$LOCAL_MUTEX_CLI" b "echo direct"',
            str(lock_dir),
        ]
    )
    assert r.returncode == 0, r.stderr
    assert r.stdout == b"via-sh\ndirect\n"
    for name in ("outer", "a", "b"):
        assert lock_file(lock_dir, name).exists()


def test_cli_shim_runs_through_a_symlink(lock_dir: Path, tmp_path: Path) -> None:
    """A user's ``ln -s "$LOCAL_MUTEX_CLI" ~/bin/lm``: the package is found from the
    shim's real path (it was looked for next to the link: ModuleNotFoundError)."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    r = run_cli(
        [
            "outer",
            f'ln -s "$LOCAL_MUTEX_CLI" {bin_dir}/lm && sh {bin_dir}/lm a "echo via-sh" && '
            f'cd {bin_dir} && PATH={bin_dir}:$PATH lm b "echo on-path"',
            str(lock_dir),
        ]
    )
    assert r.returncode == 0, r.stderr
    assert r.stdout == b"via-sh\non-path\n"


def test_shim_passes_exit_status_and_arg_errors(lock_dir: Path) -> None:
    r = run_cli(["outer", 'sh "$LOCAL_MUTEX_CLI" a "exit 9"', str(lock_dir)])
    assert r.returncode == 9
    r = run_cli(["outer", 'sh "$LOCAL_MUTEX_CLI" only-one-arg', str(lock_dir)])
    assert r.returncode == 2 and b"missing COMMAND after NAME" in r.stderr


def test_per_item_loop_with_items_kept_out_of_the_shell_text(
    lock_dir: Path, tmp_path: Path
) -> None:
    out = tmp_path / "out"
    items = "plain\nwith space\n$(touch pwned)\nquote'\"\n"
    loop = (
        'printf %s "$ITEMS" | while IFS= read -r key; do '
        f'KEY="$key" sh "$LOCAL_MUTEX_CLI" "item-$key" \'printf "%s\\n" "$KEY" >> "{out}"\'; '
        "done"
    )
    r = run_cli(["sweep", loop, str(lock_dir)], env={"ITEMS": items}, cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert out.read_text() == items
    assert not (tmp_path / "pwned").exists()
    assert lock_file(lock_dir, "item-with space").exists()


def test_nested_call_inherits_a_custom_lock_dir(lock_dir: Path) -> None:
    r = run_cli(["--lock-dir", str(lock_dir), "outer", 'sh "$LOCAL_MUTEX_CLI" inner true'])
    assert r.returncode == 0, r.stderr
    assert lock_file(lock_dir, "inner").exists()


def test_same_name_nested_is_reentrant(lock_dir: Path) -> None:
    r = run_cli(["n", 'sh "$LOCAL_MUTEX_CLI" n "echo inner"', str(lock_dir)], timeout=20)
    assert r.returncode == 0
    assert r.stdout == b"inner\n"
    assert b"already held by enclosing pid" in r.stderr


def test_reentrancy_reaches_through_intermediate_processes(lock_dir: Path) -> None:
    deep = 'sh -c \'sh -c "sh \\"\\$LOCAL_MUTEX_CLI\\" n \\"echo deep\\""\''
    r = run_cli(["n", deep, str(lock_dir)], timeout=20)
    assert r.returncode == 0, r.stderr
    assert r.stdout == b"deep\n"


def test_a_non_descendant_with_the_inherited_environment_still_waits(
    procs: Procs, lock_dir: Path, marks: Path
) -> None:
    env_dump = marks / "env.json"
    cmd = (
        f'printf "%s" "$LOCAL_MUTEX_HELD" > "{env_dump}.tmp"; mv "{env_dump}.tmp" '
        f'"{env_dump}"; {hold_until(marks)}'
    )
    holder = procs.start(["n", cmd, str(lock_dir)])
    wait_for(env_dump)
    held = env_dump.read_text()
    assert held.startswith(f"{pw.supervisor_child(holder.pid)}:")  # the run's supervisor
    r = run_cli(
        ["--no-wait", "n", f"touch '{marks}/ran'", str(lock_dir)], env={"LOCAL_MUTEX_HELD": held}
    )
    assert r.returncode == 75
    assert not (marks / "ran").exists()
    (marks / "h.go").touch()
    assert holder.wait(20) == 0


def test_an_entry_naming_pid_1_is_nobodys_enclosing_hold(
    procs: Procs, lock_dir: Path, marks: Path
) -> None:
    """pid 1 is every process's ancestor: an entry naming it (planted, or copied from a
    container's environment) ran a caller inside a lock another process held."""
    holder = procs.start(["n", hold_until(marks), str(lock_dir)])
    wait_for(marks / "h.held")
    st = os.stat(lock_file(lock_dir, "n"))
    for entry in (f"1:{st.st_dev}:{st.st_ino}:x", f"0:{st.st_dev}:{st.st_ino}:x"):
        r = run_cli(
            ["--no-wait", "n", f"touch '{marks}/ran'", str(lock_dir)],
            env={"LOCAL_MUTEX_HELD": entry},
        )
        assert r.returncode == 75, r.stderr
    assert not (marks / "ran").exists()
    (marks / "h.go").touch()
    assert holder.wait(20) == 0


def test_exclusive_inside_shared_is_an_error_not_a_hang(lock_dir: Path, marks: Path) -> None:
    r = run_cli(
        ["--shared", "n", f'sh "$LOCAL_MUTEX_CLI" n "touch {marks}/ran"', str(lock_dir)], timeout=20
    )
    assert r.returncode == 2
    assert b"held shared by enclosing pid" in r.stderr
    assert not (marks / "ran").exists()
    r = run_cli(["n", '"$LOCAL_MUTEX_CLI" --shared n "echo ok"', str(lock_dir)], timeout=20)
    assert r.returncode == 0 and r.stdout == b"ok\n"


def test_holder_record_is_in_the_lock_file_while_held(
    procs: Procs, lock_dir: Path, marks: Path
) -> None:
    holder = procs.start(
        ["rec", hold_until(marks), str(lock_dir)],
        cwd=marks,
        env={
            "GITHUB_RUN_ID": "77",
            "GITHUB_REPOSITORY": "o/r",
            "RUNNER_NAME": "runner-3",
            "GITHUB_JOB": "build",
        },
    )
    wait_for(marks / "h.held")
    rec = json.loads(lock_file(lock_dir, "rec").read_text())
    assert rec["pid"] == holder.pid and rec["name"] == "rec" and rec["cwd"] == str(marks)
    assert rec["runner"] == "runner-3" and rec["job"] == "build"
    assert rec["run_url"] == "https://github.com/o/r/actions/runs/77"
    (marks / "h.go").touch()
    assert holder.wait(20) == 0
    assert lock_file(lock_dir, "rec").read_text() == ""


def test_a_leftover_of_an_earlier_each_item_is_not_inside_the_next_items_lock(
    lock_dir: Path, marks: Path
) -> None:
    """Item a leaves a job behind and ends; `each` adopts it. Its LOCAL_MUTEX_HELD names
    the lock item a held -- the same lock item b holds now. Its nested call must wait like
    anyone else's, not run inside item b's lock."""
    leftover = (
        f'(setsid sh -c \'while [ ! -e "{marks}/go" ]; do sleep 0.01; done; '
        f'sh "$LOCAL_MUTEX_CLI" --no-wait k "touch {marks}/ran"; '
        f'echo $? > "{marks}/rc.tmp"; mv "{marks}/rc.tmp" "{marks}/rc"\' '
        "</dev/null >/dev/null 2>&1 &)"
    )
    cmd = (
        f'if [ "$LOCAL_MUTEX_ITEM" = a ]; then {leftover}; exit 0; fi; '
        f"touch '{marks}/b.started'; "
        f"while [ ! -e '{marks}/rc' ]; do sleep 0.01; done"
    )
    p = start_each(["-q", "--lock-dir", str(lock_dir), "k", cmd], b"a\nb\n")
    assert p.stderr is not None
    wait_for(marks / "b.started")
    (marks / "go").touch()
    wait_for(marks / "rc")
    assert p.wait(20) == 0, p.stderr.read()
    assert (marks / "rc").read_text().strip() == "75"
    assert not (marks / "ran").exists()


def test_a_descriptor_merely_open_on_the_lock_file_is_not_a_holder(
    procs: Procs, lock_dir: Path, marks: Path
) -> None:
    """An enclosing run that has a lock file open (inherited, unlocked: ``exec 9<FILE``)
    does not hold it: a nested call of that lock inside it waits like anyone else."""
    holder = procs.start(["x", hold_until(marks, "a"), str(lock_dir)])
    wait_for(marks / "a.held")
    path = lock_file(lock_dir, "x")
    nested = f'"$LOCAL_MUTEX_CLI" --no-wait x "touch \'{marks}/inside\'"'
    peek = os.open(path, os.O_RDONLY)  # the caller's, inherited by y's keeper and supervisor
    try:
        r = subprocess.run(
            [*CLI, "y", nested, str(lock_dir)],
            env=clean_env(),
            capture_output=True,
            timeout=60,
            pass_fds=(peek,),
        )
    finally:
        os.close(peek)
    assert r.returncode == 75, r.stderr
    assert not (marks / "inside").exists()
    (marks / "a.go").touch()
    assert holder.wait(20) == 0


def test_cli_shim_runs_from_a_tree_of_symlinked_files(lock_dir: Path, tmp_path: Path) -> None:
    """Each file a symlink into a store (Bazel runfiles, Nix-style forests): the package
    is next to the shim as called, not next to its real path."""
    import sys

    import local_mutex

    package = Path(local_mutex.__file__).parent
    store, forest = tmp_path / "store", tmp_path / "forest"
    store.mkdir()
    for i, src in enumerate(p for p in package.rglob("*") if p.is_file()):
        if "__pycache__" in src.parts:
            continue
        (store / str(i)).write_bytes(src.read_bytes())
        (store / str(i)).chmod(src.stat().st_mode)
        link = forest / "local_mutex" / src.relative_to(package)
        link.parent.mkdir(parents=True, exist_ok=True)
        link.symlink_to(store / str(i))
    r = subprocess.run(
        [sys.executable, "-m", "local_mutex", "-q", "outer", '"$LOCAL_MUTEX_CLI" -q a "echo ok"'],
        env=clean_env({"PYTHONPATH": str(forest), "LOCAL_MUTEX_LOCK_DIR": str(lock_dir)}),
        capture_output=True,
        timeout=60,
    )
    assert r.returncode == 0 and r.stdout == b"ok\n", r.stderr


@pytest.mark.parametrize("pid", ["\u00b9", "\u0663", "1" * 5000])
def test_a_garbled_entry_pid_is_ignored_not_a_traceback(lock_dir: Path, pid: str) -> None:
    """``str.isdigit`` takes a superscript one or an Arabic-Indic three, which ``int``
    refuses, and ``int`` refuses 5000 digits: such an entry is nobody's, the run runs."""
    r = run_cli(["n", "true", str(lock_dir)], env={"LOCAL_MUTEX_HELD": f"{pid}:1:2:x"})
    assert r.returncode == 0, r.stderr
    assert b"Traceback" not in r.stderr


@pytest.mark.skipif(
    not Path("/proc/self/fdinfo").is_dir(), reason="without /proc an ancestor's locks are unseen"
)
def test_an_entry_naming_an_ancestor_that_holds_nothing_waits(
    procs: Procs, lock_dir: Path, marks: Path
) -> None:
    """An entry whose pid is our ancestor but holds no lock on the file: what a leftover
    job of an earlier run sees once the pid space wrapped and its dead supervisor's pid
    went to one of its own children. It must wait for the current holder, not run inside."""
    holder = procs.start(["-q", "n", hold_until(marks), str(lock_dir)])
    try:
        wait_for(marks / "h.held")
        st = os.stat(lock_file(lock_dir, "n"))
        # $$ (this shell) is the nested call's parent: an ancestor, holding nothing.
        script = (
            f'LOCAL_MUTEX_HELD="$$:{st.st_dev}:{st.st_ino}:x" "$@" --no-wait -q n '
            f"'touch {marks}/ran-inside' {lock_dir}; exit $?"
        )
        r = subprocess.run(["sh", "-c", script, "sh", *CLI], env=clean_env(), timeout=60)
        assert r.returncode == 75
        assert not (marks / "ran-inside").exists()
    finally:
        (marks / "h.go").touch()
        holder.wait(20)


@pytest.mark.parametrize("holder", ["alive", "killed"])
def test_a_leftover_of_a_run_inside_a_hold_does_not_run_inside_the_hold(
    lock_dir: Path, marks: Path, holder: str
) -> None:
    """A run inside a hold shares the hold's lock description, and so does a job its
    command leaves behind. Once the run is over, that job's nested call must wait like
    anyone else: the description is locked by the hold -- and, its holder killed, by all
    that ran inside it, whose leftovers would otherwise all run "inside" at once. Nobody can
    unlock it then, and the job holds it: rather than wait for itself forever, it is told
    so (exit 2), and runs nothing."""
    r = run_cli(["hold", "h", "--lock-dir", str(lock_dir)])
    assert r.returncode == 0, r.stderr
    job = {"LOCAL_MUTEX_HOLD_TOKEN": r.stdout.decode().strip()}
    status = run_cli(["status", "h", "--lock-dir", str(lock_dir), "--json"])
    holder_pid = json.loads(status.stdout)["holders"][0]["pid"]
    leftover = left_behind_call(marks, "h")
    try:
        inside = run_cli(
            ["--lock-dir", str(lock_dir), "run", "--reentrant", "h", leftover], env=job
        )
        assert inside.returncode == 0 and b"running inside it" in inside.stderr, inside.stderr
        if holder == "alive":
            left_behind_call_waited(marks)
            return
        # Killed once it saw the run end: a holder killed before names it among the runs
        # inside, whose commands (and what they leave behind) its end leaves the lock to.
        path = lock_file(lock_dir, "h")
        wait_for(lambda: "runs_inside" not in path.read_text(), 10, "the holder to see it end")
        os.kill(holder_pid, signal.SIGKILL)
        assert pw.wait_gone([holder_pid], 20) == []
        (marks / "go").touch()
        assert read_written(marks / "rc", 20, "the left-behind job's call") == "2"
        assert not (marks / "ran").exists()
    finally:
        (marks / "go").touch()
        run_cli(["release", "h", "--lock-dir", str(lock_dir)], env=job)


@pytest.mark.skipif(not os.path.isdir("/proc/self/fdinfo"), reason="finds the lock through /proc")
@pytest.mark.parametrize("ends", ["before", "after"])
def test_a_left_behind_jobs_call_that_outlives_its_run_says_the_lock_was_let_go(
    lock_dir: Path, marks: Path, ends: str
) -> None:
    """A job the command leaves behind calls the lock while the run lives: it runs inside.
    The run then ends normally and unlocks -- what it leaves behind runs on unlocked -- and
    a newcomer may take the lock while the job's command still runs: the job's call said
    nothing of it ("done inside enclosing lock"). It now says it ran on without the lock;
    a call whose run outlives its command says nothing more."""
    err = marks / "job.err"
    job = (
        f'(setsid sh -c \'"$LOCAL_MUTEX_CLI" p "touch {marks}/in; '
        f"while [ ! -e {marks}/go ]; do sleep 0.01; done\" 2> {err}; echo $? > {marks}/rc' "
        "</dev/null >/dev/null 2>&1 &)"
    )
    wait_in = f"while [ ! -e {marks}/in ]; do sleep 0.01; done"
    if ends == "before":
        r = run_cli(["p", f"{job}; {wait_in}", str(lock_dir)])
        assert r.returncode == 0, r.stderr
        r = run_cli(["--no-wait", "p", f"touch {marks}/newcomer", str(lock_dir)])
        assert r.returncode == 0, r.stderr  # unlocked: the job runs on without it
        (marks / "go").touch()
    else:
        cmd = f"{job}; {wait_in}; touch {marks}/go; while [ ! -e {marks}/rc ]; do sleep 0.01; done"
        r = run_cli(["p", cmd, str(lock_dir)])
        assert r.returncode == 0, r.stderr
    assert read_written(marks / "rc", 20, "the job's call to end") == "0"
    said = err.read_text()
    assert "running inside it" in said
    assert ("it ran on without the lock" in said) is (ends == "before"), said
