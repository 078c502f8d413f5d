"""What a stall report adds about threads: who waits for whose module lock, deadlocks, lookups, retry loops.

Runs in the heartbeat thread at a report, never on an import's path. Reads the
tracer's chains, importlib's records of module locks and each thread's innermost
frame; imports nothing while it runs.
"""

# Run from memory at a stall (tracing/standby.py), this module may import nothing that start-up holds back
# from the program (tracing/handback.py).
import _thread
import os
import sys

from importwatch.facts import pools, resolver, retry
from importwatch.tracing.doors import DoorStep
from importwatch.tracing.forklocks import FORK, lost_in_fork
from importwatch.tracing.hook import lock_owner

TYPE_CHECKING = False
if TYPE_CHECKING:
    from types import FrameType
    from typing import Callable

    from importwatch.tracing.hook import TracedStep, Tracer

_OURS = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep
_STDLIB = os.path.dirname(os.path.abspath(os.__file__)) + os.sep
# Where a thread waits for another thread to end, by the innermost threading function it is in.
_JOINS = ("join", "_wait_for_tstate_lock")
# Where a thread waits in threading for something that another thread must do.
_THREADING_WAITS = ("wait", "acquire", "get", "put", "wait_for")


def waits(chains: "dict[int, list[TracedStep]]") -> dict[int, tuple[int, str]]:
    """Per thread waiting for a module lock held by another thread: (the holder's ident, the module).

    A holder of 0 means importlib did not say who holds it.
    """
    found = {}
    for ident, chain in chains.items():
        top = chain[-1]
        if isinstance(top, DoorStep):
            if top.owner is not None:
                found[ident] = (top.owner, top.name)
            continue
        if top.kind == "import" and top.name not in sys.modules:
            owner = lock_owner(ident, top.name)
            if owner:
                found[ident] = (owner, top.name)
    return found


def deadlocks(found: dict[int, tuple[int, str]], thread_name: "Callable[[int], str]") -> list[str]:
    """One line per wait for a module lock that can never end: a holder lost in a fork, or a cycle of
    threads each waiting for the next (for its module lock, or in Thread.join for it), named once from
    the thread that holds a lock of the cycle (MainThread where it can); a likely one where the holder
    waits in threading for something else."""
    lines = []
    frames = _others_frames()
    joined: dict[int, int] = {}
    waiting_in: dict[int, str] = {}
    for ident, frame in frames.items():
        target, name = _threading_wait(frame)
        if target is not None:
            joined[ident] = target
        elif name is not None:
            waiting_in[ident] = name
    said: set[frozenset[int]] = set()
    for waiter, (owner, module) in found.items():
        who = thread_name(waiter)
        lost = lost_in_fork(module, owner)
        if lost is not None:
            lines.append(
                f"deadlock: {who} waits for the module lock of {module}, whose holder ({lost} in the parent "
                f"{FORK.parent}) was lost in the fork: no thread here can release it, this will never resolve"
            )
            continue
        cycle = _cycle(waiter, found, joined)
        if cycle is not None:
            if frozenset(cycle) not in said:
                said.add(frozenset(cycle))
                lines.append(_cycle_line(cycle, found, thread_name))
            continue
        how = waiting_in.get(owner) if owner not in found else None
        if how:
            lines.append(
                f"likely deadlock: {thread_name(owner)} holds the module lock of {module} and waits in "
                f"threading's {how}; if what it waits for needs {who}, neither can go on"
            )
    return lines


def _cycle(start: int, found: dict[int, tuple[int, str]], joined: dict[int, int]) -> "list[int] | None":
    """The threads from START round a cycle of waits back to it (each waits for the next's module lock or
    in Thread.join for it), or None when START's waits lead elsewhere."""
    path = [start]
    while True:
        ident = path[-1]
        following = found[ident][0] if ident in found else joined.get(ident)
        if not following:
            return None
        if following == start:
            return path
        if following in path:
            return None  # a cycle that START only leads into: named from its own threads
        path.append(following)


