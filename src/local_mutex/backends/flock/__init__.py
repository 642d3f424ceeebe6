"""This machine's locks: flock(2) on files in a lock directory."""
