"""Locks on a git remote, in lock-action's protocol: a branch per lock, CAS pushes, leases."""
