"""The reading half of the event model: a text or a JSON line back into an Event.

Imported by the readers (report, bisect, doctor, the watcher), never by the traced process, which
only writes. The package's __init__ has the kinds, their fields and both renderings.
"""

import json
import re
import signal

from importwatch.events import (
    _EXIT_OUTSIDE,
    _HEADS,
    _MAX_ID,
    _PROSE,
    BUSY,
    CHECKPOINT,
    DIED,
    ENV,
    EXIT,
    FORK,
    IMPORT,
    IMPORT_END,
    KINDS,
    MAX_LINE,
    MAX_MS,
    MAX_TIME,
    NATIVE,
    NATIVE_END,
    OTHER,
    OUTSIDE,
    PHASE,
    RESUMED,
    STALL,
    START,
    STEP,
    TORCH,
    environment,
    outside,
    render,
)

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any


class BadLine(ValueError):
    """A line that claims to be ours (text or JSON) but cannot be read: the message says why."""


def clean(text: str) -> str:
    """TEXT as printable ASCII: anything else (escape sequences, newlines, non-ASCII) escaped."""
    if text.isascii() and text.isprintable():
        return text
    return text.encode("unicode_escape").decode("ascii")


# -- the events read back ----------------------------------------------------------------------
class Event:
    """One line of a log, whichever format it was written in.

    The fields of the model are `name` (a module's, a phase's or a step's name, or the
    path of a native load), `ms` and `error` as attributes, the rest in `fields`; data()
    gives them all as the writer passed them.
    """

    __slots__ = (
        "clock",
        "depth",
        "error",
        "fields",
        "kind",
        "ms",
        "name",
        "pid",
        "rank",
        "text",
        "thread",
        "time",
    )

    def __init__(self, kind: str, pid: int, thread: str, text: str) -> None:
        self.kind = kind
        self.pid = pid
        self.thread = thread
        self.text = text  # the line's body, as written
        self.clock = ""  # HH:MM:SS.mmm (text logs)
        self.time: float | None = None  # seconds since the epoch (JSON logs)
        self.name = ""  # module name, or the file path of a native load
        self.depth = 0  # nesting in its thread
        self.ms: float | None = None
        self.error: str | None = None
        self.rank: int | None = None  # in a distributed job
        self.fields: dict[str, Any] = {}

    def __repr__(self) -> str:
        return f"Event({self.kind!r}, {self.pid}, {self.thread!r}, {self.name or self.text!r})"

    def data(self) -> "dict[str, Any]":
        """Every field of the event, keyed as the writer passed them."""
        data: dict[str, Any] = {}
        if self.name:
            data["path" if self.kind in (NATIVE, NATIVE_END) else "name"] = self.name
        if self.ms is not None:
            data["ms"] = self.ms
        if self.error is not None:
            data["error"] = self.error
        data.update(self.fields)
        return data


def seconds_of_day(clock: str) -> float:
    """A text line's clock, HH:MM:SS or HH:MM:SS.mmm (local time), in seconds since its midnight.

    The prefix regex has checked the digits of a line's own clock; ValueError for anything else.
    """
    return int(clock[0:2]) * 3600 + int(clock[3:5]) * 60 + float(clock[6:])


# How a line of ours begins: a text line, and a JSON line (events.json_line writes "time" first).
_TEXT_HEAD = "[importwatch "
_JSON_HEAD = '{"time": '


def parse_line(line: str) -> "Event | None":
    """The event on LINE, or None for a line that is not ours or cannot be read (see read_line)."""
    try:
        return read_line(line)
    except BadLine:
        return None


def read_line(line: str) -> "Event | None":
    """The event on LINE; None for a line that is not ours (a faulthandler dump, program output),
    unless a line of ours was written onto the end of it (see _glued_at).

    BadLine for one that claims to be ours and cannot be read: malformed JSON, nesting
    too deep, NaN or out-of-range numbers, fields of the wrong type, an overlong line.
    """
    parser = _parser
    if line[-1:] in ("\n", "\r"):
        line = line.rstrip("\r\n")
    if line[:1] == "{":
        if len(line) > MAX_LINE:
            raise BadLine("overlong line")
        return parser.json_line(line)
    if not line.startswith(_TEXT_HEAD):
        glued = _glued_at(line)
        if glued < 0:
            return None
        try:
            return read_line(line[glued:])
        except BadLine:
            return None  # a program's words that quote a head: the line is the program's, not a bad one
    if len(line) > MAX_LINE:
        raise BadLine("overlong line")
    return parser.text_line(line)


