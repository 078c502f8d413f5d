"""Rebuilds a log's per-process, per-thread trees of imports and native loads, cut-off logs included.

The log is read as a stream, a chunk at a time: memory holds what is in flight,
plus the whole trees only when a format needs them (keep=True).
"""

from __future__ import annotations

import time

from importwatch.events import (
    CHECKPOINT,
    DIED,
    EXIT,
    IMPORT,
    NATIVE,
    OUTSIDE,
    OUTSIDE_HEAD,
    RESUMED,
    SIGNAL,
    STALL,
    STALL_CONTEXT,
    STALL_THREAD,
    START,
    TORCH,
    VERDICT,
    WARNING,
    escape,
    render,
)
from importwatch.events.read import BadLine, Event, seconds_of_day
from importwatch.inflight import STARTED_BY, STARTS, Started, close
from importwatch.masking import mask_argv, mask_text
from importwatch.tools.report.logread import Skipped, read_events

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable, Iterator

# A clock that jumps back by more than half a day has passed midnight.
_DAY = 86400.0
_HALF_DAY = _DAY / 2
# Lines of each kind of note kept per process (stall reports, warnings, checkpoints); the rest counted.
NOTES = 1000
# Deeper nesting than this is no import chain (each level takes several of the interpreter's
# 1000 frames): a crafted log, whose trees would exhaust the report's own recursion.
MAX_DEPTH = 256


class Node(Started):
    """One import, native load, phase or step on one thread, with the imports and loads it caused.

    While in flight it is its thread's step (inflight.Started): kind, name, start in
    seconds on the log's clock (best estimate), seq the order of its start in its process.
    """

    __slots__ = ("begin", "children", "clock", "end", "error", "ms", "nested", "parent", "unfinished")

    def __init__(
        self, kind: str, name: str, start: float, parent: Node | None, clock: str = "", seq: int = 0
    ) -> None:
        # Started's fields set here, not through its __init__: a log makes millions of nodes.
        self.kind = kind
        self.name = name
        self.start = start
        self.seq = seq
        self.warnings = ()
        self.clock = clock  # the start line's HH:MM:SS.mmm
        self.parent = parent
        self.children: list[Node] = []  # only when the trees are kept
        self.ms = 0.0  # measured duration; for an unfinished one, until the log ends
        self.nested = 0.0  # ms of the imports under it, seen through loads and phases (import_children)
        self.error: str | None = None
        self.unfinished = False
        self.begin = 0  # placed start and end in microseconds since the log began (see place)
        self.end = 0

    @property
    def label(self) -> str:
        if self.kind == IMPORT:
            return self.name
        return f"{'dlopen' if self.kind == NATIVE else self.kind} {self.name}"

    @property
    def self_ms(self) -> float:
        """Time not spent in nested imports, as -X importtime counts it: native loads count as self."""
        return max(self.ms - self.nested, 0.0)

    @property
    def counted(self) -> float:
        """What this node adds to its parent's nested time: its own if an import, else its imports'."""
        return self.ms if self.kind == IMPORT else self.nested

    def walk(self):
        """This node and everything under it, parents first."""
        yield self
        for child in self.children:
            yield from child.walk()

    def chain(self) -> list[Node]:
        """The nodes from the outermost ancestor down to this one."""
        nodes = []
        node: Node | None = self
        while node is not None:
            nodes.append(node)
            node = node.parent
        return nodes[::-1]

    def __repr__(self) -> str:
        return f"Node({self.label!r}, {self.ms:.3f} ms)"


def import_children(node: Node) -> list[Node]:
    """The imports directly under NODE, seen through native loads (an init may import) and phases."""
    found = []
    for child in node.children:
        if child.kind == IMPORT:
            found.append(child)
        else:
            found.extend(import_children(child))
    return found


class Thread:
    """The imports of one thread of one process, in the order they started."""

    def __init__(self, name: str, index: int = 0) -> None:
        self.name = name
        self.index = index  # order of its first line in its process
        self.roots: list[Node] = []  # only when the trees are kept
        self.stack: list[Node] = []  # in flight while reading; what is left at the end never ended
        self.nested = 0.0  # as Node.nested, for what ran at the top level

    def walk(self):
        for root in self.roots:
            yield from root.walk()


class Ending:
    """How a process's own end was told in the log: by the watcher, --exit-on-stall, or a signal."""

    __slots__ = ("clock", "text", "what", "when")

    def __init__(self, what: str, when: float, clock: str, text: str) -> None:
        self.what = what  # DIED, EXIT or SIGNAL
        self.when = when
        self.clock = clock
        self.text = text  # the line's words, e.g. "died during import: process 7 was killed by SIGKILL ..."


