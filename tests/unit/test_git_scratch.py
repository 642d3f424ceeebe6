"""What the sweep of scratch repositories left behind removes: only our user's
directories, of a process gone, in our pid namespace -- nothing else in TMPDIR."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from local_mutex.backends.git.plumbing import _sweep

pytestmark = pytest.mark.skipif(
    not os.path.exists("/proc/self/ns/pid"), reason="no pid namespaces here"
)


def _gone_pid() -> int:
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    return child.pid


def test_only_our_gone_processes_directories_are_removed(tmp_path: Path) -> None:
    ns = "b00t" + str(os.stat("/proc/self/ns/pid").st_ino)
    gone = _gone_pid()
    target = tmp_path / "not-ours"
    target.mkdir()
    (target / "keep").touch()
    made = {
        "gone": tmp_path / f"local-mutex-git-{ns}-{gone}-abc",
        "live": tmp_path / f"local-mutex-git-{ns}-{os.getpid()}-abc",
        "other-namespace": tmp_path / f"local-mutex-git-{ns}1-{gone}-abc",
        "old-style": tmp_path / "local-mutex-git-abc",
    }
    for path in made.values():
        (path / "objects").mkdir(parents=True)
    link = tmp_path / f"local-mutex-git-{ns}-{gone}-lnk"
    link.symlink_to(target)
    plain = tmp_path / f"local-mutex-git-{ns}-{gone}-file"
    plain.touch()
    _sweep(str(tmp_path), ns)
    assert not made["gone"].exists()
    assert all(made[k].is_dir() for k in ("live", "other-namespace", "old-style"))
    assert link.is_symlink() and (target / "keep").exists() and plain.exists()


def test_an_unreadable_tmpdir_is_no_error(tmp_path: Path) -> None:
    _sweep(str(tmp_path / "missing"), "1")


@pytest.mark.parametrize("pid", ["\u00b9", "\u0663", "9" * 200])
def test_a_planted_name_with_odd_digits_is_skipped(tmp_path: Path, pid: str) -> None:
    """Anyone can create names in a shared TMPDIR: digits ``int`` refuses made the sweep
    (and the remote call it runs in) fail with a traceback."""
    planted = tmp_path / f"local-mutex-git-ns-{pid}-abc"
    planted.mkdir()
    _sweep(str(tmp_path), "ns")
    assert planted.is_dir()
