"""A stop signal after the lock was taken but before the command started: the caller lets
go of the lock and exits 128+N saying the command did not run. A local lock the kernel
would free anyway; a git remote's branch nobody frees but its lease (a run) or `release
--force` (a hold). The signal is sent by an audit hook when a run looks up prctl (through
``_ctypes``), which it does right there, just before it forks its supervisor, so the
moment is exact on any machine."""

from __future__ import annotations

import json
import signal
import subprocess
from pathlib import Path

import pytest

from helpers import CLI, clean_env, run_cli, wait_for
from helpers import procwatch as pw
from helpers.gitserver import git_daemon

pytestmark = pytest.mark.timeout(60)

HOOK = """
import os, sys
def _stop(event, args, sig=int(os.environ["SIGNAL_AT_CTYPES"])):
    if event == "ctypes.dlsym/handle" and args[1] == "prctl":
        os.kill(os.getpid(), sig)
sys.addaudithook(_stop)
"""


def _env(tmp_path: Path, sig: int) -> dict[str, str]:
    site = tmp_path / "site"
    site.mkdir(exist_ok=True)
    (site / "sitecustomize.py").write_text(HOOK)
    src = Path(__file__).resolve().parents[2] / "src"
    return {"PYTHONPATH": f"{site}:{src}", "SIGNAL_AT_CTYPES": str(int(sig))}


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT, signal.SIGHUP])
def test_a_local_run_stopped_before_its_command_says_it_did_not_run(
    tmp_path: Path, lock_dir: Path, sig: int
) -> None:
    ran = tmp_path / "ran"
    # The lock file made first: a new one is created through _ctypes too (renameat2).
    assert run_cli(["n", "true", str(lock_dir)]).returncode == 0
    r = run_cli(["n", f"touch '{ran}'", str(lock_dir)], env=_env(tmp_path, sig))
    assert r.returncode == 128 + sig, r.stderr
    assert b"the command did not run" in r.stderr and b"Traceback" not in r.stderr
    assert not ran.exists()
    assert run_cli(["--no-wait", "n", "true", str(lock_dir)]).returncode == 0


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_a_remote_run_stopped_before_its_command_leaves_the_branch_free(
    tmp_path: Path, sig: int
) -> None:
    with git_daemon(tmp_path / "server") as url:
        ran = tmp_path / "ran"
        r = run_cli(["--remote", url, "x", f"touch '{ran}'"], env=_env(tmp_path, sig))
        assert r.returncode == 128 + sig, r.stderr
        assert b"the command did not run" in r.stderr and b"Traceback" not in r.stderr
        assert not ran.exists()
        status = run_cli(["status", "x", "--remote", url, "--json"])
        assert json.loads(status.stdout)["state"] == "free", status.stdout


AT_SCRATCH_REMOVAL = """
import os, sys
sent = []
def _stop(event, args):
    # The remote call is over (its scratch repository goes): the hold is taken. Once.
    if event == "shutil.rmtree" and f"-{os.getpid()}-" in os.fspath(args[0]) and not sent:
        sent.append(1)
        os.kill(os.getpid(), int(os.environ["SIGNAL_AT_RMTREE"]))
sys.addaudithook(_stop)
"""


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_a_remote_hold_stopped_before_its_token_is_printed_is_ended(
    tmp_path: Path, sig: int
) -> None:
    """The branch was locked, then a stop signal came before the token was printed: the
    hold lasted until a forced release (SIGTERM killed us outright) with nobody holding
    its token. The signal waits until the token is out, then ends the hold, and the exit
    says so."""
    site = tmp_path / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text(AT_SCRATCH_REMOVAL)
    src = Path(__file__).resolve().parents[2] / "src"
    env = {"PYTHONPATH": f"{site}:{src}", "SIGNAL_AT_RMTREE": str(int(sig))}
    with git_daemon(tmp_path / "server") as url:
        r = run_cli(["hold", "x", "--remote", url], env=env)
        assert r.returncode == 128 + sig, r.stderr
        assert b"stopped by signal" in r.stderr and b"ended the hold" in r.stderr, r.stderr
        status = run_cli(["status", "x", "--remote", url, "--json"])
        assert json.loads(status.stdout)["state"] == "free", status.stdout


def test_a_local_hold_stopped_while_it_waits_ends_its_holder(
    tmp_path: Path, lock_dir: Path
) -> None:
    """`hold` waits while its detached holder waits for the lock. Stopped then, it exits
    128+N and ends the holder at once -- which would otherwise take the lock later for
    nobody (its token lost with us)."""
    busy = subprocess.Popen(
        [*CLI, "-q", "busy", f"touch '{tmp_path}/busy'; sleep 30", str(lock_dir)],
        env=clean_env(),
    )
    hold = None
    try:
        wait_for(tmp_path / "busy")
        hold = subprocess.Popen(
            [*CLI, "hold", "busy", "--lock-dir", str(lock_dir)],
            env=clean_env(),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )
        wait_for(lambda: pw.children(hold.pid) != [], what="the holder started")
        holder = pw.children(hold.pid)[0]
        wait_for(lambda: pw.state(holder) == "S", what="the holder waits")
        hold.send_signal(signal.SIGTERM)
        assert hold.wait(20) == 128 + signal.SIGTERM
        assert b"stopped waiting for the lock" in hold.communicate()[1]
        assert pw.wait_gone([holder], 10) == [], "the holder still waits for the lock"
    finally:
        busy.kill()
        busy.wait()
        if hold is not None and hold.poll() is None:
            hold.kill()
            hold.wait()


AT_HOLDER_START = """
import os, sys
sent = []
def _stop(event, args):
    # The holder process is being started: its wait for the lock has not begun yet.
    if event == "subprocess.Popen" and not sent:
        sent.append(1)
        os.kill(os.getpid(), int(os.environ["SIGNAL_AT_POPEN"]))
sys.addaudithook(_stop)
"""


def test_a_hold_stopped_just_before_its_wait_does_not_wait(tmp_path: Path, lock_dir: Path) -> None:
    """A stop signal noted (deferred) just before the wait for a busy lock began: the wait
    must end at once, not ignore it until the lock comes."""
    site = tmp_path / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text(AT_HOLDER_START)
    src = Path(__file__).resolve().parents[2] / "src"
    busy = subprocess.Popen(
        [*CLI, "-q", "early", f"touch '{tmp_path}/busy'; sleep 60", str(lock_dir)],
        env=clean_env(),
    )
    try:
        wait_for(tmp_path / "busy")
        env = {"PYTHONPATH": f"{site}:{src}", "SIGNAL_AT_POPEN": str(int(signal.SIGTERM))}
        r = run_cli(["hold", "early", "--lock-dir", str(lock_dir)], env=env, timeout=30)
        assert r.returncode == 128 + signal.SIGTERM, r.stderr
        assert b"stopped waiting for the lock" in r.stderr
    finally:
        busy.kill()
        busy.wait()
