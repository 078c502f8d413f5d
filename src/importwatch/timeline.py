"""Rebuilds a log's per-process, per-thread trees of imports and native loads, cut-off logs included."""

from __future__ import annotations

import time

from importwatch.events import (
    CHECKPOINT,
    IMPORT,
    IMPORT_END,
    NATIVE,
    NATIVE_END,
    PHASE,
    PHASE_END,
    STEP,
    STEP_END,
    Event,
    parse_line,
)

# What starts a node, and the kind of the line that ends it.
ENDS = {IMPORT: IMPORT_END, NATIVE: NATIVE_END, PHASE: PHASE_END, STEP: STEP_END}
_STARTS = {end: start for start, end in ENDS.items()}
# A clock that jumps back by more than half a day has passed midnight.
_DAY = 86400.0
_HALF_DAY = _DAY / 2
# Bytes that never occur in a text log: a file holding them is not one.
_BINARY_SNIFF = 8192


class LogError(Exception):
    """The file cannot be read as a log: its message is the one line the user sees."""


class Node:
    """One import or native load on one thread, with the imports and loads it caused."""

    __slots__ = (
        "begin",
        "children",
        "clock",
        "end",
        "error",
        "kind",
        "ms",
        "name",
        "parent",
        "start",
        "unfinished",
    )

    def __init__(self, kind: str, name: str, start: float, parent: Node | None, clock: str = "") -> None:
        self.kind = kind  # IMPORT, NATIVE (a dlopen), PHASE (named by the program) or STEP
        self.name = name  # module name, or the library's path
        self.start = start  # seconds on the log's clock (best estimate)
        self.clock = clock  # the start line's HH:MM:SS.mmm
        self.parent = parent
        self.children: list[Node] = []
        self.ms = 0.0  # measured duration; for an unfinished one, until the log ends
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
        return max(self.ms - sum(child.ms for child in import_children(self)), 0.0)

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

    def __init__(self, name: str) -> None:
        self.name = name
        self.roots: list[Node] = []
        self.stack: list[Node] = []  # in flight while reading; what is left at the end never ended

    def walk(self):
        for root in self.roots:
            yield from root.walk()


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
        self.torch = ""
        # (seconds, clock, text) of STALL, "also in flight" and RESUMED lines, and of "! " lines
        self.stalls: list[tuple[float, str, str]] = []
        self.warnings: list[tuple[float, str, str]] = []
        self.checkpoints: list[tuple[float, str, str]] = []  # (seconds, thread, name)
        self.rank: int | None = None  # in a distributed job
        self.orphans = 0  # ends whose start is not in this log (a fork inside an import)

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
            thread = self.threads[name] = Thread(name)
        return thread

    def nodes(self):
        for thread in self.threads.values():
            yield from thread.walk()

    def in_flight(self) -> list[tuple[Thread, list[Node]]]:
        """Per thread, the chain of imports and loads that had started and not ended when the log ends."""
        return [(thread, list(thread.stack)) for thread in self.threads.values() if thread.stack]


class _Clock:
    """Turns an event's time into seconds on one axis: epoch time (JSON) or clock time past midnights."""

    def __init__(self) -> None:
        self.days = 0.0
        self.last: float | None = None

    def seconds(self, event: Event) -> float:
        if event.time is not None:
            return float(event.time)
        hours, minutes, seconds = event.clock.split(":")
        value = int(hours) * 3600 + int(minutes) * 60 + float(seconds) + self.days
        if self.last is not None and value < self.last - _HALF_DAY:
            self.days += _DAY
            value += _DAY
        self.last = value
        return value


def read_events(path: str) -> list[Event]:
    """The events of the log at PATH, or LogError saying in one line why it is not a log."""
    try:
        with open(path, "rb") as file:
            data = file.read()
    except OSError as error:
        raise LogError(f"cannot read {path}: {error.strerror or error}") from None
    if not data.strip():
        raise LogError(f"{path} is empty: there is nothing to report")
    if b"\0" in data[:_BINARY_SNIFF]:
        raise LogError(f"{path} is a binary file, not an importwatch log")
    events = []
    for line in data.decode("utf-8", "replace").splitlines():
        try:
            event = parse_line(line)
        except (ValueError, TypeError):  # a JSON object of someone else's, e.g. a pid that is no number
            continue
        if event is not None and _usable(event):
            events.append(event)
    if not events:
        raise LogError(
            f"{path} is not an importwatch log: no line starts with '[importwatch '"
            " nor is one of its JSON records"
        )
    return events


