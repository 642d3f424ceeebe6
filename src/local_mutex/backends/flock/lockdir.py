"""Where lock files live and how they are opened without trusting a shared /tmp."""

from __future__ import annotations

import errno
import os
import stat
import sys
import time

from ..._json import dumps
from ...errors import InvalidLockDir, UnsafeLockFile

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable, Mapping
    from typing import Any

    from .lock import FlockLock

DEFAULT_LOCK_DIR = "/tmp"
ENV_LOCK_DIR = "LOCAL_MUTEX_LOCK_DIR"
ENV_ALLOW_OTHER_OWNER = "LOCAL_MUTEX_ALLOW_OTHER_OWNER"
# Exactly this mode whatever the umask: others may open the file read-only to take the lock
# (flock works on any descriptor), but only its owner may rewrite the holder record in it.
FILE_MODE = 0o644


def new_file_mark(path: str) -> bytes:
    """What a new lock file holds until its first taker looked for a lock still held on a
    file deleted from the path (``predecessor``): any content makes a taker look, and clear
    it. It names the lock file: a new file renamed away is known by it (``recorded_path``)."""
    message = "a new lock file: its first taker looks for a lock still held on a file deleted"
    rec = {"v": 1, "message": f"{message} from here", "lock_file": as_proc_names_it(path)}
    return (dumps(rec) + "\n").encode("ascii")


# O_NONBLOCK keeps a planted FIFO from hanging the open; it has no effect on regular files
# and none on flock(), which takes its own LOCK_NB flag.
_OPEN_FLAGS = os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK


def choose_lock_dir(explicit: str | None, env: Mapping[str, str] | None = None) -> str:
    """Explicit value > LOCAL_MUTEX_LOCK_DIR > /tmp; an empty string counts as unset."""
    if explicit:
        return explicit
    from_env = (os.environ if env is None else env).get(ENV_LOCK_DIR, "")
    return from_env or DEFAULT_LOCK_DIR


def resolve_lock_dir(
    explicit: str | None, env: Mapping[str, str] | None = None, *, writable: bool = True
) -> str:
    """The lock directory to use, checked: absolute, an existing directory, writable
    (``writable=False`` for readers such as ``status``, which never create a file).
    The wording matches what existing log searches look for."""
    path = choose_lock_dir(explicit, env)
    try:
        return _checked(path, writable)
    except InvalidLockDir as exc:
        if explicit or path == DEFAULT_LOCK_DIR:
            raise
        raise InvalidLockDir(f"{exc} (from ${ENV_LOCK_DIR})") from None  # not typed here


def _checked(path: str, writable: bool) -> str:
    if not os.path.isabs(path):
        raise InvalidLockDir(f"lock dir {path!r} must be an absolute path")
    try:
        st = os.stat(path)
    except OSError as exc:
        why = "" if exc.errno in (errno.ENOENT, errno.ENOTDIR) else f" ({exc.strerror})"
        raise InvalidLockDir(
            f"lock dir {path!r} does not exist or is not a directory{why}"
        ) from None
    if not stat.S_ISDIR(st.st_mode):
        raise InvalidLockDir(f"lock dir {path!r} does not exist or is not a directory")
    if writable and not os.access(path, os.W_OK | os.X_OK):
        # Without search (x) a writable dir takes no file either: say which bit is missing.
        lacks = " or ".join(
            what
            for flag, what in ((os.W_OK, "write (w)"), (os.X_OK, "search (x)"))
            if not os.access(path, flag)
        )
        raise InvalidLockDir(f"lock dir {path!r} is not writable: no {lacks} permission for us")
    return path


def allow_other_owner_from_env(env: Mapping[str, str] | None = None) -> bool:
    value = (os.environ if env is None else env).get(ENV_ALLOW_OTHER_OWNER, "")
    return value.strip().lower() in {"1", "true", "yes"}


def open_lock_file(path: str, *, allow_other_owner: bool = False) -> int:
    """Open (creating if needed) the lock file and return a close-on-exec descriptor."""
    return open_or_create(path, allow_other_owner=allow_other_owner)[0]


