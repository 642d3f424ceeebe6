"""``each``: one command per item, each under its own lock, all in one process.

A sweep over thousands of keys pays one interpreter start, not one per key. Items never
reach the shell text: the command reads its item from $LOCAL_MUTEX_ITEM.
"""

from __future__ import annotations

import os
import time

from .._fastsignal import deferred_stops, interruptible
from ..errors import (
    EXIT_NOT_ACQUIRED,
    Interrupted,
    InvalidTemplate,
    ItemsUnreadable,
    LocalMutexError,
    NotAcquired,
    SpawnError,
    Unavailable,
    ValidationError,
)
from ..lifecycle import run_locked
from ..names import display, name_bytes
from ..nudge import Nudge
from ..ui.lines import duration
from ..ui.output import STDIN, closed_by_caller
from . import Failed, reporter_for, using
from .options import UsageError
from .run import command_of, options_of

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Iterable, Iterator, Mapping

    from ..backends.base import Backend
    from ..runspec import Command, Options
    from ..ui.lines import Reporter
    from .argv import Parsed

ENV_ITEM = "LOCAL_MUTEX_ITEM"
MAX_EXIT = 125
SHOWN = 80  # characters of an item a log line quotes: an item may be megabytes long
# The longest item $LOCAL_MUTEX_ITEM can carry: Linux takes no environment string (with its
# name, "=" and NUL) over 128 KiB.
MAX_ITEM = 128 * 1024 - len(ENV_ITEM) - 2


def parse_template(template: str) -> list[str | None]:
    """Split into literal parts and ``None`` placeholders; ``{{``/``}}`` are literal braces."""
    bad = next((c for c in template if c < " " or c == "\x7f"), None)
    if bad is not None:
        raise InvalidTemplate(
            f"template {template!r} contains control characters (byte 0x{ord(bad):02X}); "
            "lock names cannot hold them"
        )
    parts: list[str | None] = []
    literal: list[str] = []
    i = 0
    while i < len(template):
        pair = template[i : i + 2]
        if pair == "{}":
            parts.append("".join(literal))
            parts.append(None)
            literal = []
            i += 2
        elif pair in ("{{", "}}"):
            literal.append(pair[0])
            i += 2
        elif template[i] in "{}":
            raise InvalidTemplate(
                f"template {template!r}: a lone {template[i]!r} at {i}; "
                "use {} for the item and {{ or }} for a literal brace"
            )
        else:
            literal.append(template[i])
            i += 1
    parts.append("".join(literal))
    return parts


def template_parts(template: str) -> list[str | None]:
    """``parse_template``, and refuse a template whose lock name is bad whatever the item
    (empty, only whitespace) up front, not once per item -- or never, when there are none."""
    parts = parse_template(template)
    if not template or template.isspace():
        raise InvalidTemplate(
            f"template {template!r} names no lock: it is "
            f"{'empty' if not template else 'only whitespace'}; "
            "give a lock name with {} for the item, e.g. 'cache-{}'"
        )
    return parts


def expand(parts: list[str | None], item: str) -> str:
    return "".join(item if part is None else part for part in parts)


def read_items(stream: object, *, null: bool) -> Iterator[str]:
    """Items from a binary stream: lines (or NUL-separated), empty ones skipped.

    Each item is yielded as soon as its separator arrives. Only the new chunk is searched
    for separators: an item longer than a chunk is gathered in pieces, joined once. One
    longer than ``MAX_ITEM`` is kept only in part (an endless line must not fill memory),
    and yielded as a ``TooLong``.
    """
    sep = b"\0" if null else b"\n"
    read = getattr(stream, "read1", None) or stream.read  # type: ignore[attr-defined]
    pending: list[bytes] = []  # the item being read, no separator in it yet
    size = 0  # its length so far
    while True:
        chunk = read(65536)
        if not chunk:
            break
        if sep not in chunk:
            size += len(chunk)
            if size <= MAX_ITEM:
                pending.append(chunk)
            elif size - len(chunk) <= MAX_ITEM:
                pending = [b"".join(pending)[:SHOWN]]
            continue
        first, *items, last = chunk.split(sep)
        pending.append(first)
        yield from _item(pending, size + len(first), null)
        for raw in items:
            yield from _item([raw], len(raw), null)
        pending, size = [last], len(last)
    yield from _item(pending, size, null)


