"""Processes: the keeper (the caller's process), the supervisor (its forked child) and the
command (the supervisor's child, in its own process group)."""
