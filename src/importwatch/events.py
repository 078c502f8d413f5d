"""Reads our log lines back: one text or JSON line in, one Event out (for report, bisect, the watcher).

Logs may come from anywhere (a shared folder, a bug report): every string an
Event carries is printable ASCII (the rest escaped, as the writer escapes it),
every number is finite and within bounds, and a line that claims to be ours but
cannot be read is rejected with its reason (BadLine), never an exception of
another kind.
"""

from __future__ import annotations

import json
import re

# [importwatch PID rRANK HH:MM:SS.mmm THREAD] BODY -- rRANK only in a distributed job (RANK or
# LOCAL_RANK set), THREAD only when not the main thread. Bounded digits: int() of thousands of
# digits is slow or refused, and no pid or rank is that long.
_TEXT = re.compile(
    r"^\[importwatch (\d{1,10})(?: r(\d{1,10}))? (\d\d:\d\d:\d\d\.\d\d\d)(?: (\S+))?\] (.*)$", re.DOTALL
)
_NUMBER = r"(\d{1,15}(?:\.\d{1,15})?)"
_END = re.compile(rf"^(\S+) {_NUMBER} ms(?: failed (.*))?$", re.DOTALL)
_NATIVE_START = re.compile(r"^dlopen (.*?) \((\S+)\)(?: needs (.*))?$", re.DOTALL)
# Phases (named by the program, spaces allowed) and blocking steps (one word, then details).
_PHASE_END = re.compile(rf"^(.*?) {_NUMBER} ms(?: failed (.*))?$", re.DOTALL)
_NATIVE_END = re.compile(rf"^dlopen (.*?) {_NUMBER} ms(?: failed (.*?))?(?:; (.*))?$", re.DOTALL)

# An import's start (`> NAME`) or end (`< NAME 1.234 ms [failed ...]`) on a line of printable ASCII; other
# lines, and modules whose names read as another kind's line (`> dlopen x`), take the general path.
_IMPORT_LINE = re.compile(
    r"^\[importwatch (\d{1,10})(?: r(\d{1,10}))? (\d\d:\d\d:\d\d\.\d\d\d)(?: (\S+))?\] ( *)([<>]) "
    rf"(?!dlopen |phase |step )(\S+)(?: {_NUMBER} ms(?: failed (.*))?)?$"
)
# A line longer than this is not one of ours (the longest, a library listing, is tens of KiB).
MAX_LINE = 1 << 20
# Bounds on what a line of ours can say: pids and ranks, durations (a year), clock times
# (the epoch to the year 9999, which time.localtime can still render).
_MAX_ID = 1 << 31
MAX_MS = 366 * 86400 * 1000.0
MAX_TIME = 253402300799.0

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
# A `! ` line: importwatch's own warnings and the verdicts on a native load (CUDA versions).
# A text line cannot tell the two apart, so both renderings read as this one kind.
WARNING = "warning"
# The watcher's line when the program died with something in flight, and the lines that say the
# program is being ended on purpose (--exit-on-stall, a parent terminating its child).
DIED = "died"
EXIT = "exit"
SIGNAL = "signal"
# Kinds a JSON line may carry that read back as another, so that both renderings agree.
_JSON_ALIASES = {"verdict": WARNING}
OTHER_KINDS = {
    "start ": "start",
    "env ": "env",
    "torch ": "torch",
    "STALL ": "stall",
    "  also in flight: ": "stall_thread",
    "RESUMED": "resumed",
    "! ": WARNING,
    "outside: died during import: ": DIED,
    "outside: --exit-on-stall: ": EXIT,
    "outside: ": "outside",
    "  context: ": "stall_context",
    "  busy, not stuck: ": "busy",
    "  threads: ": "stall_threads",
    "fork ": "fork",
    "exiting with status ": EXIT,
    "signal ": SIGNAL,
}


class BadLine(ValueError):
    """A line that claims to be ours (text or JSON) but cannot be read: the message says why."""


def clean(text: str) -> str:
    """TEXT as printable ASCII: anything else (escape sequences, newlines, non-ASCII) escaped."""
    if text.isascii() and text.isprintable():
        return text
    return text.encode("unicode_escape").decode("ascii")


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
    """The event on LINE, or None for a line that is not ours or cannot be read (see read_line)."""
    try:
        return read_line(line)
    except BadLine:
        return None


