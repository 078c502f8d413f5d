"""What a stall report adds about threads: who waits for whose module lock, deadlocks, and thread names.

Runs in the heartbeat thread at a report, never on an import's path. Reads the
tracer's chains, importlib's records of module locks and each thread's innermost
frame; imports nothing while it runs.
"""

from __future__ import annotations

import sys

from importwatch.tracing.doors import DoorStep
from importwatch.tracing.forklocks import FORK, lost_in_fork
from importwatch.tracing.hook import lock_owner

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Callable

    from importwatch.tracing.hook import TracedStep

# Where a thread waits for another thread to end, by the innermost threading function it is in.
_JOINS = ("join", "_wait_for_tstate_lock")
# Where a thread waits in threading for something that another thread must do.
_THREADING_WAITS = ("wait", "acquire", "get", "put", "wait_for")


def waits(chains: dict[int, list[TracedStep]]) -> dict[int, tuple[int, str]]:
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


def deadlocks(found: dict[int, tuple[int, str]], thread_name: Callable[[int], str]) -> list[str]:
    """One line per wait for a module lock that can never end, or that waits on its own waiter."""
    lines = []
    frames = sys._current_frames()
    for waiter, (owner, module) in found.items():
        who = thread_name(waiter)
        lost = lost_in_fork(module, owner)
        if lost is not None:
            lines.append(
                f"deadlock: {who} waits for the module lock of {module}, whose holder ({lost} in the parent "
                f"{FORK.parent}) was lost in the fork: no thread here can release it, this will never resolve"
            )
            continue
        holder = thread_name(owner)
        cycle = found.get(owner)
        if cycle is not None and cycle[0] == waiter:
            if waiter < owner:  # one line per pair
                lines.append(
                    f"deadlock: {who} waits for the module lock of {module} held by {holder}, which waits "
                    f"for the module lock of {cycle[1]} held by {who}: neither can go on"
                )
            continue
        how = _holder_waits_for(frames.get(owner), waiter)
        if how == "join":
            lines.append(
                f"deadlock: {holder} holds the module lock of {module} and waits in Thread.join for {who}, "
                f"which waits for that lock: neither can go on"
            )
        elif how:
            lines.append(
                f"likely deadlock: {holder} holds the module lock of {module} and waits in threading's {how}; "
                f"if what it waits for needs {who}, neither can go on"
            )
    return lines


def _holder_waits_for(frame: object, waiter: int) -> str | None:
    """'join' when FRAME's thread waits for thread WAITER to end; the threading function when it
    waits in threading for something else; None when it is not waiting in threading."""
    threading = sys.modules.get("threading")
    filename = getattr(threading, "__file__", None)
    name = None
    while frame is not None and filename is not None:
        code = frame.f_code  # type: ignore[attr-defined]
        if code.co_filename != filename:
            break
        if code.co_name in _JOINS:
            joined = frame.f_locals.get("self")  # type: ignore[attr-defined]
            if getattr(joined, "ident", None) == waiter:
                return "join"
        if name is None and code.co_name in _THREADING_WAITS:
            name = code.co_name
        frame = frame.f_back  # type: ignore[attr-defined]
    return name


def thread_names(thread_name: Callable[[int], str]) -> str:
    """Each Python thread as faulthandler prints it (0x and 16 hex digits) and by its name."""
    return ", ".join(f"0x{ident:016x} {thread_name(ident)}" for ident in sorted(sys._current_frames()))


def lookups(
    chains: dict[int, list[TracedStep]], now: float, thread_name: Callable[[int], str], import_own: Callable
) -> list[str]:
    """One line per thread in flight whose innermost Python frame is socket.getaddrinfo: the host it
    resolves, the nameserver asked (facts/resolver.py, imported only then) and for how long."""
    socket = sys.modules.get("socket")
    filename = getattr(socket, "__file__", None)
    if filename is None:
        return []
    lines = []
    frames = sys._current_frames()
    for ident, chain in chains.items():
        frame = frames.get(ident)
        code = getattr(frame, "f_code", None)
        if code is None or code.co_name != "getaddrinfo" or code.co_filename != filename:
            continue
        host = frame.f_locals.get("host")  # type: ignore[union-attr]
        if isinstance(host, bytes):
            host = host.decode("ascii", "backslashreplace")
        resolver = import_own("importwatch.facts.resolver")
        servers = resolver.queried()
        text = resolver.lookup(
            host if isinstance(host, str) and host else None,
            servers[0] if servers else None,
            now - chain[-1].progress,
        )
        lines.append(f"{thread_name(ident)} waits in a {text}")
    return lines
