"""Reads another process from /proc: its threads' states and CPU, what a blocked thread waits on, its stacks.

Everything here is read from outside, so it answers while the process holds the
GIL in a hung dlopen, and while it is stopped. The files differ in who may read
them: stat, status, wchan, maps, fd links and /proc/locks need only the same
user; task/TID/syscall and mem (the syscall's arguments, the stack) need ptrace
permission, which Yama's ptrace_scope may deny to a process that is not the
target's ancestor. Each reader returns None or [] when it cannot see, and
ptrace_blocker() says why, so a report shows what it can and says what it cannot.
"""

from __future__ import annotations

import bisect
import os
import signal
import socket
import struct
import subprocess
import time

from importwatch.facts import procstat
from importwatch.signame import signal_name

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

# Syscall numbers whose waits we can explain: name and which argument is a file descriptor (or a path).
# Two tables: x86_64 has its own numbers; aarch64 and most newer ports share the generic table.
_FD, _PATH_AT, _PATH, _POLL, _NONE = "fd", "path_at", "path", "poll", ""
_X86_64 = {
    0: ("read", _FD), 1: ("write", _FD), 2: ("open", _PATH), 4: ("stat", _PATH), 6: ("lstat", _PATH),
    7: ("poll", _POLL), 16: ("ioctl", _FD), 17: ("pread64", _FD), 18: ("pwrite64", _FD),
    19: ("readv", _FD), 20: ("writev", _FD), 23: ("select", _NONE), 34: ("pause", _NONE),
    35: ("nanosleep", _NONE), 42: ("connect", _FD), 43: ("accept", _FD), 44: ("sendto", _FD),
    45: ("recvfrom", _FD), 46: ("sendmsg", _FD), 47: ("recvmsg", _FD), 61: ("wait4", _NONE),
    72: ("fcntl", _FD), 73: ("flock", _FD), 74: ("fsync", _FD), 202: ("futex", _NONE),
    217: ("getdents64", _FD), 230: ("clock_nanosleep", _NONE), 232: ("epoll_wait", _NONE),
    247: ("waitid", _NONE), 257: ("openat", _PATH_AT), 262: ("newfstatat", _PATH_AT),
    270: ("pselect6", _NONE), 271: ("ppoll", _POLL), 281: ("epoll_pwait", _NONE), 288: ("accept4", _FD),
    332: ("statx", _PATH_AT), 437: ("openat2", _PATH_AT), 441: ("epoll_pwait2", _NONE),
    449: ("futex_waitv", _NONE),
}  # fmt: skip
_GENERIC = {
    22: ("epoll_pwait", _NONE), 25: ("fcntl", _FD), 29: ("ioctl", _FD), 32: ("flock", _FD),
    56: ("openat", _PATH_AT), 61: ("getdents64", _FD), 63: ("read", _FD), 64: ("write", _FD),
    65: ("readv", _FD), 66: ("writev", _FD), 67: ("pread64", _FD), 68: ("pwrite64", _FD),
    72: ("pselect6", _NONE), 73: ("ppoll", _POLL), 79: ("newfstatat", _PATH_AT), 82: ("fsync", _FD),
    95: ("waitid", _NONE), 98: ("futex", _NONE), 101: ("nanosleep", _NONE),
    115: ("clock_nanosleep", _NONE), 202: ("accept", _FD), 203: ("connect", _FD), 206: ("sendto", _FD),
    207: ("recvfrom", _FD), 211: ("sendmsg", _FD), 212: ("recvmsg", _FD), 242: ("accept4", _FD),
    260: ("wait4", _NONE), 291: ("statx", _PATH_AT), 437: ("openat2", _PATH_AT),
    441: ("epoll_pwait2", _NONE), 449: ("futex_waitv", _NONE),
}  # fmt: skip
SYSCALLS = _X86_64 if os.uname().machine == "x86_64" else _GENERIC

_TCP_STATES = {
    "01": "established", "02": "connecting (SYN sent, no answer)", "03": "SYN received", "04": "closing",
    "05": "closing", "06": "TIME_WAIT", "07": "closed", "08": "closed by the peer", "09": "closing",
    "0A": "listening", "0B": "closing",
}  # fmt: skip
_F_SETLKW = (7, 38)  # F_SETLKW, F_OFD_SETLKW: waits for a record lock


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


