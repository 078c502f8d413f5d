"""Our own descriptors in the traced process: placed high and close-on-exec, known by what they refer to.

A program may close a range of descriptors, dup2 onto any number or open a
thousand files: ours must never take its writes nor give it our lines. So each
one is moved just below fd 1024, and its identity (device, inode) is kept to tell,
when it matters, whether the number is still ours; we close one only while it is.
"""

import errno
import os

# Our own descriptors are moved just below this number (or the process's limit, if lower): a
# program that closes a range of descriptors and then opens files gets the lowest free numbers,
# so it can come to reuse ours only by holding about a thousand at once (or by dup2 onto them).
_HIGH_FD = 1024
STDERR = 2  # the program's stderr, which ours copies


def high_descriptor(fd: int) -> int:
    """FD moved to a free number just below _HIGH_FD, close-on-exec; FD itself when none is free.

    os.dup2 onto a number found free, not fcntl's F_DUPFD: importing fcntl here would
    hide the program's own `import fcntl` from the log.
    """
    try:
        top = min(os.sysconf("SC_OPEN_MAX"), _HIGH_FD) - 1
    except (OSError, ValueError):
        return fd
    for number in range(top, max(fd, top - 64), -1):
        try:
            os.fstat(number)
            continue  # in use
        except OSError as error:
            if error.errno != errno.EBADF:
                continue
        try:
            os.dup2(fd, number, inheritable=False)
        except OSError:
            return fd
        os.close(fd)
        return number
    return fd


def identity(fd: int) -> "tuple[int, int] | None":
    """What descriptor FD refers to (device and inode), or None when it is closed."""
    try:
        stat = os.fstat(fd)
    except OSError:
        return None
    return stat.st_dev, stat.st_ino


def close_if_ours(fd: int, ident: "tuple[int, int] | None") -> None:
    """Close FD unless the program has put something else at its number (then it is the program's)."""
    if ident is not None and identity(fd) == ident:
        try:
            os.close(fd)
        except OSError:
            pass


class Channel:
    """One descriptor of our own that lines go to; on the first failed write it says so once and stops.

    IDENT is what the descriptor refers to (device, inode) when we placed it: check_descriptors
    compares, now and then, never per write (see Sink).
    """

    __slots__ = ("broken", "fd", "ident", "json", "name")

    def __init__(
        self, fd: int, name: str, json: bool = False, ident: "tuple[int, int] | None" = None
    ) -> None:
        self.fd = fd
        self.name = name
        self.json = json
        self.ident = ident
        self.broken = False

    def write(self, data: bytes) -> "OSError | None":
        """Write all of DATA; return the error that broke the channel, if one did."""
        if self.broken:
            return None
        try:
            while data:
                data = data[os.write(self.fd, data) :]
        except OSError as error:
            self.broken = True
            return error
        return None


def own_stderr(fd: int) -> "Channel":
    """Our own copy of the program's stderr FD, placed high and close-on-exec: where our stderr lines go.

    Never fd 2 itself: a program that closes fd 2 and opens a file (which then gets number 2),
    or dup2s a file onto it, has that file take only what it writes itself. Our lines go on
    to the stderr the process started with (see docs/forks-and-faulthandler.md). FD, when it is
    not 2, is a copy made for us already (the pytest plugin's) and is taken over. When fd 2
    is closed at start, lines for stderr go to /dev/null.
    """
    try:
        copy = os.dup(fd) if fd == STDERR else fd
    except OSError:
        copy = os.open(os.devnull, os.O_WRONLY | os.O_CLOEXEC)
    copy = high_descriptor(copy)
    return Channel(copy, "stderr", ident=identity(copy))
