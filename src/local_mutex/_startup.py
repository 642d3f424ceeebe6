"""A plain run's modules from one file, as CPython's own start-up modules are frozen.

A plain ``local-mutex NAME CMD`` imports some 30 modules of ours. Through the import
system each costs ~60 us beyond its own code (finders, stat calls, a .pyc file to open
and check): ~1.5-2 ms a run, paid again by every nested call in a loop. This cache holds
their code objects in the order they finished importing, each with its source file's size,
mtime and ctime; ``load()`` reads it in one go, checks every source (an edit, or an mtime
put back after one, changes the ctime), and runs them straight into ``sys.modules`` with
the specs the import system would have given them.

A missing, stale, unreadable or foreign file (another interpreter, another ``-O``) is not
used: every module then imports as usual. A plain run that did not wait and exited 0
writes it again at its end -- compiled from the sources, with what it imported the usual
way -- where bytecode may be written (as for .pyc files: not under ``-B`` or
PYTHONDONTWRITEBYTECODE) and the directory is writable. The file lives in the package's own
``__pycache__``, so it is trusted exactly as the .pyc files beside it are, and damage that
still unmarshals can do what a damaged .pyc does.
"""

# No ``from __future__ import annotations`` here (the annotations that need it are quoted):
# importing ``__future__`` would cost every run ~0.15 ms (see ``_startup._compile``).

import marshal
import os
import stat
import sys

TYPE_CHECKING = False
if TYPE_CHECKING:
    import ast
    from types import CodeType, ModuleType
    from typing import Any

    Entry = tuple[str, bool, str, tuple[int, int, int], CodeType]
    Extension = tuple[str, str, tuple[int, int, int]]  # name, its file, that file's stamp

# Bumped whenever the layout below changes.
_FORMAT = 3
# The C extension modules a plain run imports (where they are files, not built in): the
# cache names their files, and ``load()`` loads them straight from there. The import system
# would search sys.path for each first, ~0.6 ms in all. Named here, not noted as they come:
# a ``--slots`` run's ``_socket`` must not be loaded by every plain run after it.
_EXTENSIONS = ("_sha2", "_sha256", "fcntl", "select", "_ctypes")
_PACKAGE = __name__.rpartition(".")[0]
_HERE = os.path.dirname(os.path.abspath(__file__))
_PARENT = os.path.dirname(_HERE)
_OURS = f"{_PACKAGE}."
# Imported only by a run that found the lock busy: such a run's imports are not the plain
# path's (what waiting needs would be run by every uncontended run after it).
_WAITED = f"{_PACKAGE}.ui.progress"
# Never cached: what only help, completion, the remote backends, ``--slots``,
# ``--reentrant``, a run inside a hold and the first run on a new lock file use, and what is
# imported before the cache is read. The file only grows (a run saves what it loaded from
# it too): one ``--slots`` run would make every plain run after it execute the slots for
# nothing (sharing a hold's lock loads ``socket``, a few milliseconds).
_NOT_CACHED = (
    f"{_PACKAGE}.backends.git",
    f"{_PACKAGE}.backends.postgres",
    f"{_PACKAGE}.backends.secrets",
    f"{_PACKAGE}.backends.flock.ancestry",
    f"{_PACKAGE}.backends.flock.share",
    f"{_PACKAGE}.backends.flock.joining",
    f"{_PACKAGE}.backends.flock.predecessor",
    f"{_PACKAGE}.backends.flock.proclocks",
    f"{_PACKAGE}.backends.flock.slots",
    f"{_PACKAGE}.backends.flock.state",
    f"{_PACKAGE}.nudge",
    f"{_PACKAGE}.commands.clicktree",
    f"{_PACKAGE}.commands.suggest",
    f"{_PACKAGE}._site",
    __name__,
)

_CODE = type((lambda: None).__code__)
_loaded: "list[Entry]" = []  # what this run took from the file, in its order
_recorder: "_Recorder | None" = None
# Set by the CLI once it knows this is a plain run (``run``, a local lock): only such a
# run's imports are saved; help, other verbs and remote locks would bloat the cache.
plain_run = False


def cache_path() -> "str | None":
    """Where the cache of this interpreter (and optimization level) lives, if anywhere."""
    tag = sys.implementation.cache_tag
    if tag is None or sys.pycache_prefix is not None:
        return None  # no bytecode cache at all, or one kept elsewhere: stay out of it
    opt = f".opt-{sys.flags.optimize}" if sys.flags.optimize else ""
    return os.path.join(_HERE, "__pycache__", f"plain-run.{tag}{opt}.marshal")


def load() -> None:
    """Run the cached modules, if the cache is valid; then, where bytecode may be written,
    note what still imports the usual way, for ``save()``."""
    path = cache_path()
    if path is None:
        return
    entries, extensions = _read(path)
    if entries:
        _preload(extensions)
        _run(entries)
    if not sys.dont_write_bytecode and _writable(path):
        global _recorder
        _recorder = _Recorder()
        sys.meta_path.insert(0, _recorder)