class TooLong(str):
    """An item longer than ``MAX_ITEM``: its start, and its length in bytes."""

    length = 0


def _item(parts: list[bytes], size: int, null: bool) -> Iterator[str]:
    if size > MAX_ITEM:
        too_long = TooLong(display(b"".join(parts)[:SHOWN]))
        too_long.length = size
        yield too_long
        return
    raw = b"".join(parts)
    if not null and raw.endswith(b"\r"):
        raw = raw[:-1]
    if raw:
        yield display(raw)


class StdinItems:
    """stdin read through its descriptor. BufferedReader takes a pipe another process made
    non-blocking (Node.js does; the flag is the pipe's, shared) for its end when it is
    merely empty -- the batch ended early, exit 0; here it is waited on. A read that fails
    is ItemsUnreadable, not a traceback."""

    def __init__(self, fd: int | None) -> None:
        self.fd = fd  # None: the caller closed it (``<&-``; /dev/null stands in, no items)

    def read1(self, size: int) -> bytes:
        if self.fd is None:
            raise ItemsUnreadable("cannot read items: stdin is closed")
        import select

        while True:
            try:
                if select.select([self.fd], [], [], 0)[0]:
                    return os.read(self.fd, size)
                # Asleep until there is more, or the end -- and a stop signal taken just
                # before the sleep began ends it too (``Nudge``), not the producer's next item.
                with Nudge() as nudge:
                    nudge.call(select.select, [self.fd], [], [])
            except BlockingIOError:
                continue  # another reader of the pipe took what there was
            except OSError as exc:
                raise ItemsUnreadable(f"cannot read items from stdin: {exc.strerror}") from None


def named(item: str) -> str:
    """The item as a log line quotes it: its repr, cut short when long."""
    if isinstance(item, TooLong):
        return f"{item!r}... ({item.length} bytes)"
    if len(item) <= SHOWN:
        return repr(item)
    return f"{item[:SHOWN]!r}... ({len(name_bytes(item))} bytes)"


class EachResult:
    __slots__ = ("failed", "first_failure", "not_run", "ran", "skipped", "status", "stopped")

    def __init__(self) -> None:
        self.ran = 0  # items whose command ran
        self.not_run = 0  # items that failed before their command could run
        self.failed: list[tuple[str, int]] = []
        self.skipped: list[str] = []
        self.first_failure: tuple[str, int] | None = None
        self.status = 0
        self.stopped = False