def read_file(path: str, limit: int = 1 << 16) -> bytes | None:
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


_read = read_file  # the short name the readers below use


def sample_threads(pid: int, detail: bool = False) -> dict[int, ThreadSample]:
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
        sample.demand = _demand(f"{base}/schedstat")
        if detail:
            wchan = _read(f"{base}/wchan") or b""
            sample.wchan = "" if wchan in (b"0", b"") else wchan.decode("ascii", "replace")
            sample.syscall = _read_syscall(f"{base}/syscall")
        samples[tid] = sample
    return samples


def _demand(path: str) -> float | None:
    data = _read(path)
    try:
        run, wait = (data or b"").split()[:2]
        return (int(run) + int(wait)) / 1e9
    except ValueError:
        return None


def _read_syscall(path: str) -> list[int] | None:
    data = _read(path)
    if not data or data.startswith((b"running", b"-1")):
        return None
    try:
        return [int(word, 0) for word in data.split()]
    except ValueError:
        return None


def cpu_share(before: ThreadSample | None, after: ThreadSample, seconds: float) -> float | None:
    """Share of one CPU the thread used (or waited in the run queue for) between two samples; None
    without an earlier sample."""
    if before is None or seconds <= 0:
        return None
    if before.demand is not None and after.demand is not None:
        return min((after.demand - before.demand) / seconds, 1.0)
    return (after.cpu - before.cpu) / _TICKS / seconds


def verdict(sample: ThreadSample, share: float | None) -> str:
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

    def __init__(self, comm: str, fields: list[bytes]) -> None:
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


def process_stat(pid: int) -> ProcessStat | None:
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


def reaped_status(pidfd: int) -> int | None:
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


# -- what a thread waits on ------------------------------------------------------------------------
def fd_target(pid: int, fd: int) -> str | None:
    try:
        return os.readlink(f"/proc/{pid}/fd/{fd}")
    except OSError:
        return None


def read_memory(pid: int, address: int, size: int) -> bytes | None:
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


def _read_string(pid: int, address: int) -> str | None:
    data = read_memory(pid, address, 4096)
    if not data:
        return None
    return data.partition(b"\0")[0].decode("utf-8", "backslashreplace")


def waits_on(pid: int, sample: ThreadSample) -> str | None:
    """What the thread's blocked syscall waits for, in words; None when it cannot be seen."""
    call = sample.syscall
    if call is None:
        return _waits_on_without_syscall(pid, sample)
    name, kind = SYSCALLS.get(call[0], (f"syscall {call[0]}", _NONE))
    if kind == _FD:
        fd = call[1]
        if name == "fcntl" and call[2] not in _F_SETLKW:
            return f"in fcntl on {fd_name(fd)}: {describe_fd(pid, fd)}"
        what = describe_fd(pid, fd)
        if name in ("flock", "fcntl"):
            return f"waiting for a lock on {what}{lock_holder(pid, fd)}"
        return f"in {name} on {fd_name(fd)}: {what}"
    if kind in (_PATH, _PATH_AT):
        path = _read_string(pid, call[2 if kind == _PATH_AT else 1])
        return f"in {name} of {path}" if path is not None else f"in {name}"
    if kind == _POLL:
        fds = _poll_fds(pid, call[1], call[2])
        if fds:
            described = "; ".join(f"{fd_name(fd)}: {describe_fd(pid, fd)}" for fd in fds[:4])
            return f"in {name} on {described}"
        return f"in {name}"
    if name == "futex":
        return "in futex: waiting for a lock or a condition held by another thread"
    if name in ("wait4", "waitid"):
        return f"in {name}: waiting for a child process{_children(pid)}"
    if name == "pause":
        return "in pause: waiting for a signal"
    if name in ("nanosleep", "clock_nanosleep"):
        return f"in {name}: sleeping on a timer"
    return f"in {name}"


def _waits_on_without_syscall(pid: int, sample: ThreadSample) -> str | None:
    """Without ptrace permission: what the wait channel and /proc/locks still tell."""
    if "lock" in sample.wchan:
        waited = locks_waited(pid)
        if waited:
            return f"waiting for a lock on {waited}"
    return None