def _glued_at(line: str) -> int:
    """Where a line of ours begins inside LINE, which is not ours; -1 when none does.

    faulthandler writes a dump in many pieces: a process killed amid one leaves its last line
    unended, and the next line of ours (the watcher's death line, another process's event)
    goes on the end of it. Only lines that are not ours are looked into: an event line whose
    name holds a head stays whole.
    """
    return min((at for at in (line.find(_TEXT_HEAD), line.find(_JSON_HEAD)) if at >= 0), default=-1)


def _bounded(number: int) -> int:
    if number >= _MAX_ID:
        raise BadLine("a pid or rank out of range")
    return number


def _ms(text: str) -> float:
    value = float(text)
    if value > MAX_MS:
        raise BadLine("a duration out of range")
    return value


def _no_constant(name: str) -> None:
    raise BadLine(f"{name} in a JSON line")


class _Parser:
    """The regular expressions and the JSON scanner, made once."""

    def __init__(self) -> None:
        # One piece on purpose: a table of the patterns of every line shape, compiled once; split up,
        # the table would only be scattered.
        # [importwatch PID rRANK HH:MM:SS.mmm THREAD] BODY -- rRANK only in a distributed job (RANK or
        # LOCAL_RANK set), THREAD only when not the main thread. Bounded digits: int() of thousands of
        # digits is slow or refused, and no pid or rank is that long.
        self.prefix = re.compile(
            r"^\[importwatch (\d{1,10})(?: r(\d{1,10}))? (\d\d:\d\d:\d\d\.\d\d\d)(?: (\S+))?\] (.*)$",
            re.DOTALL,
        )
        number = r"(\d{1,15}(?:\.\d{1,15})?)"
        # An import's start (`> NAME`) or end (`< NAME 1.234 ms [failed ...]`) on a line of printable
        # ASCII; other lines, and modules whose names read as another kind's line (`> dlopen x`), take
        # the general path.
        self.import_line = re.compile(
            r"^\[importwatch (\d{1,10})(?: r(\d{1,10}))? (\d\d:\d\d:\d\d\.\d\d\d)(?: (\S+))?\] ( *)([<>]) "
            rf"(?!dlopen |phase |step )(\S+)(?: {number} ms(?: failed (.*))?)?$"
        )
        self.end = re.compile(rf"^(\S+) {number} ms(?: failed (.*))?$", re.DOTALL)
        # Phases are named by the program (spaces allowed).
        self.phase_end = re.compile(rf"^(.*?) {number} ms(?: failed (.*))?$", re.DOTALL)
        self.native = re.compile(r"^(.*?) \((\S+)\)(?: needs (.*))?$", re.DOTALL)
        self.native_end = re.compile(
            rf"^(.*?) {number} ms(?: failed (.*?))?(?:; mapped (\d{{1,9}}) new: (.*))?$", re.DOTALL
        )
        self.start = re.compile(
            r"^python (\S+) (.*?) argv=(\[.*\]) cwd=(.*?)(?: platform=(\S+))?(?: dumps=(.*))?$", re.DOTALL
        )
        # A first report, `N s without progress` (or `busy, not stuck`; neither in older versions' lines),
        # or a later one, `still stuck after N s (report K)`; then where the thread is, if known.
        self.stall = re.compile(
            rf"^(?:still (busy|stuck) after {number} s \(report (\d{{1,9}})\)|{number} s( busy, not stuck|"
            r" without progress)?)(?: at (.*?))?; in flight: (\S+?): (.*)$",
            re.DOTALL,
        )
        self.exit = re.compile(r"^(\d{1,10}) \((.*)\)$", re.DOTALL)
        # A phase's own timeout, as events._timeout writes it.
        self.phase_timeout = re.compile(
            r"^(.*) \(timeout (\d{1,20}(?:\.\d{1,20})?(?:e[+-]\d{1,3})?) s\)$", re.DOTALL
        )
        # What the prose of some kinds shows, read back into their fields (events.EXTRAS lists the rest).
        self.busy = re.compile(r"^(\S+) used (\d{1,4})% of a CPU just now", re.DOTALL)
        self.resumed = re.compile(
            rf"^ after {number} s: (.*) (ended|interrupted \(KeyboardInterrupt\))(?: \(stacks dumped (.*)\))?$",
            re.DOTALL,
        )
        self.died = re.compile(
            rf"^process (\d{{1,10}}) (.*?) after {number} s with in flight: (.*)$", re.DOTALL
        )
        self.killed = re.compile(
            r"^was killed by (?:(SIG[A-Z0-9+]+)|signal (\d{1,3}))(?: \([^()]*\))?(, core dumped)?$"
        )
        self.exited = re.compile(r"^exited with status (\d{1,3})(?:[ ,].*)?$", re.DOTALL)
        self.rendered = {
            ENV: environment.env,
            TORCH: environment.torch,
            BUSY: self._busy,
            RESUMED: self._resumed,
            DIED: self._died,
            OUTSIDE: outside.fields,
        }
        self.signal = re.compile(r"^(\S+) to child (\d{1,10}) \((.*)\)$", re.DOTALL)
        # NaN and Infinity are not JSON: refused as they are read. The scanner alone, not json.loads:
        # one call per line, nothing else (a log holds millions).
        self.scan = json.JSONDecoder(parse_constant=_no_constant).scan_once

    # -- text lines ------------------------------------------------------------------------
    def text_line(self, line: str) -> "Event":
        # Most lines of a log are an import's start or end in printable ASCII: one match reads them.
        match = self.import_line.match(line) if line.isascii() and line.isprintable() else None
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
        match = self.prefix.match(line)
        if match is None:
            raise BadLine("a malformed [importwatch ...] prefix")
        pid, rank, clock, thread, body = match.groups()
        if not (body.isascii() and body.isprintable()):
            body = clean(body)
        event = Event(OTHER, _bounded(int(pid)), clean(thread) if thread else "MainThread", body)
        self.body(event, body)
        event.clock = clock
        event.rank = _bounded(int(rank)) if rank is not None else None
        return event

    def body(self, event: "Event", body: str) -> None:
        """Set EVENT's kind, depth and fields from the body of its text line."""
        stripped = body.lstrip(" ")
        marker, _, rest = stripped.partition(" ")
        if marker in (">", "<", "checkpoint"):
            event.depth = (len(body) - len(stripped)) // 2
            self._nested(event, marker, rest)
            return
        for head, kind in _HEADS:
            if body.startswith(head):
                event.kind = kind
                self._other(event, kind, body[len(head) :])
                return
        event.fields = {"message": body}

    def _nested(self, event: "Event", marker: str, rest: str) -> None:
        if marker == "checkpoint":
            event.kind, event.name = CHECKPOINT, rest
        elif rest.startswith("dlopen "):
            rest = rest[len("dlopen ") :]
            if marker == ">":
                event.kind = NATIVE
                match = self.native.match(rest)
                if match is None:
                    raise BadLine("a native load without its owner")
                event.name, owner, needs = match.groups()
                event.fields = {"owner": owner, "needs": needs.split(", ")} if needs else {"owner": owner}
            else:
                event.kind = NATIVE_END
                match = self.native_end.match(rest)
                if match is None:
                    raise BadLine("an end line without its duration")
                event.name, event.ms, event.error = match.group(1), _ms(match.group(2)), match.group(3)
                if match.group(5) is not None:
                    event.fields = {"mapped": match.group(5).split(", ")}
        # A module may be called phase or step: its end line `< phase 1.2 ms` reads as an import's.
        elif rest.startswith(("phase ", "step ")) and not (marker == "<" and self.end.match(rest)):
            what, _, rest = rest.partition(" ")
            if marker == ">":
                event.kind = what
                if what == STEP:
                    event.name, _, detail = rest.partition(" ")
                    event.fields = {"detail": detail}
                else:
                    self._phase(event, rest)
            else:
                event.kind = f"{what}_end"
                self._ended(event, (self.phase_end if what == PHASE else self.end).match(rest))
        elif marker == ">":
            event.kind, event.name = IMPORT, rest
        else:
            event.kind = IMPORT_END
            self._ended(event, self.end.match(rest))

    def _phase(self, event: "Event", rest: str) -> None:
        match = self.phase_timeout.match(rest)
        timeout = float(match.group(2)) if match is not None else None
        if timeout is not None and timeout - timeout == 0:  # 1e999 reads as infinity: not ours
            event.name = match.group(1)
        else:
            event.name, timeout = rest, None
        event.fields = {"timeout": timeout}

    @staticmethod
    def _ended(event: "Event", match: "Any") -> None:
        if match is None:
            raise BadLine("an end line without its duration")
        event.name, event.ms, event.error = match.group(1), _ms(match.group(2)), match.group(3)

    def _other(self, event: "Event", kind: str, rest: str) -> None:
        """The fields of a line that is not nested; REST is what follows its head."""
        if kind in _PROSE:
            event.fields = {_PROSE[kind][1]: rest}
            return
        fields: dict[str, Any] | None = None
        if kind in self.rendered:
            fields = self.rendered[kind](rest) or None
        elif kind == START:
            fields = self._start(rest)
        elif kind == STALL:
            match = self.stall.match(rest)
            if match is not None:
                still, later, report, first, how, at, thread, chain = match.groups()
                fields = {
                    "seconds": _ms(later or first),
                    "stalled": thread,
                    "chain": chain,
                    "report": int(report) if report else 1,
                    "busy": (still or how or "").startswith(("busy", " busy")),
                    "at": at,
                }
        elif kind == EXIT:
            match = self.exit.match(rest)
            if event.text.startswith(_EXIT_OUTSIDE):
                fields = {"status": None, "message": rest}
            elif match is not None:
                fields = {"status": int(match.group(1)), "message": match.group(2)}
        elif kind == FORK:
            if rest.isdigit() and len(rest) <= 10:
                fields = {"parent": _bounded(int(rest))}
        else:  # SIGNAL
            match = self.signal.match(rest)
            if match is not None:
                fields = {
                    "signal": match.group(1),
                    "child": _bounded(int(match.group(2))),
                    "via": match.group(3),
                }
        if fields is None:  # not as we write it (an older version's line, or a forged one)
            event.kind, fields = OTHER, {"message": event.text}
        event.fields = fields

    # -- the fields that a kind's prose shows (all or none: a line not as we write it gives none) --
    def _busy(self, rest: str) -> "dict[str, Any]":
        match = self.busy.match(rest)
        if match is None:
            return {}
        # The advice names CUDA JIT only where an NVIDIA driver was loaded (events._busy).
        return {"stalled": match.group(1), "cpu": int(match.group(2)) / 100, "gpu": "CUDA JIT" in rest}

    def _resumed(self, rest: str) -> "dict[str, Any]":  # as events._resumed writes it
        head = ": progress again after a stall; stacks dumped "
        if rest.startswith(head):
            return {"dumped": rest[len(head) :]}
        match = self.resumed.match(rest)
        if match is None:
            return {}
        seconds, name, how, dumped = match.groups()
        return {"name": name, "seconds": _ms(seconds), "interrupted": how != "ended", "dumped": dumped}

    def _died(self, rest: str) -> "dict[str, Any]":
        match = self.died.match(rest)
        if match is None:
            return {}
        process, how, seconds, chain = match.groups()
        status: int | None = None  # None: ended without a clean exit
        killed, exited = self.killed.match(how), self.exited.match(how)
        if killed is not None:  # a wait status: the signal, and 0x80 for a core dump
            name, number, core = killed.groups()
            try:
                status = int(number) if number is not None else int(signal.Signals[name])
            except KeyError:
                return {}
            status |= 0x80 if core else 0
        elif exited is not None:
            status = int(exited.group(1)) << 8
        elif not how.startswith("ended without a clean exit"):
            return {}
        fields = {"process": _bounded(int(process)), "how": how, "seconds": _ms(seconds)}
        return {**fields, "status": status, "chain": chain}

    def _start(self, rest: str) -> "dict[str, Any] | None":
        import ast

        match = self.start.match(rest)
        if match is None:
            return None
        python, executable, argv, cwd, platform, dumps = match.groups()
        try:  # the repr of a list of strings, as the banner wrote it: nothing else is accepted
            words = ast.literal_eval(argv)
        except (ValueError, SyntaxError, MemoryError, RecursionError, TypeError):
            return None
        if not isinstance(words, list) or not all(type(word) is str for word in words):
            return None
        fields = {"python": python, "executable": executable, "argv": [clean(w) for w in words], "cwd": cwd}
        if platform is not None:
            fields["platform"] = platform
        if dumps is not None:
            fields["dumps"] = dumps
        return fields

    # -- JSON lines ------------------------------------------------------------------------
    def json_line(self, line: str) -> "Event":
        try:
            record, end = self.scan(line, 0)
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
        event = Event(OTHER, pid, _string(record, "thread") or "MainThread", text)
        # The text line's fields first (a log of an older version may hold no more), then the
        # JSON's own, which are exact (durations to the nanosecond) and include the extras.
        try:
            self.body(event, text)
        except BadLine:
            event.fields = {}
        event.kind = clean(kind)
        event.time = float(when)
        for key, value in record.items():
            if key not in _HEADER:
                _take(event, key, value)
        rank = record.get("rank")
        if rank is not None:
            if type(rank) is not int or not 0 <= rank < _MAX_ID:
                raise BadLine("a JSON line with an invalid rank")
            event.rank = rank
        if event.kind in KINDS:  # readers may render it again: its fields must fit its kind
            try:
                render(event.kind, event.data())
            except (KeyError, TypeError, ValueError):  # not as we write it, as _other() says of text lines
                event.kind, event.fields = OTHER, {"message": text}
                event.name, event.ms, event.error = "", None, None
        return event


