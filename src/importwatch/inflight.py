"""What is in flight per thread, rebuilt from start and end events: the one reader for report, bisect, doctor
and the watcher.

A start puts a step on its thread's stack. An end closes the innermost step of its
kind and name; steps started above that one have lost their end lines (a log cut
and appended to, a feed that dropped lines) and close with it. An end whose start
was never read (a fork child ending what its parent began) closes nothing here: the
caller decides what it means. The watcher, whose feed may drop lines, follows the
indentation instead (by_depth): a start or end at depth D says that everything at D
and deeper has ended.
"""

from importwatch.events import IMPORT, IMPORT_END, NATIVE, NATIVE_END, PHASE, PHASE_END, STEP, STEP_END

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Collection, Hashable, Sequence
    from typing import Any, TypeVar

    S = TypeVar("S", bound="Started")  # the caller's steps: a report's tree nodes are steps too

    from importwatch.events.read import Event

# The kind of an end line -> the kind of the start it closes.
STARTED_BY = {IMPORT_END: IMPORT, NATIVE_END: NATIVE, PHASE_END: PHASE, STEP_END: STEP}
STARTS = frozenset(STARTED_BY.values())


class Started:
    """One import, native load, phase or blocking step whose start was read and whose end was not (yet)."""

    __slots__ = ("kind", "name", "seq", "start", "warnings")

    def __init__(self, kind: str, name: str, start: float = 0.0, seq: int = 0) -> None:
        self.kind = kind  # IMPORT, NATIVE, PHASE or STEP: the kind of its start line
        self.name = name  # module, library path, phase or step name
        self.start = start  # when it started, on the reader's clock
        self.seq = seq  # the reader's count of what it had read when this started
        self.warnings: tuple[str, ...] = ()  # "! ..." lines written while it was the innermost

    def __repr__(self) -> str:
        return f"Started({self.kind!r}, {self.name!r})"


def closes(stack: "list[S]", kind: str, name: str) -> int:
    """The index in STACK of what an end of KIND (its start's kind) and NAME closes: the innermost
    step of that kind and name; -1 when none is in flight."""
    index = len(stack) - 1
    while index >= 0:
        step = stack[index]
        if step.kind == kind and step.name == name:
            return index
        index -= 1
    return -1


def close(stack: "list[S]", kind: str, name: str) -> "tuple[S | None, list[S]]":
    """End the step of KIND and NAME in STACK: (that step, or None when it is not in flight; the steps
    started above it, whose ends were lost, innermost first). They all leave STACK."""
    index = closes(stack, kind, name)
    if index < 0:
        return None, []
    step = stack[index]
    lost = stack[:index:-1]
    del stack[index:]
    return step, lost


def named_once(names: "Sequence[str]") -> "list[str]":
    """A chain (outermost first) as people read it: each step named once, where it does the work.

    `import pkg.sub` first imports pkg; when pkg's own code imports pkg.sub, the outer request for
    pkg.sub only waits for the inner one, which loads it: the chain pkg.sub > pkg > pkg.sub reads
    pkg > pkg.sub."""
    last = {name: index for index, name in enumerate(names)}
    return [name for index, name in enumerate(names) if last[name] == index]


class InFlight:
    """Per thread, the steps in flight, outermost first; a thread is whatever key the caller gives.

    KINDS are the start kinds followed (an end of another kind is ignored); BY_DEPTH
    follows the indentation instead of the names (see the module's docstring).
    """

    def __init__(self, kinds: "Collection[str]" = STARTS, by_depth: bool = False) -> None:
        self.kinds = kinds
        self.by_depth = by_depth
        self.stacks: dict[Any, list[Started]] = {}  # thread key: its steps in flight

    def follows(self, kind: str) -> bool:
        """Whether an event of KIND starts or ends a step this reader follows."""
        return kind in self.kinds or STARTED_BY.get(kind) in self.kinds

    def follow(self, event: "Event", key: "Hashable", start: float = 0.0, seq: int = 0) -> "Started | None":
        """Apply EVENT, of thread KEY: the step it started (at START, numbered SEQ) or ended; None when
        it is neither a start nor an end followed, or ends nothing in flight."""
        kind = event.kind
        if kind in self.kinds:
            stack = self.stacks.setdefault(key, [])
            if self.by_depth:
                del stack[event.depth :]
            step = Started(kind, event.name, start, seq)
            stack.append(step)
            return step
        begun = STARTED_BY.get(kind)
        if begun is None or begun not in self.kinds:
            return None
        stack = self.stacks.get(key)
        if not stack:
            return None
        if self.by_depth:
            # The name is not checked: after lost lines, the depth is what still holds.
            ended = stack[event.depth] if event.depth < len(stack) else None
            del stack[event.depth :]
            return ended
        return close(stack, begun, event.name)[0]

    def warn(self, key: "Hashable", text: str) -> None:
        """A "! ..." line of thread KEY: it belongs to the innermost step in flight there, if any."""
        stack = self.stacks.get(key)
        if stack:
            stack[-1].warnings += (text,)

    def chain(self, key: "Hashable") -> "list[Started]":
        """What thread KEY has in flight, outermost first (empty when nothing)."""
        return self.stacks.get(key) or []

    def chains(self) -> "dict[Any, list[Started]]":
        """The threads with something in flight, in the order they first started a step, and their steps."""
        return {key: stack for key, stack in self.stacks.items() if stack}
