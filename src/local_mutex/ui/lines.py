"""Every line local-mutex writes to stderr, formatted in one place.

Under GitHub Actions the bookends and errors are workflow commands (``::notice::``,
``::error::``); elsewhere the same text prints plainly. Nested calls print plain lines even
under Actions, because GitHub keeps only a few annotations per step and a loop takes many.
"""

from __future__ import annotations

import os
import sys

from .._fastsignal import stoppable, stops_taken
from ..identity import utc_stamp

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Mapping
    from typing import IO, Any

PREFIX = "local-mutex: "
_MAX_COMMAND = 120
_MAX_LINE = 3000  # characters of one line, whatever it quotes
ANNOTATIONS = ("always", "waited", "never")
ENV_PROGRESS = "LOCAL_MUTEX_PROGRESS_SECONDS"
DEFAULT_PROGRESS = 30.0  # seconds, and at least 0.5: each line reads /proc/locks
# Once a stop signal came, how long a line may wait for a stderr that takes nothing.
STOPPING_WRITE_WAIT = 0.5
_SAID: set[str] = set()  # the $LOCAL_MUTEX_PROGRESS_SECONDS values already warned of


def progress_interval(env: Mapping[str, str], reporter: Reporter | None = None) -> float:
    """Seconds between "still waiting" lines ($LOCAL_MUTEX_PROGRESS_SECONDS): at least 0.5,
    at most 1e9 (a huge value asks for none). What is not a number above 0 is said, not
    silently replaced: the user meant something by it."""
    raw = env.get(ENV_PROGRESS, "")
    try:
        value = float(raw or DEFAULT_PROGRESS)
    except ValueError:
        value = 0.0
    if value > 0:  # not NaN either
        return min(max(value, 0.5), 1e9)
    if reporter is not None and raw not in _SAID:  # once a process (``each``: not per item)
        _SAID.add(raw)
        reporter.warning(
            f"${ENV_PROGRESS}={printable(raw)!r} is not a number of seconds above 0; "
            f"ignored: a still-waiting line every {DEFAULT_PROGRESS:g}s"
        )
    return DEFAULT_PROGRESS


def in_words(text: str, words: Mapping[str, str]) -> str:
    """``--remote 'x' is not a lock address`` with ``{"remote": "$LOCAL_MUTEX_REMOTE"}``:
    ``$LOCAL_MUTEX_REMOTE 'x' is not a lock address``. Whole options only."""
    import re

    options = "|".join(re.escape(option) for option in words)
    return re.sub(rf"(?<![\w-])--({options})(?![\w-])", lambda m: words[m.group(1)], text)


def duration(seconds: float) -> str:
    if seconds < 60:
        return f"{seconds:.1f}s"
    whole = int(seconds)
    if whole < 3600:
        return f"{whole // 60}m{whole % 60:02d}s"
    return f"{whole // 3600}h{whole % 3600 // 60:02d}m"


def one_line(text: str, limit: int = _MAX_COMMAND) -> str:
    flat = printable(" ".join(text.split()))
    return flat if len(flat) <= limit else flat[: limit - 1] + "…"


def printable(text: str) -> str:
    """``text`` with control characters escaped (``\\n``, ``\\x1b``): a record field, a
    path or an argument can hold anything, and one line must stay one line -- a raw
    newline could even start a ``::error::`` workflow command of its own. C1 controls
    (a terminal may read ``\x9b`` as an escape), the line and paragraph separators (a new
    line to many log viewers), the marks that turn text right to left (a name could read
    backwards, or hide what follows), a name's raw bytes in the C1 range (written as they
    are, a terminal may take ``0x9b`` for an escape: ``\\x9b``) and surrogates that stand
    for no byte of a name (a record's JSON may hold ``\\ud800``; they cannot be written)
    are escaped too."""
    if all(" " <= c < "\x7f" for c in text):
        return text
    return "".join(c if _shown(c) else _escaped(c) for c in text)


_BIDI = frozenset("\u061c\u200e\u200f\u202a\u202b\u202c\u202d\u202e\u2066\u2067\u2068\u2069")


def _shown(c: str) -> bool:
    if c < " " or "\x7f" <= c <= "\x9f" or c in "\u2028\u2029" or c in _BIDI:
        return False  # the separators: new lines to many viewers
    return not "\ud800" <= c <= "\udfff" or "\udca0" <= c <= "\udcff"  # a name's raw bytes


def _escaped(c: str) -> str:
    if "\udc80" <= c <= "\udc9f":  # a raw byte: say which
        return f"\\x{ord(c) - 0xDC00:02x}"
    return repr(c)[1:-1]