def open_or_create(path: str, *, allow_other_owner: bool = False) -> tuple[int, bool]:
    """Open (creating if needed) the lock file: a close-on-exec descriptor, and whether we
    created it. A tmp cleaner may have deleted a held one: so a new file appears with a mark
    in it (``new_file_mark``), and whoever takes it first, we or not, asks the kernel
    (``predecessor``) -- where a file can appear at the path ready-made (Linux).

    Never follows a symlink, never blocks on a FIFO, never unlinks a lock file (only what a
    creator killed mid-creation left beside one: ``_sweep_temps``). Opening an
    existing file first (no O_CREAT) keeps fs.protected_regular from refusing a file that
    another user created in sticky /tmp; O_EXCL makes the create step race-free.
    """
    while True:
        fd = _open_existing(path)
        created = fd is None
        if fd is None:
            try:  # marked from its first instant: whoever takes it first looks (``predecessor``)
                fd = create_exclusive(path, lambda new: _mark_new(new, path))
            except OSError as exc:
                raise _refusal(path, exc) from None
            if fd is None:
                if not os.path.isdir(os.path.dirname(path) or "."):
                    gone = FileNotFoundError(errno.ENOENT, os.strerror(errno.ENOENT))
                    raise _refusal(path, gone) from None
                continue  # another process created it between our two opens
        try:
            if check_opened(fd, path, allow_other_owner):
                return fd, created
        except BaseException:
            os.close(fd)
            raise
        os.close(fd)  # unlinked between open and check: open what is there now


def create_exclusive(path: str, prepare: Callable[[int], object] | None = None) -> int | None:
    """A fresh lock file at ``path`` (None if something is already there, or its directory
    is gone); OSError if it cannot be created (out of descriptors, disk full, read-only).
    ``prepare`` (lock it, write its record) runs on the file returned: before it appears at
    the path where the system can rename without replacing (Linux), so that no newcomer can
    take it in the instant between its creation and its lock; elsewhere just after."""
    if prepare is not None:
        for _ in range(_VANISHED_TRIES):
            fd = _create_renamed(path, prepare)
            if fd is not _VANISHED:
                break
        if fd is not _UNSUPPORTED and fd is not _VANISHED:
            return fd
    fd = _open_new(path)
    if fd is not None:
        try:
            os.fchmod(fd, FILE_MODE)
        except OSError:
            pass
        if prepare is not None:  # the file the caller gets is the one prepared, always
            try:
                prepare(fd)
            except BaseException:
                os.close(fd)
                raise
    return fd


def _open_new(path: str) -> int | None:
    """A new file at ``path`` (O_EXCL); None if something is there or the directory is
    gone. A directory that is there yet answers "no such file" takes no new files (/proc):
    that is an error, or the caller would look again forever."""
    try:
        return os.open(path, _OPEN_FLAGS | os.O_RDWR | os.O_CREAT | os.O_EXCL, FILE_MODE)
    except FileExistsError:
        return None
    except FileNotFoundError:
        if os.path.isdir(os.path.dirname(path) or "."):
            raise
        return None


_UNSUPPORTED = -1
_VANISHED = -2  # our prepared file deleted before its rename
# Prepared files deleted before their rename, one after another, before the plain way is
# taken (prepared just after it appears): a cleaner that deletes every new file at once
# must not keep a caller trying for ever.
_VANISHED_TRIES = 8


def _mark_new(fd: int, path: str) -> None:
    try:
        if not os.fstat(fd).st_size:  # visible before its mark (no rename): a taker's record
            os.pwrite(fd, new_file_mark(path), 0)
    except OSError:  # a full disk, a file size limit: unmarked, only its creator looks
        pass


_RENAME_NOREPLACE = 1  # renameat2(2): fail with EEXIST rather than replace


