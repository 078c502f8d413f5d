"""Starting the watcher's lines on a line of their own in files the program writes too.

faulthandler writes a dump in many pieces, and a program may leave a line of its own unended (a
progress bar, a prompt): a job killed in the middle of a dump (a scheduler's SIGKILL after a
stall) leaves the log's last line unended, and the watcher's death line would go on the end of
it. report reads such a line all the same (events/read.py); this keeps the file right for the
people who read it. Only a regular file can say how it ends: a terminal or a pipe is left alone.
"""

from __future__ import annotations

import os
import stat

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Iterable

    from importwatch.tracing.sink import Sink


def end_torn_lines(sink: Sink, kinds: Iterable[str], only: str | None = None) -> None:
    """Before SINK writes lines of KINDS (to ONLY "log" or "stderr", or both, as Sink.event takes it),
    a newline in each file they go to whose last line is unended."""
    channels = []
    if only != "stderr" and sink.log is not None:
        channels.append(sink.log)
    if only != "log" and any(sink.loud(kind) for kind in kinds):
        channels.append(sink.stderr)
    for channel in channels:
        if not channel.broken and _unended(channel.fd):
            channel.write(b"\n")


def _unended(fd: int) -> bool:
    """Whether the regular file open for writing at FD ends in the middle of a line."""
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return False
        # Our descriptor is write-only: the same file opened again through it, to read its end.
        reader = os.open(f"/proc/self/fd/{fd}", os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:
        return False
    try:
        size = os.fstat(reader).st_size
        return size > 0 and os.pread(reader, 1, size - 1) != b"\n"
    except OSError:
        return False
    finally:
        os.close(reader)
