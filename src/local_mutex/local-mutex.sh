#!/bin/sh
# LOCAL_MUTEX_CLI points here. Both `sh "$LOCAL_MUTEX_CLI" NAME CMD [DIR]` and
# `"$LOCAL_MUTEX_CLI" NAME CMD [DIR]` run the same CLI as the console script, with the
# interpreter that ran the enclosing local-mutex (LOCAL_MUTEX_PYTHON), else python3.
# -I -S: no site processing and no PYTHON* variables, so a nested call starts faster than
# a bare interpreter; the package's parent directory goes on sys.path inside Python (the
# command's environment stays exactly as the caller had it), and what needs installed
# packages (click for --help, psycopg) loads site itself.
case $0 in
    */*) self=$0 ;;
    *) self=$(command -v -- "$0") || self=$0 ;;
esac
# The package's parent is found from this file's real path: a symlink to it works too.
exec "${LOCAL_MUTEX_PYTHON:-python3}" -I -S -c '
import os, sys
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.realpath(sys.argv.pop(1)))))
from local_mutex.cli import main, run_and_exit
run_and_exit(main)
' "$self" "$@"
