"""Our own descriptors in the traced process: placed high and close-on-exec, known by what they refer to.

A program may close a range of descriptors, dup2 onto any number, open a
thousand files or list what it has open: ours must never take its writes nor
give it our lines, nor use up its numbers. So each one is moved above the
program's soft limit on open files where the hard limit leaves room (the usual
soft limit of 1024 under a higher hard one), out of every number the program can
open, dup2 onto or scan with `range(SC_OPEN_MAX)`; else just below fd 1024. Its
identity (device, inode) is kept to tell, when it matters, whether the number is
still ours; we close one only while it is.
"""

import _thread
import errno
import os

TYPE_CHECKING = False
if TYPE_CHECKING:
    from types import ModuleType
    from typing import Any, Callable

# Below the program's soft limit, ours are moved just below this number (or that limit, if lower): a
# program that closes a range of descriptors and then opens files gets the lowest free numbers,
# so it can come to reuse ours only by holding about a thousand at once (or by dup2 onto them).
_HIGH_FD = 1024
# Above it, just below this one (or the hard limit, if lower): 64 numbers above the usual soft limit,
# kept low because the kernel's table of descriptors, copied at each fork, grows to the highest one.
_ABOVE_FD = 1024 + 64
STDERR = 2  # the program's stderr, which ours copies

# How the soft limit is read and set for a moment (see learn_limits): the C accelerator's
# open_files_limit, a stand-in over the resource module, or None (ours stay below the limit).
_open_files_limit: "Callable[..., Any] | None" = None


def learn_limits(accelerator: "ModuleType | None") -> None:
    """Find how to place ours above the soft limit, before tracing starts (our start-up's imports are
    held back from the program: tracing/handback.py). Without the accelerator that takes the resource
    module, a file's import: only where the soft limit leaves such room to find."""
    global _open_files_limit
    if accelerator is not None:
        _open_files_limit = accelerator.open_files_limit
        return
    try:
        if os.sysconf("SC_OPEN_MAX") >= _ABOVE_FD:
            return
        import resource
    except (ImportError, OSError, ValueError):
        return

    def open_files_limit(soft: int = -1) -> "tuple[int, int] | None":
        limits = resource.getrlimit(resource.RLIMIT_NOFILE)
        if soft < 0:
            return limits
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, limits[1]))
        return None

    _open_files_limit = open_files_limit


def high_descriptor(fd: int) -> int:
    """FD moved to a free number out of the program's reach, close-on-exec; FD itself when none is free.

    Above the soft limit only while the program runs no thread of its own (_thread's count): the limit is
    raised for the moment of the dup2, and a program's own setrlimit meanwhile would be undone.
    os.dup2 onto a number found free, not fcntl's F_DUPFD: importing fcntl here would
    hide the program's own `import fcntl` from the log.
    """
    limit = _open_files_limit
    try:
        soft, hard = limit() if limit is not None else (os.sysconf("SC_OPEN_MAX"), -1)
    except (OSError, ValueError):
        return fd
    top = _ABOVE_FD if hard < 0 else min(hard, _ABOVE_FD)  # (a hard limit of -1: none, or unknown)
    if limit is not None and 0 <= soft < top and _thread._count() == 0:
        moved = _above_limit(fd, limit, soft, top)
        if moved != fd:
            return moved
    top = min(soft, _HIGH_FD) - 1
    return _move(fd, top, max(fd, top - 64))


def _above_limit(fd: int, limit: "Callable[..., Any]", soft: int, top: int) -> int:
    """FD moved above the soft limit SOFT, raised to TOP for that moment and put back; FD where it cannot be."""
    try:
        limit(top)
    except OSError:
        return fd
    try:
        return _move(fd, top - 1, max(soft - 1, fd))
    finally:
        limit(soft)  # lowered again: never refused


def _move(fd: int, top: int, bottom: int) -> int:
    """FD moved to the highest free number from TOP down to above BOTTOM, close-on-exec; FD when none is."""
    for number in range(top, bottom, -1):
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
