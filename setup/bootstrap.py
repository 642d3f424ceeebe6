"""Install local-mutex into the runner's tool cache (once per host and version), then run it.

Standard library only, so it works on a bare self-hosted runner that has nothing but
python3 >= 3.9. Usage (by the actions in this repository):

    python3 setup/bootstrap.py action   # install if needed, then become the action's entry
    python3 setup/bootstrap.py setup    # install if needed, then export PATH/ENV for later steps

The install is a copy of the package into ``$RUNNER_TOOL_CACHE/local-mutex/<version>-<digest>``
(else ``${XDG_CACHE_HOME:-~/.cache}/local-mutex/...``), prepared in a temporary directory and
renamed into place under a kernel lock, so two runners' first use installs once and nobody
ever sees a half-written install. Only an install that no other user could have written is
used (``_trusted``); where another user's holds the name, ours is ``<version>-<digest>-u<uid>``.
One damaged since (a file deleted or changed) is installed again. ``setup`` adds click
(``bootstrap_click.py``).

This file must parse on any Python, 2.7 included (a runner's ``python`` may be Python 2),
so that an old interpreter gets the friendly error in ``main`` instead of a SyntaxError: no
f-strings, no annotations (signatures are typed in ``# type:`` comments), ``print`` from
``__future__``, nothing before the version check that Python 2 or 3.0 lacks.
"""

from __future__ import print_function  # noqa: UP010 - Python 2 must parse this file

import errno
import fcntl
import os
import sys
import zlib

ACTION_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PACKAGE_SRC = os.path.join(ACTION_ROOT, "src", "local_mutex")
COMPLETE = ".complete"


class BootstrapError(Exception):
    pass


def install_key(base=PACKAGE_SRC):
    # type: (str) -> str
    """``<version>-<digest of the package files>``: a new commit of the action reinstalls.
    Of an install's copy (``base``), what the copy holds: the key it was installed under if
    it is whole."""
    # crc32 of names and contents: a cache key, not a security boundary (the cache is the
    # runner user's own), and zlib costs this warm path far less than hashlib.
    digest, size = 0, 0
    version = "0"
    for name in _package_files():
        with open(os.path.join(base, name), "rb") as f:
            data = f.read()
        digest = zlib.crc32(name.encode() + b"\0" + data + b"\0", digest)
        size += len(data)
        if name == "_version.py":
            version = data.decode().split('"')[1]
    return version + "-" + format(digest, "08x") + format(size, "x")


_files = []  # type: list[str]


def _package_files():
    # type: () -> list[str]
    """Every file of the package, subpackages included, relative and sorted."""
    if _files:
        return _files
    found = _files
    for root, dirs, files in os.walk(PACKAGE_SRC):
        dirs[:] = sorted(d for d in dirs if d != "__pycache__")
        rel = os.path.relpath(root, PACKAGE_SRC)
        for name in files:
            if not name.endswith(".pyc"):
                found.append(name if rel == "." else os.path.join(rel, name))
    found.sort()
    return found


def cache_roots(env):
    # type: (dict[str, str]) -> list[str]
    import tempfile

    roots = []
    if env.get("RUNNER_TOOL_CACHE"):
        roots.append(os.path.join(env["RUNNER_TOOL_CACHE"], "local-mutex"))
    base = env.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    roots.append(os.path.join(base, "local-mutex"))
    # Last: a directory of our own in the temporary one, for a home nobody may write and
    # caches we cannot trust: installed again after a reboot empties it, not a failed step.
    roots.append(os.path.join(tempfile.gettempdir(), "local-mutex-tools-" + str(os.geteuid())))
    return roots


# Whose files an install may be: ours, root's, and the runner's own account, which owns the
# job's workspace (a container job runs as root over the runner user's bind mounts).
_owners = {0, os.geteuid()}


def trust_the_runner(env):
    # type: (dict[str, str]) -> None
    for where in ("RUNNER_TEMP", "GITHUB_WORKSPACE"):
        try:
            _owners.add(os.stat(env[where]).st_uid)
            return
        except (KeyError, OSError):
            continue


def _usable(root):
    # type: (str) -> bool
    umask = os.umask(0o022)  # a directory others may write would not be used (``_safe_path``)
    try:
        os.makedirs(root, exist_ok=True)
    except OSError:
        return False
    finally:
        os.umask(umask)
    return os.access(root, os.W_OK | os.X_OK) and _safe_path(root)


# An install runs as code of whoever starts the action, and a tool cache may be shared by
# several runners' users: nothing is trusted that another user (not in ``_owners``) could
# have written or could swap -- a file or directory they own, one anybody may write (but
# for a sticky directory among the ancestors: /tmp), or one reached through such a
# directory. Group-writable is left to the group (runners that share one under umask 002
# trust it on purpose).
def _trusted(path, st, ancestor=False):
    # type: (str, os.stat_result, bool) -> bool
    import stat

    if st.st_uid not in _owners or stat.S_ISLNK(st.st_mode):
        return False
    return not st.st_mode & stat.S_IWOTH or (ancestor and bool(st.st_mode & stat.S_ISVTX))


