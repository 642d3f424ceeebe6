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
# The package's parent: next to this file as called (a tree of symlinked files keeps the
# package there), else next to its real path (a symlink to this file from elsewhere).
exec "${LOCAL_MUTEX_PYTHON:-python3}" -I -S -c '
try:  # a Ctrl-C before our handlers (importing os is work too): 130, no traceback
    import os, sys
    if sys.version_info < (3, 9):  # an interpreter older than ours: say so, no traceback
        sys.stderr.write("local-mutex: needs Python >= 3.9, %s is %s; set"
                         " LOCAL_MUTEX_PYTHON to a newer one\n"
                         % (sys.executable, sys.version.split()[0]))
        raise SystemExit(2)
    here = sys.argv.pop(1)
    parent = os.path.dirname(os.path.dirname(os.path.abspath(here)))
    if not os.path.isdir(os.path.join(parent, "local_mutex")):
        parent = os.path.dirname(os.path.dirname(os.path.realpath(here)))
    sys.path.insert(0, parent)
    from local_mutex.cli import main, run_and_exit
except KeyboardInterrupt:  # SystemExit prints none
    raise SystemExit(130)
run_and_exit(main)
' "$self" "$@"
