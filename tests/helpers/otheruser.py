"""Run the CLI as another user (uid 65534) from wherever the checkout lives.

The checkout, its venv and pytest's own tmp root may all sit in directories that user
cannot search (``mktemp -d`` makes 0700 ones). So the package under test is copied into a
fresh world-readable directory, the other user gets it on ``PYTHONPATH``, and it runs
whichever of this interpreter's paths it can start (the venv's, or the real binary
behind it: the CLI's plain paths need nothing outside the standard library). If none
works, the test is skipped with the reason.
"""

from __future__ import annotations

import os
import shutil
import stat
import subprocess
import sys
import tempfile
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import pytest

from helpers import clean_env

NOBODY = 65534


@dataclass(frozen=True)
class OtherUser:
    uid: int
    setpriv: str
    python: str
    base: Path  # world-readable; holds the package copy and any shared_dir()s
    pythonpath: str

    @property
    def drop(self) -> list[str]:
        """The prefix that runs what follows as this user, with no supplementary groups."""
        return [self.setpriv, f"--reuid={self.uid}", f"--regid={self.uid}", "--clear-groups"]

    @property
    def cli(self) -> list[str]:
        return [*self.drop, self.python, "-m", "local_mutex"]

    def env(self, extra: Mapping[str, str] | None = None) -> dict[str, str]:
        return clean_env(
            {
                **(extra or {}),
                "PYTHONPATH": self.pythonpath,
                "PYTHONNOUSERSITE": "1",
                "PYTHONDONTWRITEBYTECODE": "1",
            }
        )

    def run(
        self,
        args: Sequence[str | bytes],
        env: Mapping[str, str] | None = None,
        timeout: float = 60,
        input: bytes = b"",
    ) -> subprocess.CompletedProcess[bytes]:
        return subprocess.run(
            [*self.cli, *args],
            env=self.env(env),
            capture_output=True,
            timeout=timeout,
            input=input,
            cwd="/",
        )

    def shared_dir(self, name: str, mode: int = 0o755) -> Path:
        """A new directory this user can reach (removed with the rest at the end)."""
        d = self.base / name
        d.mkdir()
        d.chmod(mode)
        return d


def _readable_copy(src: Path, dest: Path) -> None:
    shutil.copytree(src, dest, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    for root, dirs, files in os.walk(dest):
        for d in dirs:
            os.chmod(os.path.join(root, d), 0o755)
        for f in files:
            path = os.path.join(root, f)
            mode = stat.S_IMODE(os.stat(path).st_mode)
            os.chmod(path, 0o755 if mode & stat.S_IXUSR else 0o644)


def _interpreters() -> list[str]:
    found: list[str] = []
    base = getattr(sys, "_base_executable", None)
    for candidate in (sys.executable, os.path.realpath(sys.executable), base):
        if candidate and candidate not in found and os.path.isfile(candidate):
            found.append(candidate)
    return found


def _temp_roots() -> list[str]:
    roots: list[str] = []
    for root in (tempfile.gettempdir(), "/tmp", "/var/tmp", "/dev/shm"):
        if root not in roots and os.path.isdir(root):
            roots.append(root)
    return roots


@contextmanager
def as_other_user(uid: int = NOBODY) -> Iterator[OtherUser]:
    """Yield an :class:`OtherUser`, or skip the test saying why that is impossible here."""
    if os.geteuid() != 0:
        pytest.skip(f"needs root to run the CLI as uid {uid}")
    setpriv = shutil.which("setpriv")
    if setpriv is None:
        pytest.skip("needs setpriv(1) to run the CLI as another user")
    import local_mutex

    package = Path(local_mutex.__file__).resolve().parent
    why = "no temporary directory found"
    for root in _temp_roots():
        base = Path(tempfile.mkdtemp(prefix="lm-other-user-", dir=root))
        try:
            base.chmod(0o755)
            _readable_copy(package, base / "site" / "local_mutex")
            (base / "site").chmod(0o755)
            pythonpath = str(base / "site")
            for python in _interpreters():
                other = OtherUser(uid, setpriv, python, base, pythonpath)
                probe = subprocess.run(
                    [*other.drop, python, "-c", "import local_mutex; print(local_mutex.__file__)"],
                    env=other.env(),
                    capture_output=True,
                    timeout=60,
                    cwd="/",
                )
                where = probe.stdout.decode("utf-8", "replace").strip()
                if probe.returncode == 0 and where.startswith(pythonpath + os.sep):
                    yield other
                    return
                why = (
                    f"uid {uid} cannot start {python} with the package copied to "
                    f"{pythonpath}: exit {probe.returncode}, "
                    f"{probe.stderr.decode('utf-8', 'replace').strip()[-300:] or where}"
                )
        finally:
            shutil.rmtree(base, ignore_errors=True)
    pytest.skip(why)
