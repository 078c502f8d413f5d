"""A process's children and their descendants, read from /proc, and ending them.

For --exit-on-stall: a job ended for a stall takes with it what the stalled import started (a
compiler, a `sleep`), which would otherwise run on under PID 1. The standard library only, and
nothing imported but os and time: the traced process loads it when --exit-on-stall is on.
"""

import os
import time

from importwatch.facts import procstat

_SIGKILL = 9  # not signal.SIGKILL: the signal module imports enum
_TICK = os.sysconf("SC_CLK_TCK")
# Our own reference: a library that patches the time module must not move it.
_boottime, _BOOTTIME = time.clock_gettime, time.CLOCK_BOOTTIME


def boot_ticks(seconds_ago: float) -> int:
    """The /proc start time (clock ticks since boot, CLOCK_BOOTTIME) of SECONDS_AGO before now, a tick early."""
    return int((_boottime(_BOOTTIME) - seconds_ago) * _TICK) - 1


def descendants(pid: int, since: int = 0) -> "list[tuple[int, str]]":
    """The children of PID started at or after SINCE (clock ticks since boot), and all their
    descendants, each as (pid, command name), parents first."""
    children: dict[int, list[tuple[int, int, str]]] = {}
    try:
        entries = os.listdir("/proc")
    except OSError:
        return []
    for entry in entries:
        if not entry.isdigit():
            continue
        found = procstat.read(f"/proc/{entry}/stat")
        if found is None:
            continue
        name, stat = found
        try:
            if stat[procstat.STATE] in (b"Z", b"X"):
                continue  # ended already: nothing to end
            parent, started = int(stat[procstat.PPID]), int(stat[procstat.START_TIME])
        except (IndexError, ValueError):
            continue
        children.setdefault(parent, []).append((int(entry), started, name))
    found_list: list[tuple[int, str]] = []
    level = [(child, name) for child, started, name in children.get(pid, ()) if started >= since]
    while level:
        found_list += level
        level = [(child, name) for parent, _ in level for child, _, name in children.get(parent, ())]
    return found_list


def end(processes: "list[tuple[int, str]]") -> "list[str]":
    """SIGKILL each of PROCESSES (a stalled job's, which may ignore a gentler signal); returns
    "PID NAME" for those that were there to end."""
    ended = []
    for pid, name in processes:
        try:
            os.kill(pid, _SIGKILL)
        except OSError:
            continue
        ended.append(f"{pid} {name}")
    return ended
