"""What commands print on stdout: answers (status, list, history, a hold's token), as
text or JSON."""

from __future__ import annotations

import sys

from .._json import dumps
from ..errors import EXIT_IOERR
from .lines import describe_holder, one_line, printable, running

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

    from .lines import Reporter

# The standard streams (by descriptor) the caller had closed (``cmd >&-``): the CLI stands
# /dev/null in for them (so that no file of ours takes their number; the command gets them
# closed, ``Options.closed``), where an answer would be lost unseen; so an answer to a
# closed stdout is an error (74), and ``hold`` refuses to take a hold whose token nobody
# could read.
closed_by_caller: set[int] = set()
STDIN, STDOUT = 0, 1


def out(text: str) -> None:
    """An answer on stdout, byte for byte (names may be any bytes); each of its lines
    stays one line, and none starts a workflow command (``::``: a lock's name can)."""
    text = "\n".join(_inert(printable(line)) for line in text.split("\n"))
    stream = sys.stdout.buffer
    stream.write((text + "\n").encode("utf-8", "surrogateescape"))
    stream.flush()


def _inert(line: str) -> str:
    return line.replace("::", "\\x3a:", 1) if line.lstrip().startswith("::") else line


def out_json(value: Any) -> None:
    out(dumps(value))


def answer(text: str, status: int, reporter: Reporter) -> int:
    """Print an answer (``out``) and return the exit status it leaves: ``status`` once it
    is written -- or once its reader went away (EPIPE: ``| head -1``, ``| grep -q``
    stopped reading on purpose, as ripgrep or ``ls`` take it, and ``status`` keeps its
    free/held verdict) -- else 74: a full disk or an I/O error lost an answer someone
    meant to keep, which must not pass for one (an empty ``status --json >file``). So is
    a stdout the caller closed (``>&-``): the answer would go to the /dev/null standing in."""
    if STDOUT in closed_by_caller:
        reporter.error("could not write the answer to standard output (closed by the caller)")
        return EXIT_IOERR
    try:
        out(text)
    except BrokenPipeError:
        return status
    except (OSError, ValueError, AttributeError) as exc:  # AttributeError: no stdout at all
        why = getattr(exc, "strerror", None) or type(exc).__name__
        reporter.error(f"could not write the answer to standard output ({why})")
        return EXIT_IOERR
    return status


def answer_json(value: Any, status: int, reporter: Reporter) -> int:
    return answer(dumps(value), status, reporter)


def describe_status(st: dict[str, Any], asked: str | None) -> str:
    """The human form of one status object (the same data as ``--json``)."""
    label = printable(str(st.get("name") or asked or "(unnamed)"))
    if st.get("slot") is not None:
        label += f" [slot {st['slot']}]"
    lines = []
    slots = st.get("slots") or []
    if st["state"] == "free" and slots:
        # Slots (files here, keys on a server) come as callers use them: their count is
        # no caller's N.
        unit = "slot" if st["method"] == "server" else "slot file"
        files = f"{len(slots)} {unit}{'s' if len(slots) != 1 else ''}"
        in_use = st.get("slots_in_use", 0)
        line = f"{label}: plain lock free; slots held: {in_use} of {files}"
        if in_use == len(slots):  # status --slots then says 1, whatever N callers give
            line += f" (a --slots N caller waits if N <= {len(slots)})"
        lines.append(line)
    elif st["state"] == "free":
        lines.append(f"{label}: free")
    elif st["state"] == "held":
        holders = st["holders"]
        mode = f" ({st['mode']})" if st.get("mode") else ""
        if holders:
            who = "; ".join(describe_holder(h) for h in holders)
            lines.append(f"{label}: held{mode} by {who}")
        else:
            lines.append(f"{label}: held{mode}")
    else:
        lines.append(f"{label}: cannot tell")
    # ``lock_file`` (its JSON name) is a file here, a branch on git, a key on a server.
    where = {"git": "branch", "server": "lock"}.get(st["method"], "lock file")
    lines.append(f"  {where}: {printable(st['lock_file'])}")
    if st["method"] == "probe":
        lines.append(
            "  (probed without /proc/locks: a holder shows only as its record names it; "
            "other holders and waiters unknown)"
        )
    for index, slot in enumerate(slots):
        who = "; ".join(describe_holder(h) for h in slot["holders"]) or slot["state"]
        lines.append(f"    slot {index}: {who}")
    waiters = st.get("waiters") or []
    if waiters:
        lines.append(f"  waiting: {len(waiters)}")
        for w in waiters:
            since = f", started {w['started']}" if w.get("started") else ""
            host = f" on {printable(str(w['host']))}" if w.get("host") else ""
            lines.append(
                f"    {w['position']}. pid {w['pid']}{host} {w['mode']}{since}: "
                f"{printable(str(w.get('command') or '?'))}"
            )
    return "\n".join(lines)


FIELDS = ("time", "event", "actor", "message")


def describe_history(rows: list[dict[str, Any]], name: str, where: str) -> str:
    if not rows:
        return f"{name}: no history on {where}"
    lines = []
    for row in rows:
        time, event, actor, message = (printable(str(row[k] or "")) for k in FIELDS)
        host = f" on {printable(str(row['host']))}" if row.get("host") else ""
        said = [message] if message else []
        said += running(row.get("command"), row.get("cwd"))  # a run's, as its holder's
        if row.get("error"):  # a commit whose body could not be trusted: its first line only
            said.append(f"body not read: {one_line(str(row['error']), 400)}")
        lines.append(f"{time}  {event:<8} {actor}{host}" + (": " + ", ".join(said) if said else ""))
    return "\n".join(lines)
