"""The Python API checks what it is given before anything is opened or locked: a typed
error naming the parameter, never a bare TypeError from deep inside, a lock taken in /tmp,
or a run that took the lock and ended with 70 (the command never started)."""

from __future__ import annotations

import math
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

import local_mutex
from helpers import clean_env, lock_file


@pytest.fixture(autouse=True)
def default_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Where a lock goes when no lock dir is given: it must stay empty too."""
    d = tmp_path / "default"
    d.mkdir()
    monkeypatch.setenv("LOCAL_MUTEX_LOCK_DIR", str(d))
    monkeypatch.delenv("LOCAL_MUTEX_REMOTE", raising=False)
    return d


def _refused(
    lock_dir: Path, marks: Path, error: type[Exception], /, **kwargs: Any
) -> local_mutex.ValidationError:
    """``run`` with ``kwargs`` raises ``error`` (a ValidationError), nothing ran, nothing
    was locked (nor in the default lock dir)."""
    kwargs.setdefault("lock_dir", str(lock_dir))
    if "argv" not in kwargs:
        kwargs.setdefault("command", f"touch '{marks}/ran'")
    with pytest.raises(error) as info:
        local_mutex.run("api-input", **kwargs)
    assert isinstance(info.value, local_mutex.ValidationError)
    assert info.value.exit_code == 2
    assert not (marks / "ran").exists()
    assert not list(lock_dir.iterdir())
    assert not os.listdir(os.environ["LOCAL_MUTEX_LOCK_DIR"])
    return info.value


def test_a_command_or_argument_no_program_can_get_is_refused(lock_dir: Path, marks: Path) -> None:
    """A lone surrogate encodes to no bytes: the run took the lock and ended with 70. One
    that ``surrogateescape`` read from raw bytes (``\\udcff``) is those bytes, and runs."""
    error = _refused(lock_dir, marks, local_mutex.InvalidCommand, command="echo \ud800")
    assert "lone surrogate" in str(error)
    _refused(lock_dir, marks, local_mutex.InvalidCommand, argv=["echo", "\ud800"])
    _refused(lock_dir, marks, local_mutex.InvalidCommand, argv=["\udc00"])
    out = marks / "out"
    argv = ["sh", "-c", 'printf %s "$1" > "$2"', "sh", "a\udcffb", str(out)]
    assert local_mutex.run("api-input", argv=argv, lock_dir=str(lock_dir)).status == 0
    assert out.read_bytes() == b"a\xffb"


@pytest.mark.parametrize(
    ("kwargs", "says"),
    [
        ({"command": b"true"}, "not bytes"),
        ({"command": ["true"]}, "argv="),
        ({"argv": (a for a in ["true"])}, "not generator"),
        ({"argv": {"true"}}, "not set"),
    ],
    ids=["bytes command", "list command", "generator argv", "set argv"],  # one id per worker
)
def test_a_command_of_the_wrong_type_says_what_to_give(
    lock_dir: Path, marks: Path, kwargs: dict[str, Any], says: str
) -> None:
    """They raised TypeError or AttributeError from deep inside."""
    error = _refused(lock_dir, marks, local_mutex.InvalidCommand, **kwargs)
    assert says in str(error)


CLI_SURROGATE = """
import sys
from local_mutex.cli import main
lock_dir, marks = sys.argv[1], sys.argv[2]
shell = main(["-q", "api-input", f"touch {marks}/shell; echo \\ud800", lock_dir])
program = main(["-q", "api-input", "--", "touch", f"{marks}/program", "\\ud800"])
print(shell, program)
"""


def test_the_cli_refuses_a_lone_surrogate_too(lock_dir: Path, marks: Path) -> None:
    """``main(argv)`` shares the check (a real command line cannot hold one): it took the
    lock and ended with 70."""
    r = subprocess.run(
        [sys.executable, "-c", CLI_SURROGATE, str(lock_dir), str(marks)],
        env=clean_env(),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert r.stdout.split() == ["2", "2"], r.stderr
    assert r.stderr.count("lone surrogate") == 2
    assert not list(marks.iterdir())
    assert not list(lock_dir.iterdir())


@pytest.mark.parametrize(
    ("kwargs", "says"),
    [
        ({"kill_after": None}, "kill_after"),
        ({"slots": 2.0}, "slots"),
        ({"slots": "2"}, "slots"),
        ({"slots": math.nan}, "slots"),
        ({"slots": True}, "slots"),
        ({"slots": 5000}, "1024"),
        ({"shared": "no"}, "shared"),
        ({"shared": 1}, "shared"),
        ({"allow_other_owner": "no"}, "allow_other_owner"),
    ],
    ids=lambda value: repr(value).replace(" ", ""),
)
def test_an_option_of_the_wrong_type_or_range_is_refused(
    lock_dir: Path, marks: Path, kwargs: dict[str, Any], says: str
) -> None:
    """TypeError from deep inside, or taken as something else: ``slots=True`` as 1,
    ``shared="no"`` as a shared lock, ``slots=5000`` past the 1024 the CLI allows (and
    the only slots anything looks at)."""
    error = _refused(lock_dir, marks, local_mutex.ValidationError, **kwargs)
    assert says in str(error)


PATH = {"PATH": os.environ.get("PATH", "/usr/bin:/bin")}


def _with(key: Any, value: Any) -> dict[Any, Any]:
    return {**PATH, key: value}


@pytest.mark.parametrize(
    ("env", "says"),
    [
        (_with("N", 1), "str to str"),
        (_with(b"N", "1"), "str to str"),
        (_with("N", "a\0b"), "NUL"),
        (_with("A=B", "c"), "'='"),
        (_with("", "c"), "empty name"),
        (_with("N", "\ud800"), "lone surrogate"),
        ([("PATH", PATH["PATH"])], "mapping"),
    ],
    ids=["int value", "bytes name", "NUL", "= in a name", "empty name", "surrogate", "pairs"],
)
def test_an_environment_no_program_can_get_is_refused(
    lock_dir: Path, marks: Path, env: Any, says: str
) -> None:
    """Each took the lock and ended with 70 ("the supervisor failed"), or raised
    AttributeError (a list of pairs)."""
    error = _refused(lock_dir, marks, local_mutex.ValidationError, env=env)
    assert "env" in str(error) and says in str(error)


@pytest.mark.parametrize(
    ("lock_dir_given", "says"),
    [("", "empty"), ("/tmp/\0x", "NUL"), ("/tmp/\ud800", "lone surrogate"), (5, "int")],
    ids=repr,
)
def test_a_lock_dir_that_is_no_directory_is_refused(
    lock_dir: Path, marks: Path, lock_dir_given: Any, says: str
) -> None:
    """An empty one locked in /tmp (as the CLI refuses --lock-dir "": an unset variable);
    the others raised ValueError, UnicodeEncodeError, TypeError."""
    error = _refused(lock_dir, marks, local_mutex.InvalidLockDir, lock_dir=lock_dir_given)
    assert "lock_dir" in str(error) and says in str(error)


def test_an_empty_lock_dir_is_refused_by_every_call(default_dir: Path) -> None:
    """Each looked in (or locked) the default lock dir instead."""
    calls: list[Callable[[], object]] = [
        lambda: local_mutex.status("api-input", ""),
        lambda: local_mutex.list_locks(""),
        lambda: local_mutex.lock_path("api-input", ""),
        lambda: local_mutex.hold("api-input", lock_dir="").__enter__(),
    ]
    for call in calls:
        with pytest.raises(local_mutex.InvalidLockDir, match="empty"):
            call()
    assert not list(default_dir.iterdir())


def test_a_lock_dir_may_be_a_path(lock_dir: Path, marks: Path) -> None:
    """A ``pathlib.Path`` raised AttributeError ('PosixPath' object has no attribute)."""
    assert local_mutex.lock_path("api-input", lock_dir) == str(lock_file(lock_dir, "api-input"))
    result = local_mutex.run("api-input", command=f"touch '{marks}/ran'", lock_dir=lock_dir)
    assert result.status == 0 and (marks / "ran").exists()
    assert result.lock_file == str(lock_file(lock_dir, "api-input"))
    with local_mutex.hold("api-input", lock_dir=lock_dir) as held:
        assert held.path == str(lock_file(lock_dir, "api-input"))
        assert local_mutex.status("api-input", lock_dir).state == "held"
        assert [s.name for s in local_mutex.list_locks(lock_dir)] == ["api-input"]


def test_a_name_that_stands_for_no_bytes_is_an_invalid_name(lock_dir: Path) -> None:
    """A lone surrogate raised UnicodeEncodeError, a number TypeError."""
    calls: list[Callable[[Any], object]] = [
        lambda name: local_mutex.run(name, command="true", lock_dir=str(lock_dir)),
        lambda name: local_mutex.hold(name, lock_dir=str(lock_dir)).__enter__(),
        lambda name: local_mutex.status(name, str(lock_dir)),
        lambda name: local_mutex.lock_path(name, str(lock_dir)),
    ]
    for call in calls:
        for name in ("\ud800", 5):
            with pytest.raises(local_mutex.InvalidName):
                call(name)
    assert not list(lock_dir.iterdir())
    # Raw bytes read through surrogateescape are the same name as those bytes.
    assert local_mutex.lock_path("\udcff", str(lock_dir)) == str(lock_file(lock_dir, b"\xff"))


def test_hold_refuses_what_it_cannot_take_as_given(lock_dir: Path) -> None:
    """``message=5`` raised TypeError; ``shared="no"`` took a shared lock."""
    for kwargs in ({"message": 5}, {"shared": "no"}, {"allow_other_owner": 1}):
        with pytest.raises(local_mutex.ValidationError):
            local_mutex.hold("api-input", lock_dir=str(lock_dir), **kwargs).__enter__()
    with pytest.raises(local_mutex.ValidationError, match="include_free"):
        local_mutex.list_locks(str(lock_dir), include_free="no")  # type: ignore[arg-type]
    assert not list(lock_dir.iterdir())


@pytest.fixture
def bare_repo(tmp_path: Path) -> str:
    repo = tmp_path / "locks.git"
    subprocess.run(["git", "init", "-q", "--bare", str(repo)], check=True)
    return f"file://{repo}"


def _branches(url: str) -> str:
    return subprocess.run(
        ["git", "--git-dir", url.removeprefix("file://"), "for-each-ref"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout


def test_a_lock_dir_beside_a_remote_is_refused(lock_dir: Path, marks: Path, bare_repo: str) -> None:
    """The lock dir was silently ignored (the README: refused, as the CLI refuses both)."""
    _refused(lock_dir, marks, local_mutex.Unsupported, remote=bare_repo)
    calls: list[Callable[[], object]] = [
        lambda: local_mutex.status("api-input", str(lock_dir), remote=bare_repo),
        lambda: local_mutex.list_locks(str(lock_dir), remote=bare_repo),
        lambda: local_mutex.hold("api-input", lock_dir=str(lock_dir), remote=bare_repo),
    ]
    for call in calls:
        with pytest.raises(local_mutex.Unsupported, match="lock_dir"):
            call()
    assert _branches(bare_repo) == ""


def test_a_remote_is_a_url_string(lock_dir: Path, marks: Path, bare_repo: str) -> None:
    """A ``pathlib.Path`` raised AttributeError ('PosixPath' object has no attribute)."""
    path = Path(bare_repo.removeprefix("file://"))
    error = _refused(lock_dir, marks, local_mutex.BadAddress, remote=path, lock_dir=None)
    assert "URL" in str(error)
    with pytest.raises(local_mutex.BadAddress):
        local_mutex.status("api-input", remote=path)  # type: ignore[arg-type]
    assert _branches(bare_repo) == ""
