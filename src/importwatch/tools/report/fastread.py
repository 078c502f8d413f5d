"""Reads a log into a streamed summary's Timeline, the common lines without making an Event of each.

Most lines of a log are an import's or a native load's start (`> NAME`) or end
(`< NAME 1.234 ms`). For those, one compiled pattern proves the line well formed
(printable ASCII, or in a JSON line strings without escapes, numbers in range once
converted), and the Timeline's own work is done here inline: push the node, or pop
it and count it. Every other line, and every such line that is not the plain case
(a pid not yet seen, an end whose start is not on top of its thread, nesting too
deep, a number out of range), takes the general path (events.read.read_line, then
Timeline.add) unchanged: both paths leave the Timeline in the same state, so the
summary is the same. docs/report-speed.md has the measurements.
"""

from __future__ import annotations

import re

from importwatch.events import IMPORT, MAX_LINE, MAX_MS, MAX_TIME, NATIVE, SIGNAL
from importwatch.events.read import BadLine, Event
from importwatch.tools.report.logread import Skipped, chunks, not_a_log, open_log, take_line
from importwatch.tools.report.timeline import MAX_DEPTH, Node, Process, Timeline

# Text: pid (and rank) as one key, clock, thread; then a start (`dlopen ` for a native load, its name
# or path) or an end (`dlopen `, name, ms, an import's failure). A native load's path is one word here
# and its end names no failure: the rest, and modules named as another kind's line (`> phase x`),
# take the general path. The classes are printable ASCII: a line with anything else takes it too,
# and is escaped there.
TEXT_LINE = re.compile(
    r"\[importwatch (\d{1,10}(?: r\d{1,10})?) (\d\d:\d\d:\d\d\.\d\d\d)(?: ([!-~]+))?\] +"
    r"(?:> (dlopen )?(?!dlopen |phase |step )([!-~]+)(?(4) \([!-~]+\))"
    r"|< (dlopen )?(?!dlopen |phase |step )([!-~]+) (\d{1,15}(?:\.\d{1,15})?) ms(?(6)|(?: failed ([ -~]*))?))"
).fullmatch
# JSON, as importwatch writes it (json.dumps' separators, its key order): an import's or a native
# load's start or end, strings without escapes (so without quotes, backslashes, controls or
# non-ASCII), numbers as JSON writes them and float() reads them alike, no exponent. Any other
# shape (a failure, a load's CUDA needs or mapped libraries) takes the general path.
_STRING = r'"[ !#-\[\]-~]*"'
_JNUMBER = r"((?:0|[1-9]\d{0,15})(?:\.\d{1,20})?)"
JSON_LINE = re.compile(
    rf'\{{"time": {_JNUMBER}, "pid": (0|[1-9]\d{{0,9}}), "thread": "([ !#-\[\]-~]+)", '
    r'(?:"rank": (0|[1-9]\d{0,9}), )?"kind": "(import|native)(_end)?", '
    rf'(?:"name": "([ !#-\[\]-~]+)", (?:"parent": (?:{_STRING}|null), )?'
    rf'|"path": "([ !#-\[\]-~]+)", (?:"owner": {_STRING}, )?)'
    rf'(?:"ms": {_JNUMBER}, )?"text": {_STRING}\}}'
).fullmatch

# A text clock's milliseconds as seconds, as int(MMM) / 1000.0 gives them.
_MILLISECONDS = {f"{ms:03d}": ms / 1000.0 for ms in range(1000)}


def read_summary(path: str, timeline: Timeline, skipped: Skipped, pid: int | None = None) -> None:
    """Read the log at PATH into TIMELINE (one that does not keep its trees), bad lines counted in SKIPPED.

    With PID, only that process's lines go in (and signals sent to it, which its
    parent writes). LogError when the file is not a log.
    """
    if timeline.keep:
        raise ValueError("read_summary() is for a timeline that does not keep its trees")
    reader = _Reader(timeline, skipped, pid)
    with open_log(path) as file:
        number = 0
        for lines in chunks(file, path):
            first = lines[0]
            if first is None or max(map(len, lines)) > MAX_LINE:  # overlong lines: the general path says so
                for line in lines:
                    number += 1
                    reader.general(line, number)
            elif first[:1] == "{":  # a chunk is read in its first line's format; the other's lines go general
                number = reader.json_lines(lines, number)
            else:
                number = reader.text_lines(lines, number)
    if not reader.found:
        raise not_a_log(path, skipped)