_HEADER = frozenset(("time", "pid", "thread", "rank", "kind", "text"))


def _take(event: "Event", key: str, value: "Any") -> None:
    """A field of a JSON line onto EVENT, checked as untrusted input."""
    if key == "name" or (key == "path" and event.kind in (NATIVE, NATIVE_END)):
        event.name = _checked_string(key, value)
    elif key == "ms":
        if type(value) not in (int, float) or not 0 <= value <= MAX_MS:
            raise BadLine("a JSON line with an invalid duration")
        event.ms = float(value)
    elif key == "error":
        event.error = None if value is None else _checked_string(key, value)
    else:
        taken = _plain(value)
        if taken is not _SKIP:
            event.fields[clean(key)] = taken


_SKIP = object()


def _plain(value: "Any") -> "Any":
    """VALUE as an event's field may hold it: ASCII strings, finite numbers, lists and maps of
    strings; _SKIP for anything else (a newer version's field, or a forged one)."""
    kind = type(value)
    if kind is str:
        return clean(value)
    if value is None or kind is bool:
        return value
    if kind is int:
        return value if -(1 << 63) <= value < 1 << 63 else _SKIP
    if kind is float:
        return value if value - value == 0 else _SKIP  # 1e999 reads as infinity
    if kind is list and all(type(item) is str for item in value):
        return [clean(item) for item in value]
    if kind is dict and all(type(item) is str for item in value.values()):
        return {clean(key): clean(item) for key, item in value.items()}
    return _SKIP


def _checked_string(key: str, value: "Any") -> str:
    if type(value) is not str:
        raise BadLine(f"a JSON line whose {key} is not a string")
    return clean(value)


def _string(record: dict, key: str) -> "str | None":
    """RECORD[KEY] as printable ASCII; None when absent; BadLine when it is not a string."""
    value = record.get(key)
    if value is None:
        return None
    return _checked_string(key, value)


_parser = _Parser()
