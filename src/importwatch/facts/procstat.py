"""Reads a process's or a thread's /proc stat line (its command name and the fields after it), its
schedstat and its TracerPid, and this process's threads: the readers the traced process needs too.

The command name (comm) is the program's to choose, spaces and parentheses included
(`a) b (c`), so the fields are read after the LAST `)`. Imported at start-up in the
traced process (the watchdog, fork handling): the standard library only, nothing else.
"""

import os

# Indices into the fields after comm (proc(5)'s field number minus 3).
STATE = 0
PPID = 1
PGRP = 2
TTY = 4
TPGID = 5
UTIME = 11
STIME = 12
THREADS = 17
START_TIME = 19  # in clock ticks since boot: with the pid, it tells a process from a later one
EXIT_CODE = 49  # Linux >= 3.5: the wait status once the process is exiting


def tasks() -> "set[str]":
    """The kernel thread ids of this process."""
    try:
        return set(os.listdir("/proc/self/task"))
    except OSError:
        return set()


def split(data: bytes) -> "tuple[str, list[bytes]]":
    """The comm (ASCII, the rest escaped) and the fields after it, of the stat line DATA."""
    head, _, tail = data.rpartition(b")")
    return head.partition(b"(")[2].decode("ascii", "backslashreplace"), tail.split()


def read(path: str) -> "tuple[str, list[bytes]] | None":
    """The comm and the fields after it of the stat file at PATH (`/proc/PID/stat`,
    `/proc/PID/task/TID/stat`); None when it cannot be read (the process or thread is gone)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        # One read: the kernel hands the whole line over at once (it is well under a page).
        data = os.read(fd, 4096)
    except OSError:
        return None
    finally:
        os.close(fd)
    return split(data) if data else None


def fields(path: str) -> "list[bytes] | None":
    """The fields after comm of the stat file at PATH; None when it cannot be read."""
    found = read(path)
    return found[1] if found is not None else None


def cpu_ticks(stat: "list[bytes]") -> int:
    """User plus system CPU time, in clock ticks, of the fields STAT (ValueError, IndexError if malformed)."""
    return int(stat[UTIME]) + int(stat[STIME])


def read_file(path: str, limit: int = 1 << 16) -> "bytes | None":
    """The file at PATH read to its end (at most LIMIT bytes), or None when it cannot be read."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        # /proc files such as maps, locks and net/tcp give about a page per read: read to the end.
        chunks = []
        size = 0
        while size < limit:
            chunk = os.read(fd, limit - size)
            if not chunk:
                break
            chunks.append(chunk)
            size += len(chunk)
        return b"".join(chunks)
    except OSError:
        return None
    finally:
        os.close(fd)


def schedstat(path: str) -> "float | None":
    """Seconds the thread ran or waited in the run queue for a CPU, from the schedstat file at PATH
    (`/proc/PID/task/TID/schedstat`); None when it cannot be read (no CONFIG_SCHEDSTATS, or gone)."""
    try:
        run, wait = (read_file(path) or b"").split()[:2]
        return (int(run) + int(wait)) / 1e9
    except ValueError:
        return None


def tracer_pid(pid: "int | str" = "self") -> int:
    """The pid of the debugger (ptrace) attached to process PID, 0 when none (or it cannot be read)."""
    for line in (read_file(f"/proc/{pid}/status") or b"").splitlines():
        if line.startswith(b"TracerPid:"):
            value = line.split()[1:]
            return int(value[0]) if value and value[0].isdigit() else 0
    return 0


def blocks_all_signals(pid: "int | str", tid: int) -> bool:
    """True when thread TID blocks every signal it can (faulthandler's timer thread does, and ours)."""
    status = read_file(f"/proc/{pid}/task/{tid}/status") or b""
    for line in status.splitlines():
        if line.startswith(b"SigBlk:"):
            try:
                mask = int(line.split()[1], 16)
            except (IndexError, ValueError):
                return False
            # SIGKILL and SIGSTOP cannot be blocked, and glibc keeps its two internal signals (32, 33).
            wanted = ((1 << 64) - 1) & ~((1 << 8) | (1 << 18) | (1 << 31) | (1 << 32))
            return mask & wanted == wanted
    return False


def net_rows(where: str, table: str) -> "list[list[str]] | None":
    """The rows of /proc/WHERE/net/TABLE (tcp, udp6, unix, ...) split into fields, without the header
    line; None when it cannot be read. WHERE: a pid, or "self"."""
    data = read_file(f"/proc/{where}/net/{table}", 1 << 24)
    if data is None:
        return None
    return [line.split() for line in data.decode("utf-8", "replace").splitlines()[1:]]


def has_waker(pid: "int | str", tid: int) -> bool:
    """Whether PID ("self" too) has a thread besides TID that could wake it. faulthandler's timer and
    importwatch's own threads block every signal and wake no one; when /proc cannot tell, True."""
    try:
        tids = [int(name) for name in os.listdir(f"/proc/{pid}/task")]
    except (OSError, ValueError):
        return True
    return any(other != tid and not blocks_all_signals(pid, other) for other in tids)