def _writable(path: str) -> bool:
    """Could a run write the file? Asked first, so a read-only install pays nothing more."""
    pycache = os.path.dirname(path)
    return os.access(pycache if os.path.isdir(pycache) else _HERE, os.W_OK)


def _read(path: str) -> "tuple[list[Entry], list[Extension]]":
    try:
        # O_NONBLOCK: a FIFO planted at the path must not hang the run.
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC | os.O_NONBLOCK)
        with open(fd, "rb") as f:
            if not stat.S_ISREG(os.fstat(fd).st_mode):
                return [], []
            header, entries = marshal.loads(f.read())
        format_, magic, optimize, extensions = header
        if format_ != _FORMAT or optimize != sys.flags.optimize or magic != _magic():
            return [], []
        for name, _is_pkg, rel, stamp, code in entries:
            if type(name) is not str or type(rel) is not str or type(code) is not _CODE:
                return [], []
            if name.startswith(_NOT_CACHED):  # written before it was left out: write anew
                return [], []
            if _stamp(os.stat(os.path.join(_PARENT, rel))) != stamp:
                return [], []
    except Exception:  # missing, unreadable, damaged (marshal raises SystemError too),
        return [], []  # or a source gone: the usual imports
    return list(entries), [e for e in extensions if _usable(e)]


def _usable(extension: "Extension") -> bool:
    """Not another interpreter's file (two installs of a version sharing the package's
    dir: each would rewrite the cache for itself, every run), nor one rebuilt in place. The
    import system loads one that is not; the cache stays (a read-only one cannot change)."""
    try:
        name, origin, stamp = extension
        return (
            name in _EXTENSIONS
            and os.path.dirname(origin) in sys.path
            and _stamp(os.stat(origin)) == stamp
        )
    except Exception:  # damaged: not a triple of a name, a path and a stamp
        return False


def _stamp(st: os.stat_result) -> "tuple[int, int, int]":
    """What tells a source changed. The ctime too: nobody can set it, so an edit whose
    mtime was put back (a checkout with normalized times) still shows."""
    return st.st_mtime_ns, st.st_size, st.st_ctime_ns


def _magic() -> bytes:
    # The import system's own copy, without importing importlib.util for it.
    external: ModuleType = sys.modules["_frozen_importlib_external"]
    return bytes(external.MAGIC_NUMBER)


def _preload(extensions: "list[Extension]") -> None:
    """Load each C extension module from its file, as the import system would once it had
    found it; one that fails is left to the usual import, which says what is wrong."""
    bootstrap: ModuleType = sys.modules["_frozen_importlib"]
    external: ModuleType = sys.modules["_frozen_importlib_external"]
    for name, origin, _ in extensions:
        if name in sys.modules:
            continue
        loader = external.ExtensionFileLoader(name, origin)
        spec = bootstrap.ModuleSpec(name, loader, origin=origin)
        spec.has_location = True
        try:
            module = bootstrap.module_from_spec(spec)
            sys.modules[name] = module
            loader.exec_module(module)
        except Exception:
            sys.modules.pop(name, None)
            return


def _extensions() -> "list[Extension]":
    """The ``_EXTENSIONS`` this run loaded from files, for the next run to load directly."""
    external: Any = sys.modules["_frozen_importlib_external"]
    found = []
    for name in _EXTENSIONS:
        spec = getattr(sys.modules.get(name), "__spec__", None)
        origin = getattr(spec, "origin", None)
        if isinstance(getattr(spec, "loader", None), external.ExtensionFileLoader) and (
            isinstance(origin, str)
        ):
            found.append((name, origin, _stamp(os.stat(origin))))
    return found


def _run(entries: "list[Entry]") -> None:
    """Each module as the import system runs it: registered before its code runs, dropped
    again if that code fails, bound on its parent package once it is done. One whose
    package is not there yet (an order the file cannot serve) ends the cache's part: the
    usual imports load the rest."""
    import _imp

    bootstrap: ModuleType = sys.modules["_frozen_importlib"]
    external: ModuleType = sys.modules["_frozen_importlib_external"]
    for entry in entries:
        name, is_pkg, rel, _, code = entry
        if name in sys.modules:
            continue
        parent, _, child = name.rpartition(".")
        if parent not in sys.modules:
            return
        origin = os.path.join(_PARENT, rel)
        spec = bootstrap.ModuleSpec(
            name, external.SourceFileLoader(name, origin), origin=origin, is_package=is_pkg
        )
        spec.has_location = True
        if is_pkg:
            spec.submodule_search_locations = [os.path.dirname(origin)]
        module = bootstrap.module_from_spec(spec)
        # As for a .pyc: the tree may have moved since the file was written.
        _imp._fix_co_filename(code, origin)  # type: ignore[attr-defined]
        sys.modules[name] = module
        try:
            exec(code, module.__dict__)
        except BaseException:
            sys.modules.pop(name, None)
            raise
        setattr(sys.modules[parent], child, module)
        _loaded.append(entry)


