"""Reads another process from /proc: its threads' states and CPU, its stat line, who debugs it,
its command line, whether it is alive, how it ended, and the code it has mapped.

Everything here is read from outside, so it answers while the process holds the
GIL in a hung dlopen, and while it is stopped. The files differ in who may read
them: stat, status, maps and cmdline need only the same user; task/TID/syscall and
mem (the syscall's arguments, the stack) need ptrace permission, which Yama's
ptrace_scope may deny to a process that is not the target's ancestor. Each reader
returns None or [] when it cannot see, and ptrace_blocker() says why.
"""

import bisect
import os
import signal
import struct

from importwatch.facts import procstat
from importwatch.facts.procstat import blocks_all_signals, read_file, tracer_pid
from importwatch.masking import mask_argv
from importwatch.signame import signal_name

__all__ = [
    "read_file",
    "tracer_pid",
]  # the readers' own, kept here for who reads a process

STATES = {
    "R": "running",
    "S": "sleeping",
    "D": "disk wait",
    "T": "stopped",
    "t": "stopped by a debugger",
    "Z": "zombie",
    "X": "dead",
    "I": "idle",
}
BUSY = "busy"
WAITING = "waiting"
STOPPED = "stopped"
GONE = "gone"
# A thread that used this share of one CPU over the interval is working, not waiting.
BUSY_SHARE = 0.2
_TICKS = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


# -- threads -------------------------------------------------------------------------------
class ThreadSample:
    """One look at one thread: its state, CPU time so far (in clock ticks), wait channel, syscall."""

    __slots__ = ("comm", "cpu", "demand", "state", "syscall", "tid", "wchan")

    def __init__(self, tid: int, comm: str, state: str, cpu: int) -> None:
        self.tid = tid
        self.comm = comm
        self.state = state
        self.cpu = cpu
        # Seconds it ran or waited in the run queue (schedstat): on a loaded machine a spinning
        # thread gets a fraction of a CPU, yet is never waiting for anything else.
        self.demand: float | None = None
        self.wchan = ""
        self.syscall: list[int] | None = None  # [nr, arg1..arg6, sp, pc]; None when unknown or running

    @property
    def state_name(self) -> str:
        return STATES.get(self.state, self.state)


_read = read_file  # the short name the readers below use


def sample_threads(pid: int, detail: bool = False) -> "dict[int, ThreadSample]":
    """Every thread of PID now; with DETAIL also its wait channel and the syscall it is blocked in."""
    try:
        tids = [int(name) for name in os.listdir(f"/proc/{pid}/task")]
    except (OSError, ValueError):
        return {}
    samples = {}
    for tid in sorted(tids):
        base = f"/proc/{pid}/task/{tid}"
        found = procstat.read(f"{base}/stat")
        if found is None:
            continue
        comm, fields = found
        try:
            sample = ThreadSample(tid, comm, fields[procstat.STATE].decode(), procstat.cpu_ticks(fields))
        except (IndexError, ValueError):
            continue
        sample.demand = procstat.schedstat(f"{base}/schedstat")
        if detail:
            wchan = _read(f"{base}/wchan") or b""
            sample.wchan = "" if wchan in (b"0", b"") else wchan.decode("ascii", "replace")
            sample.syscall = _read_syscall(f"{base}/syscall")
        samples[tid] = sample
    return samples


def _read_syscall(path: str) -> "list[int] | None":
    data = _read(path)
    if not data or data.startswith((b"running", b"-1")):
        return None
    try:
        return [int(word, 0) for word in data.split()]
    except ValueError:
        return None


def cpu_share(before: "ThreadSample | None", after: "ThreadSample", seconds: float) -> "float | None":
    """Share of one CPU the thread used (or waited in the run queue for) between two samples; None
    without an earlier sample."""
    if before is None or seconds <= 0:
        return None
    if before.demand is not None and after.demand is not None:
        return min((after.demand - before.demand) / seconds, 1.0)
    return (after.cpu - before.cpu) / _TICKS / seconds


# A thread that the CPU share calls waiting but that ran at the look (state R): it wakes briefly and
# sleeps again (a timed poll, such as a thread taking the GIL every 5 ms). Never "waiting (running)".
POLLING = "waking briefly between sleeps"


def state_words(state: str, verdict: str) -> str:
    """A thread's state as said next to its VERDICT: the state's name, unless the two would contradict."""
    if verdict == WAITING and state == STATES["R"]:
        return POLLING
    return state


