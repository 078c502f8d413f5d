"""An in-process stall report's words: the chains, the context, and the program's stacks read at Python level.

Runs in the heartbeat thread, with the GIL free, at a report (see watchdog.py); imports
nothing while it runs. The stacks come from sys._current_frames(), not faulthandler's
dump, so they can be ordered and folded: the program's threads only, the stalled one
first, and the frames of importlib, runpy, threading and importwatch folded to a count.
The terminal gets that short form; a text log gets every frame of every thread.
"""

# Run from memory at a stall (tracing/standby.py), this module may import nothing that start-up holds back
# from the program (tracing/handback.py).
import _thread
import os
import sys

from importwatch.events import BUSY, STALL, STALL_CONTEXT, STALL_THREAD
from importwatch.tracing import stalls

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Callable

    from importwatch.tracing.hook import TracedStep, Tracer
    from importwatch.tracing.sink import Sink
    from importwatch.tracing.stalls import Retries

# As deep as faulthandler goes.
_MAX_FRAMES = 100
# Threads shown one line each on the terminal besides those in flight; the rest are counted.
_OTHER_THREADS = 6
# Frames the program can do nothing about: importlib's (frozen), importwatch's own, the runner's.
_OURS = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep
_STDLIB = os.path.dirname(os.path.abspath(os.__file__)) + os.sep
_MACHINERY = frozenset(("runpy.py", "threading.py"))
HEADER = "Stacks of the program's threads, the stalled one first (most recent call first):"
# facts/cuda.py's NVIDIA_PROC: the driver's version file, present only where an NVIDIA driver is loaded.
_NVIDIA_VERSION = "/proc/driver/nvidia/version"

Frame = tuple  # (file, line, function)


def _machinery(frame: "Frame") -> bool:
    """Whether a frame is the interpreter's or ours (the dlopen frame of native.py names the load: kept)."""
    filename, _, function = frame
    if function.startswith("dlopen "):
        return False
    if filename.startswith(("<frozen ", _OURS)):
        return True
    return filename.startswith(_STDLIB) and os.path.basename(filename) in _MACHINERY


def frames_of(frame: object) -> "list[Frame]":
    """A Python frame and its callers, innermost first, as (file, line, function)."""
    found: list[Frame] = []
    while frame is not None and len(found) < _MAX_FRAMES:
        code = frame.f_code  # type: ignore[attr-defined]
        found.append((code.co_filename, frame.f_lineno or 0, code.co_name))  # type: ignore[attr-defined]
        frame = frame.f_back  # type: ignore[attr-defined]
    return found


def innermost(frames: "list[Frame]") -> "str | None":
    """Where a thread is, in the program's own code: `FILE:LINE in FUNCTION` of its innermost such frame."""
    for frame in frames:
        if not _machinery(frame):
            return f"{frame[0]}:{frame[1]} in {frame[2]}"
    return None


def _line(frame: "Frame") -> str:
    return f'  File "{frame[0]}", line {frame[1]} in {frame[2]}'


def folded(frames: "list[Frame]") -> list[str]:
    """FRAMES as lines, each run of the interpreter's and our frames folded to one count."""
    lines: list[str] = []
    run = 0
    for frame in frames:
        if _machinery(frame):
            run += 1
            continue
        if run:
            lines.append(f"  ... {run} interpreter frame{'s' if run != 1 else ''}")
            run = 0
        lines.append(_line(frame))
    if run:
        lines.append(f"  ... {run} interpreter frame{'s' if run != 1 else ''}")
    return lines


def stacks(
    stacks_now: "dict[int, list[Frame]]",
    order: list[int],
    ours: set[int],
    thread_name: "Callable[[int], str]",
) -> tuple[list[str], list[str]]:
    """The stacks as the terminal shows them (short) and as a log keeps them (every frame, every thread).

    ORDER: the stalled thread first, then the others in flight; OURS: importwatch's threads,
    left out of the short form.
    """
    short, full = [HEADER], [HEADER]
    rest = [ident for ident in stacks_now if ident not in order and ident not in ours]
    for ident in [*order, *rest, *(ident for ident in ours if ident not in order)]:
        frames = stacks_now.get(ident)
        if frames is None:
            continue
        name = thread_name(ident) + (" (importwatch's own)" if ident in ours else "")
        full.append(f"Thread {name}:")
        full += [_line(frame) for frame in frames]
    for ident in order:
        if ident in stacks_now:
            short.append(f"Thread {thread_name(ident)}:")
            short += folded(stacks_now[ident])
    for index, ident in enumerate(rest):
        if index == _OTHER_THREADS:
            more = len(rest) - index
            short.append(f"... {more} more thread{'s' if more != 1 else ''} of the program's")
            break
        where = innermost(stacks_now[ident]) or "in the interpreter's own code"
        short.append(f"Thread {thread_name(ident)}: {where}")
    return short, full