def _poll_fds(pid: int, address: int, count: int) -> list[int]:
    if not 0 < count <= 64:
        return []
    data = read_memory(pid, address, 8 * count)  # struct pollfd: int fd; short events, revents
    if not data or len(data) < 8 * count:
        return []
    return [fd for fd in struct.unpack_from(f"{'ihh' * count}", data)[::3] if fd >= 0]


def _children(pid: int) -> str:
    children = []
    for tid in os.listdir(f"/proc/{pid}/task") if os.path.isdir(f"/proc/{pid}/task") else []:
        data = _read(f"/proc/{pid}/task/{tid}/children") or b""
        children += [int(child) for child in data.split()]
    if not children:
        return ""
    return " (" + ", ".join(f"pid {child} {command_of(child)}" for child in children[:4]) + ")"


def command_of(pid: int) -> str:
    from importwatch.tracing.banner import mask_argv  # the watcher needs it only in a report

    data = _read(f"/proc/{pid}/cmdline", 512)
    if not data:
        stat = process_stat(pid)
        return f"[{stat.comm}]" if stat else "[gone]"
    words = [word.decode("utf-8", "backslashreplace") for word in data.rstrip(b"\0").split(b"\0")]
    text = " ".join(mask_argv(words))
    return text if len(text) <= 80 else text[:77] + "..."


_STANDARD_FDS = ("stdin", "stdout", "stderr")


def fd_name(fd: int) -> str:
    """A descriptor as a verdict names it: the standard ones by name (`stdin (fd 0)`), others `fd N`."""
    return f"{_STANDARD_FDS[fd]} (fd {fd})" if 0 <= fd < len(_STANDARD_FDS) else f"fd {fd}"


def describe_fd(pid: int, fd: int) -> str:
    """A file descriptor of PID in words: the file, the socket's addresses, the pipe's other end, a tty."""
    target = fd_target(pid, fd)
    if target is None:
        return "(closed)"
    if target.startswith("socket:["):
        return describe_socket(pid, int(target[8:-1]))
    if target.startswith("pipe:["):
        others = pipe_peers(pid, target)
        return f"a pipe ({target})" + (f", also held by {others}" if others else "")
    if target.startswith(("/dev/pts/", "/dev/tty")) or target == "/dev/console":
        hint = " (a terminal: a background job stops here; redirect stdin: < /dev/null)" if fd == 0 else ""
        return f"the terminal {target}{hint}"
    return target


def _address(hex_address: str) -> str:
    host, _, port = hex_address.partition(":")
    raw = bytes.fromhex(host)
    # The kernel prints each 32-bit word in host byte order.
    words = b"".join(raw[i : i + 4][::-1] for i in range(0, len(raw), 4))
    family = socket.AF_INET if len(words) == 4 else socket.AF_INET6
    text = socket.inet_ntop(family, words)
    return f"{text}:{int(port, 16)}" if family == socket.AF_INET else f"[{text}]:{int(port, 16)}"


def describe_socket(pid: int, inode: int) -> str:
    """A socket by inode: TCP/UDP local and peer addresses and state, or a unix socket's path."""
    wanted = str(inode)
    for table in ("tcp", "tcp6", "udp", "udp6"):
        data = _read(f"/proc/{pid}/net/{table}", 1 << 24) or b""
        for line in data.decode("ascii", "replace").splitlines()[1:]:
            fields = line.split()
            if len(fields) > 9 and fields[9] == wanted:
                local, peer, state = _address(fields[1]), _address(fields[2]), fields[3]
                kind = table.rstrip("6").upper()
                if state == "0A":
                    return f"a {kind} socket listening on {local}"
                words = _TCP_STATES.get(state, state) if kind == "TCP" else ""
                return f"a {kind} socket {local} -> {peer} {words}".rstrip()
    data = _read(f"/proc/{pid}/net/unix", 1 << 24) or b""
    for line in data.decode("utf-8", "replace").splitlines()[1:]:
        fields = line.split()
        if len(fields) > 6 and fields[6] == wanted:
            return f"a unix socket {fields[7]}" if len(fields) > 7 else "a unix socket"
    return f"a socket (socket:[{inode}])"