def verdict(sample: "ThreadSample", share: "float | None") -> str:
    """busy (using CPU), waiting (asleep, or in disk wait), stopped, or gone (a zombie or dead thread)."""
    if sample.state in "Tt":
        return STOPPED
    if sample.state in "ZX":
        return GONE
    if share is not None:
        return BUSY if share >= BUSY_SHARE else WAITING
    return BUSY if sample.state == "R" else WAITING


# -- the process ------------------------------------------------------------------------------
class ProcessStat:
    """Fields of /proc/PID/stat that matter from outside: state, process group, terminal, exit code."""

    __slots__ = ("comm", "exit_code", "pgrp", "ppid", "start", "state", "tpgid", "tty")

    def __init__(self, comm: str, fields: "list[bytes]") -> None:
        self.comm = comm
        self.state = fields[procstat.STATE].decode()
        self.ppid, self.pgrp = int(fields[procstat.PPID]), int(fields[procstat.PGRP])
        self.tty, self.tpgid = int(fields[procstat.TTY]), int(fields[procstat.TPGID])
        self.start = int(fields[procstat.START_TIME])
        # Linux >= 3.5 gives the wait status (as waitpid() would) once the process is exiting.
        self.exit_code = int(fields[procstat.EXIT_CODE]) if len(fields) > procstat.EXIT_CODE else None

    @property
    def state_name(self) -> str:
        return STATES.get(self.state, self.state)

    @property
    def background(self) -> bool:
        """True in a background process group of its controlling terminal (SIGTTIN/SIGTTOU stop it)."""
        return self.tty != 0 and self.tpgid > 0 and self.tpgid != self.pgrp


def process_stat(pid: int) -> "ProcessStat | None":
    found = procstat.read(f"/proc/{pid}/stat")
    if found is None:
        return None
    try:
        return ProcessStat(*found)
    except (IndexError, ValueError):
        return None


def describe_status(status: int) -> str:
    """A wait status in words: "was killed by SIGKILL", "exited with status 3"."""
    if os.WIFSIGNALED(status):
        number = os.WTERMSIG(status)
        text = f"was killed by {signal_name(number)}"
        if number == signal.SIGKILL:
            text += " (the OOM killer, a scheduler or kill -9)"
        return text + (", core dumped" if os.WCOREDUMP(status) else "")
    return f"exited with status {os.WEXITSTATUS(status)}"


# struct pidfd_info (Linux >= 6.15): mask, cgroupid, then 11 u32 ids, then exit_code at offset 60.
_PIDFD_INFO_SIZE = 64
_PIDFD_GET_INFO = (3 << 30) | (_PIDFD_INFO_SIZE << 16) | (0xFF << 8) | 11
_PIDFD_INFO_EXIT = 1 << 3


def reaped_status(pidfd: int) -> "int | None":
    """The wait status of a process already reaped by its parent, from its pidfd (Linux >= 6.15)."""
    try:
        import fcntl
    except ImportError:
        return None
    buffer = bytearray(_PIDFD_INFO_SIZE)
    struct.pack_into("Q", buffer, 0, _PIDFD_INFO_EXIT)
    try:
        fcntl.ioctl(pidfd, _PIDFD_GET_INFO, buffer, True)
    except OSError:
        return None
    (mask,) = struct.unpack_from("Q", buffer, 0)
    if not mask & _PIDFD_INFO_EXIT:
        return None
    return struct.unpack_from("i", buffer, 60)[0]


