"""Site processing on demand.

``$LOCAL_MUTEX_CLI`` starts the interpreter with ``-I -S`` (no site processing: a nested
call in a loop starts faster than a bare ``python3``), with this package's parent directory
on sys.path. What needs installed distributions -- click for help and completion, psycopg
for PostgreSQL -- calls ``ensure()`` first.
"""

from __future__ import annotations

import os
import sys


def ensure() -> None:
    if sys.flags.no_site and "site" not in sys.modules:
        import site

        site.main()
    deps = _install_deps()
    if deps is not None and deps not in sys.path:
        sys.path.insert(0, deps)


def _install_deps() -> str | None:
    """This interpreter's click, in an install the action's bootstrap made: in
    ``<install>/deps/<cache tag>`` beside ``<install>/lib/local_mutex``, one per interpreter
    (a click that 3.13 installed may be a SyntaxError to 3.9). ``setup/bootstrap_click.py``
    puts it there."""
    install = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    impl = sys.implementation
    tag = impl.cache_tag or f"{impl.name}-{sys.version_info[0]}{sys.version_info[1]}"
    deps = os.path.join(install, "deps", tag)
    if os.path.isfile(os.path.join(install, ".complete")) and os.path.isdir(deps):
        return deps
    return None
