"""Locks in a PostgreSQL database: session-level advisory locks (``--remote postgresql://``).

The server queues waiters and wakes the next one the moment the holder lets go, and a lock
ends with the session that took it -- the same shape as ``flock(2)``, across machines. The
lock domain is one server and one database. Modules: ``keys`` (name -> bigint key),
``address`` (URL, secrets, driver, drop bound), ``connect`` (connection parameters, a
deadline for connecting, what a failure means), ``session`` (one connection: settings,
heartbeat, end of session), ``record`` (who holds, carried in the session's query text),
``observe`` (holders and waiters from ``pg_locks``), ``waiting`` (progress, stop signals,
refusals), ``slots`` (counting semaphores),
``lock`` (one name), ``backend`` (the domain: status, list, release of holds).
"""