class _Recorder:
    """A finder first in ``sys.meta_path`` that finds nothing itself: it notes which of our
    modules the usual finders load, in the order their code finishes running."""

    def __init__(self) -> None:
        self.done: list[str] = []

    def find_spec(self, name: str, path: object = None, target: object = None) -> "Any":
        if not name.startswith(_OURS) or name.startswith(_NOT_CACHED):
            return None
        external: Any = sys.modules["_frozen_importlib_external"]
        spec = external.PathFinder.find_spec(name, path, target)
        if spec is not None and isinstance(spec.loader, external.SourceFileLoader):
            spec.loader = _Noting(spec.loader, self.done)
        return spec


class _Noting:
    """The module's own loader, noting when its code has run (then it steps aside)."""

    def __init__(self, loader: "Any", done: "list[str]") -> None:
        self.loader, self.done = loader, done

    def create_module(self, spec: object) -> None:
        return None

    def exec_module(self, module: "Any") -> None:
        module.__loader__ = module.__spec__.loader = self.loader
        self.loader.exec_module(module)
        self.done.append(module.__name__)


def save(status: int) -> None:
    """After a plain run that did not wait and exited 0, write the cache again if the run
    imported any of our modules the usual way: the modules from the file first, in their
    order, then those, in the order they finished, each compiled from the source bytes
    its stamp describes. Best effort: nothing here changes the run's outcome."""
    if not plain_run or status != 0 or _recorder is None or not _recorder.done:
        return
    path = cache_path()
    if path is None or _WAITED in sys.modules:
        return
    entries = list(_loaded)
    try:
        for name in _recorder.done:
            origin = getattr(getattr(sys.modules.get(name), "__spec__", None), "origin", None)
            if not isinstance(origin, str) or not origin.endswith(".py"):
                continue
            with open(origin, "rb") as f:
                source, st = f.read(), os.fstat(f.fileno())
            code = _compile(source, origin)
            is_pkg = os.path.basename(origin) == "__init__.py"
            entries.append((name, is_pkg, os.path.relpath(origin, _PARENT), _stamp(st), code))
        header = (_FORMAT, _magic(), sys.flags.optimize, _extensions())
        _write(path, marshal.dumps((header, entries)))
    except Exception:  # a source edited mid-run into a SyntaxError, a full disk, a
        pass  # read-only tree: the run's outcome is the command's


def _compile(source: bytes, origin: str) -> "CodeType":
    """The module's code, but with its ``from __future__`` imports taken out and their
    flags given to the compiler instead: the same code, without an import of ``__future__``
    (~0.15 ms) in every run. Only the module's ``annotations`` global is missing, and the
    docstrings (``_drop_docstring``)."""
    import __future__

    import ast

    tree = ast.parse(source, origin)
    flags, body = 0, []
    for node in tree.body:
        if isinstance(node, ast.ImportFrom) and node.module == "__future__":
            for alias in node.names:
                flags |= int(getattr(__future__, alias.name).compiler_flag)
        else:
            body.append(node)
    tree.body = body
    for each in ast.walk(tree):
        _drop_docstring(each)
    code: CodeType = compile(tree, origin, "exec", flags=flags, dont_inherit=True)
    return code


def _drop_docstring(node: "ast.AST") -> None:
    """Docstrings are an eighth of the file, and every run unmarshals the file whole; the
    CLI reads none of them (help text comes from the option table). Line numbers stay."""
    import ast

    if not isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
        return
    first = node.body[0] if node.body else None
    if (
        isinstance(first, ast.Expr)
        and isinstance(first.value, ast.Constant)
        and isinstance(first.value.value, str)
    ):
        node.body[0] = ast.copy_location(ast.Pass(), first)


def _write(path: str, data: bytes) -> None:
    """Atomically, as the import system writes a .pyc: a file of our own, then a rename."""
    os.makedirs(os.path.dirname(path), exist_ok=True)
    temp = f"{path}.{os.getpid()}"
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC | os.O_NOFOLLOW
    try:
        fd = os.open(temp, flags, 0o644)
    except FileExistsError:  # left by a writer of our pid that was killed: it is ours
        os.unlink(temp)
        fd = os.open(temp, flags, 0o644)
    try:
        with open(fd, "wb") as f:
            f.write(data)
        os.replace(temp, path)
    except BaseException:
        try:
            os.unlink(temp)
        except OSError:
            pass
        raise
    _sweep(path)


def _sweep(path: str) -> None:
    """Remove what writers killed mid-write left (``<file>.<pid>`` of a pid now gone)."""
    from . import _proc

    folder, base = os.path.split(path)
    for entry in os.listdir(folder):
        pid = entry[len(base) + 1 :]
        if entry.startswith(f"{base}.") and pid.isdigit() and not _proc.exists(int(pid)):
            try:
                os.unlink(os.path.join(folder, entry))
            except OSError:
                pass
