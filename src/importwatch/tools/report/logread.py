"""Reads a log file for report: opened without blocking on a FIFO, in chunks, one event a line.

A line is never longer than events.MAX_LINE in memory, however long in the file; a
line that claims to be ours but cannot be read is counted (Skipped), never raised.
"""

from __future__ import annotations

import os
import stat

from importwatch.events import MAX_LINE
from importwatch.events.read import BadLine, Event, read_line

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Iterator

# Bytes that never occur in a text log: a file holding them is not one.
_BINARY_SNIFF = 8192
_CHUNK = 1 << 20


class LogError(Exception):
    """The file cannot be read as a log: its message is the one line the user sees."""


class Skipped:
    """Lines that claim to be ours (text or JSON) but cannot be read: how many, and the first."""

    def __init__(self) -> None:
        self.count = 0
        self.first = ""  # "line N: why"
        self.number = 0  # the line being read

    def add(self, number: int, why: str) -> None:
        self.count += 1
        if not self.first:
            self.first = f"line {number}: {why}"

    def __str__(self) -> str:
        noun = "line" if self.count == 1 else "lines"
        return f"{self.count} {noun} could not be read and were skipped (the first, {self.first})"


def read_events(path: str, skipped: Skipped | None = None) -> Iterator[Event]:
    """The events of the log at PATH, one at a time; LogError, in one line, when it is not a log.

    Bad lines (see events.read.read_line) are counted in SKIPPED and left out. Read in
    chunks: a line is never longer than events.MAX_LINE in memory, however long in the file.
    """
    skipped = skipped if skipped is not None else Skipped()
    found = 0
    with open_log(path) as file:
        number = 0
        for lines in chunks(file, path):
            for line in lines:
                number += 1
                event = take_line(line, number, skipped)
                if event is not None:
                    found += 1
                    skipped.number = number
                    yield event
    if not found:
        raise not_a_log(path, skipped)


def take_line(line: str | None, number: int, skipped: Skipped) -> Event | None:
    """The event on LINE (line NUMBER of its log); None, and the line counted in SKIPPED when bad."""
    if line is None:
        skipped.add(number, "longer than any line of ours")
        return None
    try:
        event = read_line(line)
    except BadLine as error:
        skipped.add(number, str(error))
        return None
    if event is None and ("\ufffd" in line or "\0" in line):
        skipped.add(number, "not text")
    return event


def not_a_log(path: str, skipped: Skipped) -> LogError:
    """The error for a file in which no line is one of ours."""
    why = f"; {skipped}" if skipped.count else ""
    return LogError(
        f"{path} is not an importwatch log: no line starts with '[importwatch '"
        f" nor is one of its JSON records{why}"
    )


def open_log(path: str):
    """The file at PATH for reading, never blocking on a FIFO or a device; LogError if it cannot be."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as error:
        raise LogError(f"cannot read {path}: {error.strerror or error}") from None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise LogError(f"cannot read {path}: not a regular file")
        os.set_blocking(fd, True)
        return os.fdopen(fd, "rb", buffering=_CHUNK)
    except BaseException:
        os.close(fd)
        raise


def chunks(file, path: str) -> Iterator[list[str | None]]:
    """The lines of FILE (opened by open_log), a chunk's worth at a time, decoded; None for an overlong line.

    LogError when it is empty or binary.
    """
    data = file.read(_BINARY_SNIFF)
    if not data.strip() and not file.peek(1):
        raise LogError(f"{path} is empty: there is nothing to report")
    if b"\0" in data:
        raise LogError(f"{path} is a binary file, not an importwatch log")
    carry = b""
    skipping = False  # inside an overlong line: its bytes are dropped up to its end
    while data:
        if skipping:
            cut = data.find(b"\n")
            if cut < 0:
                data = file.read(_CHUNK)
                continue
            data, skipping = data[cut + 1 :], False
        if carry:
            data = carry + data
        cut = data.rfind(b"\n")
        carry = data[cut + 1 :]
        if cut >= 0:
            yield data[:cut].decode("utf-8", "replace").split("\n")
        if len(carry) > MAX_LINE:
            yield [None]
            carry, skipping = b"", True
        data = file.read(_CHUNK)
    if carry:
        yield [carry.decode("utf-8", "replace")]
