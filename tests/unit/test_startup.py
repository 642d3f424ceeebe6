"""The plain path stays light: a nested ``local-mutex NAME CMD`` in a loop must not load
what a bare interpreter does not (click, json, typing, hashlib, enum, dataclasses, re)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

HEAVY = {"click", "json", "typing", "hashlib", "enum", "dataclasses", "re", "psycopg"}
SRC = Path(__file__).resolve().parents[2] / "src"
SHIM = SRC / "local_mutex" / "local-mutex.sh"


def _imported(argv: list[str], cwd: Path, env: dict[str, str]) -> set[str]:
    r = subprocess.run(
        argv, cwd=cwd, env=env, capture_output=True, text=True, check=False, timeout=60
    )
    assert r.returncode == 0, r.stderr
    found = set()
    for line in r.stderr.splitlines():
        if line.startswith("import time:") and "|" in line:
            found.add(line.rsplit("|", 1)[1].strip())
    return found


def _env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("LOCAL_MUTEX_", "GITHUB_"))}
    env.update(extra)
    return env


def _baseline(tmp_path: Path, *flags: str) -> set[str]:
    return _imported([sys.executable, *flags, "-X", "importtime", "-c", "pass"], tmp_path, _env())


@pytest.mark.parametrize(
    "args",
    [
        ["plain", "true", "{dir}"],
        ["-q", "--wait", "5", "--lock-dir", "{dir}", "opts", "true"],
        ["argv", "--lock-dir", "{dir}", "--", "true"],
        # A name after a first `--` is looked up as a program (``suggest``): none here.
        ["-q", "--lock-dir", "{dir}", "--", "no-such-program-here", "true"],
        ["status", "plain", "--lock-dir", "{dir}"],
        ["list", "--lock-dir", "{dir}"],
    ],
)
def test_the_plain_path_imports_nothing_heavy(tmp_path: Path, args: list[str]) -> None:
    argv = [a.replace("{dir}", str(tmp_path)) for a in args]
    code = "import sys; from local_mutex.cli import main; main(sys.argv[1:])"
    env = _env(PYTHONPATH=str(SRC))
    loaded = _imported([sys.executable, "-X", "importtime", "-c", code, *argv], tmp_path, env)
    assert "local_mutex.cli" in loaded  # the probe really ran the CLI
    extra = (loaded - _baseline(tmp_path)) & HEAVY
    assert extra == set(), f"{argv} imports {sorted(extra)}"


def test_the_shim_imports_nothing_heavy(tmp_path: Path) -> None:
    env = _env(LOCAL_MUTEX_PYTHON=sys.executable, PYTHONPROFILEIMPORTTIME="1")
    # -I ignores PYTHON* variables: ask through -X instead, by wrapping the interpreter.
    wrapper = tmp_path / "python"
    wrapper.write_text(f'#!/bin/sh\nexec "{sys.executable}" -X importtime "$@"\n')
    wrapper.chmod(0o755)
    env["LOCAL_MUTEX_PYTHON"] = str(wrapper)
    loaded = _imported(["sh", str(SHIM), "shim", "true", str(tmp_path)], tmp_path, env)
    assert "local_mutex.cli" in loaded
    assert "site" not in loaded  # -I -S: no site processing on the nested path
    extra = (loaded - _baseline(tmp_path, "-I", "-S")) & HEAVY
    assert extra == set(), f"the shim imports {sorted(extra)}"


def test_a_nested_call_inside_a_run_imports_nothing_heavy(tmp_path: Path) -> None:
    """Inside its enclosing run a nested call runs within it: it asked the lock for a hold
    to tell goodbye, which loaded ``socket`` (and ``enum``: ~10 ms a call in a loop)."""
    wrapper = tmp_path / "python"
    wrapper.write_text(f'#!/bin/sh\nexec "{sys.executable}" -X importtime "$@"\n')
    wrapper.chmod(0o755)
    log = tmp_path / "nested.log"
    inner = f'LOCAL_MUTEX_PYTHON="{wrapper}" sh "$LOCAL_MUTEX_CLI" outer true 2>"{log}"'
    code = "import sys; from local_mutex.cli import main; sys.exit(main(sys.argv[1:]))"
    env = _env(PYTHONPATH=str(SRC))
    r = subprocess.run(
        [sys.executable, "-c", code, "-q", "outer", inner, str(tmp_path)],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert r.returncode == 0, r.stderr
    text = log.read_text()
    assert "running inside it" in text, text
    loaded = {ln.rsplit("|", 1)[1].strip() for ln in text.splitlines() if "import time:" in ln}
    extra = (loaded - _baseline(tmp_path, "-I", "-S")) & (HEAVY | {"socket"})
    assert extra == set(), f"a nested call imports {sorted(extra)}"


def test_a_heavy_import_would_be_caught(tmp_path: Path) -> None:
    """The guard's own check: help needs click, and the probe sees it."""
    code = "import sys; from local_mutex.cli import main; main(['--help'])"
    env = _env(PYTHONPATH=str(SRC))
    loaded = _imported([sys.executable, "-X", "importtime", "-c", code], tmp_path, env)
    assert "click" in loaded


def test_the_verbs_that_skip_the_plain_run_cache_are_all_but_run() -> None:
    from local_mutex.cli import OTHER_VERBS
    from local_mutex.commands.options import RUN, VERBS

    assert set(VERBS) - {RUN} == OTHER_VERBS
