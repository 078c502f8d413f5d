"""How busy a thread of this process is: its share of a CPU over a short look that no debugger's stop spoils.

Runs in the heartbeat thread (see watchdog.py); reads /proc/self only.
"""

# Run from memory at a stall (tracing/standby.py), this module may import nothing that start-up holds back
# from the program (tracing/handback.py).
import _thread
import os
import time

from importwatch.facts import procstat
from importwatch.tracing.sink import CLOCKS

# The look: _LOOK seconds in which the process ran free, in steps of _STEP, of which at most STEPS
# are taken (see share).
_LOOK = 0.2
_STEP = 0.05
STEPS = 40
# Before a report's headline, which must not wait long for a debugger to let go (see watchdog.py).
FIRST_STEPS = 10
# A step in which the thread ran (or waited for a CPU) this share of the time shows it busy, however long.
_RAN = 0.5
_TICK = os.sysconf("SC_CLK_TCK")


def _demand(task: str) -> "float | None":
    """Seconds thread TASK (/proc/self/task/TID) has run or waited in the run queue for a CPU.

    On a loaded machine a spinning thread gets only part of a CPU, yet never waits
    for anything else; without schedstat, its CPU time has to do.
    """
    seconds = procstat.schedstat(f"{task}/schedstat")
    return seconds if seconds is not None else _cpu_seconds(f"{task}/stat")


def _cpu_seconds(stat_path: str) -> "float | None":
    """User plus system CPU seconds of one thread, from /proc/self/task/TID/stat."""
    fields = procstat.fields(stat_path)
    try:
        return procstat.cpu_ticks(fields) / _TICK if fields is not None else None
    except (IndexError, ValueError):
        return None


def share(tid: int, steps: int = STEPS) -> "float | None":
    """The share of time thread TID (its kernel id) ran or was ready to run, over _LOOK seconds in which the
    process ran free.

    A debugger reading stacks (the watcher's gdb, or a person's) stops every thread,
    and a stopped busy thread looks idle: so the look is made of short steps, and a
    step counts only when no debugger was attached at either end and this thread,
    too, lost no time to a stop: a step that overran its length by more than it
    waited for a CPU (a loaded machine) was stopped for the rest. None when it
    cannot be read, or when no _LOOK seconds free of stops came within STEPS steps.
    """
    task = f"/proc/self/task/{tid}"
    me = f"/proc/self/task/{_thread.get_native_id()}"
    used = spent = 0.0
    before, mine, began = _demand(task), _demand(me), CLOCKS.monotonic()
    for _ in range(steps):
        free = not procstat.tracer_pid()
        time.sleep(_STEP)
        after, mine_after, ended = _demand(task), _demand(me), CLOCKS.monotonic()
        if before is None or after is None or mine is None or mine_after is None:
            return None
        stopped = (ended - began) - _STEP - (mine_after - mine)
        # A stop can only make a busy thread look idle. A thread that holds the GIL and spins makes
        # every /proc read of ours wait for the GIL (up to a switch interval each), so our step
        # overruns though nothing stopped us: a step in which the thread ran most of the time counts.
        ran = (after - before) >= (ended - began) * _RAN
        if free and (stopped < _STEP or ran) and not procstat.tracer_pid():
            used += after - before
            spent += ended - began
            if spent >= _LOOK:
                return used / spent
        before, mine, began = after, mine_after, ended
    return None
