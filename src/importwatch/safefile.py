"""Opening a file to write that a person named: no symlink followed, no FIFO waited on, 0600 when new,
never another user's file, never the file being read.

Standard library only and nothing imported beyond os and stat, so that the traced process (the log's
opening, in tracing/sink.py) could use it as the offline tools do (report's -o).
"""

from __future__ import annotations

import errno
import os
import stat

_FLAGS = os.O_WRONLY | os.O_CLOEXEC | os.O_NOFOLLOW | os.O_NONBLOCK


class UnsafeFile(Exception):
    """Why a path was not opened: one line for a person, the path first."""


def open_for_writing(path: str, keep: tuple[os.stat_result, ...] = ()) -> int:
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
            raise UnsafeFile(f"{path}: not a regular file (a FIFO, a device or a socket); choose a file")
        if any(info.st_dev == other.st_dev and info.st_ino == other.st_ino for other in keep):
            raise UnsafeFile(f"{path}: it is the file being read; writing there would destroy it")
        if info.st_uid != os.geteuid():
            raise UnsafeFile(f"{path}: it belongs to another user (uid {info.st_uid}); choose another file")
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


def _why(error: OSError) -> str:
    if error.errno == errno.ELOOP:
        return "it is a symbolic link; name the file itself"
    if error.errno in (errno.ENXIO, errno.EWOULDBLOCK):
        return "not a regular file (a FIFO, a device or a socket); choose a file"
    return error.strerror or str(error)