def _create_renamed(path: str, prepare: Callable[[int], object]) -> int | None:
    """``create_exclusive`` by a file of our own beside the path, prepared, then renamed to
    the path unless something is there (``renameat2``; ``_UNSUPPORTED`` where the C library
    or the file system has no such rename). A rename moves the file's name with it, so its
    holders' ``/proc/PID/fd`` links name the lock path, as ``status`` reads them."""
    rename = _renameat2()
    if rename is None:
        return _UNSUPPORTED
    directory, base = os.path.split(path)
    temp = os.path.join(directory, f".{base}.{os.urandom(6).hex()}")
    fd = _open_new(temp)
    if fd is None:
        return None  # the directory is gone (or that name taken): the caller looks again
    try:
        try:
            os.fchmod(fd, FILE_MODE)
        except OSError:
            pass
        prepare(fd)
        renamed = rename(temp, path)
    except BaseException:
        _discard(temp, fd)
        raise
    if renamed:
        _sweep_temps(directory, base)
        return fd
    # Our file deleted before its rename (a tmp cleaner): not a file system without the
    # rename -- try again (``create_exclusive``), with no instant unprepared at the path.
    vanished = not os.path.lexists(temp)
    _discard(temp, fd)
    if os.path.lexists(path):
        return None  # somebody created a file there first: the caller looks again
    if vanished:
        return _VANISHED
    return _UNSUPPORTED  # a file system without it (or the directory went: the usual way says)


# A file of ours beside the path older than this was left by a creator killed before its
# rename (the step takes microseconds; one stopped there renames or falls back unharmed).
_TEMP_LEFT_AFTER = 60.0


def _sweep_temps(directory: str, base: str) -> None:
    """Remove what creators of this lock file killed mid-creation left: our own
    ``.<base>.<hex>`` files, past ``_TEMP_LEFT_AFTER``. Only when a new file is created."""
    prefix = f".{base}."
    now = time.time()
    try:
        with os.scandir(directory or ".") as entries:
            for entry in entries:
                name = entry.name
                if not name.startswith(prefix) or len(name) != len(prefix) + 12:
                    continue
                st = entry.stat(follow_symlinks=False)
                if (
                    stat.S_ISREG(st.st_mode)
                    and st.st_uid == os.geteuid()
                    and now - st.st_mtime > _TEMP_LEFT_AFTER
                ):
                    os.unlink(entry.path)
    except OSError:
        pass  # tidying only: a file gone meanwhile, a directory we may not list


def _discard(temp: str, fd: int) -> None:
    try:
        os.unlink(temp)  # our own file, never at a lock path
    except OSError:
        pass
    os.close(fd)