def describe_holder(holder: Mapping[str, Any], now: float | None = None) -> str:
    """``pid 123 ('make deps' in /src on host, runner r1, since …, for 2m03s, <url>)``."""
    import time

    def field(key: str) -> str:
        return one_line(str(holder[key]), 400)

    pid = holder.get("pid")
    # Without a pid (a remote's holder), its user: "user 0", not a "0" that reads as a pid.
    who = f"user {field('user')}" if holder.get("user") else "?"
    parts = [f"pid {field('pid')}" if pid is not None else who]
    details = running(holder.get("command"), holder.get("cwd"))
    if holder.get("source") == "guardian":  # it holds the lock for that run's command
        details = [" ".join(["guardian of", *details]) if details else "guardian"]
    for key, word in (("host", "on"), ("runner", "runner"), ("job", "job")):
        if holder.get(key):
            details.append(f"{word} {field(key)}")
    since = holder.get("since_epoch")
    if isinstance(since, (int, float)) and not isinstance(since, bool) and since == since:
        held = (time.time() if now is None else now) - since
        if -1e12 < held < 1e12:
            details.append(f"since {utc_stamp(since)}, for {duration(max(held, 0.0))}")
    if holder.get("message"):
        details.append(f"message {quoted(holder['message'])}")
    if holder.get("run_url"):
        details.append(field("run_url"))
    if details:
        parts.append("(" + ", ".join(details) + ")")
    return " ".join(parts)


def quoted(text: object) -> str:
    """In quotes, escaped once: ``repr`` of text ``one_line`` escaped already doubled its
    backslashes (``\\x1b``), and wrote a name's raw bytes as ``\\udcff``."""
    return f"'{one_line(str(text))}'"


def running(command: object, cwd: object) -> list[str]:
    """What a holder runs, and where (``'make deps'``, ``in /src``), as every backend's
    holder and ``history`` show it; what is not given (or not text) is left out."""
    said = [quoted(command)] if isinstance(command, str) and command else []
    return said + ([f"in {one_line(cwd, 400)}"] if isinstance(cwd, str) and cwd else [])


def writable_when_stopping(stream: IO[str]) -> bool:
    """False if a stop signal came and ``stream`` has taken nothing for a moment: a pipe
    whose reader stopped reading (a parent that reads only our stdout) would block the
    write, and the run that was told to stop, for good. A pipe that reports room takes a
    line of up to PIPE_BUF bytes at once; before any stop signal, writes block as usual."""
    if not stops_taken:
        return True
    try:
        fd = stream.fileno()
    except (AttributeError, OSError, ValueError):  # not a file (an API caller's buffer)
        return True
    import select

    poller = select.poll()
    poller.register(fd, select.POLLOUT)
    return bool(poller.poll(int(STOPPING_WRITE_WAIT * 1000)))


def _escape_data(text: str) -> str:
    # GitHub workflow-command data escaping.
    return text.replace("%", "%25").replace("\r", "%0D").replace("\n", "%0A")


