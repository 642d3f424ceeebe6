"""The action's bootstrap: install once into the tool cache, never trust a partial install."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from helpers import (
    CLI,
    clean_env,
    hold_until,
    needs_pyenv,
    old_pythons,
    pyenv_python,
    version_of,
    wait_for,
)
from helpers.gitserver import Silent

BOOTSTRAP = Path(__file__).resolve().parents[2] / "setup" / "bootstrap.py"
BOOTSTRAP_CLICK = BOOTSTRAP.with_name("bootstrap_click.py")
# pip, where setup installs click: no package index nor any pip setting of the machine's
# (a test's own wheels or index come in through ``extra``).
NO_INDEX = {"PIP_CONFIG_FILE": os.devnull, "PIP_NO_INDEX": "1"}


def _setup(
    tool_cache: Path,
    tmp: Path,
    python: str = sys.executable,
    lock_dir: str = "",
    umask: int = 0o022,
    xdg: Path | None = None,
    extra: dict[str, str] | None = None,
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
            "LOCAL_MUTEX_INPUT_LOCK_DIR": lock_dir,
            "XDG_CACHE_HOME": str(xdg or tmp / "xdg"),  # never the real home
            "TMPDIR": str(tmp),  # nor the machine's /tmp (the last resort)
            **NO_INDEX,
            **(extra or {}),
        }
    )
    for pip_setting in [k for k in env if k.startswith("PIP_") and k not in NO_INDEX]:
        if pip_setting not in (extra or {}):
            env.pop(pip_setting)
    for runners_own in ("RUNNER_TEMP", "GITHUB_WORKSPACE"):  # whose files are trusted
        if runners_own not in (extra or {}):
            env.pop(runners_own, None)
    return subprocess.run(
        [python, str(BOOTSTRAP), "setup"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        umask=umask,
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


def _runner_file(text: str) -> dict[str, str]:
    """GITHUB_ENV / GITHUB_OUTPUT read as the runner reads them: ``KEY=value`` lines, and
    ``KEY<<DELIMITER`` ... ``DELIMITER`` for a value of several lines."""
    values: dict[str, str] = {}
    lines = iter(text.split("\n"))
    for line in lines:
        if "<<" in line and ("=" not in line or line.index("<<") < line.index("=")):
            key, delimiter = line.split("<<", 1)
            body = []
            for inner in lines:
                if inner == delimiter:
                    break
                body.append(inner)
            values[key] = "\n".join(body)
        elif line:
            key, value = line.split("=", 1)
            values[key] = value
    return values


def test_a_lock_dir_with_a_line_break_sets_no_other_variable(tmp_path: Path) -> None:
    """A lock dir anyone may create under /tmp: its second line must not become a
    variable of later steps (BASH_ENV runs a file in every later bash step)."""
    lock_dir = tmp_path / "locks\nBASH_ENV=" / "evil.sh"
    lock_dir.mkdir(parents=True)
    r = _setup(tmp_path / "tc", tmp_path, lock_dir=str(lock_dir))
    assert r.returncode == 0, r.stderr
    values = _runner_file((tmp_path / "env").read_text())
    assert sorted(values) == ["LOCAL_MUTEX_CLI", "LOCAL_MUTEX_LOCK_DIR", "LOCAL_MUTEX_PYTHON"]
    assert values["LOCAL_MUTEX_LOCK_DIR"] == str(lock_dir)
    assert list(_runner_file((tmp_path / "out").read_text())) == ["cli"]


def test_a_partial_install_is_never_used(tmp_path: Path) -> None:
    cache = tmp_path / "tc"
    assert _setup(cache, tmp_path).returncode == 0
    (install,) = [p for p in (cache / "local-mutex").iterdir() if not p.name.startswith(".")]
    # Simulate what a killed install could leave: a temp dir, and a final dir whose
    # completion marker is missing and whose package is broken.
    (install / ".complete").unlink()
    (install / "lib" / "local_mutex" / "cli.py").write_text("raise SystemExit(99)\n")
    leftover = cache / "local-mutex" / f".tmp-{os.geteuid()}-killed"
    leftover.mkdir()
    r = _setup(cache, tmp_path)
    assert r.returncode == 0, r.stderr
    assert (install / ".complete").exists()
    assert "SystemExit(99)" not in (install / "lib" / "local_mutex" / "cli.py").read_text()
    assert not leftover.exists()


@pytest.mark.parametrize("mode", ["action", "setup"])
@pytest.mark.parametrize("damage", ["deleted", "cut short"])
def test_a_damaged_install_is_installed_again(tmp_path: Path, mode: str, damage: str) -> None:
    """A module of a complete install deleted (with its .pyc) or cut short: every later
    action step ended in a ModuleNotFoundError traceback (only ``.complete`` and the
    owners were checked), and setup handed later steps the broken CLI."""
    cache = tmp_path / "tc"
    assert _setup(cache, tmp_path).returncode == 0
    (install,) = [p for p in (cache / "local-mutex").iterdir() if not p.name.startswith(".")]
    package = install / "lib" / "local_mutex"
    module = package / "lifecycle.py"
    whole = module.read_text()
    if damage == "deleted":
        module.unlink()
        for compiled in (package / "__pycache__").glob("lifecycle.*.pyc"):
            compiled.unlink()
    else:
        module.write_text(whole[: len(whole) // 2])
    if mode == "setup":
        r = _setup(cache, tmp_path)
        assert r.returncode == 0, r.stderr
    r, out = _run_once(tmp_path, "mended")
    assert r.returncode == 0, r.stderr
    assert "Traceback" not in r.stderr and r.stdout == "ran\n"
    assert "acquired=true" in out.read_text()
    assert module.read_text() == whole  # installed again where it was


def _run_once(tmp_path: Path, name: str) -> tuple[subprocess.CompletedProcess[str], Path]:
    """The action runs ``echo ran`` under ``name``: its result, and its outputs file."""
    out, locks = tmp_path / "out", tmp_path / "locks"
    out.write_text("")
    locks.mkdir()
    r = _action(
        tmp_path,
        {"NAME": name, "RUN": "echo ran", "LOCK_DIR": str(locks)},
        {"GITHUB_OUTPUT": str(out), "XDG_CACHE_HOME": str(tmp_path / "xdg")},
    )
    return r, out


def test_an_install_that_does_not_import_is_one_error_line(tmp_path: Path) -> None:
    """Damage the checks cannot see (a compiled file spoilt in place, its source intact):
    one ``::error::`` line and exit 125 (nothing ran, ``acquired=false``), not a
    traceback."""
    cache = tmp_path / "tc"
    assert _setup(cache, tmp_path).returncode == 0
    (install,) = [p for p in (cache / "local-mutex").iterdir() if not p.name.startswith(".")]
    tag = sys.implementation.cache_tag
    compiled = install / "lib" / "local_mutex" / "__pycache__" / f"action.{tag}.pyc"
    data = compiled.read_bytes()
    compiled.write_bytes(data[:16] + b"\xff" * (len(data) - 16))  # the header still matches
    r, out = _run_once(tmp_path, "spoilt")
    assert r.returncode == 125, r.stderr
    assert r.stdout == ""
    (line,) = r.stderr.splitlines()
    assert line.startswith(f"::error::local-mutex: the install at {install} does not import (")
    assert out.read_text() == "acquired=false\n"


def _click_wheel(wheels: Path, version: str, requires_python: str) -> None:
    """A wheel of the click these tests run with, released as ``version`` for Python
    ``requires_python``, with syntax of 3.10 (``match``) that makes it a SyntaxError to 3.9,
    as click 8.2 and later are."""
    import base64
    import hashlib
    import zipfile

    import click

    src = Path(click.__file__).parent
    files = {
        f"click/{f.relative_to(src)}": f.read_bytes()
        for f in sorted(src.rglob("*"))
        if f.is_file() and "__pycache__" not in f.parts
    }
    files["click/_newer.py"] = b"def f(x):\n    match x:\n        case _:\n            return x\n"
    files["click/__init__.py"] += b"\nfrom . import _newer as _newer\n"
    info = f"click-{version}.dist-info"
    files[f"{info}/METADATA"] = (
        f"Metadata-Version: 2.1\nName: click\nVersion: {version}\n"
        f"Requires-Python: {requires_python}\n"
    ).encode()
    files[f"{info}/WHEEL"] = (
        b"Wheel-Version: 1.0\nGenerator: tests\nRoot-Is-Purelib: true\nTag: py3-none-any\n"
    )
    record = []
    for name, data in files.items():
        digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
        record.append(f"{name},sha256={digest},{len(data)}\n")
    files[f"{info}/RECORD"] = ("".join(record) + f"{info}/RECORD,,\n").encode()
    wheels.mkdir(exist_ok=True)
    with zipfile.ZipFile(wheels / f"click-{version}-py3-none-any.whl", "w") as whl:
        for name, data in files.items():
            whl.writestr(name, data)


def _without_click(*versions: str) -> str | None:
    """The first pyenv interpreter of ``versions`` that cannot import click."""
    for version in versions:
        python = pyenv_python(version)
        if (
            python
            and subprocess.run([python, "-c", "import click"], capture_output=True).returncode
        ):
            return python
    return None


NEWER = _without_click("3.13", "3.12", "3.11", "3.10")


@needs_pyenv("3.9")
@pytest.mark.skipif(NEWER is None, reason="no pyenv Python >= 3.10 without click here")
def test_click_is_kept_per_interpreter(tmp_path: Path) -> None:
    """One install serves every interpreter of the host: the click a 3.13 step installed
    (click 8.2 and later need 3.10) was a SyntaxError traceback to a later 3.9 step's
    setup, and to its --help. Each gets a click of its own, and one that will not import
    counts as none."""
    assert NEWER is not None
    old = pyenv_python("3.9")
    assert old is not None
    wheels = tmp_path / "wheels"
    _click_wheel(wheels, "99.0", ">=3.10")
    cache, pip = tmp_path / "tc", {"PIP_FIND_LINKS": str(wheels)}
    env_file = tmp_path / "env"

    def cli_help(python: str) -> subprocess.CompletedProcess[str]:
        cli = _runner_file(env_file.read_text())["LOCAL_MUTEX_CLI"]
        return subprocess.run(
            ["sh", cli, "--help"],
            env=clean_env({"LOCAL_MUTEX_PYTHON": python}),
            capture_output=True,
            text=True,
            timeout=60,
        )

    r = _setup(cache, tmp_path, python=NEWER, extra=pip)
    assert r.returncode == 0 and "::warning::" not in r.stderr, r.stderr
    assert cli_help(NEWER).stdout.startswith("Usage: local-mutex")
    r = _setup(cache, tmp_path, python=old, extra=pip)
    assert r.returncode == 0, r.stderr
    assert "Traceback" not in r.stderr
    (warning,) = [x for x in r.stderr.splitlines() if "::" in x]
    assert warning.startswith(f"::warning::local-mutex: could not install click for {old}: ")
    h = cli_help(old)
    assert h.returncode == 2 and "Traceback" not in h.stderr, h.stderr
    assert "help and shell completion need click" in h.stderr
    assert cli_help(NEWER).stdout.startswith("Usage: local-mutex")  # its click is still its


def test_a_click_this_python_cannot_import_is_none(tmp_path: Path) -> None:
    """A click on the interpreter's path that fails to import (here a SyntaxError) was a
    traceback; setup installs one of the install's own, which the CLI then uses."""
    broken = tmp_path / "broken"
    (broken / "click").mkdir(parents=True)
    (broken / "click" / "__init__.py").write_text("def f(x:\n")
    wheels = tmp_path / "wheels"
    _click_wheel(wheels, "99.0", ">=3.10")
    extra = {"PIP_FIND_LINKS": str(wheels), "PYTHONPATH": f"{broken}{os.pathsep}"}
    r = _setup(tmp_path / "tc", tmp_path, extra=extra)
    assert r.returncode == 0, r.stderr
    assert "Traceback" not in r.stderr and "::warning::" not in r.stderr, r.stderr
    cli = _runner_file((tmp_path / "env").read_text())["LOCAL_MUTEX_CLI"]
    h = subprocess.run(
        ["sh", cli, "--help"],
        env=clean_env({"LOCAL_MUTEX_PYTHON": sys.executable, **extra}),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert h.returncode == 0 and h.stdout.startswith("Usage: local-mutex"), h.stderr


def test_an_index_that_never_answers_costs_seconds_and_only_once(tmp_path: Path) -> None:
    """Every setup step on an interpreter without click waited out pip's timeouts and
    retries (~100 s), its retry warnings flooded the log, and the warning that followed
    did not start a line. Now: a few seconds, pip's words summed up in one warning line,
    and not again for a while."""
    bare = tmp_path / "bare-python"  # -S: no site-packages, no click
    bare.write_text(f'#!/bin/sh\nexec "{sys.executable}" -S "$@"\n')
    bare.chmod(0o755)
    index = Silent()  # a loopback "index" that takes connections and never answers
    try:
        extra = {"PIP_INDEX_URL": index.url.replace("/locks.git", "/simple"), "PIP_NO_INDEX": "0"}
        r = _setup(tmp_path / "tc", tmp_path, python=str(bare), extra=extra)
        assert r.returncode == 0, r.stderr
        assert index.held  # pip did ask
        lines = r.stderr.splitlines()
        (warning,) = [x for x in lines if "::" in x or "\x1b" in x or "Retrying" in x]
        assert warning.startswith(
            f"::warning::local-mutex: could not install click for {sys.executable}: pip gave up"
        )
        assert lines[-1].startswith("local-mutex: ready at ")
        (install,) = [
            p for p in (tmp_path / "tc" / "local-mutex").iterdir() if not p.name.startswith(".")
        ]
        (failed,) = (install / "deps").glob("*.failed")
        # The next steps do not ask again (each would wait as long) ...
        asked = len(index.held)
        r = _setup(tmp_path / "tc", tmp_path, python=str(bare), extra=extra)
        assert r.returncode == 0, r.stderr
        assert len(index.held) == asked
        (warning,) = [x for x in r.stderr.splitlines() if "::" in x]
        assert warning.startswith("::warning::local-mutex: could not install click") and (
            " ago; pip is tried again " in warning
        )
        # ... until a while has passed.
        long_ago = time.time() - 3600
        os.utime(failed, (long_ago, long_ago))
        assert _setup(tmp_path / "tc", tmp_path, python=str(bare), extra=extra).returncode == 0
        assert len(index.held) > asked
    finally:
        index.close()


def _install_key() -> str:
    r = subprocess.run(
        [sys.executable, "-c", "import bootstrap; print(bootstrap.install_key())"],
        cwd=BOOTSTRAP.parent,
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    return r.stdout.strip()


def _plant(install: Path, pwned: Path, owner: int) -> None:
    """What another user could leave in a shared tool cache: an install that looks
    complete and runs their code as whoever starts the action."""
    package = install / "lib" / "local_mutex"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text(f"open({str(pwned)!r}, 'w').close()\n")
    (install / ".complete").write_text("")
    for path in (install, *install.rglob("*")):
        os.chown(path, owner, owner)


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to give files to another user")
@pytest.mark.parametrize("shared", ["the cache dir", "the install only"])
def test_an_install_another_user_planted_is_never_run(tmp_path: Path, shared: str) -> None:
    """A tool cache shared by several runners' users: an install with the right name but
    another owner ran their code as root (whoever started the action)."""
    cache, pwned, xdg = tmp_path / "tc", tmp_path / "pwned", tmp_path / "xdg"
    cache.mkdir()
    cache.chmod(0o1777)
    root = cache / "local-mutex"
    root.mkdir()
    if shared == "the cache dir":  # theirs: they could swap what we check
        os.chown(root, 65534, 65534)
    else:
        root.chmod(0o1777)
    _plant(root / _install_key(), pwned, 65534)
    r = _setup(cache, tmp_path, xdg=xdg)
    assert r.returncode == 0, r.stderr
    assert not pwned.exists()
    cli = _runner_file((tmp_path / "env").read_text())["LOCAL_MUTEX_CLI"]
    if shared == "the cache dir":
        assert cli.startswith(f"{xdg}/local-mutex/")
    else:
        assert cli.startswith(f"{root / _install_key()}-u0/")
    assert _setup(cache, tmp_path, xdg=xdg).returncode == 0 and not pwned.exists()


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to give directories to another user")
@pytest.mark.parametrize("runner_temp", [True, False])
def test_a_container_job_over_the_runner_users_mounts_installs(
    tmp_path: Path, runner_temp: bool
) -> None:
    """A `container:` job runs as root over directories of the runner's user (/__t,
    /github/home): both cache roots were refused, and the action failed (125). The runner's
    account (it owns the job's RUNNER_TEMP) is trusted; without it, a directory of our own
    in the temporary one serves."""
    runner = 65534
    cache, home, temp = tmp_path / "__t", tmp_path / "home", tmp_path / "temp"
    for d in (cache, home, temp):
        d.mkdir()
        os.chown(d, runner, runner)
    r = _setup(cache, tmp_path, xdg=home, extra={"RUNNER_TEMP": str(temp)} if runner_temp else {})
    assert r.returncode == 0, r.stderr
    cli = _runner_file((tmp_path / "env").read_text())["LOCAL_MUTEX_CLI"]
    where = cache / "local-mutex" if runner_temp else tmp_path / "local-mutex-tools-0"
    assert cli.startswith(f"{where}/"), cli


def test_an_install_made_under_umask_0_is_ours_alone_and_reused(tmp_path: Path) -> None:
    """Nothing of it may be anybody's to write (it would not be trusted, and reinstalled)."""
    cache, xdg = tmp_path / "tc", tmp_path / "xdg"
    assert _setup(cache, tmp_path, umask=0, xdg=xdg).returncode == 0
    assert not xdg.exists()
    (install,) = [p for p in (cache / "local-mutex").iterdir() if not p.name.startswith(".")]
    assert not [p for p in (install, *install.rglob("*")) if p.lstat().st_mode & 0o002]
    stamp = (install / ".complete").stat().st_mtime_ns
    assert _setup(cache, tmp_path, umask=0, xdg=xdg).returncode == 0
    assert (install / ".complete").stat().st_mtime_ns == stamp


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


# -- old interpreters: the bootstrap parses on any Python 3 and says what it needs --------


@pytest.mark.parametrize("version", old_pythons())
@pytest.mark.parametrize("mode", ["action", "setup"])
def test_an_old_python_gets_the_friendly_error(tmp_path: Path, version: str, mode: str) -> None:
    python = pyenv_python(version)
    assert python is not None
    cache = tmp_path / "tc"
    files = {n: tmp_path / n for n in ("path", "env", "out")}
    for f in files.values():
        f.write_text("")
    env = clean_env(
        {
            "RUNNER_TOOL_CACHE": str(cache),
            "XDG_CACHE_HOME": str(tmp_path / "xdg"),
            "GITHUB_PATH": str(files["path"]),
            "GITHUB_ENV": str(files["env"]),
            "GITHUB_OUTPUT": str(files["out"]),
            "LOCAL_MUTEX_INPUT_NAME": "old",
            "LOCAL_MUTEX_INPUT_RUN": "echo must-not-run",
        }
    )
    r = subprocess.run(
        [python, str(BOOTSTRAP), mode], env=env, capture_output=True, text=True, timeout=60
    )
    assert r.returncode == 2, r.stderr
    full = version_of(python)
    assert r.stderr == f"::error::local-mutex needs Python >= 3.9, {python} is {full}\n"
    assert r.stdout == ""
    assert not cache.exists() and not (tmp_path / "xdg").exists()  # nothing installed
    # The action's outputs say nothing was acquired, as when there is no interpreter.
    assert files["out"].read_text() == ("acquired=false\n" if mode == "action" else "")
    assert files["path"].read_text() == files["env"].read_text() == ""


@pytest.mark.parametrize("version", old_pythons())
@pytest.mark.parametrize("path", [BOOTSTRAP, BOOTSTRAP_CLICK], ids=lambda p: p.name)
def test_an_old_python_compiles_the_bootstrap(tmp_path: Path, version: str, path: Path) -> None:
    """The whole file compiles (not just the lines that run before the version check)."""
    python = pyenv_python(version)
    assert python is not None
    code = "import sys; compile(open(sys.argv[1]).read(), sys.argv[1], 'exec')"
    r = subprocess.run([python, "-c", code, str(path)], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr


@pytest.mark.parametrize("path", [BOOTSTRAP, BOOTSTRAP_CLICK], ids=lambda p: p.name)
def test_the_bootstrap_uses_no_syntax_that_python_2_7_or_3_0_lacks(path: Path) -> None:
    """What the interpreters here cannot all check (3.0 to 3.5): no f-strings, no
    annotations of any kind (Python 2 has none: signatures are typed in comments), no
    keyword-only parameters, ``nonlocal``, ``yield from``, ``raise ... from`` or starred
    targets (Python 2), no u"" strings (3.0 to 3.2). Tokens and the syntax tree tell."""
    import ast
    import io
    import tokenize

    source = path.read_text()
    fstring_start = getattr(tokenize, "FSTRING_START", None)
    for tok in tokenize.generate_tokens(io.StringIO(source).readline):
        if tok.type == fstring_start:
            raise AssertionError(f"f-string at line {tok.start[0]}")
        if tok.type == tokenize.STRING:
            prefix = tok.string[: len(tok.string) - len(tok.string.lstrip("rRbBuUfF"))]
            assert not set(prefix.lower()) & {"f", "u"}, f"{prefix} string at {tok.start[0]}"
    tree = ast.parse(source)
    newer = (
        ast.AnnAssign,
        ast.NamedExpr,
        ast.AsyncFunctionDef,
        ast.Await,
        ast.JoinedStr,
        ast.Nonlocal,
        ast.YieldFrom,
        ast.Starred,
    )
    futures: set[str] = set()
    for node in ast.walk(tree):
        assert not isinstance(node, newer), f"{type(node).__name__} at line {node.lineno}"
        if isinstance(node, ast.ImportFrom) and node.module == "__future__":
            futures |= {a.name for a in node.names}
        if isinstance(node, ast.Raise):
            assert node.cause is None, f"raise ... from at line {node.lineno}"
        if isinstance(node, ast.arguments):
            assert not node.posonlyargs and not node.kwonlyargs, "keyword-only parameters"
            for arg in [*node.args, node.vararg, node.kwarg]:
                assert arg is None or arg.annotation is None, f"annotated {arg.arg}"
        if isinstance(node, ast.FunctionDef):
            assert node.returns is None, f"return annotation at line {node.lineno}"
    assert futures == {"print_function"}, futures


@pytest.mark.skipif(pyenv_python("3.9") is None, reason="no pyenv Python 3.9 here")
def test_the_lowest_supported_python_runs_the_action(tmp_path: Path) -> None:
    """Python 3.9 (the floor) installs the package and runs a command under a lock, with no
    click needed (the action path is click-free)."""
    python = pyenv_python("3.9")
    assert python is not None
    out = tmp_path / "out"
    out.write_text("")
    locks = tmp_path / "locks"
    locks.mkdir()
    env = clean_env(
        {
            "RUNNER_TOOL_CACHE": str(tmp_path / "tc"),
            "GITHUB_OUTPUT": str(out),
            "LOCAL_MUTEX_INPUT_NAME": "floor",
            "LOCAL_MUTEX_INPUT_RUN": "echo ran-under-lock",
            "LOCAL_MUTEX_INPUT_LOCK_DIR": str(locks),
        }
    )
    env.pop("GITHUB_STEP_SUMMARY", None)
    r = subprocess.run(
        [python, str(BOOTSTRAP), "action"], env=env, capture_output=True, text=True, timeout=60
    )
    assert r.returncode == 0, r.stderr
    assert r.stdout == "ran-under-lock\n"
    assert "acquired=true" in out.read_text()


def test_the_action_locks_where_the_cli_does_with_a_job_wide_remote(tmp_path: Path) -> None:
    """$LOCAL_MUTEX_REMOTE set for the job, no remote: input: the action locked on this
    machine, beside the CLI's run of the name on the remote."""
    repo = tmp_path / "locks.git"
    subprocess.run(["git", "init", "-q", "--bare", str(repo)], check=True)
    marks = tmp_path / "marks"
    marks.mkdir()
    base = {"LOCAL_MUTEX_REMOTE": f"file://{repo}", "LOCAL_MUTEX_LOCK_DIR": str(tmp_path)}
    holder = subprocess.Popen([*CLI, "-q", "shared-name", hold_until(marks)], env=clean_env(base))
    try:
        wait_for(marks / "h.held")
        out = tmp_path / "out"
        out.write_text("")
        inputs = {"NAME": "shared-name", "RUN": f"touch '{marks}/action-ran'"}
        r = _action(
            tmp_path,
            {**inputs, "WAIT_SECONDS": "0"},
            {**base, "GITHUB_OUTPUT": str(out)},
        )
        assert r.returncode == 75, r.stderr  # not acquired: the CLI's run holds it
        assert not (marks / "action-ran").exists()
        assert "acquired=false" in out.read_text()
    finally:
        (marks / "h.go").touch()
        assert holder.wait(30) == 0


def _action(tmp_path: Path, inputs: dict[str, str], extra: dict[str, str]) -> Any:
    """The action's entry under Actions, with these inputs and ``extra`` variables (the
    runner files among them: those not given are unset)."""
    env = clean_env(
        {
            "GITHUB_ACTIONS": "true",
            "RUNNER_TOOL_CACHE": str(tmp_path / "tc"),
            "LOCAL_MUTEX_INPUT_LOCK_DIR": str(tmp_path),
            **{f"LOCAL_MUTEX_INPUT_{k}": v for k, v in inputs.items()},
            **extra,
        }
    )
    for unset in ("GITHUB_OUTPUT", "GITHUB_STEP_SUMMARY"):
        if unset not in extra:
            env.pop(unset, None)
    return subprocess.run(
        [sys.executable, str(BOOTSTRAP), "action"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_the_action_says_what_the_backend_warns_of(tmp_path: Path) -> None:
    """A lock dir anybody may swap files in (or a password in a remote's URL): the CLI
    said so, the action did not."""
    locks = tmp_path / "open"
    locks.mkdir()
    locks.chmod(0o777)
    out = tmp_path / "out"
    out.write_text("")
    extra = {"LOCAL_MUTEX_INPUT_LOCK_DIR": str(locks), "GITHUB_OUTPUT": str(out)}
    r = _action(tmp_path, {"NAME": "warned", "RUN": "true"}, extra)
    assert r.returncode == 0, r.stderr
    assert "::warning::local-mutex: lock dir" in r.stderr and "not sticky" in r.stderr


@pytest.mark.parametrize(
    ("inputs", "said"),
    [
        ({"MESSAGE": "m" * 8193}, "message is 8193 characters long; at most 8192"),
        ({"LOCK_DIR": "", "REMOTE": "garbage"}, "remote 'garbage' is not a lock address"),
        ({"REENTRANT": "true"}, "reentrant runs inside a hold of this GitHub job"),  # a warning
    ],
)
def test_the_action_names_its_inputs_in_errors(
    tmp_path: Path, inputs: dict[str, str], said: str
) -> None:
    """An error the run finds (not ``ActionInputs``) spoke of the CLI's options (--message,
    --remote, --reentrant): the action's users set inputs."""
    r = _action(tmp_path, {"NAME": "words", "RUN": f"touch '{tmp_path}/ran'", **inputs}, {})
    kind = "warning" if "REENTRANT" in inputs else "error"
    assert f"::{kind}::local-mutex: {said}" in r.stderr, r.stderr
    assert "--" not in r.stderr.split(f"::{kind}::", 1)[1], r.stderr
    assert r.returncode == (0 if kind == "warning" else 2), r.stderr
    assert (tmp_path / "ran").exists() == (kind == "warning")


@pytest.mark.parametrize(
    "inputs", [{"NAME": "", "RUN": "true"}, {"NAME": "n", "RUN": "true", "MESSAGE": "m" * 9000}]
)
def test_a_refused_run_leaves_no_output_file(tmp_path: Path, inputs: dict[str, str]) -> None:
    """The command's output file is made before the run: one that never ran left it."""
    temp, out = tmp_path / "rt", tmp_path / "out"
    temp.mkdir()
    out.touch()
    r = _action(tmp_path, inputs, {"RUNNER_TEMP": str(temp), "GITHUB_OUTPUT": str(out)})
    assert r.returncode == 2, r.stderr
    assert list(temp.iterdir()) == [] and "output-file" not in out.read_text(), r.stderr
    assert "acquired=false" in out.read_text()


def test_the_action_module_runs_the_action(tmp_path: Path) -> None:
    """``python -m local_mutex.action`` (what the bootstrap calls) did nothing, exit 0."""
    env = clean_env({"LOCAL_MUTEX_INPUT_NAME": "", "LOCAL_MUTEX_INPUT_RUN": "true"})
    r = subprocess.run(
        [sys.executable, "-m", "local_mutex.action"], env=env, capture_output=True, text=True
    )
    assert r.returncode == 2 and "local-mutex: " in r.stderr, r.stderr


def test_the_actions_run_may_start_with_a_dash(tmp_path: Path) -> None:
    """run: -x ...: a command for sh, not sh's options ("Illegal option")."""
    r = _action(tmp_path, {"NAME": "dash", "RUN": f"-x; touch '{tmp_path}/ran'"}, {})
    assert r.returncode == 0 and (tmp_path / "ran").exists(), r.stderr
    assert "llegal option" not in r.stderr


def test_the_action_names_a_job_wide_address_as_the_variable(tmp_path: Path) -> None:
    """No remote input: the address the error is about is $LOCAL_MUTEX_REMOTE's."""
    inputs = {"NAME": "words", "RUN": f"touch '{tmp_path}/ran'", "LOCK_DIR": ""}
    r = _action(tmp_path, inputs, {"LOCAL_MUTEX_REMOTE": "garbage"})
    said = "::error::local-mutex: $LOCAL_MUTEX_REMOTE 'garbage' is not a lock address"
    assert said in r.stderr and "remote 'garbage'" not in r.stderr, r.stderr
    assert r.returncode == 2 and not (tmp_path / "ran").exists()


@pytest.mark.parametrize(("command", "status"), [("exit 3", 3), ("true", 74)])
def test_outputs_that_cannot_be_written_are_an_error_not_a_traceback(
    tmp_path: Path, command: str, status: int
) -> None:
    """A full disk under GITHUB_OUTPUT: a traceback and exit 1 took the command's status."""
    r = _action(tmp_path, {"NAME": "n", "RUN": command}, {"GITHUB_OUTPUT": "/dev/full"})
    assert r.returncode == status, r.stderr
    assert "Traceback" not in r.stderr and "could not write the step's outputs" in r.stderr


def test_a_summary_that_cannot_be_written_is_a_warning(tmp_path: Path) -> None:
    r = _action(tmp_path, {"NAME": "n", "RUN": "true"}, {"GITHUB_STEP_SUMMARY": "/dev/full"})
    assert r.returncode == 0, r.stderr
    assert "::warning::" in r.stderr and "Traceback" not in r.stderr


def test_a_hold_whose_token_cannot_be_written_is_ended(tmp_path: Path) -> None:
    """Nobody could ever release it with its token: it stayed held (and no traceback)."""
    r = _action(tmp_path, {"NAME": "h", "MODE": "hold"}, {"GITHUB_OUTPUT": "/dev/full"})
    assert r.returncode == 74, r.stderr
    assert "ended the hold" in r.stderr and "Traceback" not in r.stderr
    status = subprocess.run(
        [*CLI, "status", "h", "--lock-dir", str(tmp_path)], env=clean_env(), capture_output=True
    )
    assert status.returncode == 0, status.stdout  # free


def test_a_hold_with_no_job_process_to_end_it_says_so(tmp_path: Path) -> None:
    """No runner worker (nor act) among its ancestors: the hold ends only at a release or
    its TTL, and the step said it would end with the job."""
    out = tmp_path / "out"
    out.write_text("")
    r = _action(tmp_path, {"NAME": "h", "MODE": "hold"}, {"GITHUB_OUTPUT": str(out)})
    try:
        assert r.returncode == 0, r.stderr
        assert "no job process found to end it" in r.stderr, r.stderr
        assert "this job ends" not in r.stderr
    finally:
        subprocess.run(
            [*CLI, "-q", "release", "--force", "h", "--lock-dir", str(tmp_path)],
            env=clean_env(),
            check=True,
        )


@pytest.mark.parametrize(
    ("held_with", "check_with", "locked"),
    [
        ([], ["3"], False),
        (["--slots", "1"], [], False),
        ([], [], True),
        (["--slots", "1"], ["1"], True),
    ],
    ids=["plain-held-slots-asked", "slot-held-plain-asked", "plain", "slots"],
)
def test_check_names_a_holder_only_of_what_locked_is_about(
    tmp_path: Path, held_with: list[str], check_with: list[str], locked: bool
) -> None:
    """``holder`` was the plain lock's holder while ``locked`` spoke of the slots (and the
    other way round): action.yml says it is empty when free."""
    marks = tmp_path / "marks"
    marks.mkdir()
    holder = subprocess.Popen(
        [*CLI, "-q", *held_with, "c", hold_until(marks), str(tmp_path)], env=clean_env()
    )
    try:
        wait_for(marks / "h.held")
        out = tmp_path / "out"
        out.write_text("")
        slots = {"SLOTS": check_with[0]} if check_with else {}
        r = _action(tmp_path, {"NAME": "c", "MODE": "check", **slots}, {"GITHUB_OUTPUT": str(out)})
        assert r.returncode == 0, r.stderr
        values = _runner_file(out.read_text())
        assert values["locked"] == ("true" if locked else "false")
        if locked:
            assert json.loads(values["holder"])["pid"] == holder.pid
        else:
            assert values["holder"] == ""
    finally:
        (marks / "h.go").touch()
        holder.wait(30)


def _run_script(action_yml: Path) -> str:
    """The step's ``run: |`` block, as the runner hands it to ``sh``."""
    lines = action_yml.read_text().splitlines()
    start = next(i for i, line in enumerate(lines) if line.strip() == "run: |") + 1
    indent = len(lines[start]) - len(lines[start].lstrip())
    body = []
    for line in lines[start:]:
        if line.strip() and len(line) - len(line.lstrip()) < indent:
            break
        body.append(line[indent:])
    return "\n".join(body) + "\n"


@pytest.mark.parametrize("which", ["action.yml", "setup/action.yml"])
def test_a_missing_interpreter_is_a_clear_error(tmp_path: Path, which: str) -> None:
    """``python: python3.12`` on a runner without it: sh said ``exec: python3.12: not
    found`` (exit 127), no ``::error::``."""
    script = _run_script(BOOTSTRAP.parents[1] / which)
    for python in ("no-such-python3.99", str(tmp_path / "absent")):
        env = clean_env({"LOCAL_MUTEX_INPUT_PYTHON": python, "GITHUB_ACTION_PATH": "/nowhere"})
        r = subprocess.run(["sh", "-c", script], env=env, capture_output=True, text=True)
        assert r.returncode == 2, r.stderr
        assert r.stdout.startswith(f"::error::local-mutex: no Python interpreter '{python}'")
    if which == "action.yml":  # its outputs say what they say for any other error
        out = tmp_path / "out"
        env = clean_env({"LOCAL_MUTEX_INPUT_PYTHON": "absent3.99", "GITHUB_OUTPUT": str(out)})
        assert subprocess.run(["sh", "-c", script], env=env, capture_output=True).returncode == 2
        assert out.read_text() == "acquired=false\n"
    env = clean_env({"LOCAL_MUTEX_INPUT_PYTHON": sys.executable, "GITHUB_ACTION_PATH": "/x"})
    r = subprocess.run(["sh", "-c", script], env=env, capture_output=True, text=True)
    assert "No such file" in r.stderr  # found, and exec'd: it is the bootstrap that is missing
    shellcheck = Path(sys.executable).parent / "shellcheck"
    if shellcheck.exists():  # a dev tool: CI runs it (.ci/run installs it)
        r = subprocess.run(
            [str(shellcheck), "-s", "sh", "-"], input=script, capture_output=True, text=True
        )
        assert r.returncode == 0, r.stdout


@pytest.mark.parametrize("which", ["action.yml", "setup/action.yml"])
@pytest.mark.parametrize("python", ["/bin/true", "/bin/false", "perl", "/bin"])
def test_something_that_is_not_a_python_is_a_clear_error(
    tmp_path: Path, which: str, python: str
) -> None:
    """``python: /bin/true``: the step succeeded without running the command or taking the
    lock; /bin/false failed it without a word; perl printed screens of its errors."""
    if shutil.which(python) is None and not os.path.isdir(python):
        pytest.skip(f"no {python} here")
    script = _run_script(BOOTSTRAP.parents[1] / which)
    out = tmp_path / "out"
    out.write_text("")
    env = clean_env(
        {
            "LOCAL_MUTEX_INPUT_PYTHON": python,
            "GITHUB_ACTION_PATH": str(BOOTSTRAP.parents[1 if which == "action.yml" else 0]),
            "GITHUB_OUTPUT": str(out),
            "RUNNER_TOOL_CACHE": str(tmp_path / "tc"),
            "LOCAL_MUTEX_INPUT_NAME": "not-python",
            "LOCAL_MUTEX_INPUT_RUN": f"touch {tmp_path}/ran",
            "LOCAL_MUTEX_INPUT_LOCK_DIR": str(tmp_path),
        }
    )
    r = subprocess.run(["sh", "-c", script], env=env, capture_output=True, text=True)
    assert r.returncode == 2, r.stderr
    assert r.stderr == ""
    assert r.stdout == (
        f"::error::local-mutex: '{python}' is not a Python interpreter that runs (it did not "
        "answer -c 'print(...)'): name a Python 3.9 or newer (the python input, else "
        "$LOCAL_MUTEX_PYTHON, else python3)\n"
    )
    assert not (tmp_path / "ran").exists()
    assert out.read_text() == ("acquired=false\n" if which == "action.yml" else "")


@pytest.mark.parametrize("which", ["action.yml", "setup/action.yml"])
def test_the_interpreters_name_is_escaped_in_the_error(tmp_path: Path, which: str) -> None:
    """'$py' went into the ``::error::`` line raw: a line break ended the annotation (the
    rest of the name could be a workflow command of its own), a % was taken for an escape,
    and dash's echo turned a backslash-n into a line break."""
    script = _run_script(BOOTSTRAP.parents[1] / which)
    python = str(tmp_path / "100%\\new\r\n::warning::no python")
    r = subprocess.run(
        ["sh", "-c", script],
        env=clean_env({"LOCAL_MUTEX_INPUT_PYTHON": python}),
        capture_output=True,
        text=True,
    )
    assert r.returncode == 2, r.stderr
    (line,) = r.stdout.splitlines()
    shown = str(tmp_path / "100%25\\new%0D%0A::warning::no python")
    assert line.startswith(f"::error::local-mutex: no Python interpreter '{shown}' on this")
