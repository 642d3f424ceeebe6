"""Git plumbing for remote locks: a throwaway bare repository, refs read and written by
compare-and-swap, never a working tree. Credentials come from git's own machinery, or from
a token placed in git's environment-only configuration -- never on a command line."""

from __future__ import annotations

import base64
import os
import shutil
import stat
import subprocess
import tempfile
import time
from urllib.parse import urlsplit

from ..._proc import decimal, exists
from ...errors import BadAddress, Unavailable
from ..secrets import hide_secrets, mask
from .protocol import NotALock
from .spawn import run_git

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Mapping

GIT_TIMEOUT = 60.0
EMPTY_TREE_INPUT = b""
# How a push that lost a race reads: our lease check failed locally, or the server's ref
# update found the branch moved under it (two pushes crossing on the server).
_LOST_RACE = (
    "stale info",
    "fetch first",
    "non-fast-forward",
    "cannot lock ref",
    "failed to update ref",
    "incorrect old value",
    "reference already exists",
    "atomic transaction failed",
)

# What the server says after "cannot lock ref '<ref>':" when the ref can never be written
# as asked, however often we try: a branch in the way of a folder of branches (or the other
# way round), a name too long for its file system, a repository it cannot write to.
# A push that failed with one of these never reached a server that would take it (no
# connection, a service or repository refused before any update was sent): nothing landed.
_NEVER_SENT = (
    "unable to connect to",
    "Connection refused",
    "Could not resolve host",
    "fatal: remote error: ",  # git daemon: service not enabled, repository not exported
    "Repository not found",
    "does not appear to be a git repository",
    "The requested URL returned error: 4",
    "Authentication failed",
    "could not read Username",
)
_NOT_A_RACE = (
    "exists; cannot create",
    "cannot process '",
    "blocking reference",
    "File name too long",
    "Permission denied",
    "Read-only file system",
    "No space left on device",
)
_DF_HINT = (
    " (on a git remote, a lock name cannot also be the folder of another: 'a' and 'a/b' "
    "cannot both exist)"
)
# git's generic lines, which say nothing about the cause.
_NO_READ = "fatal: Could not read from remote repository"
_BOILERPLATE = (
    "hint:",
    _NO_READ,
    "error: failed to push some refs",
    "Please make sure you have the correct access rights",  # git's advice after _NO_READ
    "and the repository exists.",
)


def ended(returncode: int) -> str:
    """How a git process ended, as people read it ("exit -13" is a signal, not a status)."""
    if returncode >= 0:
        return f"exit {returncode}"
    import signal

    try:
        return f"killed by {signal.Signals(-returncode).name}"
    except ValueError:
        return f"killed by signal {-returncode}"


def why(stderr: str, limit: int = 3) -> str:
    """git's stderr as one line: the lines that say the cause, not the advice that follows
    them after a blank line ("Please make sure you have the correct access rights ...").
    A line that ends in ':' goes on with the next (``unable to connect to h:\\n<errno>``)."""
    parts: list[str] = []
    for raw in stderr.splitlines():
        line = " ".join(raw.split())
        said = line.removeprefix("remote:").strip()  # the server's own stderr, relayed
        if not said:
            if parts:
                break
            continue
        if said.startswith(_BOILERPLATE):
            continue
        if parts and parts[-1].endswith(":"):
            parts[-1] = f"{parts[-1]} {line}"
        elif len(parts) < limit:
            parts.append(line)
    if not parts and _NO_READ in stderr:
        # Nothing but the advice ("Please make sure you have the correct access rights"),
        # which is as often wrong: a server that closed the connection says no more.
        return "the remote closed the connection or refused it (git said no more)"
    return "; ".join(parts)


def refused_for_good(stderr: str) -> str | None:
    """The server's reason when it could not lock the ref for a cause that is no race."""
    for raw in stderr.splitlines():
        line = " ".join(raw.split())
        at = line.find("cannot lock ref '")
        if at < 0:
            continue
        reason = line[at:]
        if any(sign in reason for sign in _NOT_A_RACE):
            return reason + (_DF_HINT if "exists; cannot create" in reason else "")
        if "Unable to create '" in reason and "File exists" not in reason:
            return reason  # another errno than a concurrent update's lock file
    return None


_SCRATCH = "local-mutex-git-"


def _scratch_dir() -> str:
    """A directory for the private repository, named after this process (pid namespace,
    pid), so that once a SIGKILL left it behind the next one of our user removes it."""
    try:  # the boot too: the first pid namespace has the same inode on every host
        with open("/proc/sys/kernel/random/boot_id") as f:
            boot = f.read().strip().replace("-", "")[:12]
        namespace = f"{boot}{os.stat('/proc/self/ns/pid').st_ino}"
    except OSError:
        namespace = "0"  # unknown (no /proc): never removed by another process
    else:
        _sweep(tempfile.gettempdir(), namespace)
    return tempfile.mkdtemp(prefix=f"{_SCRATCH}{namespace}-{os.getpid()}-")


