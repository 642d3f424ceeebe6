"""Fixtures shared by every test; the helpers themselves live in tests/helpers."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from helpers import Procs


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
