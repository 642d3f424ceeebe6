"""Locks that outlive one command: ``hold`` starts a detached holder process (or, on a git
remote, writes a persistent lock), ``release`` ends it."""
