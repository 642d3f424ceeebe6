"""Same path, same kernel lock: plain flock(1) and local-mutex exclude each other."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from helpers import Procs, hold_until, lock_file, run_cli, wait_for

pytestmark = pytest.mark.skipif(shutil.which("flock") is None, reason="flock(1) not installed")


def test_flock_holder_blocks_local_mutex(lock_dir: Path, marks: Path) -> None:
    path = lock_file(lock_dir, "shared-tool")
    holder = subprocess.Popen(["flock", "-x", str(path), "sh", "-c", hold_until(marks)])
    try:
        wait_for(marks / "h.held")
        r = run_cli(["--no-wait", "shared-tool", f"touch '{marks}/ran'", str(lock_dir)])
        assert r.returncode == 75
        assert f"held by pid {holder.pid}" in r.stderr.decode()
        assert not (marks / "ran").exists()
    finally:
        (marks / "h.go").touch()
        holder.wait(20)


def test_local_mutex_holder_blocks_flock(procs: Procs, lock_dir: Path, marks: Path) -> None:
    procs.start(["shared-tool", hold_until(marks), str(lock_dir)])
    wait_for(marks / "h.held")
    path = lock_file(lock_dir, "shared-tool")
    assert subprocess.run(["flock", "-n", "-x", str(path), "true"], timeout=10).returncode == 1
    (marks / "h.go").touch()
    wait_for(lambda: subprocess.run(["flock", "-n", str(path), "true"]).returncode == 0)
