"""Who waits for whom among an inspected process's threads: waits for an import lock and joins as a
wait-for graph, a cycle in it named as a deadlock in one line, and a main thread whose code has ended
waiting at exit (threading's shutdown) for a thread that hangs."""

from __future__ import annotations

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Sequence

    from importwatch.facts.stacks import StackFrame

_JOINS = ("join", "_wait_for_tstate_lock")


def _in_threading(frame: StackFrame) -> bool:
    return frame.filename in ("threading.py", "<frozen threading>") or frame.filename.endswith(
        "/threading.py"
    )


def _self(frames: Sequence[StackFrame], functions: tuple[str, ...]) -> str | None:
    """The `self` (as the reader printed it, `<Thread at 0x...>`) of the innermost of threading's FUNCTIONS."""
    for frame in frames:
        if _in_threading(frame) and frame.function.rsplit(".", 1)[-1] in functions:
            return frame.values.get("self")
    return None


def _joins(frames: Sequence[StackFrame]) -> bool:
    """Whether a thread waits in Thread.join: threading's join frames innermost, nothing of its own below."""
    for frame in frames:
        if not _in_threading(frame):
            return False
        if frame.function.rsplit(".", 1)[-1] in _JOINS:
            return True
    return False


def _label(thread: dict) -> str:
    return f"{thread['name']} (tid {thread['tid']})"


def relations(pid: int, threads: list[dict], python: dict[int, list[StackFrame]]) -> list[str]:
    """The problems a relation between threads names, the answer first: a cycle of waits (each thread
    waits for the next's import lock or in Thread.join for it), and the main thread waiting at exit for
    a thread in an import. Each thread that joins another gets `joins` (the other's label)."""
    by_tid = {thread["tid"]: thread for thread in threads}
    # A thread's own Thread object, as its _bootstrap frame shows it: how a join names its target.
    objects = {_self(python.get(tid, []), ("_bootstrap",)): tid for tid in by_tid}
    objects.pop(None, None)
    following: dict[int, tuple[int, str | None]] = {}  # waiter -> (whom it waits for, the lock or None)
    for thread in threads:
        tid = thread["tid"]
        if thread.get("lock"):
            holder = next(
                (
                    t
                    for t in threads
                    if t is not thread and thread["lock"] in t["chain"] and t.get("lock") != thread["lock"]
                ),
                None,
            )
            if holder is not None:
                following[tid] = (holder["tid"], thread["lock"])
        elif _joins(python.get(tid, [])):
            target = objects.get(_self(python[tid], _JOINS))
            others = [other for other in python if other != tid and python[other]]
            if target is None and len(others) == 1:
                target = others[0]  # a join waits for a live Python thread other than itself: this one
            if target is not None and target in by_tid:
                following[tid] = (target, None)
                thread["joins"] = _label(by_tid[target])
    problems = _cycles(following, by_tid, pid)
    ending = _at_exit(pid, by_tid, python)
    return [*ending, *problems]


def _cycles(following: dict[int, tuple[int, str | None]], by_tid: dict[int, dict], pid: int) -> list[str]:
    lines = []
    said: set[frozenset[int]] = set()
    for start in following:
        path = [start]
        while path[-1] in following and following[path[-1]][0] not in path:
            path.append(following[path[-1]][0])
        if path[-1] not in following or following[path[-1]][0] != start or frozenset(path) in said:
            continue
        said.add(frozenset(path))
        lines.append(_cycle_line(path, following, by_tid, pid))
    return lines


def _cycle_line(
    cycle: list[int], following: dict[int, tuple[int, str | None]], by_tid: dict[int, dict], pid: int
) -> str:
    """`deadlock: MainThread (tid N) holds the import lock of X and waits for the import lock of Y, held by
    warmup (tid M), which waits for the import lock of X: neither can go on`, from the main thread where
    it holds a lock of the cycle, else from the first thread that does."""
    count = len(cycle)
    holders = [i for i in range(count) if following[cycle[i - 1]][1]]
    if not holders:  # joins only: each thread joins the next
        holders = [0]
    first = next((i for i in holders if cycle[i] == pid), holders[0])
    cycle = cycle[first:] + cycle[:first]
    held = following[cycle[-1]][1]
    texts = []
    for tid in cycle:
        target, lock = following[tid]
        whom = "" if target == cycle[0] and lock else f", held by {_label(by_tid[target])}"
        texts.append(
            f"waits for the import lock of {lock}{whom}"
            if lock
            else f"waits in Thread.join for {_label(by_tid[target])}"
        )
    holds = f" holds the import lock of {held} and" if held else ""
    ending = "neither can go on" if count == 2 else f"none of the {count} can go on"
    return f"deadlock: {_label(by_tid[cycle[0]])}{holds} {', which '.join(texts)}: {ending}"


def _at_exit(pid: int, by_tid: dict[int, dict], python: dict[int, list[StackFrame]]) -> list[str]:
    """When the main thread's only Python frame left is threading's _shutdown: the threads it waits for."""
    frames = python.get(pid, [])
    if not frames or not _in_threading(frames[0]) or frames[0].function.rsplit(".", 1)[-1] != "_shutdown":
        return []
    lines = []
    for tid, thread in by_tid.items():
        if tid == pid or not thread["chain"]:
            continue
        lines.append(
            f"at exit: the main code has ended and {_label(by_tid[pid])} waits in threading's shutdown for "
            f"{_label(thread)}, which is importing {' > '.join(thread['chain'])} and waits "
            f"{_waiting(python.get(tid, []))}: if that needs the main code, the program never ends; do it "
            f"before the main code ends, or make {thread['name']} a daemon"
        )
    return lines


def _waiting(frames: Sequence[StackFrame]) -> str:
    """`in Queue.get (queue.py:171), at <module> (worker.py:2)`: the innermost frame outside threading and
    importlib, and the module body that called it when that is another."""
    call = next((f for f in frames if not _in_threading(f) and not f.in_importlib), None)
    body = next((f for f in frames if f.function == "<module>"), None)
    if call is None:
        return "in threading"
    if body is None or body is call:
        return f"at {call.describe()}"
    return f"in {call.describe()}, at {body.describe()}"
