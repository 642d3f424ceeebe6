"""Every public name is exported from ``local_mutex``: it resolves at run time (lazily, via
the module ``__getattr__``) and mypy --strict accepts importing it from the package."""

from __future__ import annotations

import importlib
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import local_mutex

SRC = Path(__file__).resolve().parents[2] / "src"


def test_every_name_in_all_resolves() -> None:
    assert len(set(local_mutex.__all__)) == len(local_mutex.__all__)
    for name in local_mutex.__all__:
        value = getattr(local_mutex, name)
        assert value is not None, name
        if name != "__version__":
            home = importlib.import_module(value.__module__)
            assert getattr(home, name) is value, f"{name} is not {value.__module__}.{name}"
    assert sorted(dir(local_mutex)) == sorted(local_mutex.__all__)


def test_star_import_gives_every_public_name() -> None:
    namespace: dict[str, object] = {}
    exec("from local_mutex import *", namespace)
    assert set(local_mutex.__all__) <= set(namespace)


def test_every_error_the_library_raises_is_exported() -> None:
    """NoRoom (no lock file could be created: a full disk) was raised but not exported."""
    from local_mutex import errors

    classes = {
        name
        for name, value in vars(errors).items()
        if isinstance(value, type) and issubclass(value, errors.LocalMutexError)
    }
    # `each` reading its items from stdin; `release` (a Refused) finding no hold of ours
    only_the_cli = {"ItemsUnreadable", "NotOurHold"}
    assert classes - only_the_cli <= set(local_mutex.__all__)


def test_an_unknown_name_is_an_attribute_error() -> None:
    with pytest.raises(AttributeError, match="no attribute 'nope'"):
        local_mutex.nope  # type: ignore[attr-defined]  # noqa: B018


def test_the_package_import_stays_light() -> None:
    """The public names load on first use: importing the package pulls in none of them."""
    code = (
        "import sys, local_mutex\n"
        "print(sorted(m for m in sys.modules if m.startswith('local_mutex')))"
    )
    r = subprocess.run(
        [sys.executable, "-c", code],
        env={**os.environ, "PYTHONPATH": str(SRC)},
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    )
    assert r.stdout.strip() == "['local_mutex']"  # even the version loads on first use


def _mypy() -> list[str] | None:
    found = shutil.which("mypy", path=os.path.dirname(sys.executable))
    if found:
        return [found]
    try:
        import mypy  # noqa: F401
    except ImportError:
        return None
    return [sys.executable, "-m", "mypy"]


@pytest.mark.timeout(300)
def test_mypy_strict_accepts_importing_every_public_name(tmp_path: Path) -> None:
    mypy = _mypy()
    if mypy is None:
        pytest.skip("mypy is not installed")
    names = [n for n in local_mutex.__all__ if n != "__version__"]
    snippet = tmp_path / "uses_api.py"
    snippet.write_text(
        "from local_mutex import (\n"
        + "".join(f"    {n},\n" for n in names)
        + "    __version__,\n)\n\n"
        + "version: str = __version__\n"
        + "everything: list[object] = [\n"
        + "".join(f"    {n},\n" for n in names)
        + "]\n"
        + "".join(f"reveal_type({n})\n" for n in names)
        + "def show(st: LockStatus) -> bool:\n    return st.held\n"
        + "def catch(exc: LocalMutexError) -> str:\n    return str(exc)\n"
    )
    # A name the package does not have is an error (the module __getattr__, typed as
    # returning `object`, let any name import cleanly).
    (tmp_path / "misspelt.py").write_text("from local_mutex import LockStatuss\n")
    r = subprocess.run(
        [
            *mypy,
            "--strict",
            "--no-incremental",
            "--follow-imports=silent",  # judge the snippet, not the package's own source
            "--cache-dir",
            os.devnull,
            "--python-version",
            "3.10",
            str(snippet),
            "misspelt.py",
        ],
        cwd=tmp_path,
        env={**os.environ, "MYPYPATH": str(SRC)},
        capture_output=True,
        text=True,
        timeout=280,
    )
    errors = [x for x in r.stdout.splitlines() if ": error:" in x]
    assert len(errors) == 1, r.stdout + r.stderr
    assert errors[0].startswith("misspelt.py:1:") and '"LockStatuss"' in errors[0], errors
    # A name mypy cannot see as exported falls back to the module __getattr__: `object`.
    revealed = [x for x in r.stdout.splitlines() if "Revealed type is" in x]
    assert len(revealed) == len(names)
    vague = [x for x in revealed if x.endswith(('"object"', '"Any"'))]
    assert vague == [], "\n".join(vague)
