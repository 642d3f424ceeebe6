"""``status``, ``list`` and ``history``: look, print, pick the exit code. Click-free, so a
dashboard polling ``local-mutex status NAME`` costs little more than a plain run."""

from __future__ import annotations

import os

from ..errors import CannotTell, Unavailable, UnsafeLockFile
from ..names import name_bytes
from ..ui.output import answer, answer_json, describe_history, describe_status
from . import Failed, reporter_for, using

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Mapping

    from .argv import Parsed

EXIT_FREE, EXIT_HELD = 0, 1


def _cannot_tell(exc: BaseException) -> BaseException:
    """A remote that cannot be reached leaves the question open: exit 3, not 69."""
    return CannotTell(str(exc)) if isinstance(exc, Unavailable) else exc


def status(parsed: Parsed, env: Mapping[str, str] | None = None) -> int:
    """Exit 0 free, 1 held (with ``--slots``: every slot), 3 cannot tell, 2 bad input, 74 the
    answer not written."""
    env = os.environ if env is None else env
    reporter = reporter_for(parsed, env)
    name = parsed.positionals[0]
    try:
        st = using(
            parsed,
            env,
            reporter,
            lambda b: b.status(name_bytes(name)),
            reading=True,
            translate=_cannot_tell,
        )
    except Failed as exc:
        return exc.code
    # --slots asks about the name's counting semaphore, a lock apart from the plain one.
    slots = len(st.slots) + len(st.refused_slots) if parsed.flag("slotted") else None
    data = st.as_dict()
    try:
        busy = st.busy(slots)  # UnsafeLockFile: a slot file that `--slots` runs refuse
    except UnsafeLockFile as exc:
        return reporter.failure(exc)
    for why in st.refused_slots:  # the plain lock is answered for, with a warning
        reporter.warning(f"{why}; slot not counted")
    if st.state not in ("free", "held"):
        verdict = CannotTell.exit_code
    else:
        verdict = EXIT_HELD if busy else EXIT_FREE
    if parsed.flag("quiet"):  # as grep -q: the exit status is the answer
        return verdict
    if parsed.flag("json"):
        return answer_json(data, verdict, reporter)
    return answer(describe_status(data, name), verdict, reporter)


def list_(parsed: Parsed, env: Mapping[str, str] | None = None) -> int:
    env = os.environ if env is None else env
    reporter = reporter_for(parsed, env)
    include_free = parsed.flag("include_free")
    try:
        listed = using(
            parsed,
            env,
            reporter,
            lambda b: (b.list_locks(include_free=include_free), b.unlisted),
            reading=True,
            translate=_cannot_tell,
        )
    except Failed as exc:
        return exc.code
    found, unlisted = listed
    for why in unlisted:
        reporter.warning(why)
    if parsed.flag("quiet"):
        return 0
    if parsed.flag("json"):
        return answer_json([s.as_dict() for s in found], 0, reporter)
    if not found:
        return answer("no lock files" if include_free else "no held locks", 0, reporter)
    return answer("\n".join(describe_status(s.as_dict(), None) for s in found), 0, reporter)


def history(parsed: Parsed, env: Mapping[str, str] | None = None) -> int:
    env = os.environ if env is None else env
    reporter = reporter_for(parsed, env)
    name = parsed.positionals[0]
    try:
        where, rows = using(
            parsed,
            env,
            reporter,
            lambda b: (b.address, b.history(name_bytes(name))),
            reading=True,
        )
    except Failed as exc:
        return exc.code
    if parsed.flag("quiet"):
        return 0
    if parsed.flag("json"):
        return answer_json(rows, 0, reporter)
    return answer(describe_history(rows, name, where), 0, reporter)