def _safe_path(root):
    # type: (str) -> bool
    """``root`` and every directory above it belong to ``_owners``, and are nobody else's to
    write, but for sticky ones (nobody can rename our entries in those)."""
    path = os.path.realpath(root)
    while True:
        try:
            if not _trusted(path, os.lstat(path), ancestor=True):
                return False
        except OSError:
            return False
        parent = os.path.dirname(path)
        if parent == path:
            return True
        path = parent


def _trusted_install(final, key):
    # type: (str, str) -> bool
    """A complete install, every file and directory of it belonging to ``_owners``, and
    whole: the package as ``key`` says, the launcher there (one damaged since -- a file
    deleted or cut short -- is installed again, not run into a traceback)."""
    if not os.path.exists(os.path.join(final, COMPLETE)):
        return False
    try:
        if not _trusted(final, os.lstat(final)):
            return False
        for top, dirs, files in os.walk(final):
            for name in dirs + files:
                if not _trusted(name, os.lstat(os.path.join(top, name))):
                    return False
        if not os.path.isfile(os.path.join(final, "bin", "local-mutex")):
            return False
        return install_key(os.path.join(final, "lib", "local_mutex")) == key
    except Exception:  # unreadable, or a _version.py that says no version
        return False


def _candidates(root, key):
    # type: (str, str) -> list[str]
    """Where this version's install may be: the shared name, and ours alone for when
    another user installed under the shared one."""
    return [os.path.join(root, key), os.path.join(root, key + "-u" + str(os.geteuid()))]


def ensure_installed(env):
    # type: (dict[str, str]) -> str
    """The install directory for this version, installing it first if needed."""
    trust_the_runner(env)
    key = install_key()
    roots = cache_roots(env)
    for root in roots:
        if os.path.isdir(root) and _safe_path(root):
            for final in _candidates(root, key):
                if _trusted_install(final, key):
                    return final
    for root in roots:
        if _usable(root):
            return _install(root, key)
    raise BootstrapError(
        "no tool cache that is writable and that no other user can change among " + repr(roots)
    )


def _install(root, key):
    # type: (str, str) -> str
    import shutil
    import tempfile

    uid = str(os.geteuid())
    lock_fd = os.open(
        os.path.join(root, ".install-" + uid + ".lock"),
        os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC,
        0o600,
    )
    umask = os.umask(0o022)  # nothing of an install may be anybody's to write
    try:
        fcntl.flock(lock_fd, fcntl.LOCK_EX)  # the second runner waits here, then reuses
        mine = ".tmp-" + uid + "-"
        for leftover in os.listdir(root):  # from our installs killed midway; none of
            if leftover.startswith(mine):  # ours is running while we hold the lock
                shutil.rmtree(os.path.join(root, leftover), ignore_errors=True)
        for final in _candidates(root, key):
            if _trusted_install(final, key):
                return final
            if os.path.lexists(final) and not _trusted(final, os.lstat(final)):
                continue  # another user's: ours goes under our own name
            tmp = tempfile.mkdtemp(prefix=mine, dir=root)
            try:
                _populate(tmp, final)
                if os.path.lexists(final):  # left by an install that died before completing,
                    try:  # or damaged since
                        shutil.rmtree(final)
                    except OSError:  # root's, say: ours goes under our own name
                        shutil.rmtree(tmp, ignore_errors=True)
                        continue
                os.rename(tmp, final)
            except OSError as exc:
                shutil.rmtree(tmp, ignore_errors=True)
                if exc.errno in (errno.EEXIST, errno.ENOTEMPTY) and not _trusted_install(
                    final, key
                ):
                    continue  # another user's rename came first: ours goes under our name
                raise
            except BaseException:
                shutil.rmtree(tmp, ignore_errors=True)
                raise
            return final
        raise BootstrapError("another user's installs are in the way under " + repr(root))
    finally:
        os.umask(umask)
        os.close(lock_fd)


def _populate(tmp, final):
    # type: (str, str) -> None
    import shutil

    lib = os.path.join(tmp, "lib")
    shutil.copytree(
        PACKAGE_SRC,
        os.path.join(lib, "local_mutex"),
        ignore=shutil.ignore_patterns("__pycache__", "*.pyc"),
    )
    import compileall

    compileall.compile_dir(lib, quiet=1)
    os.mkdir(os.path.join(tmp, "bin"))
    launcher = os.path.join(tmp, "bin", "local-mutex")
    shim = os.path.join(final, "lib", "local_mutex", "local-mutex.sh")
    with open(launcher, "w", encoding="utf-8") as f:
        f.write(
            "#!/bin/sh\n"
            "# local-mutex, installed by the local-mutex action.\n"
            "LOCAL_MUTEX_PYTHON=${LOCAL_MUTEX_PYTHON:-" + _sh_quote(sys.executable) + "}\n"
            "export LOCAL_MUTEX_PYTHON\n"
            "exec sh " + _sh_quote(shim) + ' "$@"\n'
        )
    os.chmod(launcher, 0o755)
    os.chmod(os.path.join(lib, "local_mutex", "local-mutex.sh"), 0o755)
    for top, dirs, files in os.walk(tmp):  # copied modes may let others write (umask 0)
        for name in dirs + files:
            path = os.path.join(top, name)
            os.chmod(path, os.stat(path).st_mode & ~0o022)
    os.chmod(tmp, 0o755)
    with open(os.path.join(tmp, COMPLETE), "w", encoding="utf-8") as f:
        f.write(sys.executable + "\n")


