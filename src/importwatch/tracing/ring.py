"""The watcher's feed: a ring in shared memory the traced process appends its lines to, and the watcher reads.

A line costs the program a copy into shared memory and no system call: no write,
and no wake-up of the watcher, which reads what is new ten times a second
(watcher/loop.py). The memory is a memfd that the program maps and hands down to the
watcher; the program keeps no descriptor of it.

Layout: the first 8 bytes hold HEAD, the number of bytes ever appended (native byte
order: both ends run on this machine), stored after the bytes it counts; the lines
follow from HEADER on, each at HEAD modulo the ring's size. One writer: the program's
threads take turns under the GIL, and the C hook (_speedups_ring.h) appends exactly as
Ring.put does. A reader that falls a whole ring behind loses the oldest bytes and
knows how many (RingReader.read).
"""

import _thread
import os
import sys

from importwatch.tracing.descriptors import close_if_ours, identity

TYPE_CHECKING = False
if TYPE_CHECKING:
    from types import ModuleType
    from typing import Callable

HEADER = 64  # HEAD, then room to spare: the lines start on a cache line of their own
SIZE = 1 << 20  # bytes of lines: `import torch`, the busiest burst seen, writes about 0.3 MB in all
_NAME = "importwatch-feed"
# The longest line the feed takes whole (a stack or a traceback can be longer); FEED_LONGEST in C.
_LONGEST = 1 << 16


def create(
    speedups: "ModuleType | None", import_own: "Callable[[str], ModuleType]" = __import__
) -> "tuple[int, Ring]":
    """A new ring and its memfd (close-on-exec), for the watcher to inherit; OSError when it cannot be made.

    Mapped by the C accelerator (SPEEDUPS) when built: `import mmap` would cost the
    program's start-up half a millisecond, and mmap is not ours to import early. Else mmap
    comes through IMPORT_OWN (Tracer.import_own): in a fork child, whose tracing is on, an
    import statement here would be a line of the program's. An mmap keeps a copy of the
    descriptor it maps, at the lowest free number, one the program would get next, unless
    told not to (trackfd, Python 3.13 on): before 3.13 the pure twin keeps that copy
    (docs/limits.md).
    """
    fd = os.memfd_create(_NAME, os.MFD_CLOEXEC)
    try:
        os.ftruncate(fd, HEADER + SIZE)
        if speedups is not None:
            mapping = speedups.shared_memory(fd, HEADER + SIZE)
        elif sys.version_info >= (3, 13):
            mapping = import_own("mmap").mmap(fd, HEADER + SIZE, trackfd=False)
        else:
            mapping = import_own("mmap").mmap(fd, HEADER + SIZE)
    except BaseException:
        os.close(fd)
        raise
    return fd, Ring(mapping)


class Ring:
    """The program's end: appends bytes. MAPPING is any writable buffer over the shared memory."""

    __slots__ = ("heads", "mapping", "size", "view")

    def __init__(self, mapping: object) -> None:
        self.mapping = mapping  # what the C hook appends to (the buffer protocol)
        self.view = memoryview(mapping)  # type: ignore[arg-type]
        self.heads = self.view[:8].cast("Q")
        self.size = len(self.view) - HEADER

    def put(self, data: bytes) -> None:
        """Append DATA: the bytes first, then HEAD, so a reader never sees HEAD count bytes not there."""
        head = self.heads[0]
        size = self.size
        at = HEADER + head % size
        end = at + len(data)
        if end <= HEADER + size:
            self.view[at:end] = data
        else:
            first = HEADER + size - at
            self.view[at:] = data[:first]
            self.view[HEADER : HEADER + len(data) - first] = data[first:]
        self.heads[0] = head + len(data)

    def close(self) -> None:
        """Unmap (a fork child: the parent's ring is not its to write)."""
        self.heads.release()
        self.view.release()
        self.mapping = None


class RingReader:
    """The watcher's end: what was appended since its last read."""

    def __init__(self, fd: int) -> None:
        import mmap

        size = os.fstat(fd).st_size
        self.mapping = mmap.mmap(fd, size, prot=mmap.PROT_READ)
        self.view = memoryview(self.mapping)
        self.heads = self.view[:8].cast("Q")
        self.size = size - HEADER
        self.tail = 0  # bytes read so far (or lost)

    def read(self) -> "tuple[bytes, int]":
        """The bytes appended since the last read, and how many bytes before them were lost: overwritten
        before they could be read (the data then starts inside a line)."""
        head = self.heads[0]
        tail = self.tail
        if head <= tail:
            return b"", 0
        lost = 0
        if head - tail > self.size:
            lost = head - self.size - tail
            tail = head - self.size
        data = self._copy(tail, head)
        # The writer went on while we copied: what it may have written over is not to be trusted.
        spoiled = self.heads[0] - self.size - tail
        if spoiled > 0:
            data = data[spoiled:]
            lost += spoiled
        self.tail = head
        return data, lost

    def _copy(self, begin: int, end: int) -> bytes:
        size = self.size
        at = HEADER + begin % size
        stop = at + (end - begin)
        if stop <= HEADER + size:
            return self.view[at:stop].tobytes()
        return self.view[at:].tobytes() + self.view[HEADER : stop - size].tobytes()


class Feed:
    """The watcher's copy of every text line, appended to its Ring (above) in shared memory.

    No system call per line, and a slow or dead watcher costs nothing: the ring
    just turns over. Lines starting with "#" are for the watcher only: `#thread
    NAME TID`, `#mapped PATH`, `#exit`. FD, the pipe's write end (placed where ours go by
    watcher_launch), is written nothing: its end tells the watcher this process has gone (or exec'd), and its
    lock is how the exit silences the watcher (watcher_launch.hush). The read end is
    the watcher's alone: with nothing written, no SIGPIPE can come of its death.
    """

    __slots__ = ("closed", "fd", "ident", "ring", "starting", "threads")

    def __init__(
        self, fd: int, ring: "Ring", starting: "Callable[[float], int | None] | None" = None
    ) -> None:
        self.fd = fd
        self.ident = identity(self.fd)
        self.ring = ring
        self.closed = False  # closed under us: the program closed its pipe, and the watcher has gone
        self.threads: set[int] = set()
        # While the watcher is started by a thread of ours: how it went (_speedups.spawn_started).
        self.starting = starting

    def send(self, data: bytes) -> None:
        if self.closed:
            return
        if len(data) > _LONGEST:
            data = data[: _LONGEST - 1] + b"\n"
        self.ring.put(data)

    def announce(self, ident: int, name: str, tid: "int | None" = None) -> None:
        """Tell the watcher which kernel thread id (TID, this thread's by default) a thread name stands
        for (once per thread)."""
        self.threads.add(ident)
        tid = _thread.get_native_id() if tid is None else tid
        self.send(f"#thread {name} {tid}\n".encode("ascii"))

    def close(self) -> None:
        self.closed = True
        self.ring.close()
        close_if_ours(self.fd, self.ident)
