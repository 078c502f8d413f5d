"""Opening a file to write that a person named, the log (appended, in the traced process) and report's
-o (replaced) alike: no symlink followed, no FIFO waited on, 0600 when new, never another user's file,
never the file being read.

Imported at start-up by the traced process (tracing/sink.py opens the log here): the standard library
only, and nothing beyond errno, os and stat, which the sink needs anyway.
"""

import errno
import os
import stat

# Never follow a symlink, never wait on a FIFO's reader, never hand the descriptor to a child.
_FLAGS = os.O_WRONLY | os.O_CLOEXEC | os.O_NOFOLLOW | os.O_NONBLOCK
_LOG_FLAGS = _FLAGS | os.O_APPEND | os.O_CREAT
_OPEN_ERRORS = {errno.ELOOP: "it is a symbolic link", errno.ENXIO: "it is a FIFO or a socket"}
_KINDS = {
    stat.S_IFIFO: "a FIFO",
    stat.S_IFCHR: "a device",
    stat.S_IFBLK: "a device",
    stat.S_IFSOCK: "a socket",
}


class UnsafeFile(Exception):
    """Why a path was not opened: one line for a person, the path first."""


def open_for_writing(path: str, keep: "tuple[os.stat_result, ...]" = ()) -> int:
    """A descriptor on PATH, emptied, to write a new content to; a new file is created with mode 0600.

    Refused (UnsafeFile): a symbolic link at PATH (another user's, in a shared folder, would have us
    write through it), anything but a regular file (a FIFO would block, a device take the text), a
    file another user owns, and a file that is one of KEEP (the stat of a file being read: writing
    the report over its own log would destroy it). The file is emptied only once it passed.
    """
    created = True
    try:
        fd = os.open(path, _FLAGS | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
        created = False
        try:
            fd = os.open(path, _FLAGS)
        except OSError as error:
            raise UnsafeFile(f"{path}: {_why(error)}") from None
    except OSError as error:
        raise UnsafeFile(f"{path}: {_why(error)}") from None
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise UnsafeFile(f"{path}: not a regular file ({refusal(info)}); choose a file")
        if any(info.st_dev == other.st_dev and info.st_ino == other.st_ino for other in keep):
            raise UnsafeFile(f"{path}: it is the file being read; writing there would destroy it")
        why = refusal(info)
        if why is not None:
            raise UnsafeFile(f"{path}: {why}; choose another file")
        if created:
            os.fchmod(fd, 0o600)  # whatever the umask
        os.set_blocking(fd, True)
        os.ftruncate(fd, 0)
    except UnsafeFile:
        os.close(fd)
        raise
    except OSError as error:
        os.close(fd)
        raise UnsafeFile(f"{path}: {_why(error)}") from None
    return fd


def _why(error: "OSError") -> str:
    if error.errno == errno.ELOOP:
        return "it is a symbolic link; name the file itself"
    if error.errno in (errno.ENXIO, errno.EWOULDBLOCK):
        return "not a regular file (a FIFO, a device or a socket); choose a file"
    return error.strerror or str(error)


def refusal(info: "os.stat_result") -> "str | None":
    """Why the file INFO describes must not take our text, or None: not a regular file (`it is a FIFO`:
    a FIFO would block, a device take the text), or another user's."""
    if not stat.S_ISREG(info.st_mode):
        return f"it is {_KINDS.get(stat.S_IFMT(info.st_mode), 'not a regular file')}"
    if info.st_uid != os.geteuid():
        return f"it belongs to another user (uid {info.st_uid})"
    return None


def open_log(path: str, shown: str) -> "int | str":
    """A descriptor appending to the log at PATH (created 0600), or why not, in words, naming it SHOWN.

    Logs often live in shared, world-writable folders, where another user may have put
    something at PATH first: a symlink is never followed, a FIFO or device never waited
    on, and only a regular file of our own (or a new one) is taken.
    """
    planted = planted_link(path)
    if planted is not None:
        return (
            f"cannot open log file {shown}: {planted} is a symbolic link another user put in a shared folder"
        )
    try:
        fd = os.open(path, _LOG_FLAGS, 0o600)
    except OSError as error:
        return f"cannot open log file {shown}: {_OPEN_ERRORS.get(error.errno, error.strerror)}"
    try:
        info = os.fstat(fd)
        if stat.S_ISREG(info.st_mode):
            os.set_blocking(fd, True)  # no meaning for a regular file; our writes expect none
    except OSError as error:
        os.close(fd)
        return f"cannot use log file {shown}: {error.strerror}"
    why = refusal(info)
    if why is not None:
        os.close(fd)
        return f"cannot use log file {shown}: {why}"
    return fd


def planted_link(path: str) -> "str | None":
    """The first folder on PATH's way that is a symlink another user put in a sticky, world-writable
    folder (as /tmp), or None.

    This is the kernel's fs.protected_symlinks rule, kept where that setting is off (some
    containers): such a link is followed only by its owner or the folder's. PATH's last part
    is left to O_NOFOLLOW, which refuses every symlink there.
    """
    here = "/"
    parts = [part for part in os.path.abspath(path).split("/") if part][:-1]
    links = 0
    while parts:
        step = os.path.join(here, parts.pop(0))
        try:
            link = os.lstat(step)
            if not stat.S_ISLNK(link.st_mode):
                here = step
                continue
            folder = os.stat(here)
            target = os.readlink(step)
        except OSError:
            return None  # nothing there (yet): the open itself says what is wrong
        shared = folder.st_mode & (stat.S_ISVTX | stat.S_IWOTH) == stat.S_ISVTX | stat.S_IWOTH
        if shared and link.st_uid not in (os.geteuid(), folder.st_uid):
            return step
        links += 1
        if links > 40:  # the kernel's own limit: the open fails with ELOOP
            return None
        parts[:0] = [part for part in target.split("/") if part]
        if target.startswith("/"):
            here = "/"
    return None
