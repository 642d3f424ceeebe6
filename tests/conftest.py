"""Fixtures shared by every test; the helpers themselves live in tests/helpers."""

from __future__ import annotations

import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from helpers import CLI, Procs, clean_env


@pytest.fixture(scope="session", autouse=True)
def plain_run_cache() -> None:
    """The CLI runs below take their modules from the plain run's cache (``_startup``), as
    an installed local-mutex does from its second run on: one plain run writes it, even
    where the environment says not to write bytecode. test_startup_cache.py covers runs
    without it, and a cache stale, damaged or foreign."""
    env = clean_env()
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    with tempfile.TemporaryDirectory() as lock_dir:
        subprocess.run([*CLI, "-q", "warm-up", "true", lock_dir], env=env, check=True, timeout=60)


@pytest.fixture
def procs(tmp_path: Path) -> Iterator[Procs]:
    p = Procs(tmp_path)
    yield p
    p.stop_all()


@pytest.fixture
def lock_dir(tmp_path: Path) -> Path:
    d = tmp_path / "locks"
    d.mkdir()
    return d


@pytest.fixture
def marks(tmp_path: Path) -> Path:
    d = tmp_path / "marks"
    d.mkdir()
    return d