def _cycle_line(
    cycle: list[int], found: dict[int, tuple[int, str]], thread_name: "Callable[[int], str]"
) -> str:
    """`deadlock: A holds the module lock of X and waits ... for B, which waits ... for A's X: ...`, from
    the main thread where it is in the cycle and holds a lock of it, else from the first that holds one."""
    count = len(cycle)
    holders = [i for i in range(count) if cycle[i - 1] in found]  # waited for through a module lock
    threading = sys.modules.get("threading")
    main = threading.main_thread().ident if threading is not None else None
    first = next((i for i in holders if cycle[i] == main), holders[0])
    cycle = cycle[first:] + cycle[:first]
    held = found[cycle[-1]][1]
    texts = []
    for index, ident in enumerate(cycle):
        following = cycle[(index + 1) % count]
        if ident in found:
            module = found[ident][1]
            whose = "" if following == cycle[0] else f" held by {thread_name(following)}"
            texts.append(f"waits for the module lock of {module}{whose}")
        else:
            texts.append(f"waits in Thread.join for {thread_name(following)}")
    ending = "neither can go on" if count == 2 else f"none of the {count} can go on"
    return f"deadlock: {thread_name(cycle[0])} holds the module lock of {held} and {', which '.join(texts)}: {ending}"


def _others_frames() -> "dict[int, FrameType]":
    """Each thread's innermost frame, but this one's.

    This thread's is the frame of the function that asked: kept in one of its locals, the dict
    would hold that frame and the frame the dict, a cycle that keeps every thread's frames, and
    the program's objects in their locals, alive until the collector runs (never, in a program that
    turned it off)."""
    frames = sys._current_frames()
    frames.pop(_thread.get_ident(), None)
    return frames


def _threading_wait(frame: object) -> "tuple[int | None, str | None]":
    """Where FRAME's thread waits in threading: the ident of the thread it joins, when it joins one;
    else the threading function it waits in; (None, None) when it is not waiting in threading."""
    threading = sys.modules.get("threading")
    filename = getattr(threading, "__file__", None)
    name = None
    while frame is not None and filename is not None:
        code = frame.f_code  # type: ignore[attr-defined]
        if code.co_filename != filename:
            break
        if code.co_name in _JOINS:
            joined = getattr(frame.f_locals.get("self"), "ident", None)  # type: ignore[attr-defined]
            if joined is not None:
                return joined, None
        if name is None and code.co_name in _THREADING_WAITS:
            name = code.co_name
        frame = frame.f_back  # type: ignore[attr-defined]
    return None, name


def at_exit(chains: "dict[int, list[TracedStep]]", thread_name: "Callable[[int], str]") -> dict[int, str]:
    """A line per thread in flight that the main thread, its code ended, waits for in threading's
    shutdown (a non-daemon thread): what it imports and where it waits."""
    threading = sys.modules.get("threading")
    if threading is None:
        return {}
    main = threading.main_thread().ident
    frames = _others_frames()
    code = getattr(frames.get(main), "f_code", None)
    if code is None or code.co_name != "_shutdown" or code.co_filename != threading.__file__:
        return {}
    lines = {}
    for ident, chain in chains.items():
        thread = threading._active.get(ident)
        if ident == main or thread is None or thread.daemon:
            continue
        name = thread_name(ident)
        steps = " > ".join(step.name for step in chain)
        lines[ident] = (
            f"at exit: the main code has ended and MainThread waits in threading's shutdown for {name} "
            f"(not a daemon thread), which is importing {steps} and waits {_where(frames.get(ident))}: if that "
            f"needs the main code, the program never ends; do it before the main code ends, or make "
            f"{name} a daemon"
        )
    return lines


def _where(frame: object) -> str:
    """`in queue.get, at FILE:LINE in FUNCTION`: the innermost standard-library call a thread waits in
    (threading's own left out) and the innermost frame of the program's that made it."""
    threading = sys.modules.get("threading")
    ignored = getattr(threading, "__file__", None)
    call = None
    while frame is not None:
        code = frame.f_code  # type: ignore[attr-defined]
        filename = code.co_filename
        if filename.startswith("<frozen ") or filename == ignored or filename.startswith(_OURS):
            pass
        elif filename.startswith(_STDLIB) and "site-packages" not in filename:
            call = call or f"{os.path.basename(filename)[:-3]}.{code.co_name}"
        else:
            at = f"at {filename}:{frame.f_lineno} in {code.co_name}"  # type: ignore[attr-defined]
            return f"in {call}, {at}" if call else at
        frame = frame.f_back  # type: ignore[attr-defined]
    return f"in {call}" if call else "in the interpreter's own code"