def read_line(line: str) -> Event | None:
    """The event on LINE; None for a line that is not ours (a faulthandler dump, program output).

    BadLine for one that claims to be ours and cannot be read: malformed JSON, nesting
    too deep, NaN or out-of-range numbers, fields of the wrong type, an overlong line.
    """
    if line[-1:] in ("\n", "\r"):
        line = line.rstrip("\r\n")
    if line[:1] == "{":
        if len(line) > MAX_LINE:
            raise BadLine("overlong line")
        return _parse_json(line)
    if not line.startswith("[importwatch "):
        return None
    if len(line) > MAX_LINE:
        raise BadLine("overlong line")
    # Most lines of a log are an import's start or end in printable ASCII: one match reads them.
    match = _IMPORT_LINE.match(line) if line.isascii() and line.isprintable() else None
    if match is not None:
        pid, rank, clock, thread, indent, marker, name, ms, error = match.groups()
        if (marker == ">") == (ms is None):
            event = Event(
                IMPORT if ms is None else IMPORT_END, _bounded(int(pid)), thread or "MainThread", ""
            )
            event.text = line[match.start(5) :]
            event.name = name
            event.clock = clock
            event.depth = len(indent) // 2
            if ms is not None:
                event.ms = _ms(ms)
                event.error = error
            if rank is not None:
                event.rank = _bounded(int(rank))
            return event
    match = _TEXT.match(line)
    if match is None:
        raise BadLine("a malformed [importwatch ...] prefix")
    pid, rank, clock, thread, body = match.groups()
    if not (body.isascii() and body.isprintable()):
        body = clean(body)
    stripped = body.lstrip(" ")
    event = _parse_body(stripped, _bounded(int(pid)), clean(thread) if thread else "MainThread", body)
    event.clock = clock
    event.rank = _bounded(int(rank)) if rank is not None else None
    event.depth = (len(body) - len(stripped)) // 2
    return event


def _bounded(number: int) -> int:
    if number >= _MAX_ID:
        raise BadLine("a pid or rank out of range")
    return number


def _ms(text: str) -> float:
    value = float(text)
    if value > MAX_MS:
        raise BadLine("a duration out of range")
    return value


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
        if match is None:
            raise BadLine("an end line without its duration")
        event.name, event.ms, event.error = match.group(1), _ms(match.group(2)), match.group(3)
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
        if match is None:
            raise BadLine("an end line without its duration")
        event.name, event.ms, event.error = match.group(1), _ms(match.group(2)), match.group(3)
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
    if match is None:
        raise BadLine("an end line without its duration")
    event.name, event.ms, event.error = match.group(1), _ms(match.group(2)), match.group(3)
    return event


def _no_constant(name: str) -> None:
    raise BadLine(f"{name} in a JSON line")


# NaN and Infinity are not JSON: refused as they are read. The scanner alone, not json.loads:
# one call per line, nothing else (a log holds millions).
_scan = json.JSONDecoder(parse_constant=_no_constant).scan_once


def _parse_json(line: str) -> Event | None:
    try:
        record, end = _scan(line, 0)
    except StopIteration:
        raise BadLine("malformed JSON") from None
    except RecursionError:
        raise BadLine("JSON nested too deeply") from None
    except ValueError as error:  # malformed, or an integer of too many digits
        raise BadLine(str(error) if isinstance(error, BadLine) else "malformed JSON") from None
    if end != len(line) and line[end:].strip():
        raise BadLine("text after the JSON object")
    if not isinstance(record, dict):
        raise BadLine("a JSON line that is not an object")
    kind, pid = record.get("kind"), record.get("pid")
    if not isinstance(kind, str) or type(pid) is not int or not 0 <= pid < _MAX_ID:
        raise BadLine("a JSON line without a kind and a pid")
    when = record.get("time")
    if type(when) not in (int, float) or not 0 <= when <= MAX_TIME:  # NaN fails this too
        raise BadLine("a JSON line without a valid time")
    text = _string(record, "text") or ""
    thread = _string(record, "thread") or "MainThread"
    event = Event(_JSON_ALIASES.get(kind, clean(kind)), pid, thread, text)
    event.time = float(when)
    event.name = _string(record, "name") or _string(record, "path") or ""
    ms = record.get("ms")
    if ms is not None:
        if type(ms) not in (int, float) or not 0 <= ms <= MAX_MS:
            raise BadLine("a JSON line with an invalid duration")
        event.ms = float(ms)
    event.error = _string(record, "error")
    rank = record.get("rank")
    if rank is not None:
        if type(rank) is not int or not 0 <= rank < _MAX_ID:
            raise BadLine("a JSON line with an invalid rank")
        event.rank = rank
    event.depth = (len(text) - len(text.lstrip(" "))) // 2
    return event


def _string(record: dict, key: str) -> str | None:
    """RECORD[KEY] as printable ASCII; None when absent; BadLine when it is not a string."""
    value = record.get(key)
    if value is None:
        return None
    if type(value) is not str:
        raise BadLine(f"a JSON line whose {key} is not a string")
    return value if value.isascii() and value.isprintable() else clean(value)