def _sh_quote(text):
    # type: (str) -> str
    return "'" + text.replace("'", "'\\''") + "'"


def setup(env, final):
    # type: (dict[str, str], str) -> int
    from bootstrap_click import annotate, ensure_click

    sys.path.insert(0, os.path.join(final, "lib"))
    ensure_click(final)
    try:
        from local_mutex.backends.flock.lockdir import resolve_lock_dir
        from local_mutex.errors import ValidationError
        from local_mutex.ui.github import format_outputs
    except Exception as exc:
        return _unusable(final, exc, "setup")
    shim = os.path.join(final, "lib", "local_mutex", "local-mutex.sh")
    bin_dir = os.path.join(final, "bin")
    if "\n" in bin_dir or "\r" in bin_dir:  # one path a line: it would add paths of its own
        annotate("error", "local-mutex: the tool cache path has a line break: " + repr(bin_dir))
        return 2
    values = {"LOCAL_MUTEX_CLI": shim, "LOCAL_MUTEX_PYTHON": sys.executable}
    lock_dir = env.get("LOCAL_MUTEX_INPUT_LOCK_DIR", "")
    if lock_dir:
        try:
            values["LOCAL_MUTEX_LOCK_DIR"] = resolve_lock_dir(lock_dir)
        except ValidationError as exc:
            annotate("error", "local-mutex: " + str(exc))
            return 2
    with open(env["GITHUB_PATH"], "a", encoding="utf-8") as f:
        f.write(bin_dir + "\n")
    # As the step's outputs are: a value with a line break (a lock dir may have one) goes
    # between random delimiters, so it cannot add variables of its own (BASH_ENV=...).
    with open(env["GITHUB_ENV"], "a", encoding="utf-8", errors="surrogateescape") as f:
        f.write(format_outputs(values))
    with open(env["GITHUB_OUTPUT"], "a", encoding="utf-8", errors="surrogateescape") as f:
        f.write(format_outputs({"cli": shim}))
    print("local-mutex: ready at " + shim, file=sys.stderr)
    return 0


def main(argv):
    # type: (list[str]) -> int
    if sys.version_info < (3, 9):  # noqa: UP036 - bootstrap may run on any python
        print(
            "::error::local-mutex needs Python >= 3.9, "
            + str(sys.executable)
            + " is "
            + sys.version.split()[0],
            file=sys.stderr,
        )
        output = os.environ.get("GITHUB_OUTPUT")
        if output and argv[1:2] == ["action"]:  # as when there is no interpreter at all
            with open(output, "a") as f:
                f.write("acquired=false\n")
        return 2
    mode = argv[1] if len(argv) > 1 else ""
    if mode not in ("action", "setup"):
        print("usage: bootstrap.py action|setup", file=sys.stderr)
        return 2
    # bootstrap_click, beside this file: also under PYTHONSAFEPATH (which leaves this
    # directory off sys.path), and last, so that it shadows nothing.
    sys.path.append(os.path.dirname(os.path.abspath(__file__)))
    env = dict(os.environ)
    try:
        final = ensure_installed(env)
    except (OSError, BootstrapError) as exc:
        return _failed("install failed: " + str(exc), mode)
    if mode == "setup":
        return setup(env, final)
    sys.path.insert(0, os.path.join(final, "lib"))
    try:
        from local_mutex.action import main as action_main
    except Exception as exc:
        return _unusable(final, exc, mode)
    return action_main()


def _unusable(final, exc, mode):
    # type: (str, Exception, str) -> int
    """The install passed every check, yet does not import (a .pyc file damaged in place):
    one line, not a traceback."""
    why = type(exc).__name__ + ": " + str(exc)
    return _failed(
        "the install at " + final + " does not import (" + why + "); if it was damaged, "
        "delete it: the next step installs it again",
        mode,
    )


def _failed(message, mode):
    # type: (str, str) -> int
    """One ``::error::`` line, and exit status 125 (nothing ran); the action's outputs say
    so as for any other error."""
    from bootstrap_click import annotate

    annotate("error", "local-mutex: " + message)
    output = os.environ.get("GITHUB_OUTPUT")
    if output and mode == "action":
        try:
            with open(output, "a", encoding="utf-8") as f:
                f.write("acquired=false\n")
        except OSError:
            pass
    return 125


if __name__ == "__main__":
    sys.exit(main(sys.argv))