def _sweep(parent: str, namespace: str) -> None:
    """Remove our user's scratch directories whose process, in our pid namespace, is gone.
    (A pid number means nothing in another namespace: a container may share /tmp.)"""
    try:
        entries = list(os.scandir(parent))
    except OSError:
        return
    for entry in entries:
        if not entry.name.startswith(_SCRATCH):
            continue
        parts = entry.name[len(_SCRATCH) :].split("-")
        pid = decimal(parts[1]) if len(parts) == 3 and parts[0] == namespace else None
        if pid is None:
            continue
        try:
            st = entry.stat(follow_symlinks=False)
        except OSError:
            continue
        if stat.S_ISDIR(st.st_mode) and st.st_uid == os.geteuid() and not exists(pid):
            shutil.rmtree(entry.path, ignore_errors=True)


class PushRefused(Unavailable):
    """The server answered a push with a refusal that lasts: nothing of it landed."""


class Git:
    """One remote, talked to through a private temporary bare repository."""

    def __init__(
        self, url: str, env: Mapping[str, str] | None = None, token: str | None = None
    ) -> None:
        if not url.strip():
            raise Unavailable("the remote URL is empty")
        self.url = url
        self.shown = mask(url)  # what messages say: git may quote the URL, password and all
        self.timeout = GIT_TIMEOUT
        # When set (monotonic): every git call ends by then, however many a step makes.
        self.deadline: float | None = None
        # When set: a descriptor whose readability cuts every git call short (Cancelled).
        self.cancel: int | None = None
        self.dir = _scratch_dir()
        base = dict(os.environ if env is None else env)
        self.env = {
            **base,
            "GIT_DIR": self.dir,
            "GIT_TERMINAL_PROMPT": "0",  # never wait on a password prompt
            "GIT_ASKPASS": "true" if not base.get("GIT_ASKPASS") else base["GIT_ASKPASS"],
        }
        try:  # ``https://[::1/x``, a port that is no number: no URL git could reach
            if "://" in self.url:
                urlsplit(self.url).port  # noqa: B018 (parsing it is the check)
        except ValueError as exc:
            self.close()
            raise BadAddress(f"--remote {self.shown!r} is not a valid URL ({exc})") from None
        if token:
            self._add_token(token)
        self.run("init", "--bare", "--quiet", self.dir)
        self._empty_tree: str | None = None
        self.refusal = ""  # git's words when the last push did not go through

    def _add_token(self, token: str) -> None:
        # Environment-only config (git >= 2.31): the header is invisible to `ps`.
        parts = urlsplit(self.url)  # a valid one (``__init__``)
        scope = f"{parts.scheme}://{parts.netloc}/" if parts.scheme in ("http", "https") else ""
        key = f"http.{scope}.extraheader" if scope else "http.extraheader"
        basic = base64.b64encode(f"x-access-token:{token}".encode()).decode()
        count = int(self.env.get("GIT_CONFIG_COUNT", "0") or 0)
        self.env[f"GIT_CONFIG_KEY_{count}"] = key
        self.env[f"GIT_CONFIG_VALUE_{count}"] = f"AUTHORIZATION: basic {basic}"
        self.env["GIT_CONFIG_COUNT"] = str(count + 1)

    def close(self) -> None:
        shutil.rmtree(self.dir, ignore_errors=True)

    def __enter__(self) -> Git:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def run(
        self,
        *args: str,
        stdin: bytes = b"",
        check: bool = True,
        env: Mapping[str, str] | None = None,
    ) -> subprocess.CompletedProcess[bytes]:
        timeout = self.timeout
        if self.deadline is not None:
            timeout = max(min(timeout, self.deadline - time.monotonic()), 0.1)
        try:
            code, out, err = run_git(
                ["git", *args],
                stdin=stdin,
                env=env or self.env,
                timeout=timeout,
                cancel=self.cancel,
            )
        except subprocess.TimeoutExpired:
            raise Unavailable(f"git {args[0]} timed out after {timeout:.3g}s") from None
        proc = subprocess.CompletedProcess(["git", *args], code, out, err)
        if check and proc.returncode != 0:
            raise Unavailable(f"git {args[0]} failed: {self._why(proc)}")
        return proc

    def _why(self, proc: subprocess.CompletedProcess[bytes]) -> str:
        return self._hide(why(proc.stderr.decode("utf-8", "replace"))) or ended(proc.returncode)

    def _hide(self, text: str) -> str:
        return hide_secrets(text.replace(self.url, self.shown), self.url)

    # -- reading --

    def head(self, ref: str) -> str | None:
        """The remote's oid for ``ref`` (one small request), or None when it does not exist."""
        out = self.run("ls-remote", "--", self.url, ref).stdout.decode()
        for line in out.splitlines():
            oid, _, name = line.partition("\t")
            if name == ref:
                return oid
        return None

    def fetch(self, ref: str, depth: int | None = 1) -> str | None:
        """Fetch ``ref`` into the private repo; its oid, or None when it does not exist."""
        args = ["fetch", "--quiet", "--no-tags"]
        if depth:
            args.append(f"--depth={depth}")
        proc = self.run(*args, "--", self.url, ref, check=False)
        if proc.returncode != 0:
            reason = self._why(proc)
            if "couldn't find remote ref" in reason:
                return None
            raise Unavailable(f"cannot read {ref} from {self.shown}: {reason}")
        # FETCH_HEAD names what was fetched: reading it saves a git process per look.
        with open(os.path.join(self.dir, "FETCH_HEAD"), encoding="utf-8") as f:
            return f.read().split("\t", 1)[0].strip()

    def message(self, oid: str, ref: str, limit: int = 1 << 20) -> str:
        """The message of commit ``oid``, the tip of ``ref``; NotALock when the tip is a
        blob, tree or tag (a branch git itself would never let a push point there)."""
        proc = self.run("cat-file", "commit", oid, check=False)
        if proc.returncode != 0:
            kind = self.run("cat-file", "-t", oid, check=False).stdout.decode().strip()
            if kind in ("blob", "tree", "tag"):
                raise NotALock(
                    f"branch {ref} ({oid[:12]}) is not a lock: its tip is a {kind}, not a "
                    "commit; refusing to take, rewrite or delete it"
                )
            raise Unavailable(f"git cat-file failed: {self._why(proc)}")
        raw = proc.stdout[:limit].decode("utf-8", "replace")
        return raw.split("\n\n", 1)[1] if "\n\n" in raw else ""

    def heads(self, prefix: str) -> list[tuple[str, str]]:
        """(ref, oid) of every branch under ``refs/heads/<prefix>``."""
        out = self.run("ls-remote", "--heads", "--", self.url).stdout.decode("utf-8", "replace")
        found = []
        for line in out.splitlines():
            oid, _, ref = line.partition("\t")
            if ref.startswith(f"refs/heads/{prefix}"):
                found.append((ref, oid))
        return found

    def history(self, oid: str, limit: int = 1000) -> list[tuple[str, int, str]]:
        """(oid, commit time, message) from newest to oldest, at most ``limit``."""
        out = self.run(
            "log", f"--max-count={limit}", "--format=%H%x00%ct%x00%B%x00%x1e", oid
        ).stdout.decode("utf-8", "replace")
        entries = []
        for raw in out.split("\x00\x1e"):
            parts = raw.strip("\n").split("\x00", 2)
            if len(parts) == 3 and parts[1].isdigit():
                entries.append((parts[0], int(parts[1]), parts[2]))
        return entries

    # -- writing --

    def commit(self, parent: str | None, message: str, author: str) -> str:
        if self._empty_tree is None:
            self._empty_tree = self.run("mktree", stdin=EMPTY_TREE_INPUT).stdout.decode().strip()
        who = {
            "GIT_AUTHOR_NAME": author,
            "GIT_AUTHOR_EMAIL": "local-mutex@localhost",
            "GIT_COMMITTER_NAME": author,
            "GIT_COMMITTER_EMAIL": "local-mutex@localhost",
        }
        args = ["commit-tree", self._empty_tree, "-F", "-"]
        if parent:
            args[2:2] = ["-p", parent]
        out = self.run(*args, stdin=message.encode(), env={**self.env, **who})
        return out.stdout.decode().strip()

    def push(self, ref: str, new: str | None, expected: str | None) -> bool:
        """Compare-and-swap ``ref`` from ``expected`` (None: must not exist) to ``new`` (None:
        delete). False when it looks like someone else moved it first (``refusal`` keeps
        git's words); Unavailable for anything else."""
        lease = f"--force-with-lease={ref}:{expected or ''}"
        spec = f"{new}:{ref}" if new else f":{ref}"
        proc = self.run("push", "--porcelain", "--atomic", lease, "--", self.url, spec, check=False)
        out = proc.stdout.decode("utf-8", "replace")
        err = proc.stderr.decode("utf-8", "replace")
        status = [line for line in out.splitlines() if line[:1] in "*+-=! " and "\t" in line]
        if status and status[0][0] != "!":
            # The server reported the ref updated: it landed, whatever went wrong after (a
            # connection dropped by a post-receive hook exits 1 all the same).
            return True
        err = self._hide(err)
        self.refusal = why(err) or "; ".join(line.split("\t", 2)[-1] for line in status)
        cause = refused_for_good(err)
        if cause is not None:
            raise PushRefused(f"push to {self.shown} failed: {cause}")
        if any(
            line.startswith("!") and any(sign in line for sign in _LOST_RACE) for line in status
        ):
            return False
        if any(f"cannot lock ref '{ref}'" in line for line in err.splitlines()):
            return False
        detail = "; ".join(line.split("\t", 2)[-1] for line in status) or self.refusal
        detail = detail or ended(proc.returncode)
        if status and self.refusal and self.refusal not in detail:
            detail = f"{detail}: {self.refusal}"
        # The server's own answer (status lines) is a refusal; without one (a connection
        # lost, an answer that never came) the push may still have landed.
        never_sent = any(sign in err for sign in _NEVER_SENT)
        refused = PushRefused if status or never_sent else Unavailable
        raise refused(f"push to {self.shown} failed: {detail}")