class Process:
    """Everything one process wrote to the log."""

    def __init__(self, pid: int, run: int, first: float, first_clock: str) -> None:
        self.pid = pid
        self.run = run  # 1, or 2 and up when the pid starts again (exec, or an appended log)
        self.threads: dict[str, Thread] = {}
        self.first = first
        self.last = first
        self.first_clock = first_clock
        self.last_clock = first_clock
        self.start_text = ""  # the banner's "start python ..." line
        self.start: dict = {}  # its fields (see events.START)
        self.torch = ""
        # (seconds, clock, text) of STALL, "also in flight" and RESUMED lines, and of "! " lines;
        # the first NOTES of each, with the number left out
        self.stalls: list[tuple[float, str, str]] = []
        self.verdicts: list[tuple[float, str, str]] = []
        self.warnings: list[tuple[float, str, str]] = []
        self.checkpoints: list[tuple[float, str, str]] = []  # (seconds, thread, name)
        self.left_out = {"stalls": 0, "verdicts": 0, "warnings": 0, "checkpoints": 0}
        self.rank: int | None = None  # in a distributed job
        self.orphans = 0  # ends whose start is not in this log (a fork inside an import)
        # Steps whose end line never came, closed when a step they ran in ended (inflight.close):
        # (thread, names innermost first, clock of the innermost's start, the end that closed them)
        self.lost: list[tuple[str, list[str], str, str]] = []
        self.lost_left_out = 0
        self.endings: list[Ending] = []  # the watcher's "died", --exit-on-stall's exit, signals sent to it
        self.own_last = first  # its last line written by itself (not by the watcher, not about it)
        self.seq = 0

    @property
    def name(self) -> str:
        rank = f" rank {self.rank}" if self.rank is not None else ""
        return f"pid {self.pid}{rank}" if self.run == 1 else f"pid {self.pid}{rank} (run {self.run})"

    @property
    def seconds(self) -> float:
        return self.last - self.first

    def thread(self, name: str) -> Thread:
        thread = self.threads.get(name)
        if thread is None:
            thread = self.threads[name] = Thread(name, len(self.threads))
        return thread

    def nodes(self):
        for thread in self.threads.values():
            yield from thread.walk()

    def in_flight(self) -> list[tuple[Thread, list[Node]]]:
        """Per thread, the chain of imports and loads that had started and not ended when the log ends."""
        return [(thread, list(thread.stack)) for thread in self.threads.values() if thread.stack]

    def note(self, which: str, item: tuple) -> None:
        notes = getattr(self, which)
        if len(notes) < NOTES:
            notes.append(item)
        else:
            self.left_out[which] += 1

    def cut_by(self) -> Ending | None:
        """What ended the process with its work in flight, when the log says: else the log's end cut it.

        The watcher's death line comes first; then --exit-on-stall; then a signal its parent
        sent after its last line (a pool's terminate): before that, the process went on.
        """
        for what in (DIED, EXIT):
            for ending in self.endings:
                if ending.what == what:
                    return ending
        for ending in self.endings:
            if ending.what == SIGNAL and ending.when >= self.own_last - _CLOCK_SLACK:
                return ending
        return None


# Lines about a process that it did not write itself: the watcher's, and its own end.
_NOT_OWN = frozenset((OUTSIDE, DIED, EXIT))
# Text logs' clocks are cut to the millisecond: a signal's line may read a millisecond early.
_CLOCK_SLACK = 0.002


class _Clock:
    """Turns an event's time into seconds on one axis: epoch time (JSON) or clock time past midnights.

    Lines come many to a second: the work of a whole second is done once per second.
    """

    def __init__(self) -> None:
        self.days = 0.0
        self.last: float | None = None
        self.second = ""  # HH:MM:SS of the last text line, and its seconds since midnight
        self.base = 0.0
        self._epoch = -1  # the whole second of the last JSON line, and its HH:MM:SS.
        self._text = ""

    def seconds(self, event: Event) -> float:
        if event.time is not None:
            return event.time
        return self.text_seconds(event.clock)

    def text_seconds(self, clock: str) -> float:
        """A text line's HH:MM:SS.mmm in seconds, past as many midnights as the log has crossed."""
        if clock[:8] != self.second:
            self.second = clock[:8]
            self.base = seconds_of_day(self.second)
        value = self.base + int(clock[9:12]) / 1000.0 + self.days
        if self.last is not None and value < self.last - _HALF_DAY:
            self.days += _DAY
            value += _DAY
        self.last = value
        return value

    def stamp(self, event: Event, seconds: float) -> str:
        """HH:MM:SS.mmm: a text line's own; local time for a JSON line's epoch time."""
        if event.clock:
            return event.clock
        return self.stamp_at(seconds)

    def stamp_at(self, seconds: float) -> str:
        """HH:MM:SS.mmm in local time for an epoch time."""
        whole = int(seconds)
        if whole != self._epoch:
            self._epoch = whole
            self._text = time.strftime("%H:%M:%S", time.localtime(whole))
        return f"{self._text}.{int((seconds - whole) * 1000):03d}"


