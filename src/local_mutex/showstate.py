"""``status`` and ``list`` as commands: look, print, pick the exit code. Click-free, so a
dashboard polling ``local-mutex status NAME`` costs little more than a plain run."""

from __future__ import annotations

import sys

from .errors import CannotTell, ValidationError
from .lockstate import list_locks, status
from .notices import Reporter, describe_holder
from .record import dump_json

EXIT_FREE, EXIT_HELD, EXIT_USAGE, EXIT_CANNOT_TELL = 0, 1, 2, 3

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any


def describe_status(st: dict[str, Any], asked: str | None) -> str:
    """The human form of one status object (the same data as ``--json``)."""
    label = st.get("name") or asked or "(unnamed)"
    if st.get("slot") is not None:
        label += f" [slot {st['slot']}]"
    lines = []
    slots = st.get("slots") or []
    if st["state"] == "free" and slots:
        lines.append(f"{label}: {st.get('slots_in_use', 0)} of {len(slots)} slots in use")
    elif st["state"] == "free":
        lines.append(f"{label}: free")
    elif st["state"] == "held":
        holders = st["holders"]
        mode = st.get("mode") or "held"
        if holders:
            who = "; ".join(describe_holder(h) for h in holders)
            lines.append(f"{label}: held ({mode}) by {who}")
        else:
            lines.append(f"{label}: held ({mode})")
    else:
        lines.append(f"{label}: cannot tell")
    lines.append(f"  lock file: {st['lock_file']}")
    if st["method"] == "probe":
        lines.append("  (probed without /proc/locks: holder details and waiters unknown)")
    if slots:
        for index, slot in enumerate(slots):
            who = "; ".join(describe_holder(h) for h in slot["holders"]) or slot["state"]
            lines.append(f"    slot {index}: {who}")
    waiters = st.get("waiters") or []
    if waiters:
        lines.append(f"  waiting: {len(waiters)}")
        for w in waiters:
            since = f", started {w['started']}" if w.get("started") else ""
            lines.append(
                f"    {w['position']}. pid {w['pid']} {w['mode']}{since}: {w.get('command') or '?'}"
            )
    return "\n".join(lines)


def _print(text: str) -> None:
    out = sys.stdout.buffer
    out.write((text + "\n").encode("utf-8", "surrogateescape"))
    out.flush()


def _failure(exc: ValidationError | CannotTell) -> int:
    Reporter().error(str(exc))
    return EXIT_USAGE if isinstance(exc, ValidationError) else EXIT_CANNOT_TELL


def show_status(name: str, lock_dir: str | None, as_json: bool) -> int:
    try:
        st = status(name, lock_dir)
    except (ValidationError, CannotTell) as exc:
        return _failure(exc)
    data = st.as_dict()
    _print(dump_json(data) if as_json else describe_status(data, name))
    return {"free": EXIT_FREE, "held": EXIT_HELD}.get(st.state, EXIT_CANNOT_TELL)


def show_list(lock_dir: str | None, as_json: bool, include_free: bool) -> int:
    try:
        found = list_locks(lock_dir, include_free=include_free)
    except (ValidationError, CannotTell) as exc:
        return _failure(exc)
    if as_json:
        _print(dump_json([s.as_dict() for s in found]))
    elif not found:
        _print("no lock files" if include_free else "no held locks")
    else:
        _print("\n".join(describe_status(s.as_dict(), None) for s in found))
    return 0


def quick_parse(args: list[str], flags: frozenset[str]) -> tuple[list[str], dict[str, Any]] | None:
    """Parse ``[--lock-dir DIR] [FLAGS] POSITIONALS`` without click, or None when the line
    needs the full parser (help, an unknown option, a malformed value)."""
    positional: list[str] = []
    options: dict[str, Any] = {}
    i = 0
    while i < len(args):
        arg = args[i]
        if arg == "--":
            positional.extend(args[i + 1 :])
            break
        if arg == "--lock-dir" and i + 1 < len(args):
            options["lock_dir"] = args[i + 1]
            i += 2
            continue
        if arg.startswith("--lock-dir="):
            options["lock_dir"] = arg.split("=", 1)[1]
        elif arg in flags:
            options[arg] = True
        elif arg.startswith("-") and arg != "-":
            return None
        else:
            positional.append(arg)
        i += 1
    return positional, options
