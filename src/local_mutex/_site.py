"""Site processing on demand.

``$LOCAL_MUTEX_CLI`` starts the interpreter with ``-I -S`` (no site processing: a nested
call in a loop starts faster than a bare ``python3``), with this package's parent directory
on sys.path. What needs installed distributions -- click for help and completion, psycopg
for PostgreSQL -- calls ``ensure()`` first.
"""

from __future__ import annotations

import sys


def ensure() -> None:
    if sys.flags.no_site and "site" not in sys.modules:
        import site

        site.main()