def write(
    sink: "Sink",
    tracer: "Tracer",
    chains: "dict[int, list[TracedStep]]",
    culprit: int,
    now: float,
    stalled: tuple[float, int],
    share: "float | None",
    busy: bool,
    retries: "Retries",
    forked_from: "int | None",
) -> None:
    """A stall report of thread CULPRIT, STALLED since then, for the nth time: its headline (the STALL
    event, the CPU SHARE it used and whether that is BUSY), and for a first report what follows it."""
    since, reports = stalled
    stacks_now = now_stacks()
    waits = stalls.waits(chains)
    thread_name = sink.thread_name
    lines = [chain_line(culprit, chains[culprit], now, thread_name)]
    lines += [chain_line(i, c, now, thread_name) for i, c in chains.items() if i != culprit]
    waiting = [thread_name(waiter) for waiter, (owner, _) in waits.items() if owner == culprit]
    waited = f"; waiting for its module lock: {', '.join(waiting)}" if waiting else ""
    ending = stalls.at_exit(chains, thread_name)
    waited += "; at exit: MainThread waits for it in threading's shutdown" if culprit in ending else ""
    culprit_name = thread_name(culprit)
    fields = {
        "seconds": round(now - since, 1),
        "stalled": culprit_name,
        "chain": lines[0][len(culprit_name) + 2 :] + waited,  # the line without its "NAME: "
        "report": reports,
        "busy": busy,
        "at": innermost(stacks_now.get(culprit, [])),
    }
    sink.event(STALL, {**fields, "chains": lines})
    if reports == 1:  # a later report of the same step is its headline alone (see Watchdog._stall)
        # Who waits for whom first: the answer, where there is one.
        context_lines = [*ending.values(), *stalls.deadlocks(waits, thread_name)]
        context_lines += context(chains[culprit], now)
        context_lines += stalls.lookups(chains, now, thread_name)
        context_lines += stalls.lone_wait(tracer, culprit, thread_name, forked_from)
        context_lines += retries.lines(thread_name)
        order = [culprit, *(ident for ident in chains if ident != culprit)]
        ours = {_thread.get_ident(), *sink.own_threads()}
        detail(sink, lines[1:], context_lines, share if busy else None, stacks_now, order, ours)


def now_stacks() -> "dict[int, list[Frame]]":
    """Every Python thread's frames now, ours too (a log shows them)."""
    return {ident: frames_of(frame) for ident, frame in sys._current_frames().items()}


def chain_line(ident: int, chain: "list[TracedStep]", now: float, thread_name: "Callable[[int], str]") -> str:
    """`NAME: step > step > ...`, outermost first, each step with its phase and age."""
    return f"{thread_name(ident)}: " + " > ".join(frame.describe(now, ident, thread_name) for frame in chain)


def context(chain: "list[TracedStep]", now: float) -> list[str]:
    """What the phases and steps in flight add to a report: overrun timeouts, their environment.

    A step's context function may probe the network, but only with short timeouts and
    with modules imported before.
    """
    lines = []
    for frame in chain:
        ran = now - frame.start
        if frame.timeout is not None and 0 < frame.timeout <= ran:
            lines.append(f"{frame.name} has run {ran:.1f} s, past its timeout of {frame.timeout:g} s")
        if frame.context is not None:
            try:
                lines.extend(frame.context())
            except Exception as error:
                lines.append(f"{frame.name}: no context ({type(error).__name__}: {error})")
    return lines


def detail(
    sink: "Sink",
    others: list[str],
    context_lines: list[str],
    busy_share: "float | None",
    stacks_now: "dict[int, list[Frame]]",
    order: list[int],
    ours: set[int],
) -> None:
    """What a first report says after its headline: the OTHERS' chains, the context, how busy the
    stalled thread (ORDER's first) is when busy, and the stacks: folded on the terminal, whole in a
    text log (and the terminal says where)."""
    for line in others:
        sink.event(STALL_THREAD, {"chain": line})
    for line in context_lines:
        sink.event(STALL_CONTEXT, {"context": line})
    if busy_share is not None:
        used = min(busy_share, 1.0)  # run-queue time and the clock's steps can add up to a little more
        sink.event(BUSY, busy_fields(sink.thread_name(order[0]), used))
    short, full = stacks(stacks_now, order, ours, sink.thread_name)
    if sink.log_path is not None and not sink.structured:
        sink.raw(("\n".join(full) + "\n").encode("ascii", "backslashreplace"), to_stderr=False)
        short.append(f"full stacks in {sink.log_path}")
    sink.raw(("\n".join(short) + "\n").encode("ascii", "backslashreplace"), to_log=False)


def busy_fields(name: str, share: float) -> dict:
    """A BUSY event's fields: the thread, its share of a CPU, and whether this machine has an NVIDIA
    driver (the words name CUDA JIT only then)."""
    return {"stalled": name, "cpu": round(share, 2), "gpu": os.path.exists(_NVIDIA_VERSION)}
