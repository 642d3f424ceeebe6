"""A real git server on loopback for the remote-lock tests: `git daemon`, one per test."""

from __future__ import annotations

import socket
import subprocess
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
