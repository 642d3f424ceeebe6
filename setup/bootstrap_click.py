"""click for an install of local-mutex (``bootstrap.py setup``), and the bootstrap's log lines.

Only ``--help`` and shell completion need click: everything else works without it, so
nothing here may fail a step or hold it up for long.

An install is shared by every interpreter that runs the action on the host, while click's
releases drop old Pythons (8.2 needs 3.10): a click that 3.13 installed is a SyntaxError to
3.9. So each interpreter gets a copy of its own, in ``<install>/deps/<cache tag>``
(``cpython-39``), which ``local_mutex._site.ensure`` puts on sys.path for help and
completion, and a click that will not import counts as none, whatever the error.

pip gets a few seconds (``PIP_TIMEOUT`` an answer, no retries, ``PIP_DEADLINE`` in all), not
the minutes its retries take against an index that does not answer; what it printed is
summed up in the one warning line. A failed attempt is remembered for ``RETRY_AFTER``
seconds (``<cache tag>.failed`` beside the copy, with pip's last error): the jobs after it
do not pay it again.

Same rules as bootstrap.py: it must parse on any Python (no f-strings, no annotations).
"""

from __future__ import print_function  # noqa: UP010 - Python 2 must parse this file

import fcntl
import os
import sys
import time

PIP_TIMEOUT = 3
PIP_DEADLINE = 15
RETRY_AFTER = 15 * 60
FAILED = ".failed"


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
        earlier = _earlier_failure(deps + FAILED)
        if earlier:
            return earlier
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
                with open(deps + FAILED, "w", encoding="utf-8") as f:
                    f.write(why + "\n")
                return why
            if os.path.lexists(deps):
                shutil.rmtree(deps)
            os.rename(tmp, deps)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
        if os.path.lexists(deps + FAILED):
            os.unlink(deps + FAILED)
        return ""
    except OSError as exc:
        return str(exc)
    finally:
        os.umask(umask)
        os.close(lock_fd)


def _earlier_failure(marker):
    # type: (str) -> str
    """Why the attempt of less than ``RETRY_AFTER`` ago failed, if one did."""
    try:
        age = time.time() - os.stat(marker).st_mtime
        if not 0 <= age < RETRY_AFTER:  # old, or from a clock set back since
            return ""
        with open(marker, encoding="utf-8", errors="replace") as f:
            why = f.read().strip()
    except OSError:
        return ""
    ago = str(int(age)) + " s" if age < 60 else str(int(age // 60)) + " min"
    every = str(RETRY_AFTER // 60)
    return why + " (" + ago + " ago; pip is tried again " + every + " min after a failure)"


def _pip(target):
    # type: (str) -> str
    """pip installs click into ``target``: '', else what went wrong in one line."""
    import subprocess

    command = [sys.executable, "-m", "pip", "install", "--quiet", "--disable-pip-version-check"]
    command += ["--no-input", "--no-color", "--timeout", str(PIP_TIMEOUT), "--retries", "0"]
    command += ["--only-binary", ":all:", "--target", target, "click>=8.0"]
    start = time.time()
    try:
        result = subprocess.run(
            command,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            timeout=PIP_DEADLINE,
            check=False,
        )
    except subprocess.TimeoutExpired:
        return "pip was stopped after " + str(PIP_DEADLINE) + " s"
    except OSError as exc:
        return "pip did not start: " + str(exc)
    if result.returncode == 0 and os.path.isdir(os.path.join(target, "click")):
        return ""
    took = str(int(time.time() - start))
    return "pip gave up after " + took + " s: " + _gist(result.stderr)


def _gist(stderr):
    # type: (bytes) -> str
    """pip's last error line (its warnings and colours left out)."""
    import re

    text = re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", stderr.decode("utf-8", "replace"))
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    errors = [line[len("ERROR:") :].strip() for line in lines if line.startswith("ERROR:")]
    gist = (errors or lines or ["it said nothing"])[-1]
    return gist if len(gist) <= 300 else gist[:297] + "..."