class Reporter:
    """Writes the user-facing lines to a stream (stderr by default).

    ``annotations`` (under Actions): "always" makes the bookends ``::notice::`` lines,
    "waited" only for runs that waited, failed or were stopped, "never" keeps them plain.
    Errors are ``::error::`` lines under Actions whatever it says.
    """

    def __init__(
        self,
        stream: IO[str] | None = None,
        *,
        actions: bool | None = None,
        nested: bool = False,
        quiet: bool = False,
        only_contended: bool = False,
        annotations: str = "always",
        words: Mapping[str, str] | None = None,
    ) -> None:
        self.stream = stream
        # Options whose value came from elsewhere, as errors and warnings should name them
        # (``in_words``): the action's inputs, or $LOCAL_MUTEX_REMOTE for --remote.
        self.words = dict(words or {})
        # For batches: only lines about waits and failures, never the routine bookends.
        self.only_contended = only_contended
        if actions is None:
            actions = os.environ.get("GITHUB_ACTIONS") == "true"
        self.actions = actions
        self.annotations = "never" if nested or not actions else annotations
        self.quiet = quiet

    def settings(self) -> dict[str, Any]:
        """What another process needs to write lines as this reporter would (a holder)."""
        return {
            "actions": self.actions,
            "quiet": self.quiet,
            "annotations": self.annotations,
            "only_contended": self.only_contended,
            "words": self.words,
        }

    def waiting_only(self) -> Reporter:
        """This reporter, saying only that (and how long) we wait: a ``hold``'s own lines
        come after it holds the lock."""
        return Reporter(self.stream, **{**self.settings(), "only_contended": True})

    def write(self, text: str, kind: str | None = None) -> None:
        """One line; ``kind`` is 'notice', 'warning' or 'error' (a workflow command under
        Actions: errors and warnings always, notices as ``annotations`` says)."""
        if self.words and kind in ("error", "warning"):
            text = in_words(text, self.words)
        text = printable(text)
        if len(text) > _MAX_LINE:  # a value quoted whole (a 100 KB variable): head and tail
            cut = len(text) - _MAX_LINE
            text = f"{text[: _MAX_LINE * 2 // 3]}…[{cut} characters]…{text[-_MAX_LINE // 3 :]}"
        if self.actions and kind in ("error", "warning"):
            line = f"::{kind}::{_escape_data(PREFIX + text)}\n"
        elif kind == "notice" and self.annotations != "never":
            line = f"::notice::{_escape_data(PREFIX + text)}\n"
        else:
            line = f"{PREFIX}{text}\n"
        self._emit(line)

    def _emit(self, line: str) -> None:
        """Best effort: a stderr that cannot be written (its reader went away, a full
        disk, an I/O error, a closed stream) loses the line, never the run -- the command
        must still run, and its status is worth more than a log line about it."""
        stream = self.stream if self.stream is not None else sys.stderr
        if stream is None:  # no stderr at all (closed, and no stand-in could be opened)
            return
        try:
            # A stop signal from here on either cuts the write short (``stoppable``) or came
            # before the look for room that the write makes first: never a blocked write.
            buffer = getattr(stream, "buffer", None)
            if buffer is not None:
                # Names are arbitrary bytes (kept in surrogateescape form): verbatim.
                stoppable(_write_bytes, stream, buffer, line.encode("utf-8", "surrogateescape"))
            else:
                stoppable(_write_text, stream, line)
        except (OSError, ValueError):  # ValueError: a stream closed in this process
            pass

    def _notable(self, notable: bool) -> str | None:
        """The kind of a bookend: a notice, unless ``waited`` mode and nothing happened."""
        return "notice" if notable or self.annotations != "waited" else None

    # -- the lines ---------------------------------------------------------------------------

    def waiting(
        self, name: str, holder: Mapping[str, Any] | None, detail: str | None = None
    ) -> None:
        busy = holder is not None or detail is not None
        if self.quiet or (self.only_contended and not busy):
            return
        text = f"waiting for lock {name} at {utc_stamp()}"
        if holder is not None:
            text += f" held by {describe_holder(holder)}"
        if detail:
            text += f": {detail}"
        self.write(text, self._notable(busy))

    def still_waiting(
        self, name: str, waited: float, holder: Mapping[str, Any] | None, position: str | None
    ) -> None:
        if self.quiet:  # progress, not an error or a warning
            return
        text = f"still waiting for lock {name} after {duration(waited)}"
        extras = [position] if position else []
        if holder is not None:
            extras.append(f"held by {describe_holder(holder)}")
        if extras:
            text += " (" + "; ".join(extras) + ")"
        self.write(text)

    def acquired(self, name: str, waited: float) -> None:
        if not self.quiet:
            self.write(f"acquired lock {name} at {utc_stamp()} after waiting {duration(waited)}")

    def reentrant(self, name: str, pid: int) -> None:
        if not self.quiet:
            self.write(f"lock {name} is already held by enclosing pid {pid}; running inside it")

    def reentrant_done(self, name: str, held: float, status: int) -> None:
        if not self.quiet:
            self.write(
                f"done inside enclosing lock {name} at {utc_stamp()} "
                f"(ran {duration(held)}, exit {status})"
            )

    def released(
        self, name: str, waited: float, held: float, status: int, *, stopped: bool = False
    ) -> None:
        notable = waited > 0 or status != 0 or stopped
        if self.quiet or (self.only_contended and not notable):
            return
        self.write(
            f"released {name} at {utc_stamp()} "
            f"(waited {duration(waited)}, held {duration(held)}, exit {status})",
            self._notable(notable),
        )

    def notice(self, text: str, notable: bool = False) -> None:
        """A line worth an annotation (a hold taken, a release done); in ``waited`` mode
        only a ``notable`` one (it waited, it was skipped) is."""
        if not self.quiet:
            self.write(text, self._notable(notable))

    def info(self, text: str) -> None:
        if not self.quiet:
            self.write(text)

    def warning(self, text: str) -> None:
        self.write(text, "warning")

    def error(self, message: str) -> None:
        self.write(message, "error")

    def timed_out(self, name: str, timeout: float, killed: bool) -> None:
        how = "SIGKILL (it outlasted the grace after SIGTERM)" if killed else "SIGTERM"
        self.error(
            f"command under lock {name} ran past --timeout {timeout:g}s; stopped it with {how}"
        )

    def gave_up_on_group(self, name: str) -> None:
        self.error(
            f"a process of the command under lock {name} survived SIGKILL "
            "(uninterruptible sleep?); releasing the lock anyway"
        )

    def failure(self, exc: BaseException) -> int:
        """Report a library error the way every command does; return its exit status."""
        if isinstance(exc, KeyboardInterrupt):
            return 130
        code = getattr(exc, "exit_code", None)
        self.error(str(exc) or type(exc).__name__)
        return code if isinstance(code, int) else 1


def _write_bytes(stream: Any, buffer: Any, data: bytes) -> None:
    if writable_when_stopping(stream):
        stream.flush()
        buffer.write(data)
        buffer.flush()


def _write_text(stream: Any, line: str) -> None:
    if writable_when_stopping(stream):
        stream.write(line)
        stream.flush()
