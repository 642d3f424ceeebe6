"""click for an install of local-mutex (``bootstrap.py setup``), and the bootstrap's log lines.

Only ``--help`` and shell completion need click: everything else works without it, so
nothing here may fail a step.

An install is shared by every interpreter that runs the action on the host, while click's
releases drop old Pythons (8.2 needs 3.10): a click that 3.13 installed is a SyntaxError to
3.9. So each interpreter gets a copy of its own, in ``<install>/deps/<cache tag>``
(``cpython-39``), which ``local_mutex._site.ensure`` puts on sys.path for help and
completion, and a click that will not import counts as none, whatever the error.

Same rules as bootstrap.py: it must parse on any Python (no f-strings, no annotations).
"""

from __future__ import print_function  # noqa: UP010 - Python 2 must parse this file

import fcntl
import os
import sys


def annotate(kind, message):
    # type: (str, str) -> None
    """One workflow command (``::warning::``, ``::error::``) on a line of its own, its
    message escaped as the runner decodes it: a line break in a path or in pip's words
    cannot end it early or start a command of its own."""
    text = message.replace("%", "%25").replace("\r", "%0D").replace("\n", "%0A")
    sys.stdout.flush()
    print("::" + kind + "::" + text, file=sys.stderr)


def deps_dir(final):
    # type: (str) -> str
    """This interpreter's copy of click in the install ``final`` (``local_mutex._site``
    finds it the same way)."""
    impl = sys.implementation
    tag = impl.cache_tag or impl.name + "-" + "".join(map(str, sys.version_info[:2]))
    return os.path.join(final, "deps", tag)


def ensure_click(final):
    # type: (str) -> None
    deps = deps_dir(final)
    sys.path.insert(0, deps)  # first, as for the CLI
    seen = _inode(deps)
    if _importable():
        return
    why = _install(final, deps, seen)
    if why:
        annotate(
            "warning",
            "local-mutex: could not install click for " + sys.executable + ": " + why + "; "
            "everything works but --help and shell completion, which need `pip install click`",
        )


def _importable():
    # type: () -> bool
    try:
        import click  # noqa: F401
    except Exception:  # not there, or not for this Python (SyntaxError), or broken
        return False
    return True


def _inode(path):
    # type: (str) -> int | None
    try:
        return os.stat(path).st_ino
    except OSError:
        return None


def _install(final, deps, seen):
    # type: (str, str, int | None) -> str
    """Install click into ``deps`` (replacing ``seen``, a copy that does not import): ''
    once it is there, else why not."""
    import shutil
    import tempfile

    try:
        lock_fd = os.open(
            os.path.join(final, ".click.lock"),
            os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC,
            0o600,
        )
    except OSError:  # an install of root's (or the runner's): not ours to add to
        return "the install at " + final + " is not this user's to add to"
    umask = os.umask(0o022)  # what pip writes is part of the install (``_trusted``)
    try:
        fcntl.flock(lock_fd, fcntl.LOCK_EX)  # a job that came first: its attempt is ours
        now = _inode(deps)
        if now is not None and now != seen:
            return ""  # installed while we waited
        parent = os.path.dirname(deps)
        if not os.path.isdir(parent):
            os.mkdir(parent)
        for leftover in os.listdir(parent):  # of attempts killed midway
            if leftover.startswith(".tmp-"):
                shutil.rmtree(os.path.join(parent, leftover), ignore_errors=True)
        tmp = tempfile.mkdtemp(prefix=".tmp-", dir=parent)
        try:
            os.chmod(tmp, 0o755)
            why = _pip(tmp)
            if why:
                return why
            if os.path.lexists(deps):
                shutil.rmtree(deps)
            os.rename(tmp, deps)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
        return ""
    except OSError as exc:
        return str(exc)
    finally:
        os.umask(umask)
        os.close(lock_fd)


def _pip(target):
    # type: (str) -> str
    """pip installs click into ``target``: '', else what went wrong."""
    import subprocess

    command = [sys.executable, "-m", "pip", "install", "--quiet", "--disable-pip-version-check"]
    command += ["--no-input", "--target", target, "click>=8.0"]
    try:
        result = subprocess.run(command, stdout=subprocess.DEVNULL, check=False)
    except OSError as exc:
        return "pip did not start: " + str(exc)
    if result.returncode == 0 and os.path.isdir(os.path.join(target, "click")):
        return ""
    return "pip exited with status " + str(result.returncode)
