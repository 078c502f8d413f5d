"""The process inspect looks at, as /proc tells it: command line, environment, folders, owner, when
it started and when its threads last ran, the shared objects it has mapped."""

from __future__ import annotations

import os

from importwatch.facts.mapped import MappedObjects
from importwatch.facts.procstat import read_file

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Sequence

    from importwatch.facts.process import ProcessStat


def cmdline(pid: int) -> list[str]:
    data = read_file(f"/proc/{pid}/cmdline", 1 << 20) or b""
    if not data:
        return []
    # Each word ends with a NUL, an empty word too: strip only the last one, or `''` is lost.
    words = data[:-1] if data.endswith(b"\0") else data
    return [word.decode("utf-8", "surrogateescape") for word in words.split(b"\0")]


def environ(pid: int) -> dict[str, str] | None:
    """Its environment as it started; None when /proc/PID/environ cannot be read."""
    data = read_file(f"/proc/{pid}/environ", 1 << 22)
    if data is None:
        return None
    found = {}
    for item in data.split(b"\0"):
        key, equals, value = item.partition(b"=")
        if equals and key:
            found[key.decode("utf-8", "surrogateescape")] = value.decode("utf-8", "surrogateescape")
    return found


def _link(path: str) -> str | None:
    try:
        return os.readlink(path)
    except OSError:
        return None


def cwd(pid: int) -> str | None:
    return _link(f"/proc/{pid}/cwd")


def exe(pid: int) -> str | None:
    """The program file it runs (its path even when the file was deleted since)."""
    path = _link(f"/proc/{pid}/exe")
    return path.removesuffix(" (deleted)") if path is not None else None


def owner_uid(pid: int) -> int | None:
    try:
        return os.stat(f"/proc/{pid}").st_uid
    except OSError:
        return None


def owner(pid: int) -> str:
    """' (owned by NAME)', or by uid; '' when the process is gone."""
    uid = owner_uid(pid)
    if uid is None:
        return ""
    try:
        import pwd

        return f" (owned by {pwd.getpwuid(uid).pw_name})"
    except (ImportError, KeyError):
        return f" (owned by uid {uid})"


def started(stat: ProcessStat | None) -> float | None:
    """When the process started, as a time.time() value: the boot time plus its start in clock ticks."""
    if stat is None:
        return None
    for line in (read_file("/proc/stat", 1 << 20) or b"").splitlines():
        if line.startswith(b"btime "):
            return float(line.split()[1]) + stat.start / os.sysconf("SC_CLK_TCK")
    return None


def _exec_start(path: str) -> float | None:
    """se.exec_start of a /proc .../sched file: when the thread last ran on a CPU, in ms."""
    for line in (read_file(path) or b"").splitlines():
        if line.startswith(b"se.exec_start"):
            try:
                return float(line.split(b":")[1])
            except (IndexError, ValueError):
                return None
    return None


def last_ran(pid: int, tids: Sequence[int]) -> dict[int, float]:
    """Seconds since each thread last used a CPU (the scheduler's clock against our own thread's)."""
    now = _exec_start("/proc/thread-self/sched")
    if now is None:
        return {}
    found = {}
    for tid in tids:
        then = _exec_start(f"/proc/{pid}/task/{tid}/sched")
        if then is not None:
            found[tid] = max(0.0, (now - then) / 1000.0)
    return found


def mapped_objects(pid: int) -> list[str]:
    """The shared objects mapped in PID, in address order, each once."""
    return list(MappedObjects(pid).paths)
