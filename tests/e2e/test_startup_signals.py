"""A Ctrl-C that lands while the interpreter is still loading local-mutex, before any
handler of ours is in place: the command never ran, so the caller sees 130 and no
traceback, from every way local-mutex is started. The signal is sent by an audit hook at
the very import it must interrupt, so the moment is exact on any machine."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from helpers import clean_env, signal_in_import_callback

ROOT = Path(__file__).resolve().parents[2]
SRC = ROOT / "src"
SCRIPT = ROOT / "scripts" / "local-mutex"
SHIM = SRC / "local_mutex" / "local-mutex.sh"

# Through posix, not os: under the shim's -I -S, importing os is the program's own first
# step, and a Ctrl-C may land there too.
HOOK = """
import posix, sys
def _interrupt(event, args, target=posix.environ[b"SIGINT_AT_IMPORT"].decode()):
    if event == "import" and args[0] == target:
        posix.kill(posix.getpid(), 2)
sys.addaudithook(_interrupt)
"""


def _entry(
    kind: str, tmp_path: Path, at: str = "local_mutex.cli"
) -> tuple[list[str], dict[str, str]]:
    """How local-mutex is started, with the hook loaded before our first import."""
    env = clean_env({"SIGINT_AT_IMPORT": at})
    if kind == "shim":
        # The shim starts Python with -I -S (no sitecustomize, no PYTHONPATH): the
        # interpreter it runs is this wrapper, which loads the hook, then the shim's code.
        wrapper = tmp_path / "python-with-hook"
        run_code = 'code = sys.argv.pop(1); exec(compile(code, "<shim>", "exec"))'
        wrapper.write_text(
            f'#!/bin/sh\nshift 3\nexec "{sys.executable}" -I -S -c \'{HOOK}\n{run_code}\' "$@"\n'
        )
        wrapper.chmod(0o755)
        env["LOCAL_MUTEX_PYTHON"] = str(wrapper)
        return ["sh", str(SHIM)], env
    site = tmp_path / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text(HOOK)
    env["PYTHONPATH"] = f"{site}:{SRC}"
    if kind == "script":
        return [sys.executable, str(SCRIPT)], env
    return [sys.executable, "-m", "local_mutex"], env


@pytest.mark.parametrize(
    ("kind", "at"),
    [
        ("script", "local_mutex.cli"),
        ("module", "local_mutex.cli"),
        ("shim", "local_mutex.cli"),
        ("shim", "os"),  # the shim's first line: a traceback, exit 1
    ],
)
def test_ctrl_c_while_loading_exits_130_quietly(kind: str, at: str, tmp_path: Path) -> None:
    argv, env = _entry(kind, tmp_path, at)
    ran = tmp_path / "ran"
    r = subprocess.run(
        [*argv, "startup", f"touch {ran}", str(tmp_path)],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert "Traceback" not in r.stderr, r.stderr
    assert r.returncode == 130, r.stderr
    assert not ran.exists()


def test_the_hook_really_interrupts(tmp_path: Path) -> None:
    """The probe is sound: in a program that does not catch it, the hook's signal ends
    the import it aims at with Python's own KeyboardInterrupt."""
    site = tmp_path / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text(HOOK)
    env = clean_env({"SIGINT_AT_IMPORT": "probe_target", "PYTHONPATH": str(site)})
    (site / "probe_target.py").write_text("")
    r = subprocess.run(
        [sys.executable, "-c", "import probe_target"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert "KeyboardInterrupt" in r.stderr


# A Ctrl-C inside the import system's weakref callback, once the CLI's module is loaded
# (and none of the lock's handlers in place): Python only prints a KeyboardInterrupt there.
DROPPED = (
    signal_in_import_callback(
        "SIGINT",
        'hasattr(sys.modules.get("local_mutex.cli"), "run_and_exit")',  # loaded
    )
    + 'import runpy; runpy.run_module("local_mutex", run_name="__main__", alter_sys=True)\n'
)


def test_a_ctrl_c_python_dropped_while_loading_still_keeps_the_command_from_running(
    tmp_path: Path,
) -> None:
    """Before, the KeyboardInterrupt was printed ("Exception ignored") and the run went on:
    it took the lock and ran the command, exit 0 -- a Ctrl-C lost."""
    ran = tmp_path / "ran"
    r = subprocess.run(
        [sys.executable, "-c", DROPPED, "startup", f"touch {ran}", str(tmp_path)],
        env=clean_env({"PYTHONPATH": str(SRC)}),
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert r.stdout == "sent\n", (r.stdout, r.stderr)
    assert r.returncode == 130, r.stderr
    assert not ran.exists()