# The watcher says which signal ended a child in "signal SIGTERM to child PID (...)".


def _masked_start(event: Event) -> tuple[str, dict]:
    """A start line's text and fields with its argv masked again by today's rule: a log written by
    an older importwatch (or by hand) may hold what the rule now hides."""
    fields = event.fields
    argv = fields.get("argv") if fields else None
    # The line's own words: its argv is the repr of the program's words, escaped after (a render
    # of the read-back fields would escape the escapes).
    text = event.text[len("start ") :]
    if isinstance(argv, list) and all(isinstance(word, str) for word in argv):
        masked = mask_argv(argv)
        if masked != argv:
            fields = dict(fields, argv=masked)
            text = escape(render(START, fields))[len("start ") :]
        return text, fields
    return mask_text(text), fields


def _words(event: Event) -> str:
    """The words of a line, as the model renders its fields (what the report shows of it)."""
    return render(event.kind, event.fields).strip()


def _ending_text(event: Event) -> str:
    """What the report says of a DIED or EXIT event: its line's words, less the watcher's `outside: `."""
    fields = event.fields
    if event.kind == DIED:
        return render(DIED, fields)[len(OUTSIDE_HEAD) :]
    if fields.get("status") is None:
        return f"--exit-on-stall: {fields['message']}"
    return render(EXIT, fields)