def lookups(
    chains: "dict[int, list[TracedStep]]", now: float, thread_name: "Callable[[int], str]"
) -> list[str]:
    """One line per thread in flight whose innermost Python frame is socket.getaddrinfo: the host it
    resolves, the nameserver asked (facts/resolver.py) and for how long."""
    socket = sys.modules.get("socket")
    filename = getattr(socket, "__file__", None)
    if filename is None:
        return []
    lines = []
    frames = _others_frames()
    for ident, chain in chains.items():
        frame = frames.get(ident)
        code = getattr(frame, "f_code", None)
        if code is None or code.co_name != "getaddrinfo" or code.co_filename != filename:
            continue
        host = frame.f_locals.get("host")  # type: ignore[union-attr]
        if isinstance(host, bytes):
            host = host.decode("ascii", "backslashreplace")
        servers = resolver.queried()
        text = resolver.lookup(
            host if isinstance(host, str) and host else None,
            servers[0] if servers else None,
            now - chain[-1].progress,
        )
        lines.append(f"{thread_name(ident)} waits in a {text}")
    return lines


def lone_wait(
    tracer: "Tracer", culprit: int, thread_name: "Callable[[int], str]", parent: "int | None"
) -> list[str]:
    """One line when the stalled thread is the program's only one and waits on a futex in an OpenMP
    runtime's code: the pool it waits for has no threads in this process (facts/pools.py)."""
    tid = tracer.native_ids.get(culprit)
    library = None if tid is None else pools.own_orphaned_wait(tid)
    return [] if library is None else [f"{thread_name(culprit)}: {pools.orphaned_pool(library, parent)}"]


class Retries:
    """Counts, per thread in flight, the refused connections it handles at successive looks of the heartbeat.

    A thread retrying a refused connection sleeps inside its `except` clause, so the exception it
    handles at each look is a new ConnectionRefusedError per try (sys._current_exceptions, 3.10+:
    nothing is hooked, nothing costs the program). A new one is told apart by its `args` tuple,
    kept until the next look: the errno and message the socket call made, fresh per exception, so
    none of the program's objects (the traceback's frames and their locals) lives longer for it.
    The address is read from the traceback when a refusal is first seen. Counts the tries seen: a
    loop faster than the looks is counted low.
    """

    def __init__(self) -> None:
        # ident: (the args of the refusal last seen, how many were seen, the address tried)
        self.seen: dict[int, tuple[tuple, int, tuple[str, int] | None]] = {}

    def look(self, chains: "dict[int, list[TracedStep]]", since: float) -> "dict[int, list[TracedStep]]":
        """One look at the threads of CHAINS (those in flight) without progress SINCE then, before any
        other use of the look (what is kept for another thread, or with nothing in flight, is let go);
        returns CHAINS."""
        idents = [ident for ident, chain in chains.items() if chain[-1].progress <= since]
        if not idents and not self.seen:
            return chains
        current = getattr(sys, "_current_exceptions", None)
        handled = current() if current is not None and idents else {}
        kept = {}
        for ident in idents:
            error = handled.get(ident)
            if isinstance(error, tuple):  # (type, value, traceback) before 3.12
                error = error[1]
            if error is None:
                continue
            refused = retry.refusal(error)
            if refused is None:
                continue
            last = self.seen.get(ident)
            if last is not None and last[0] is refused.args:
                kept[ident] = last
                continue
            address = retry.address_of([refused, error] if refused is not error else [error])
            count = 1 if last is None else last[1] + 1
            kept[ident] = (refused.args, count, address or (last[2] if last is not None else None))
        self.seen = kept
        return chains

    def lines(self, thread_name: "Callable[[int], str]") -> list[str]:
        """One line per thread seen refused at two looks or more: where it connects and how often."""
        lines = []
        for ident, (_, count, address) in self.seen.items():
            if count >= 2:  # one refusal handled is no loop yet
                words = retry.words(address, count)
                lines.append(f"{thread_name(ident)} is {words}")
        return lines
