"""The plain run's module cache (``_startup``): used when valid, never trusted when not.

Each test runs a copy of the package in its own directory, so the cache it writes, edits
or damages is its own."""

from __future__ import annotations

import importlib.machinery
import importlib.util
import marshal
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from helpers import clean_env
from local_mutex import _startup

SRC = Path(__file__).resolve().parents[2] / "src" / "local_mutex"
TAG = sys.implementation.cache_tag
# What imports the usual way even with a valid cache: the package, its entry and the cache.
ENTRY = {"local_mutex", "local_mutex.cli", "local_mutex._startup"}


def _copy(tmp_path: Path, name: str = "tree") -> Path:
    root = tmp_path / name
    shutil.copytree(SRC, root / "local_mutex", ignore=shutil.ignore_patterns("__pycache__"))
    return root


def _cache(root: Path) -> Path:
    return root / "local_mutex" / "__pycache__" / f"plain-run.{TAG}.marshal"


def _cli(
    root: Path, args: list[str], *, write: bool = True, flags: tuple[str, ...] = ()
) -> subprocess.CompletedProcess[str]:
    env = clean_env({"PYTHONPATH": str(root)})
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    if not write:
        env["PYTHONDONTWRITEBYTECODE"] = "1"
    return subprocess.run(
        [sys.executable, *flags, "-m", "local_mutex", *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def _plain(root: Path, tmp_path: Path, **kw: object) -> subprocess.CompletedProcess[str]:
    """A plain run whose command leaves a mark, so a run that did nothing cannot pass."""
    mark = tmp_path / "ran"
    mark.unlink(missing_ok=True)
    r = _cli(root, ["cached", f"touch {mark}", str(tmp_path)], **kw)  # type: ignore[arg-type]
    assert r.returncode == 0, r.stderr
    assert mark.exists()
    return r


def _imports(root: Path, tmp_path: Path) -> set[str]:
    """The modules a plain run loads through the import system (not from the cache)."""
    r = _plain(root, tmp_path, write=False, flags=("-X", "importtime"))
    return {ln.rsplit("|", 1)[1].strip() for ln in r.stderr.splitlines() if "|" in ln}


def _imported_normally(root: Path, tmp_path: Path) -> set[str]:
    """Our modules a plain run loads through the import system (not from the cache)."""
    return {n for n in _imports(root, tmp_path) if n.split(".")[0] == "local_mutex"}


def _names(cache: Path) -> list[str]:
    _header, entries = marshal.loads(cache.read_bytes())
    return [entry[0] for entry in entries]


@pytest.fixture
def root(tmp_path: Path) -> Path:
    return _copy(tmp_path)


def test_a_plain_run_writes_the_cache_and_the_next_loads_from_it(
    root: Path, tmp_path: Path
) -> None:
    assert "local_mutex.lifecycle" in _imported_normally(root, tmp_path)  # no cache yet
    assert not _cache(root).exists()  # and a run that may not write bytecode wrote none
    _plain(root, tmp_path)
    names = _names(_cache(root))
    for module in ("lifecycle", "supervise.keeper", "supervise.supervisor", "backends.flock.lock"):
        assert f"local_mutex.{module}" in names
    assert not {n for n in names if ".git" in n or ".postgres" in n or "clicktree" in n}
    # The whole plain path comes from the cache: nothing of ours beyond the entry imports.
    assert _imported_normally(root, tmp_path) <= ENTRY


def test_a_plain_run_from_the_cache_imports_no_future_module(root: Path, tmp_path: Path) -> None:
    """Each module's ``from __future__ import annotations`` is in its cached code as the
    compiler flag, not as an import of ``__future__`` (~0.15 ms); the entry has none."""
    assert "__future__" in _imports(root, tmp_path)  # no cache yet: the usual imports
    _plain(root, tmp_path)
    assert "__future__" not in _imports(root, tmp_path)


def test_a_module_from_the_cache_is_the_module_an_import_gives(root: Path, tmp_path: Path) -> None:
    _plain(root, tmp_path)
    moved = tmp_path / "moved"
    root.rename(moved)  # the files keep their times: the cache stays valid after a move
    probe = (
        "import sys, inspect; from local_mutex import _startup; _startup.load()\n"
        "m = sys.modules['local_mutex.lifecycle']\n"
        "k = sys.modules['local_mutex.supervise.keeper']\n"
        "print(m.__file__); print(type(m.__loader__).__name__); print(m.__spec__.parent)\n"
        "print(m.run_locked.__code__.co_filename)\n"
        "print(m.supervise is k.supervise, sys.modules['local_mutex'].supervise.keeper is k)\n"
        "print('def run_locked' in inspect.getsource(m))\n"
        "print(len(_startup._loaded) > 20)\n"
        "print(m.run_locked.__annotations__['opts'], '__future__' in sys.modules)\n"
        "print(m.__doc__, m.run_locked.__doc__, k.supervise.__doc__)\n"
    )
    r = _probe(moved, probe)
    assert r.returncode == 0, r.stderr
    expected = str(moved / "local_mutex" / "lifecycle.py")
    assert r.stdout.split("\n")[:9] == [
        expected,
        "SourceFileLoader",
        "local_mutex",
        expected,  # tracebacks name the moved tree's file
        "True True",
        "True",
        "True",  # it really came from the cache
        "Options False",  # annotations stay unevaluated, with no import of __future__
        "None None None",  # docstrings are left out of the cache: nothing reads them
    ]


def test_an_edited_source_runs_as_edited_and_the_cache_follows(root: Path, tmp_path: Path) -> None:
    _plain(root, tmp_path)
    lines = root / "local_mutex" / "ui" / "lines.py"
    lines.write_text(lines.read_text().replace("released {", "RELEASED {"))  # the same size
    assert "RELEASED cached" in _plain(root, tmp_path, write=False).stderr
    assert "local_mutex.ui.lines" in _imported_normally(root, tmp_path)  # stale: not used
    assert "RELEASED cached" in _plain(root, tmp_path).stderr  # rewritten by this one
    assert _imported_normally(root, tmp_path) <= ENTRY
    assert "RELEASED cached" in _plain(root, tmp_path, write=False).stderr


def test_an_edit_whose_mtime_was_put_back_is_still_seen(root: Path, tmp_path: Path) -> None:
    """Size and mtime as before (a checkout that normalizes times): the ctime tells. The
    .pyc beside it cannot tell, and the usual import runs its stale code; the cache is
    written from the source."""
    _plain(root, tmp_path)
    lines = root / "local_mutex" / "ui" / "lines.py"
    st = lines.stat()
    lines.write_text(lines.read_text().replace("released {", "RELEASED {"))
    os.utime(lines, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert "local_mutex.ui.lines" in _imported_normally(root, tmp_path)
    _plain(root, tmp_path)  # writes the cache again, compiled from the edited source
    assert "RELEASED cached" in _plain(root, tmp_path, write=False).stderr


@pytest.mark.parametrize(
    "damage",
    [
        "truncated",
        "garbage",
        "another shape",
        "empty",
        "foreign interpreter",
        "source replaced",
        "not code",
    ],
)
def test_a_damaged_or_foreign_cache_is_not_used(root: Path, tmp_path: Path, damage: str) -> None:
    _plain(root, tmp_path)
    cache = _cache(root)
    data = cache.read_bytes()
    header, entries = marshal.loads(data)
    if damage == "truncated":
        cache.write_bytes(data[: len(data) // 2])
    elif damage == "garbage":
        # Fixed bytes, not random ones: some random 4 KB take marshal 30-45 s to refuse.
        cache.write_bytes(b"\xfe not a cache \x00" * 256)
    elif damage == "another shape":
        cache.write_bytes(marshal.dumps({"format": header[0], "entries": len(entries)}))
    elif damage == "empty":
        cache.write_bytes(b"")
    elif damage == "foreign interpreter":
        cache.write_bytes(marshal.dumps(((header[0], b"\x00\x00\r\n", *header[2:]), entries)))
    elif damage == "not code":
        entries[3] = (*entries[3][:4], "print('not code')")
        cache.write_bytes(marshal.dumps((header, entries)))
    else:  # a module the cache names was replaced by another file
        gone = root / entries[-1][2]
        gone.rename(gone.with_suffix(".moved"))
        shutil.copy2(gone.with_suffix(".moved"), gone)  # back, but not the same file time
        os.utime(gone, ns=(0, 0))
    damaged = cache.read_bytes()
    _plain(root, tmp_path)  # runs, the usual way, and writes a good cache again
    assert cache.read_bytes() != damaged
    assert _imported_normally(root, tmp_path) <= ENTRY


@pytest.mark.parametrize("damage", ["rebuilt", "not ours", "elsewhere", "no triple"])
def test_an_extension_the_cache_cannot_vouch_for_imports_the_usual_way(
    root: Path, tmp_path: Path, damage: str
) -> None:
    """Only that module: the cache of our modules stays, unwritten. Rejecting all of it made
    two installs of one Python version that share the package's dir rewrite it every run,
    and a read-only install (whose extensions a patch release replaced) never use it."""
    _plain(root, tmp_path)
    cache = _cache(root)
    header, entries = marshal.loads(cache.read_bytes())
    if not header[3]:
        pytest.skip("this interpreter has the plain run's C extensions built in")
    name, origin, stamp = header[3][0]
    if damage == "elsewhere":  # another install's copy: not on this interpreter's sys.path
        copy = tmp_path / os.path.basename(origin)
        shutil.copy2(origin, copy)
        origin, stamp = str(copy), _startup._stamp(os.stat(copy))
    bad: object = {
        "rebuilt": (name, origin, (0, 0, 0)),
        "not ours": ("_socket", origin, stamp),
        "elsewhere": (name, origin, stamp),
        "no triple": (name,),
    }[damage]
    cache.write_bytes(marshal.dumps(((*header[:3], [bad, *header[3][1:]]), entries)))
    damaged = cache.read_bytes()
    imported = _imports(root, tmp_path)
    assert not {n for n in imported if n.split(".")[0] == "local_mutex"} - ENTRY  # cached
    assert name in imported  # that one the usual way (its entry is the bad one)
    assert "_socket" not in imported  # a name not ours is never loaded
    _plain(root, tmp_path)
    assert cache.read_bytes() == damaged  # nothing to write: no rewrite every run


def test_a_plain_runs_c_extensions_load_from_their_files_named_in_the_cache(
    root: Path, tmp_path: Path
) -> None:
    """The import system searched sys.path for each C extension a plain run needs (~0.6 ms
    in all); the cache names their files. Every one the plain path imports must be among
    those it may name (``_EXTENSIONS``), or it would be searched for again."""
    needed = {n for n in _imports(root, tmp_path) if _is_extension_file(n)}
    assert needed <= set(_startup._EXTENSIONS), needed
    if not needed:  # Debian's python3 has fcntl and select built in; some have all of them
        pytest.skip("this interpreter has the plain run's C extensions built in")
    _plain(root, tmp_path)
    header, _entries = marshal.loads(_cache(root).read_bytes())
    assert {name for name, _origin, _stamp in header[3]} == needed
    assert not _imports(root, tmp_path) & needed  # none through the import system
    # Each is the very module a search of sys.path finds, loaded as the import system would.
    probe = (
        "import sys, importlib.machinery as m; from local_mutex import _startup; _startup.load()\n"
        "for n in sorted(sys.argv[1:]):\n"
        "    got, found = sys.modules[n], m.PathFinder.find_spec(n)\n"
        "    print(type(got.__loader__).__name__, got.__file__ == found.origin)\n"
    )
    r = _probe(root, probe, *needed)
    assert r.stdout == "ExtensionFileLoader True\n" * len(needed), r.stderr


def _probe(root: Path, code: str, *args: str) -> subprocess.CompletedProcess[str]:
    """``code`` in a Python of its own that imports the package from ``root``."""
    env = clean_env({"PYTHONPATH": str(root), "PYTHONDONTWRITEBYTECODE": "1"})
    return subprocess.run(
        [sys.executable, "-c", code, *args], env=env, capture_output=True, text=True, timeout=60
    )


def _is_extension_file(name: str) -> bool:
    spec = importlib.util.find_spec(name) if "." not in name else None
    return spec is not None and isinstance(spec.loader, importlib.machinery.ExtensionFileLoader)


@pytest.mark.parametrize(
    "args",
    [
        ["status", "cached", "{dir}"],
        ["--help"],
        ["--wait", "soon", "cached", "true", "{dir}"],  # a usage error
        ["-q", "list", "--lock-dir", "{dir}"],
    ],
)
def test_only_a_plain_run_writes_the_cache(root: Path, tmp_path: Path, args: list[str]) -> None:
    r = _cli(root, [a.replace("{dir}", str(tmp_path)) for a in args])
    assert r.returncode in (0, 1, 2), r.stderr
    assert not _cache(root).exists()


@pytest.mark.parametrize(
    "options",
    [
        ["--slots", "2"],
        ["--reentrant"],
        ["--shared"],
        ["--no-wait"],
        ["--wait", "5", "--timeout", "30", "--kill-after", "1"],
        ["--message", "why"],
    ],
    ids=lambda options: options[0],
)
def test_a_run_with_options_writes_what_a_plain_run_does(
    tmp_path: Path, options: list[str]
) -> None:
    """The file only grows (each run saves what it loaded from it too): what one run's
    options import (``--slots``: the slots; ``--reentrant``: /proc/locks) would be executed
    by every plain run after it."""
    plain, root = _copy(tmp_path, "plain"), _copy(tmp_path, "other")
    _plain(plain, tmp_path)
    expected = sorted(_names(_cache(plain)))
    for tree in (root, root, plain):  # first on its own, then over a cache, then over a plain one
        r = _cli(tree, ["-q", *options, "cached", "true", str(tmp_path)])
        assert r.returncode == 0, r.stderr
        assert sorted(_names(_cache(tree))) == expected
        _plain(tree, tmp_path)
        assert sorted(_names(_cache(tree))) == expected


def test_no_cache_is_written_where_bytecode_may_not_be(root: Path, tmp_path: Path) -> None:
    _plain(root, tmp_path, write=False)
    _plain(root, tmp_path, flags=("-B",))
    assert not _cache(root).exists()
    _plain(root, tmp_path, flags=("-O",))  # its own file: -O code differs
    assert not _cache(root).exists()
    assert _cache(root).with_name(f"plain-run.{TAG}.opt-1.marshal").exists()


def test_a_writer_killed_mid_write_leaves_nothing_that_stops_the_next(
    root: Path, tmp_path: Path
) -> None:
    """A temporary file of a killed writer whose pid came back is taken over, not fatal."""
    cache = _cache(root)
    cache.parent.mkdir()
    probe = (
        "import os, sys; from local_mutex import _startup\n"
        "open(_startup.cache_path() + '.' + str(os.getpid()), 'wb').write(b'half')\n"
        "from local_mutex.cli import main, run_and_exit\n"
        "run_and_exit(main)\n"
    )
    env = clean_env({"PYTHONPATH": str(root)})
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    r = subprocess.run(
        [sys.executable, "-c", probe, "cached", "true", str(tmp_path)],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert r.returncode == 0, r.stderr
    assert "local_mutex.lifecycle" in _names(cache)
    assert [p.name for p in cache.parent.iterdir() if "marshal" in p.name] == [cache.name]


def _raising_code_blob() -> tuple[bytes, bytes] | None:
    """A small code object's marshal bytes (version 2: no back-references, so the same
    bytes inside a bigger dump), and a one-bit flip of them that makes marshal raise an
    error other than ValueError, EOFError or TypeError (SystemError on CPython 3.11)."""
    good = marshal.dumps(compile("x = y", "f.py", "exec"), 2)
    for i in range(len(good)):
        for bit in range(8):
            bad = bytearray(good)
            bad[i] ^= 1 << bit
            try:
                marshal.loads(bytes(bad))
            except (ValueError, EOFError, TypeError):
                continue
            except Exception:
                return good, bytes(bad)
    return None


def test_a_cache_marshal_chokes_on_is_not_used(root: Path, tmp_path: Path) -> None:
    """marshal raises SystemError for some damage; that escaped as a traceback, and the
    command never ran, run after run."""
    found = _raising_code_blob()
    if found is None:
        pytest.skip("no one-bit flip of a code object makes this marshal raise oddly")
    good, bad = found
    _plain(root, tmp_path)
    header, entries = marshal.loads(_cache(root).read_bytes())
    entries[0] = (*entries[0][:4], compile("x = y", "f.py", "exec"))
    data = marshal.dumps((header, entries), 2)
    assert data.count(good) == 1
    _cache(root).write_bytes(data.replace(good, bad))
    r = _plain(root, tmp_path)  # the command runs; no traceback
    assert "Traceback" not in r.stderr, r.stderr
    assert _imported_normally(root, tmp_path) <= ENTRY  # and the file was written again


def test_a_run_that_waited_or_failed_writes_no_cache(root: Path, tmp_path: Path) -> None:
    """What waiting imports (the progress line, the holder's record) is no plain run's."""
    hold = subprocess.Popen(
        [sys.executable, "-m", "local_mutex", "busy", f"touch {tmp_path}/in; sleep 30"],
        env=clean_env({"PYTHONPATH": str(root), "LOCAL_MUTEX_LOCK_DIR": str(tmp_path)}),
        stderr=subprocess.DEVNULL,
    )
    try:
        from helpers import wait_for

        wait_for(tmp_path / "in")
        r = _cli(root, ["--wait", "0.3", "busy", "true", str(tmp_path)])
        assert r.returncode == 75, r.stderr
        assert _cli(root, ["other", "exit 3", str(tmp_path)]).returncode == 3
        assert not _cache(root).exists()
    finally:
        hold.kill()
        hold.wait()


def test_a_run_inside_a_hold_leaves_the_cache_light(root: Path, tmp_path: Path) -> None:
    """Sharing a hold's lock imports ``socket`` (and ``enum``, ``selectors``: some 4 ms):
    a ``run --reentrant`` that joined a hold wrote it into the cache, for every plain run
    after it to load."""
    r = _cli(root, ["hold", "held", "--lock-dir", str(tmp_path)])
    assert r.returncode == 0, r.stderr
    token = r.stdout.strip()
    env = clean_env({"PYTHONPATH": str(root), "LOCAL_MUTEX_HOLD_TOKEN": token})
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    try:
        inside = subprocess.run(
            [sys.executable, "-m", "local_mutex", "--reentrant", "held", "true", str(tmp_path)],
            env=env,
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert inside.returncode == 0 and "running inside it" in inside.stderr, inside.stderr
        assert "local_mutex.backends.flock.share" not in _names(_cache(root))
    finally:
        _cli(root, ["release", "held", "--lock-dir", str(tmp_path), "--token", token])
    r = _plain(root, tmp_path, write=False, flags=("-X", "importtime"))
    assert "socket" not in {
        ln.rsplit("|", 1)[1].strip() for ln in r.stderr.splitlines() if "|" in ln
    }


def test_a_source_broken_during_the_run_changes_nothing_of_its_outcome(
    root: Path, tmp_path: Path
) -> None:
    """The cache is written after the command; a source edited meanwhile into a syntax
    error is no reason for a traceback or another exit status."""
    runspec = root / "local_mutex" / "runspec.py"
    r = _cli(root, ["build", f"echo build-ok; echo 'def (' >> {runspec}", str(tmp_path)])
    assert r.returncode == 0, r.stderr
    assert "Traceback" not in r.stderr
    assert not _cache(root).exists()