def _renameat2() -> Callable[[str, str], bool] | None:
    """renameat2(..., RENAME_NOREPLACE) through the C half of ctypes (``import ctypes`` costs
    a couple of milliseconds), as a function that says whether it renamed."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        import _ctypes

        c: Any = _ctypes
        address = c.dlsym(c.dlopen(None, 2), "renameat2")
    except (AttributeError, ImportError, OSError):
        return None  # a C library without it (glibc < 2.28)
    at_fdcwd = -100

    def rename(old: str, new: str) -> bool:
        args = (at_fdcwd, os.fsencode(old), at_fdcwd, os.fsencode(new), _RENAME_NOREPLACE)
        return bool(c.call_function(address, args) == 0)

    return rename


def _open_existing(path: str) -> int | None:
    for mode in (os.O_RDWR, os.O_RDONLY):
        try:
            return os.open(path, _OPEN_FLAGS | mode)
        except FileNotFoundError:
            return None
        except PermissionError:
            continue  # flock() works on a read-only descriptor too
        except OSError as exc:
            raise _refusal(path, exc) from None
    raise UnsafeLockFile(f"lock file {path!r} cannot be opened: permission denied")


def _refusal(path: str, exc: OSError) -> Exception:
    if exc.errno == errno.ELOOP:
        return UnsafeLockFile(f"lock file {path!r} is a symlink; refusing to follow it")
    if exc.errno == errno.EISDIR:  # as status says it (refusal_for)
        return UnsafeLockFile(f"lock file {path!r} is not a regular file; refusing to use it")
    if exc.errno in (errno.EACCES, errno.EPERM, errno.EROFS):
        return InvalidLockDir(f"cannot create lock file {path!r}: {exc.strerror}")
    if exc.errno in (errno.ENOSPC, errno.EDQUOT):  # as a holder record that cannot be written
        from ...errors import NoRoom

        return NoRoom(f"cannot create lock file {path!r}: {exc.strerror}")
    where = os.path.dirname(path)
    if exc.errno in (errno.ENOENT, errno.ENOTDIR) and not os.path.isdir(where):
        # The directory went away after it was checked (a tmp cleaner, a rename).
        return InvalidLockDir(f"lock dir {where!r} does not exist or is not a directory")
    if exc.errno == errno.ENOENT:  # there, but it takes no new files (/proc)
        return InvalidLockDir(
            f"cannot create lock file {path!r}: lock dir {where!r} takes no new files"
        )
    return UnsafeLockFile(f"lock file {path!r} cannot be opened: {exc.strerror}")


def ours_or_roots(st: os.stat_result) -> bool:
    """A regular file the caller or root owns: the only one whose lock or record tells
    anything of ours (anybody else could plant one, deleted or renamed, naming our path)."""
    return stat.S_ISREG(st.st_mode) and st.st_uid in (0, os.geteuid())


def refusal_for(st: os.stat_result, path: str, allow_other_owner: bool) -> UnsafeLockFile | None:
    """Why a lock file with these stats must not be used, or None when it may be."""
    if stat.S_ISLNK(st.st_mode):
        return UnsafeLockFile(f"lock file {path!r} is a symlink; refusing to follow it")
    if not stat.S_ISREG(st.st_mode):
        return UnsafeLockFile(f"lock file {path!r} is not a regular file; refusing to use it")
    if st.st_nlink > 1:
        return UnsafeLockFile(
            f"lock file {path!r} has {st.st_nlink} links, so it may be someone else's file; "
            "refusing to write to it"
        )
    if st.st_uid not in (0, os.geteuid()) and not allow_other_owner:
        return UnsafeLockFile(
            f"lock file {path!r} is owned by uid {st.st_uid}, another user who could hold it "
            f"forever; pass --allow-other-owner or set {ENV_ALLOW_OTHER_OWNER}=1 to trust it"
        )
    return None


def check_opened(fd: int, path: str, allow_other_owner: bool) -> bool:
    """Raise if the opened file must not be used; False if it was unlinked meanwhile."""
    st = os.fstat(fd)
    if st.st_nlink == 0 and stat.S_ISREG(st.st_mode):
        return False
    refusal = refusal_for(st, path, allow_other_owner)
    if refusal is not None:
        raise refusal
    return True


def file_id(fd: int) -> tuple[int, int]:
    """The file open on ``fd``, whatever its path now: (device, inode)."""
    st = os.fstat(fd)
    return st.st_dev, st.st_ino


def cannot_put_back(lock: FlockLock, exc: OSError) -> str | None:
    """Said once per cause (out of descriptors, disk full, read-only): we look again every
    tick, and may well succeed later."""
    if lock.cannot_create == exc.errno:
        return None
    lock.cannot_create = exc.errno
    # Out of descriptors is ours alone; a disk full or a read-only mount stops a newcomer too.
    risk = "a newcomer can take the lock" if exc.errno == errno.EMFILE else "it keeps trying"
    return (
        f"lock file {lock.path!r} of {lock.label} was deleted or renamed while held, and pid "
        f"{os.getpid()} cannot put one back ({exc.strerror}): until it can, {risk}"
    )


def as_proc_names_it(path: str) -> str:
    """The lock path as a holder's /proc/PID/fd link spells it (and its record, for a file
    renamed away): the lock dir's symlinks resolved."""
    return os.path.join(os.path.realpath(os.path.dirname(path)), os.path.basename(path))


def is_file_at(path: str, fd: int) -> bool:
    """Does ``path`` name the file open on ``fd`` (another link to it may exist)?"""
    try:
        st = os.stat(path, follow_symlinks=False)
    except OSError:
        return False
    return (st.st_dev, st.st_ino) == file_id(fd)


def names_inode(path: str, fd: int) -> bool:
    """Does ``path`` still name the file open on ``fd``, with no other link to it?"""
    try:
        st = os.stat(path, follow_symlinks=False)
    except OSError:
        return False
    mine = os.fstat(fd)
    return (st.st_dev, st.st_ino) == (mine.st_dev, mine.st_ino) and mine.st_nlink == 1