def pipe_peers(pid: int, target: str, limit: int = 4) -> str:
    """Other processes that hold the same pipe (the writer a reader waits for), as 'pid N CMD'."""
    found = []
    for name in os.listdir("/proc"):
        if not name.isdigit() or int(name) == pid:
            continue
        try:
            fds = os.listdir(f"/proc/{name}/fd")
        except OSError:
            continue
        for fd in fds:
            if fd_target(int(name), int(fd)) == target:
                found.append(f"pid {name} {command_of(int(name))}")
                break
        if len(found) >= limit:
            break
    return ", ".join(found)


def _locks() -> list[list[str]]:
    data = _read("/proc/locks", 1 << 20) or b""
    return [line.split() for line in data.decode("ascii", "replace").splitlines()]


def _lock_parts(fields: list[str]) -> tuple[bool, str, str, int] | None:
    """(blocked, kind, dev:inode, pid) of one /proc/locks line."""
    blocked = len(fields) > 1 and fields[1] == "->"
    rest = fields[2:] if blocked else fields[1:]
    if len(rest) < 5 or not rest[3].lstrip("-").isdigit():
        return None
    return blocked, rest[0], rest[4], int(rest[3])


def _file_key(pid: int, fd: int) -> str | None:
    try:
        info = os.stat(f"/proc/{pid}/fd/{fd}")
    except OSError:
        return None
    return f"{os.major(info.st_dev):02x}:{os.minor(info.st_dev):02x}:{info.st_ino}"


def lock_holder(pid: int, fd: int) -> str:
    """', held by pid N CMD' for the lock on fd's file that another process holds; '' when unknown."""
    key = _file_key(pid, fd)
    if key is None:
        return ""
    for fields in _locks():
        parts = _lock_parts(fields)
        if parts and not parts[0] and parts[2] == key and parts[3] != pid:
            return f", held by pid {parts[3]} {command_of(parts[3])}"
    return ""


def locks_waited(pid: int) -> str | None:
    """The file PID is blocked on in /proc/locks (a waiting flock or F_SETLKW), with its holder."""
    lines = [p for p in map(_lock_parts, _locks()) if p]
    for blocked, kind, key, owner in lines:
        if blocked and owner == pid:
            path = _path_of_key(pid, key) or f"the file with device:inode {key}"
            holders = [other for b, _, k, other in lines if not b and k == key and other != pid]
            held = f", held by pid {holders[0]} {command_of(holders[0])}" if holders else ""
            return f"{path} ({kind}){held}"
    return None


def _path_of_key(pid: int, key: str) -> str | None:
    try:
        fds = os.listdir(f"/proc/{pid}/fd")
    except OSError:
        return None
    for fd in fds:
        if _file_key(pid, int(fd)) == key:
            return fd_target(pid, int(fd))
    return None


def stdin_terminal(pid: int) -> str | None:
    """The terminal on PID's stdin, if it reads one."""
    target = fd_target(pid, 0)
    if target and (target.startswith(("/dev/pts/", "/dev/tty")) or target == "/dev/console"):
        return target
    return None


# -- mapped objects and the stack ---------------------------------------------------------------
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

    def library_at(self, address: int) -> str | None:
        index = bisect.bisect_right(self.starts, address) - 1
        if index >= 0:
            low, high, path = self.ranges[index]
            if low <= address < high:
                return path
        return None


def libraries_on_stack(pid: int, sample: ThreadSample, code: CodeRanges, depth: int = 1 << 16) -> list[str]:
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


def ptrace_blocker(pid: int) -> str | None:
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


def find_program(name: str) -> str | None:
    """NAME's executable in the absolute folders of PATH, or None.

    An empty, `.` or relative entry means the working directory, where anyone who can
    write there could plant a `gdb` that then runs as us (root, often): those are skipped.
    """
    for folder in os.environ.get("PATH", os.defpath).split(os.pathsep):
        if not os.path.isabs(folder):
            continue
        candidate = os.path.join(folder, name)
        if os.path.isfile(candidate) and os.access(candidate, os.X_OK):
            return candidate
    return None


