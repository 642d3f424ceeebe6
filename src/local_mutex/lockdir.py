"""Where lock files live and how they are opened without trusting a shared /tmp."""

from __future__ import annotations

import errno
import os
import stat

from .errors import InvalidLockDir, UnsafeLockFile
from .names import lock_filename, validate_name

# Type-only imports: typing and collections cost a plain run measurable startup time.
TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Mapping

DEFAULT_LOCK_DIR = "/tmp"
ENV_LOCK_DIR = "LOCAL_MUTEX_LOCK_DIR"
ENV_ALLOW_OTHER_OWNER = "LOCAL_MUTEX_ALLOW_OTHER_OWNER"

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
    (``writable=False`` for readers such as ``status``, which never create a file)."""
    path = choose_lock_dir(explicit, env)
    if not os.path.isabs(path):
        raise InvalidLockDir(f"lock dir {path!r} is not an absolute path")
    try:
        st = os.stat(path)
    except FileNotFoundError:
        raise InvalidLockDir(f"lock dir {path!r} does not exist") from None
    except OSError as exc:
        raise InvalidLockDir(f"lock dir {path!r} cannot be used: {exc.strerror}") from None
    if not stat.S_ISDIR(st.st_mode):
        raise InvalidLockDir(f"lock dir {path!r} is not a directory")
    if writable and not os.access(path, os.W_OK | os.X_OK):
        raise InvalidLockDir(f"lock dir {path!r} is not writable")
    return path


def lock_path(name: str | bytes, lock_dir: str | None = None) -> str:
    """The lock file for ``name``; both are validated and resolved as the CLI does."""
    return os.path.join(resolve_lock_dir(lock_dir), lock_filename(validate_name(name)))


def allow_other_owner_from_env(env: Mapping[str, str] | None = None) -> bool:
    value = (os.environ if env is None else env).get(ENV_ALLOW_OTHER_OWNER, "")
    return value.strip().lower() in {"1", "true", "yes"}


def open_lock_file(path: str, *, allow_other_owner: bool = False) -> int:
    """Open (creating if needed) the lock file and return a close-on-exec descriptor.

    Never follows a symlink, never blocks on a FIFO, never unlinks anything. Opening an
    existing file first (no O_CREAT) keeps fs.protected_regular from refusing a file that
    another user created in sticky /tmp; O_EXCL makes the create step race-free.
    """
    while True:
        fd = _open_existing(path)
        if fd is None:
            try:
                # 0o666 is masked by the umask, as for any file the user creates.
                fd = os.open(path, _OPEN_FLAGS | os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o666)
            except FileExistsError:
                continue  # another process created it between our two opens
            except OSError as exc:
                raise _refusal(path, exc) from None
        try:
            _check_opened(fd, path, allow_other_owner)
        except BaseException:
            os.close(fd)
            raise
        return fd


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
    if exc.errno in (errno.EACCES, errno.EPERM, errno.EROFS):
        return InvalidLockDir(f"cannot create lock file {path!r}: {exc.strerror}")
    return UnsafeLockFile(f"lock file {path!r} cannot be opened: {exc.strerror}")


def _check_opened(fd: int, path: str, allow_other_owner: bool) -> None:
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode):
        raise UnsafeLockFile(f"lock file {path!r} is not a regular file; refusing to use it")
    if st.st_uid not in (0, os.geteuid()) and not allow_other_owner:
        raise UnsafeLockFile(
            f"lock file {path!r} is owned by uid {st.st_uid}, another user who could hold it "
            f"forever; pass --allow-other-owner or set {ENV_ALLOW_OTHER_OWNER}=1 to trust it"
        )