def _usable(event: Event) -> bool:
    """A JSON record of ours has a numeric time and duration; a text line always has its clock."""
    if event.clock:
        return True
    number = (int, float)
    return isinstance(event.time, number) and (event.ms is None or isinstance(event.ms, number))


def build(events: list[Event]) -> list[Process]:
    """The processes of a log, in the order they first wrote, each with its threads' trees."""
    clock = _Clock()
    processes: list[Process] = []
    current: dict[int, Process] = {}
    for event in events:
        when = clock.seconds(event)
        stamp = event.clock or _clock_text(when)
        process = current.get(event.pid)
        if process is None or (event.kind == "start" and process.start_text):
            run = process.run + 1 if process is not None else 1
            process = current[event.pid] = Process(event.pid, run, when, stamp)
            processes.append(process)
        process.last = max(process.last, when)
        process.last_clock = stamp
        _apply(process, event, when, stamp)
    for process in processes:
        _finish(process)
    return processes


def load(path: str) -> list[Process]:
    """The processes in the log at PATH (LogError when it is not one)."""
    return build(read_events(path))


def _apply(process: Process, event: Event, when: float, stamp: str) -> None:
    kind = event.kind
    if event.rank is not None:
        process.rank = event.rank
    if kind in ENDS:
        thread = process.thread(event.thread)
        parent = thread.stack[-1] if thread.stack else None
        node = Node(kind, event.name, when, parent, stamp)
        (parent.children if parent is not None else thread.roots).append(node)
        thread.stack.append(node)
    elif kind in _STARTS:
        _end(process, process.thread(event.thread), event, when)
    elif kind == "start":
        process.start_text = event.text[len("start ") :]
    elif kind == "torch":
        process.torch = event.text
    elif kind == CHECKPOINT:
        process.checkpoints.append((when, event.thread, event.name))
    elif kind in ("stall", "stall_thread", "stall_context", "resumed"):
        process.stalls.append((when, stamp, event.text.strip()))
    elif kind == "warning":
        process.warnings.append((when, stamp, event.text.strip()))


def _end(process: Process, thread: Thread, event: Event, when: float) -> None:
    kind = _STARTS[event.kind]
    ms = float(event.ms) if event.ms is not None else None
    index = len(thread.stack) - 1
    while index >= 0 and not (thread.stack[index].kind == kind and thread.stack[index].name == event.name):
        index -= 1
    if index < 0:
        _orphan(process, thread, kind, event, when, ms or 0.0)
        return
    # Starts above the match never ended: lines were lost; they end here, marked unfinished.
    for lost in thread.stack[index + 1 :]:
        lost.unfinished = True
        lost.ms = max((when - lost.start) * 1000.0, 0.0)
    del thread.stack[index + 1 :]
    node = thread.stack.pop()
    node.ms = ms if ms is not None else max((when - node.start) * 1000.0, 0.0)
    node.error = event.error
    # The start line's clock is truncated to the millisecond and so is the end's:
    # the end's clock minus the exact duration is a start no earlier than the truth.
    node.start = max(node.start, when - ms / 1000.0)


def _orphan(process: Process, thread: Thread, kind: str, event: Event, when: float, ms: float) -> None:
    """An end whose start this process never wrote: a fork in the middle of an import.

    The child inherits the parent's imports in flight and ends them under its own pid;
    what the child imported meanwhile is nested inside, so the node adopts it.
    """
    process.orphans += 1
    parent = thread.stack[-1] if thread.stack else None
    siblings = parent.children if parent is not None else thread.roots
    node = Node(kind, event.name, when - ms / 1000.0, parent)
    node.ms = ms
    node.error = event.error
    while siblings and siblings[-1].start >= node.start:
        adopted = siblings.pop()
        adopted.parent = node
        node.children.insert(0, adopted)
    siblings.append(node)


def _finish(process: Process) -> None:
    """Whatever is still in flight runs until the process's last line; then place every node."""
    for thread in process.threads.values():
        for node in thread.stack:
            node.unfinished = True
            node.ms = max((process.last - node.start) * 1000.0, 0.0)


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


def _clock_text(seconds: float) -> str:
    """HH:MM:SS.mmm local time for an epoch time (JSON logs carry no clock text)."""
    whole = int(seconds)
    return time.strftime("%H:%M:%S", time.localtime(whole)) + f".{int((seconds - whole) * 1000):03d}"