class Stacks:
    """Native stacks of a process: per thread (tid, header, frames) when the tool's output tells the
    threads apart (gdb), else one block; `seconds`: how long reading them took.

    gdb keeps the process stopped until release(): its stacks can be written while it
    cannot move on, even when moving on means ending (faulthandler's exit is due).
    """

    __slots__ = ("_gdb", "seconds", "threads", "tool")

    def __init__(
        self,
        tool: str,
        threads: list[tuple[int | None, str, list[str]]],
        seconds: float,
        gdb: subprocess.Popen | None = None,
    ) -> None:
        self.tool = tool
        self.threads = threads
        self.seconds = seconds
        self._gdb = gdb

    def release(self) -> None:
        """Let the process go on: gdb detaches and quits (killed if it does not)."""
        gdb, self._gdb = self._gdb, None
        if gdb is not None:
            _end_gdb(gdb, b"detach\nquit\n")


_GDB_END = "@@importwatch: end of stacks@@"


def read_stacks(pid: int, timeout: float = 10.0) -> Stacks | str:
    """Every thread's native stack from the first debugger installed, or why there are none.

    A debugger stops every thread of the process while it reads them (gdb: a few
    tenths of a second, longer while it loads a big library's symbols), at most
    TIMEOUT seconds; it is never started while someone else's debugger holds the process.
    gdb's stacks come back with the process still stopped: call release().
    """
    blocked = ptrace_blocker(pid)
    if blocked is not None:
        return f"no native stacks: {blocked}; run as root, or: sudo sysctl kernel.yama.ptrace_scope=0"
    tracer = tracer_pid(pid)
    if tracer:
        return f"no native stacks: pid {tracer} {command_of(tracer)} is debugging it"
    path = find_program("gdb")
    if path is not None:
        return _gdb_stacks(path, pid, timeout)
    for tool, command in (
        ("pystack", ["remote", str(pid), "--native"]),
        ("py-spy", ["dump", "--native", "--pid", str(pid)]),
    ):
        path = find_program(tool)
        if path is None:
            continue
        began = time.monotonic()
        done = run_helper(tool, [path, *command], timeout)
        if isinstance(done, str):
            return done
        out, err = done
        if not out.strip():
            return f"{tool} showed nothing: {last_line(err)}"
        return Stacks(tool, [(None, "", out.splitlines())], time.monotonic() - began)
    return "no native stacks: install gdb, py-spy or pystack to see them"


def run_helper(tool: str, command: list[str], timeout: float) -> tuple[str, str] | str:
    """The stdout and stderr of TOOL (a stack reader) run as COMMAND, within TIMEOUT seconds; or why
    it failed."""
    # Nothing on its stdin; what it says is read as text, any byte it cannot decode replaced.
    quietly: dict = {"stdin": subprocess.DEVNULL, "capture_output": True, "text": True, "errors": "replace"}
    try:
        done = subprocess.run(command, timeout=timeout, **quietly)
    except (OSError, subprocess.SubprocessError) as error:
        return f"{tool} failed: {error}"
    return done.stdout, done.stderr


def last_line(text: str, default: str = "?") -> str:
    """The last line of TEXT (what a helper said last, often its reason), or DEFAULT."""
    return (text.strip().splitlines() or [default])[-1]