class Timeline:
    """Reads a log's events, one at a time, into its processes and their threads.

    With KEEP the whole trees are kept (tree, importtime, chrome need them);
    without, a node is dropped once it ends and ON_END has seen it, so memory holds
    only what is in flight.
    """

    def __init__(self, keep: bool = True, on_end: Callable[[Process, Thread, Node], None] | None = None):
        self.keep = keep
        self.on_end = on_end
        self.clock = _Clock()
        self.processes: list[Process] = []
        self.current: dict[int, Process] = {}

    def add(self, event: Event) -> None:
        when = self.clock.seconds(event)
        stamp = self.clock.stamp(event, when)
        process = self.current.get(event.pid)
        if process is None or (event.kind == "start" and process.start_text):
            run = process.run + 1 if process is not None else 1
            process = self.current[event.pid] = Process(event.pid, run, when, stamp)
            self.processes.append(process)
        if when >= process.last:
            process.last = when
            process.last_clock = stamp
        self._apply(process, event, when, stamp)

    def finish(self) -> list[Process]:
        """The processes, in the order they first wrote; whatever is in flight runs to its last line."""
        for process in self.processes:
            # The fast path (fastread.py) leaves a JSON line's clock to be written here, when shown.
            if not process.last_clock:
                process.last_clock = self.clock.stamp_at(process.last)
            for thread in process.threads.values():
                for node in thread.stack:
                    if not node.clock:
                        node.clock = self.clock.stamp_at(node.start)
            ending = process.cut_by()
            # A signal's line is its sender's: the process ran until then, silent.
            last = max(process.last, ending.when) if ending is not None else process.last
            for thread in process.threads.values():
                for node in reversed(thread.stack):
                    node.unfinished = True
                    node.ms = max((last - node.start) * 1000.0, 0.0)
                    self.ended(process, thread, node)
        return self.processes

    def _apply(self, process: Process, event: Event, when: float, stamp: str) -> None:
        kind = event.kind
        if event.rank is not None:
            process.rank = event.rank
        if kind not in _NOT_OWN:
            process.own_last = when
        if kind in STARTS:
            thread = process.thread(event.thread)
            if len(thread.stack) >= MAX_DEPTH:
                raise BadLine(f"nested deeper than {MAX_DEPTH} levels")
            parent = thread.stack[-1] if thread.stack else None
            process.seq += 1
            node = Node(kind, event.name, when, parent, stamp, process.seq)
            if self.keep:
                (parent.children if parent is not None else thread.roots).append(node)
            thread.stack.append(node)
        elif kind in STARTED_BY:
            self._end(process, process.thread(event.thread), event, when)
        elif kind == START:
            process.start_text, process.start = _masked_start(event)
        elif kind == TORCH:
            process.torch = _words(event)
        elif kind == CHECKPOINT:
            process.note("checkpoints", (when, event.thread, event.name))
        elif kind in (STALL, STALL_THREAD, STALL_CONTEXT, RESUMED):
            process.note("stalls", (when, stamp, _words(event)))
        elif kind == VERDICT:
            process.note("verdicts", (when, stamp, _words(event)))
        elif kind == WARNING:
            process.note("warnings", (when, stamp, _words(event)))
        elif kind in (DIED, EXIT):
            process.endings.append(Ending(kind, when, stamp, _ending_text(event)))
        elif kind == SIGNAL:
            self._signal(process, event, when, stamp)

    def _signal(self, sender: Process, event: Event, when: float, stamp: str) -> None:
        """A parent's line that it sends a signal to a child: the child's ending, if the child is here."""
        fields = event.fields
        child = self.current.get(fields["child"])
        if child is not None and child is not sender and len(child.endings) < NOTES:
            text = f"{fields['signal']} from pid {sender.pid} ({fields['via']})"
            child.endings.append(Ending(SIGNAL, when, stamp, text))

    def _end(self, process: Process, thread: Thread, event: Event, when: float) -> None:
        kind = STARTED_BY[event.kind]
        ms = event.ms
        node, lost = close(thread.stack, kind, event.name)
        if node is None:
            self._orphan(process, thread, kind, event, when, ms or 0.0)
            return
        # Starts above the match never ended: lines were lost; they end here, marked unfinished.
        if lost:
            if len(process.lost) < NOTES:
                closer = f"{node.label} at {self.clock.stamp_at(when)}"
                since = self.clock.stamp_at(lost[0].start)
                process.lost.append((thread.name, [step.label for step in lost], since, closer))
            else:
                process.lost_left_out += 1
        for step in lost:
            step.unfinished = True
            step.ms = max((when - step.start) * 1000.0, 0.0)
            self.ended(process, thread, step)
        node.ms = ms if ms is not None else max((when - node.start) * 1000.0, 0.0)
        node.error = event.error
        # The start line's clock is truncated to the millisecond and so is the end's:
        # the end's clock minus the exact duration is a start no earlier than the truth.
        if ms is not None:
            node.start = max(node.start, when - ms / 1000.0)
        self.ended(process, thread, node)

    def ended(self, process: Process, thread: Thread, node: Node) -> None:
        """NODE has its duration: its parent counts it, and ON_END sees it."""
        parent = node.parent
        if parent is not None:
            parent.nested += node.counted
        else:
            thread.nested += node.counted
        if self.on_end is not None:
            self.on_end(process, thread, node)

    def _orphan(
        self, process: Process, thread: Thread, kind: str, event: Event, when: float, ms: float
    ) -> None:
        """An end whose start this process never wrote: a fork in the middle of an import.

        The child inherits the parent's imports in flight and ends them under its own pid;
        what the child imported meanwhile is nested inside, so the node adopts it (without
        the trees: all that ended at that level, which in a fork child is all since it began).
        """
        if process.orphans >= MAX_DEPTH:  # each would nest the last: as deep as a crafted log likes
            raise BadLine("more ends without their start than a fork can inherit")
        process.orphans += 1
        parent = thread.stack[-1] if thread.stack else None
        process.seq += 1
        node = Node(kind, event.name, when - ms / 1000.0, parent, seq=process.seq)
        node.ms = ms
        node.error = event.error
        holder: Node | Thread = parent if parent is not None else thread
        if self.keep:
            siblings = parent.children if parent is not None else thread.roots
            while siblings and siblings[-1].start >= node.start:
                adopted = siblings.pop()
                adopted.parent = node
                node.children.insert(0, adopted)
                node.nested += adopted.counted
            siblings.append(node)
        else:
            node.nested = holder.nested
        holder.nested -= node.nested
        self.ended(process, thread, node)


def build(events: Iterator[Event], keep: bool = True) -> list[Process]:
    """The processes of a log, in the order they first wrote, each with its threads' trees."""
    timeline = Timeline(keep)
    for event in events:
        try:
            timeline.add(event)
        except BadLine:
            continue
    return timeline.finish()


def load(path: str, skipped: Skipped | None = None) -> list[Process]:
    """The processes in the log at PATH, whole trees kept (LogError when it is not one)."""
    return build(read_events(path, skipped))


def place(processes: list[Process]) -> float:
    """Give every node begin/end in whole microseconds since the log's first event, properly nested.

    Clock times place a node; its measured duration sizes it. A child starts no
    earlier than its parent or its previous sibling and ends no later than its
    parent, so the slices of one thread always nest. Returns the origin (seconds).
    """
    origin = min((process.first for process in processes), default=0.0)
    for process in processes:
        for thread in process.threads.values():
            _place(thread.roots, round((process.first - origin) * 1e6), None, origin)
    return origin


def _place(nodes: list[Node], low: int, high: int | None, origin: float) -> None:
    cursor = low
    for node in nodes:
        length = round(node.ms * 1000.0)
        begin = max(round((node.start - origin) * 1e6), cursor)
        if high is not None:
            begin = max(min(begin, high - length), cursor)
        end = begin + length
        if high is not None:
            end = min(end, high)
        node.begin, node.end = begin, end
        _place(node.children, begin, end, origin)
        cursor = end
