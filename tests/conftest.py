"""Fixtures shared by every test; the helpers themselves live in tests/helpers."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import HealthCheck, settings

from helpers import CLI, Procs, clean_env
from helpers import procwatch as pw

SESSION_TAG = "LM_TEST_SESSION"

# Every property test, unless it says otherwise: the same examples each run (a failure in
# CI is one a rerun shows), and no per-example deadline a stalled CI worker could break.
settings.register_profile(
    "local-mutex", derandomize=True, deadline=None, suppress_health_check=[HealthCheck.too_slow]
)
settings.load_profile("local-mutex")

# Started under nohup (or as a shell's `&` job), this process and all it starts would have
# SIGHUP (SIGINT) ignored, and local-mutex keeps a caller's ignored signals ignored: the
# stop-signal tests would test nohup. They get the defaults, as from a terminal.
if signal.getsignal(signal.SIGHUP) == signal.SIG_IGN:
    signal.signal(signal.SIGHUP, signal.SIG_DFL)
if signal.getsignal(signal.SIGINT) == signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)


@pytest.fixture(scope="session", autouse=True)
def nothing_left_running() -> Iterator[None]:
    """Every process the tests start inherits this session's tag; whatever a failed test
    (or a broken product) left running at the end -- a hold never released, a guardian --
    is named and killed, never left on the machine."""
    tag = uuid.uuid4().hex
    os.environ[SESSION_TAG] = tag
    yield
    left = pw.tagged(SESSION_TAG, tag)
    if left:
        names = ", ".join(f"{p} ({' '.join(pw.argv(p))[:60]})" for p in left[:5])
        if sys.__stderr__ is not None:
            sys.__stderr__.write(
                f"\nkilled {len(left)} processes the tests left running: {names}\n"
            )
        pw.signal_quietly(left, signal.SIGKILL)


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
