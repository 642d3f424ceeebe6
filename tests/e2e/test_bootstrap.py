"""The action's bootstrap: install once into the tool cache, never trust a partial install."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from helpers import clean_env

BOOTSTRAP = Path(__file__).resolve().parents[2] / "setup" / "bootstrap.py"


def _setup(
    tool_cache: Path, tmp: Path, python: str = sys.executable
) -> subprocess.CompletedProcess[str]:
    files = {n: tmp / n for n in ("path", "env", "out")}
    for f in files.values():
        f.write_text("")
    env = clean_env(
        {
            "RUNNER_TOOL_CACHE": str(tool_cache),
            "GITHUB_PATH": str(files["path"]),
            "GITHUB_ENV": str(files["env"]),
            "GITHUB_OUTPUT": str(files["out"]),
        }
    )
    return subprocess.run(
        [python, str(BOOTSTRAP), "setup"], env=env, capture_output=True, text=True, timeout=60
    )


def test_install_then_reuse(tmp_path: Path) -> None:
    cache = tmp_path / "tc"
    r = _setup(cache, tmp_path)
    assert r.returncode == 0, r.stderr
    (install,) = [p for p in (cache / "local-mutex").iterdir() if not p.name.startswith(".")]
    assert (install / ".complete").exists()
    env_lines = (tmp_path / "env").read_text().splitlines()
    cli = next(x.split("=", 1)[1] for x in env_lines if x.startswith("LOCAL_MUTEX_CLI="))
    assert cli.startswith(str(install))
    assert (tmp_path / "path").read_text().strip() == str(install / "bin")
    out = subprocess.run(
        [str(install / "bin" / "local-mutex"), "x", "echo via-launcher", str(tmp_path)],
        capture_output=True,
        timeout=30,
        env=clean_env(),
    )
    assert out.returncode == 0 and out.stdout == b"via-launcher\n"
    stamp = (install / ".complete").stat().st_mtime_ns
    assert _setup(cache, tmp_path).returncode == 0
    assert (install / ".complete").stat().st_mtime_ns == stamp


def test_a_partial_install_is_never_used(tmp_path: Path) -> None:
    cache = tmp_path / "tc"
    assert _setup(cache, tmp_path).returncode == 0
    (install,) = [p for p in (cache / "local-mutex").iterdir() if not p.name.startswith(".")]
    # Simulate what a killed install could leave: a temp dir, and a final dir whose
    # completion marker is missing and whose package is broken.
    (install / ".complete").unlink()
    (install / "lib" / "local_mutex" / "cli.py").write_text("raise SystemExit(99)\n")
    leftover = cache / "local-mutex" / ".tmp-killed"
    leftover.mkdir()
    r = _setup(cache, tmp_path)
    assert r.returncode == 0, r.stderr
    assert (install / ".complete").exists()
    assert "SystemExit(99)" not in (install / "lib" / "local_mutex" / "cli.py").read_text()
    assert not leftover.exists()


def test_unusable_tool_cache_falls_back_to_the_user_cache(tmp_path: Path) -> None:
    blocker = tmp_path / "not-a-dir"
    blocker.write_text("")
    home_cache = tmp_path / "xdg"
    files = {n: tmp_path / n for n in ("path", "env", "out")}
    for f in files.values():
        f.write_text("")
    env = clean_env(
        {
            "RUNNER_TOOL_CACHE": str(blocker),
            "XDG_CACHE_HOME": str(home_cache),
            "GITHUB_PATH": str(files["path"]),
            "GITHUB_ENV": str(files["env"]),
            "GITHUB_OUTPUT": str(files["out"]),
        }
    )
    r = subprocess.run(
        [sys.executable, str(BOOTSTRAP), "setup"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert r.returncode == 0, r.stderr
    assert os.listdir(home_cache / "local-mutex")