def run_each(
    backend: Backend,
    items: Iterable[str],
    template: str,
    command: Command,
    opts: Options,
    *,
    keep_going: bool = False,
    skip_locked: bool = False,
    env: Mapping[str, str],
    reporter: Reporter | None = None,
    subreaper: bool = False,
) -> EachResult:
    """Run ``command`` once per item under the lock named by ``template``."""
    parts = template_parts(template)
    base_env = dict(env)
    result = EachResult()
    opts.stdin_devnull = True  # items come from our stdin
    # A stop signal between items (the next one awaited from a slow producer, or the last
    # one's lines written) stops the batch as one during an item does: with its summary.
    with deferred_stops() as stops:
        pending = iter(items)
        while True:
            try:
                with interruptible():
                    item = next(pending, None)
            except (Interrupted, ItemsUnreadable) as exc:
                if isinstance(exc, ItemsUnreadable) and reporter is not None:
                    reporter.error(str(exc))
                result.status, result.stopped = exc.exit_code, True
                return result
            if item is None:
                break
            item_env = {**base_env, ENV_ITEM: item}
            try:
                if "\0" in item:  # before its lock is taken: no environment variable holds one
                    raise ValidationError(f"it holds a NUL byte, which ${ENV_ITEM} cannot")
                if isinstance(item, TooLong):
                    raise ValidationError(
                        f"it is longer than ${ENV_ITEM} can hold ({MAX_ITEM} bytes)"
                    )
                run = run_locked(
                    backend,
                    name_bytes(expand(parts, item)),
                    command,
                    opts,
                    env=item_env,
                    reporter=reporter,
                    subreaper=subreaper,
                )
                status, stop_signal, ran = run.status, run.stop_signal, True
            except NotAcquired as exc:
                if skip_locked:
                    result.skipped.append(item)
                    if reporter is not None:
                        reporter.info(f"skipped item {named(item)}: {exc}")
                    continue
                status, stop_signal, ran = EXIT_NOT_ACQUIRED, 0, False
                if reporter is not None:
                    reporter.error(f"item {named(item)}: {exc}")
            except (ValidationError, SpawnError, Unavailable) as exc:
                # A spawn failure can be the item's own: $LOCAL_MUTEX_ITEM too big (E2BIG); a
                # remote that failed one item's take (an answer lost) may well take the next.
                status, stop_signal, ran = exc.exit_code, 0, False
                if reporter is not None:
                    reporter.error(f"item {named(item)}: {exc}")
            except Interrupted as exc:
                result.status, result.stopped = exc.exit_code, True
                return result
            if ran:
                result.ran += 1
            else:
                result.not_run += 1
            if status != 0:
                result.failed.append((item, status))
                if result.first_failure is None:
                    result.first_failure = (item, status)
            stop_signal = stop_signal or next(iter(stops.pending), 0)
            if stop_signal or (status != 0 and not keep_going):
                # A signal to us is a request to stop the whole batch, not one item: even
                # when the item it reached caught it and exited 0.
                result.status, result.stopped = status or 128 + stop_signal, True
                return result
    if result.failed:
        result.status = min(len(result.failed), MAX_EXIT)
    return result


def summary(result: EachResult, seconds: float) -> str:
    text = f"each: {result.ran} item{'s' if result.ran != 1 else ''} ran"
    if result.not_run:
        text += f", {result.not_run} could not run"
    if result.failed:
        item, status = result.first_failure or ("?", 0)
        text += f", {len(result.failed)} failed (first: {named(item)}, exit {status})"
    if result.skipped:
        text += f", {len(result.skipped)} skipped because locked"
    if result.stopped:
        text += ", stopped early"
    return text + f" in {duration(seconds)}"


def each(parsed: Parsed, env: Mapping[str, str] | None = None) -> int:
    env = os.environ if env is None else env
    reporter = reporter_for(parsed, env, only_contended=True)
    start = time.monotonic()
    try:
        wait = parsed.wait()
        if parsed.flag("skip_locked") and wait is None:
            raise UsageError("--skip-locked needs --wait SECONDS or --no-wait")
        template_parts(parsed.positionals[0])
        command, opts = command_of(parsed), options_of(parsed)
    except LocalMutexError as exc:
        return reporter.failure(exc)

    null = parsed.flag("null")

    def work(backend: Backend) -> EachResult:
        return run_each(
            backend,
            read_items(StdinItems(None if STDIN in closed_by_caller else STDIN), null=null),
            parsed.positionals[0],
            command,
            opts,
            keep_going=parsed.flag("keep_going"),
            skip_locked=parsed.flag("skip_locked"),
            env=env,
            reporter=reporter,
            subreaper=True,
        )

    try:
        result = using(parsed, env, reporter, work)
    except Failed as exc:
        return exc.code
    if not parsed.flag("quiet") or result.failed or result.stopped:
        reporter.write(summary(result, time.monotonic() - start))
    return result.status