def _gdb_stacks(path: str, pid: int, timeout: float) -> Stacks | str:
    """gdb, driven through its stdin: attach, print every stack and a mark, then wait to be released."""
    import selectors

    began = time.monotonic()
    commands = f"set pagination off\nset confirm off\nthread apply all bt\necho {_GDB_END}\\n\n"
    try:
        gdb = subprocess.Popen(
            [path, "-nx", "-q", "-p", str(pid)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
        )
        gdb.stdin.write(commands.encode())
        gdb.stdin.flush()
    except OSError as error:
        return f"gdb failed: {error}"
    output = b""
    with selectors.DefaultSelector() as selector:
        selector.register(gdb.stdout, selectors.EVENT_READ)
        while _GDB_END.encode() + b"\n" not in output:
            left = began + timeout - time.monotonic()
            if left <= 0 or not selector.select(left):
                _end_gdb(gdb, b"")
                return f"gdb failed: no stacks within {timeout:g} s"
            data = os.read(gdb.stdout.fileno(), 1 << 16)
            if not data:
                _end_gdb(gdb, b"")
                return f"gdb showed nothing: {last_line(output.decode('utf-8', 'replace'))}"
            output += data
    text = output.decode("utf-8", "replace").split(_GDB_END + "\n")[0]
    threads = gdb_threads(text)
    if not threads:
        _end_gdb(gdb, b"detach\nquit\n")
        return f"gdb showed nothing: {last_line(text)}"
    return Stacks("gdb", threads, time.monotonic() - began, gdb)


def _end_gdb(gdb: subprocess.Popen, commands: bytes) -> None:
    try:
        if commands:
            gdb.stdin.write(commands)
        gdb.stdin.close()
    except OSError:
        pass
    try:
        gdb.wait(5.0)
    except subprocess.TimeoutExpired:
        gdb.kill()  # a tracer that dies lets its tracee go
        gdb.wait()
    gdb.stdout.close()


def gdb_threads(output: str, frames: int = 24) -> list[tuple[int | None, str, list[str]]]:
    """gdb's backtraces per thread: (LWP, "Thread N (LWP T)", frames shortened to function and library)."""
    threads: list[tuple[int | None, str, list[str]]] = []
    count = 0
    for line in output.splitlines():
        if line.startswith("Thread "):
            lwp = _lwp(line)
            threads.append((lwp, line.split(" (Thread 0x")[0] + (f" (LWP {lwp})" if lwp else ""), []))
            count = 0
        elif line.startswith("#") and threads:
            count += 1
            if count <= frames:
                threads[-1][2].append("  " + short_frame(line))
            elif count == frames + 1:
                threads[-1][2].append("  ...")
    return threads


def _lwp(line: str) -> int | None:
    start = line.find("(LWP ")
    number = line[start + 5 : line.find(")", start)] if start >= 0 else ""
    return int(number) if number.isdigit() else None


# -- who else holds the process -----------------------------------------------------------------
def tracer_pid(pid: int) -> int:
    """The pid of the debugger (ptrace) attached to PID, 0 when none."""
    status = _read(f"/proc/{pid}/status") or b""
    for line in status.splitlines():
        if line.startswith(b"TracerPid:"):
            value = line.split()[1:]
            return int(value[0]) if value and value[0].isdigit() else 0
    return 0


def is_watcher_of(candidate: int, pid: int) -> bool:
    """True when CANDIDATE is importwatch's watcher process for PID."""
    command = _read(f"/proc/{candidate}/cmdline", 4096) or b""
    return b"importwatch.watcher" in command and f"\0--pid\0{pid}\0".encode() in command


def traced_by_us(pid: int, tracer: int | None = None) -> bool:
    """True when PID's debugger is one our watcher started (to read its native stacks)."""
    tracer = tracer_pid(pid) if tracer is None else tracer
    if not tracer:
        return False
    stat = process_stat(tracer)
    return stat is not None and is_watcher_of(stat.ppid, pid)


def blocks_all_signals(pid: int, tid: int) -> bool:
    """True when thread TID blocks every signal it can (faulthandler's timer thread does)."""
    status = _read(f"/proc/{pid}/task/{tid}/status") or b""
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


def is_timer_thread(pid: int, sample: ThreadSample, code: CodeRanges) -> bool:
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


def short_frame(line: str) -> str:
    """'#3  0x7f.. in my_ctor (a=1) at x.c:4' -> '#3 my_ctor at x.c:4'; ' from /lib/x.so' kept."""
    number, _, rest = line.partition(" ")
    rest = rest.strip()
    if " in " in rest and rest.startswith("0x"):
        rest = rest.split(" in ", 1)[1]
    function, paren, tail = rest.partition(" (")
    where = ""
    for marker in (" from ", " at "):
        if marker in tail:
            where = marker + tail.rsplit(marker, 1)[1]
            break
    return f"{number} {function}{where}" if paren else f"{number} {rest}"


def alive(pid: int, start: int | None = None) -> bool:
    """True while PID exists and is not a zombie (and, given START, is the same process)."""
    stat = process_stat(pid)
    return stat is not None and stat.state not in "ZX" and (start is None or stat.start == start)
