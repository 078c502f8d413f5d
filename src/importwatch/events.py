"""Reads our log lines back: one text or JSON line in, one Event out (for report, bisect, the watcher)."""

from __future__ import annotations

import json
import re

# [importwatch PID HH:MM:SS.mmm THREAD] BODY -- THREAD only when not the main thread.
_TEXT = re.compile(r"^\[importwatch (\d+) (\d\d:\d\d:\d\d\.\d\d\d)(?: (\S+))?\] (.*)$")
_END = re.compile(r"^(\S+) (\d+(?:\.\d+)?) ms(?: failed (.*))?$")
_NATIVE_START = re.compile(r"^dlopen (.*) \((\S+)\)$")
_NATIVE_END = re.compile(r"^dlopen (.*?) (\d+(?:\.\d+)?) ms(?: failed (.*?))?(?:; (.*))?$")

# Kinds of events, as the "kind" field of a JSON line names them.
IMPORT = "import"
IMPORT_END = "import_end"
NATIVE = "native"
NATIVE_END = "native_end"
OTHER_KINDS = {
    "start ": "start",
    "env ": "env",
    "torch ": "torch",
    "STALL ": "stall",
    "  also in flight: ": "stall_thread",
    "RESUMED ": "resumed",
    "! ": "warning",
}


class Event:
    """One line of a log, whichever format it was written in."""

    __slots__ = ("clock", "depth", "error", "kind", "ms", "name", "pid", "text", "thread", "time")

    def __init__(self, kind: str, pid: int, thread: str, text: str) -> None:
        self.kind = kind
        self.pid = pid
        self.thread = thread
        self.text = text  # the line's body, as written
        self.clock = ""  # HH:MM:SS.mmm (text logs)
        self.time: float | None = None  # seconds since the epoch (JSON logs)
        self.name = ""  # module name, or the file path of a native load
        self.depth = 0  # nesting in its thread, from the indentation (text logs)
        self.ms: float | None = None
        self.error: str | None = None

    def __repr__(self) -> str:
        return f"Event({self.kind!r}, {self.pid}, {self.thread!r}, {self.name or self.text!r})"


def parse_line(line: str) -> Event | None:
    """The event on LINE, or None for a line that is not ours (a faulthandler dump, program output)."""
    line = line.rstrip("\r\n")
    if line.startswith("{"):
        return _parse_json(line)
    match = _TEXT.match(line)
    if match is None:
        return None
    pid, clock, thread, body = match.groups()
    stripped = body.lstrip(" ")
    depth = (len(body) - len(stripped)) // 2
    event = _parse_body(stripped, int(pid), thread or "MainThread", body)
    event.clock = clock
    event.depth = depth
    return event


def _parse_body(body: str, pid: int, thread: str, text: str) -> Event:
    marker, _, rest = body.partition(" ")
    if marker == ">" and rest.startswith("dlopen "):
        match = _NATIVE_START.match(rest)
        event = Event(NATIVE, pid, thread, text)
        event.name = match.group(1) if match else rest[len("dlopen ") :]
        return event
    if marker == "<" and rest.startswith("dlopen "):
        event = Event(NATIVE_END, pid, thread, text)
        match = _NATIVE_END.match(rest)
        if match:
            event.name, event.ms, event.error = match.group(1), float(match.group(2)), match.group(3)
        return event
    if marker == ">":
        event = Event(IMPORT, pid, thread, text)
        event.name = rest
        return event
    if marker == "<":
        event = Event(IMPORT_END, pid, thread, text)
        match = _END.match(rest)
        if match:
            event.name, event.ms, event.error = match.group(1), float(match.group(2)), match.group(3)
        return event
    for prefix, kind in OTHER_KINDS.items():
        if text.startswith(prefix):
            return Event(kind, pid, thread, text)
    return Event("other", pid, thread, text)


def _parse_json(line: str) -> Event | None:
    try:
        record = json.loads(line)
    except ValueError:
        return None
    if not isinstance(record, dict) or "kind" not in record or "pid" not in record:
        return None
    text = str(record.get("text", ""))
    event = Event(str(record["kind"]), int(record["pid"]), str(record.get("thread", "MainThread")), text)
    event.time = record.get("time")
    event.name = str(record.get("name") or record.get("path") or "")
    event.ms = record.get("ms")
    event.error = record.get("error")
    event.depth = (len(text) - len(text.lstrip(" "))) // 2
    return event
