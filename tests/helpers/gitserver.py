"""A real git server on loopback for the remote-lock tests: `git daemon`, one per test."""

from __future__ import annotations

import socket
import subprocess
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


@contextmanager
def git_daemon(root: Path, *, writable: bool = True) -> Iterator[str]:
    """Serve a fresh bare repository at git://127.0.0.1:<port>/locks.git."""
    root.mkdir(parents=True, exist_ok=True)
    subprocess.run(["git", "init", "--quiet", "--bare", str(root / "locks.git")], check=True)
    port = _free_port()
    args = [
        "git",
        "daemon",
        "--reuseaddr",
        "--listen=127.0.0.1",
        f"--port={port}",
        f"--base-path={root}",
        "--export-all",
        "--informative-errors",
        str(root),
    ]
    if writable:
        args.insert(2, "--enable=receive-pack")
    proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 20
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                if time.monotonic() > deadline or proc.poll() is not None:
                    raise RuntimeError("git daemon did not start") from None
                time.sleep(0.05)
        yield f"git://127.0.0.1:{port}/locks.git"
    finally:
        proc.terminate()
        proc.wait(10)


def branch_message(url: str, branch: str, work: Path) -> str:
    """The newest commit message of a branch on the server, read with plain git."""
    repo = work / "reader.git"
    if not repo.exists():
        subprocess.run(["git", "init", "--quiet", "--bare", str(repo)], check=True)
    subprocess.run(
        [
            "git",
            "--git-dir",
            str(repo),
            "fetch",
            "--quiet",
            url,
            f"+refs/heads/{branch}:refs/heads/{branch}",
        ],
        check=True,
    )
    out = subprocess.run(
        ["git", "--git-dir", str(repo), "log", "-1", "--format=%B", branch],
        check=True,
        capture_output=True,
        text=True,
    )
    return out.stdout


def install_hook(repo: Path, name: str, body: str) -> None:
    """A server-side hook (``pre-receive``, ``update``, ...) for the bare repository."""
    hook = repo / "hooks" / name
    hook.write_text("#!/bin/sh\n" + body)
    hook.chmod(0o755)


def drop_connection_once(repo: Path, armed: Path, hook: str = "reference-transaction") -> None:
    """While ``armed`` exists, the next push's server process is killed once the branch
    is updated (``reference-transaction``: before it answers; ``post-receive``: after it
    reported the update), as a lost connection would; ``armed`` is gone once it fired."""
    when = '[ "$1" = committed ] || exit 0\n' if hook == "reference-transaction" else ""
    install_hook(
        repo,
        hook,
        f"cat > /dev/null\n{when}if rm '{armed}' 2>/dev/null; then kill -9 $PPID; fi\nexit 0\n",
    )


def gate_pushes(repo: Path, marks: Path) -> None:
    """A pre-receive hook that numbers the pushes the server receives (1, 2, ...) and holds
    push N on the server while ``marks/hold.N`` exists: it touches ``marks/inflight.N`` and
    waits for ``marks/go.N`` (60 s at most, so a failed test never leaves it behind). A
    held push has sent everything; the server updates the branch once it goes on.
    ``marks/server.N`` names the server process of push N (the hook's parent,
    git-receive-pack): once it is gone, push N is over on the server."""
    install_hook(
        repo,
        "pre-receive",
        f"cat > /dev/null\n"
        f"n=1; while ! mkdir '{marks}/push.'$n 2>/dev/null; do n=$((n+1)); done\n"
        f"echo $PPID > '{marks}/server.'$n\n"
        f"if [ -e '{marks}/hold.'$n ]; then\n"
        f"  touch '{marks}/inflight.'$n\n"
        f"  i=0; while [ ! -e '{marks}/go.'$n ] && [ $i -lt 3000 ]; do\n"
        f"    sleep 0.02; i=$((i+1)); done\n"
        f"fi\n"
        f"exit 0\n",
    )


def refuse_once(repo: Path, marks: Path) -> None:
    """A pre-receive hook that, once ``marks/refuse.armed`` exists, makes the next push fail
    the way a busy server does: it leaves the ref's lock file in place (as a concurrent
    update or a ``git gc`` holding it would), so git answers "cannot lock ref ... File
    exists" and the branch does not move. The push after it clears that file and goes
    through; ``marks/refuse.done`` says the refusal happened."""
    install_hook(
        repo,
        "pre-receive",
        f"read old new ref\n"
        f"cat > /dev/null\n"
        f"if [ -e '{marks}/refuse.stale' ]; then rm -f \"$(cat '{marks}/refuse.stale')\";"
        f" rm -f '{marks}/refuse.stale'; fi\n"
        f"if mv '{marks}/refuse.armed' '{marks}/refuse.taken' 2>/dev/null; then\n"
        f"  : > '{repo}'/\"$ref.lock\"\n"
        f"  echo '{repo}'/\"$ref.lock\" > '{marks}/refuse.stale'\n"
        f"  touch '{marks}/refuse.done'\n"
        f"fi\n"
        f"exit 0\n",
    )


def lock_state(url: str, name: str) -> str:
    """``status --json``'s state of the remote lock NAME: "free" or "held"."""
    import json

    from helpers import run_cli

    r = run_cli(["status", name, "--remote", url, "--json"])
    assert r.returncode in (0, 1), r.stderr
    state: str = json.loads(r.stdout)["state"]
    return state


class Silent:
    """A loopback "server" that accepts every connection and never says a word: on a free
    port, or on ``port`` (a killed daemon's, once its last connection lets go of it)."""

    def __init__(self, port: int = 0) -> None:
        self.sock = socket.socket()
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        deadline = time.monotonic() + 10
        while True:
            try:
                self.sock.bind(("127.0.0.1", port))
                break
            except OSError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.05)
        self.sock.listen(16)
        self.url = f"http://127.0.0.1:{self.sock.getsockname()[1]}/locks.git"
        self.held: list[socket.socket] = []
        self.thread = threading.Thread(target=self._accept, daemon=True)
        self.thread.start()

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            self.held.append(conn)

    def close(self) -> None:
        """Stop answering at all: refuse new connections, drop the ones held."""
        try:
            self.sock.shutdown(socket.SHUT_RDWR)  # wakes the accept() in the thread
        except OSError:
            pass
        self.sock.close()
        self.thread.join(5)  # so no connection is accepted after the ones below are dropped
        for conn in self.held:
            conn.close()