def read_memory(pid: int, address: int, size: int) -> "bytes | None":
    """SIZE bytes of PID's memory at ADDRESS (needs ptrace permission)."""
    try:
        fd = os.open(f"/proc/{pid}/mem", os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        return os.pread(fd, size, address)
    except (OSError, OverflowError, ValueError):
        return None
    finally:
        os.close(fd)


def command_of(pid: int) -> str:
    data = _read(f"/proc/{pid}/cmdline", 512)
    if not data:
        stat = process_stat(pid)
        return f"[{stat.comm}]" if stat else "[gone]"
    words = [word.decode("utf-8", "backslashreplace") for word in data.rstrip(b"\0").split(b"\0")]
    text = " ".join(mask_argv(words))
    return text if len(text) <= 80 else text[:77] + "..."


# -- who else holds the process -----------------------------------------------------------------
def ptrace_blocker(pid: int) -> "str | None":
    """Why this process may not read PID's syscalls and stacks (Yama), or None when it may."""
    status = (_read("/proc/self/status") or b"").decode("ascii", "replace")
    for line in status.splitlines():
        if line.startswith("CapEff:") and int(line.split()[1], 16) & (1 << 19):  # CAP_SYS_PTRACE
            return None
    scope = (_read("/proc/sys/kernel/yama/ptrace_scope") or b"0").strip()
    if scope in (b"", b"0"):
        return None
    if scope == b"1":
        return "ptrace_scope is 1 and the watcher is not the program's parent"
    return f"ptrace_scope is {scope.decode()}"


def is_watcher_of(candidate: int, pid: int) -> bool:
    """True when CANDIDATE is importwatch's watcher process for PID."""
    command = _read(f"/proc/{candidate}/cmdline", 4096) or b""
    return b"importwatch.watcher" in command and f"\0--pid\0{pid}\0".encode() in command


def traced_by_us(pid: int, tracer: "int | None" = None) -> bool:
    """True when PID's debugger is one our watcher started (to read its native stacks)."""
    tracer = tracer_pid(pid) if tracer is None else tracer
    if not tracer:
        return False
    stat = process_stat(tracer)
    return stat is not None and is_watcher_of(stat.ppid, pid)


# -- mapped code and the stack, without a debugger ----------------------------------------------
class CodeRanges:
    """Executable mappings of shared objects in PID, to tell which library an address belongs to."""

    def __init__(self, pid: int) -> None:
        self.starts: list[int] = []
        self.ranges: list[tuple[int, int, str]] = []
        data = _read(f"/proc/{pid}/maps", 1 << 26) or b""
        for line in data.decode("utf-8", "backslashreplace").splitlines():
            fields = line.split(None, 5)
            if len(fields) < 6 or "x" not in fields[1] or not fields[5].startswith("/"):
                continue
            low, _, high = fields[0].partition("-")
            self.ranges.append((int(low, 16), int(high, 16), fields[5].removesuffix(" (deleted)")))
        self.ranges.sort()
        self.starts = [low for low, _, _ in self.ranges]

    def library_at(self, address: int) -> "str | None":
        index = bisect.bisect_right(self.starts, address) - 1
        if index >= 0:
            low, high, path = self.ranges[index]
            if low <= address < high:
                return path
        return None


def libraries_on_stack(
    pid: int, sample: "ThreadSample", code: "CodeRanges", depth: int = 1 << 16
) -> "list[str]":
    """Libraries with return addresses on the thread's stack, innermost first (needs ptrace permission).

    No unwinder: every word from the stack pointer up that points into a
    library's code counts. A stray pointer can add a name, but the order of the
    libraries that are really calling each other is kept, which is what tells
    whose constructor runs inside a hung dlopen when no debugger is installed.
    """
    if sample.syscall is None or len(sample.syscall) < 8:
        return []
    stack_pointer = sample.syscall[-2]
    data = read_memory(pid, stack_pointer, depth)
    if not data:
        return []
    found: dict[str, None] = {}
    for (word,) in struct.iter_unpack("Q", data[: len(data) // 8 * 8]):
        path = code.library_at(word)
        if path is not None:
            found.setdefault(path, None)
    return list(found)


def is_timer_thread(pid: int, sample: "ThreadSample", code: "CodeRanges") -> bool:
    """True for faulthandler's timer thread, told from outside without a debugger.

    It is the one thread CPython starts in C: it blocks every signal, and only the
    interpreter and the C library are on its stack, where any other thread that
    blocks all signals was started by a library that is on its own stack.
    """
    if not blocks_all_signals(pid, sample.tid):
        return False
    on_stack = libraries_on_stack(pid, sample, code, 1 << 13)
    if not on_stack:
        return False
    own = {os.path.realpath(f"/proc/{pid}/exe")}
    return all(path in own or _is_runtime(path) for path in on_stack)


def _is_runtime(path: str) -> bool:
    name = os.path.basename(path)
    return name.startswith(("libc.so", "libc-", "libpthread", "ld-linux", "ld-", "libpython"))


def alive(pid: int, start: "int | None" = None) -> bool:
    """True while PID exists and is not a zombie (and, given START, is the same process)."""
    stat = process_stat(pid)
    return stat is not None and stat.state not in "ZX" and (start is None or stat.start == start)