class _Reader:
    """The state of one read_summary(): which Process each pid's lines go to, and whether any line was ours."""

    def __init__(self, timeline: Timeline, skipped: Skipped, pid: int | None) -> None:
        self.timeline = timeline
        self.skipped = skipped
        self.pid = pid
        self.found = 0
        # "PID" or "PID rRANK" as the line writes it: (its current Process, rank), or (None, None) for
        # a process that --pid leaves out. Emptied whenever a process starts (a pid's next run).
        self.who: dict[str, tuple[Process | None, int | None]] = {}

    def general(self, line: str | None, number: int) -> Event | None:
        """LINE (line NUMBER) read as an event and added as Timeline.add does; the event, or None."""
        event = take_line(line, number, self.skipped)
        if event is None:
            return None
        self.found += 1
        if self.pid is not None and event.pid != self.pid and event.kind != SIGNAL:
            return event
        timeline = self.timeline
        known = len(timeline.processes)
        self.skipped.number = number
        try:
            timeline.add(event)
        except BadLine as error:
            self.skipped.add(number, str(error))
        if len(timeline.processes) != known:
            self.who.clear()
        return event

    def _learn(self, who: str, line: str, number: int) -> None:
        """A pid (and rank) not seen since the last process started: its line read the general way."""
        event = self.general(line, number)
        if event is None:
            return
        if self.pid is not None and event.pid != self.pid:
            self.who[who] = (None, None)
        else:
            process = self.timeline.current.get(event.pid)
            if process is not None:
                self.who[who] = (process, event.rank)

    def text_lines(self, lines: list[str], before: int) -> int:
        """Read LINES (the log's from line BEFORE + 1 on); the number of the last."""
        base = before + 1
        who_of = self.who.get
        clock = self.timeline.clock
        ended = self.timeline.ended  # the parent's nested time, and on_end: as Timeline counts them
        for number, match in enumerate(map(TEXT_LINE, lines), base):
            if match is None:
                self.general(lines[number - base], number)
                continue
            who, stamp, thread_name, native, name, native_end, end_name, ms_text, error = match.groups()
            entry = who_of(who)
            if entry is None:
                self._learn(who, lines[number - base], number)
                continue
            process, rank = entry
            ms = 0.0
            if end_name is not None:
                ms = float(ms_text)
                if ms > MAX_MS:
                    self.general(lines[number - base], number)
                    continue
            if process is None:  # left out by --pid
                continue
            thread = process.threads.get(thread_name or "MainThread") or process.thread(
                thread_name or "MainThread"
            )
            stack = thread.stack
            if end_name is None:
                kind = IMPORT if native is None else NATIVE
                if len(stack) >= MAX_DEPTH:
                    self.general(lines[number - base], number)
                    continue
            else:
                kind = IMPORT if native_end is None else NATIVE
                node = stack[-1] if stack else None
                if node is None or node.name != end_name or node.kind != kind:
                    self.general(lines[number - base], number)
                    continue
            if stamp[:8] == clock.second:  # as text_seconds does, without the call: same floats
                when = clock.last = clock.base + _MILLISECONDS[stamp[9:]] + clock.days
            else:
                when = clock.text_seconds(stamp)
            if rank is not None:
                process.rank = rank
            if when >= process.last:
                process.last = when
                process.last_clock = stamp
            process.own_last = when
            if end_name is None:
                process.seq += 1
                stack.append(Node(kind, name, when, stack[-1] if stack else None, stamp, process.seq))
                continue
            stack.pop()
            node.ms = ms
            node.error = error
            ended(process, thread, node)
        return base + len(lines) - 1

    def json_lines(self, lines: list[str], before: int) -> int:
        """As text_lines, for JSON Lines: the clock of a line is written only if the summary shows it."""
        # The loop's head repeats text_lines' on purpose: a shared generator would add a call to
        # each of a large log's million lines, which is this reader's whole budget.
        base = before + 1
        who_of = self.who.get
        ended = self.timeline.ended  # the parent's nested time, and on_end: as Timeline counts them
        for number, match in enumerate(map(JSON_LINE, lines), base):
            if match is None:
                self.general(lines[number - base], number)
                continue
            time_text, pid_text, thread_name, rank_text, what, end, name, path, ms_text = match.groups()
            who = pid_text if rank_text is None else f"{pid_text} r{rank_text}"
            entry = who_of(who)
            when = float(time_text)
            ms = float(ms_text) if ms_text is not None else None
            if entry is None or when > MAX_TIME or (ms is not None and ms > MAX_MS):
                if entry is None:
                    self._learn(who, lines[number - base], number)
                else:
                    self.general(lines[number - base], number)
                continue
            process, rank = entry
            if process is None:  # left out by --pid
                continue
            thread = process.threads.get(thread_name) or process.thread(thread_name)
            stack = thread.stack
            kind = IMPORT if what == "import" else NATIVE
            name = name or path
            if (
                len(stack) >= MAX_DEPTH
                if end is None
                else ms is None or not stack or stack[-1].name != name or stack[-1].kind != kind
            ):
                self.general(lines[number - base], number)
                continue
            if rank is not None:
                process.rank = rank
            if when >= process.last:
                process.last = when
                process.last_clock = ""  # written by Timeline.finish
            process.own_last = when
            if end is None:
                process.seq += 1
                stack.append(Node(kind, name, when, stack[-1] if stack else None, "", process.seq))
                continue
            node = stack.pop()
            node.ms = ms
            node.error = None
            ended(process, thread, node)
        return base + len(lines) - 1
