"""Reads our log lines back: one text or JSON line in, one Event out (for report, bisect, the watcher)."""

from __future__ import annotations

import json
import re

# [importwatch PID rRANK HH:MM:SS.mmm THREAD] BODY -- rRANK only in a distributed job (RANK or
# LOCAL_RANK set), THREAD only when not the main thread.
_TEXT = re.compile(r"^\[importwatch (\d+)(?: r(\d+))? (\d\d:\d\d:\d\d\.\d\d\d)(?: (\S+))?\] (.*)$")
_END = re.compile(r"^(\S+) (\d+(?:\.\d+)?) ms(?: failed (.*))?$")
_NATIVE_START = re.compile(r"^dlopen (.*?) \((\S+)\)(?: needs (.*))?$")
# Phases (named by the program, spaces allowed) and blocking steps (one word, then details).
_PHASE_END = re.compile(r"^(.*?) (\d+(?:\.\d+)?) ms(?: failed (.*))?$")
_NATIVE_END = re.compile(r"^dlopen (.*?) (\d+(?:\.\d+)?) ms(?: failed (.*?))?(?:; (.*))?$")

# Kinds of events, as the "kind" field of a JSON line names them.
IMPORT = "import"
IMPORT_END = "import_end"
NATIVE = "native"
NATIVE_END = "native_end"
PHASE = "phase"
PHASE_END = "phase_end"
CHECKPOINT = "checkpoint"
STEP = "step"
STEP_END = "step_end"
OTHER_KINDS = {
    "start ": "start",
    "env ": "env",
    "torch ": "torch",
    "STALL ": "stall",
    "  also in flight: ": "stall_thread",
    "RESUMED ": "resumed",
    "! ": "warning",
    "outside: ": "outside",
    "  context: ": "stall_context",
    "  busy, not stuck: ": "busy",
    "fork ": "fork",
}


class Event:
    """One line of a log, whichever format it was written in."""

    __slots__ = ("clock", "depth", "error", "kind", "ms", "name", "pid", "rank", "text", "thread", "time")

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
        self.rank: int | None = None  # in a distributed job

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
    pid, rank, clock, thread, body = match.groups()
    stripped = body.lstrip(" ")
    depth = (len(body) - len(stripped)) // 2
    event = _parse_body(stripped, int(pid), thread or "MainThread", body)
    event.clock = clock
    event.rank = int(rank) if rank is not None else None
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
    # A module may be called phase or step: its end line `< phase 1.2 ms` reads as an import's.
    if marker in (">", "<") and rest.startswith(("phase ", "step ")) and not _END.match(rest):
        return _parse_phase_or_step(marker, rest, pid, thread, text)
    if marker == "checkpoint":
        event = Event(CHECKPOINT, pid, thread, text)
        event.name = rest
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


def _parse_phase_or_step(marker: str, rest: str, pid: int, thread: str, text: str) -> Event:
    """`> phase NAME`, `< phase NAME 1.2 ms [failed ...]`, `> step NAME DETAILS`, `< step NAME 1.2 ms ...`."""
    what, _, rest = rest.partition(" ")
    if marker == ">":
        event = Event(what, pid, thread, text)
        event.name = rest if what == PHASE else rest.partition(" ")[0]
        return event
    event = Event(f"{what}_end", pid, thread, text)
    match = (_PHASE_END if what == PHASE else _END).match(rest)
    if match:
        event.name, event.ms, event.error = match.group(1), float(match.group(2)), match.group(3)
    return event


def _parse_json(line: str) -> Event | None:
    try:
        record = json.loads(line)
    except ValueError:
        return None
    if not isinstance(record, dict) or "kind" not in record or not isinstance(record.get("pid"), int):
        return None
    text = str(record.get("text", ""))
    event = Event(str(record["kind"]), record["pid"], str(record.get("thread", "MainThread")), text)
    event.time = _number(record.get("time"))
    event.name = str(record.get("name") or record.get("path") or "")
    event.ms = _number(record.get("ms"))
    error = record.get("error")
    event.error = None if error is None else str(error)
    event.rank = record.get("rank")
    event.depth = (len(text) - len(text.lstrip(" "))) // 2
    return event


def _number(value: object) -> float | None:
    """A JSON number, or None for anything else (a log written by someone else)."""
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return float(value)
    return None
