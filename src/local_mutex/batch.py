"""``each``: one command per item, each under its own lock, all in one process.

A sweep over thousands of keys pays one interpreter start, not one per key. Items never
reach the shell text: the command reads its item from $LOCAL_MUTEX_ITEM.
"""

from __future__ import annotations

import os

from .errors import Interrupted, NotAcquired, ValidationError
from .names import display, name_bytes
from .notices import duration

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Iterable, Iterator, Mapping

    from .notices import Reporter

ENV_ITEM = "LOCAL_MUTEX_ITEM"
MAX_EXIT = 125


class InvalidTemplate(ValidationError):
    """A ``{`` or ``}`` in the template that is neither ``{}`` nor doubled."""


def parse_template(template: str) -> list[str | None]:
    """Split into literal parts and ``None`` placeholders; ``{{``/``}}`` are literal braces."""
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


def expand(parts: list[str | None], item: str) -> str:
    return "".join(item if part is None else part for part in parts)


def read_items(stream: Iterable[bytes] | object, *, null: bool) -> Iterator[str]:
    """Items from a binary stream: lines (or NUL-separated), empty ones skipped."""
    buffer = b""
    sep = b"\0" if null else b"\n"
    read = stream.read1 if hasattr(stream, "read1") else stream.read  # type: ignore[attr-defined]
    while True:
        chunk = read(65536)
        if not chunk:
            break
        buffer += chunk
        *items, buffer = buffer.split(sep)
        for raw in items:
            yield from _item(raw, null)
    yield from _item(buffer, null)


def _item(raw: bytes, null: bool) -> Iterator[str]:
    if not null and raw.endswith(b"\r"):
        raw = raw[:-1]
    if raw:
        yield display(raw)


class EachResult:
    __slots__ = ("failed", "first_failure", "ran", "skipped", "status", "stopped")

    def __init__(self) -> None:
        self.ran = 0
        self.failed: list[tuple[str, int]] = []
        self.skipped: list[str] = []
        self.first_failure: tuple[str, int] | None = None
        self.status = 0
        self.stopped = False


def run_each(
    items: Iterable[str],
    template: str,
    command: str,
    *,
    keep_going: bool = False,
    skip_locked: bool = False,
    lock_dir: str | None = None,
    wait: float | None = None,
    timeout: float | None = None,
    kill_after: float = 5.0,
    shared: bool = False,
    slots: int | None = None,
    allow_other_owner: bool | None = None,
    env: Mapping[str, str] | None = None,
    reporter: Reporter | None = None,
) -> EachResult:
    """Run ``command`` once per item under the lock named by ``template``."""
    from .names import validate_command
    from .wrap import run_locked

    validate_command(command)
    parts = parse_template(template)
    base_env = dict(os.environ if env is None else env)
    result = EachResult()
    for item in items:
        name = expand(parts, item)
        item_env = {**base_env, ENV_ITEM: item}
        try:
            run = run_locked(
                command,
                name_bytes(name),
                lock_dir=lock_dir,
                wait=wait,
                timeout=timeout,
                kill_after=kill_after,
                shared=shared,
                slots=slots,
                allow_other_owner=allow_other_owner,
                env=item_env,
                reporter=reporter,
                stdin_devnull=True,
            )
            status = run.status
            signalled = run.signalled
        except NotAcquired as exc:
            if skip_locked:
                result.skipped.append(item)
                if reporter is not None:
                    reporter.write(f"skipped item {item!r}: {exc}")
                continue
            status, signalled = 75, False
            if reporter is not None:
                reporter.error(f"item {item!r}: {exc}")
        except ValidationError as exc:
            status, signalled = 2, False
            if reporter is not None:
                reporter.error(f"item {item!r}: {exc}")
        except Interrupted as exc:
            result.status, result.stopped = 128 + exc.signum, True
            return result
        result.ran += 1
        if status != 0:
            result.failed.append((item, status))
            if result.first_failure is None:
                result.first_failure = (item, status)
            if signalled or not keep_going:
                # A signal to us is a request to stop the whole batch, not one item.
                result.status, result.stopped = status, True
                return result
    if result.failed:
        result.status = min(len(result.failed), MAX_EXIT)
    return result


def summary(result: EachResult, seconds: float) -> str:
    text = f"each: {result.ran} item{'s' if result.ran != 1 else ''} ran"
    if result.failed:
        item, status = result.first_failure or ("?", 0)
        text += f", {len(result.failed)} failed (first: {item!r}, exit {status})"
    if result.skipped:
        text += f", {len(result.skipped)} skipped because locked"
    if result.stopped:
        text += ", stopped early"
    return text + f" in {duration(seconds)}"
