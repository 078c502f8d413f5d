"""What a blocked thread of another process waits on, in words: its syscall's descriptor (a file, a
socket's addresses, a pipe's other end, a terminal), the file lock and its holder, poll's descriptors,
a child process, a timer.

Read from /proc from outside: the fd links and /proc/locks need only the same user; the syscall
and its arguments (task/TID/syscall, mem) need ptrace permission. Each reader returns None when it
cannot see.
"""

import os
import socket
import struct

from importwatch.facts import procstat, resolver
from importwatch.facts.gil import mutex_words
from importwatch.facts.process import ThreadSample, command_of, read_file, read_memory

_read = read_file

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
    217: ("getdents64", _FD), 219: ("restart_syscall", _NONE), 230: ("clock_nanosleep", _NONE),
    232: ("epoll_wait", _NONE),
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
    115: ("clock_nanosleep", _NONE), 128: ("restart_syscall", _NONE), 202: ("accept", _FD),
    203: ("connect", _FD), 206: ("sendto", _FD),
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


# -- the syscall ------------------------------------------------------------------------------------
def _read_string(pid: int, address: int) -> "str | None":
    data = read_memory(pid, address, 4096)
    if not data:
        return None
    return data.partition(b"\0")[0].decode("utf-8", "backslashreplace")


def waits_on(pid: int, sample: "ThreadSample") -> "str | None":
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
        if not procstat.has_waker(pid, sample.tid):
            return f"in futex, {ALONE}"
        held = mutex_words(pid, sample)
        return f"in futex: {held or 'waiting for a lock or a condition held by another thread'}"
    if name in ("wait4", "waitid"):
        return f"in {name}: waiting for a child process{_children(pid)}"
    if name == "pause":
        return "in pause: waiting for a signal"
    if name in ("nanosleep", "clock_nanosleep"):
        return f"in {name}: sleeping on a timer"
    if name == "restart_syscall":  # a sleep or wait resumed after a stop (a debugger's, SIGSTOP)
        return "in restart_syscall: an interrupted sleep or wait, resumed"
    return f"in {name}"


# A futex wait that no thread of the process can end: the process has no other thread (that could).
ALONE = "with no other thread in this process to wake it: a lock or a pool inherited across fork()"


def _waits_on_without_syscall(pid: int, sample: "ThreadSample") -> "str | None":
    """Without ptrace permission: what the wait channel and /proc/locks still tell."""
    if "lock" in sample.wchan:
        waited = locks_waited(pid)
        if waited:
            return f"waiting for a lock on {waited}"
    return None


def _poll_fds(pid: int, address: int, count: int) -> "list[int]":
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


# -- descriptors -------------------------------------------------------------------------------------
def fd_target(pid: int, fd: int) -> "str | None":
    try:
        return os.readlink(f"/proc/{pid}/fd/{fd}")
    except OSError:
        return None


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
        for fields in procstat.net_rows(str(pid), table) or ():
            if len(fields) > 9 and fields[9] == wanted:
                local, peer, state = _address(fields[1]), _address(fields[2]), fields[3]
                kind = table.rstrip("6").upper()
                if state == "0A":
                    return f"a {kind} socket listening on {local}"
                words = _TCP_STATES.get(state, state) if kind == "TCP" else ""
                if kind == "UDP" and resolver.is_dns_peer(peer):
                    words = "(" + resolver.lookup(None, resolver.server_of(peer), None, pid) + ")"
                return f"a {kind} socket {local} -> {peer} {words}".rstrip()
    for fields in procstat.net_rows(str(pid), "unix") or ():
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


# -- file locks -------------------------------------------------------------------------------------
def _locks() -> "list[list[str]]":
    data = _read("/proc/locks", 1 << 20) or b""
    return [line.split() for line in data.decode("ascii", "replace").splitlines()]


def _lock_parts(fields: "list[str]") -> "tuple[bool, str, str, int] | None":
    """(blocked, kind, dev:inode, pid) of one /proc/locks line."""
    blocked = len(fields) > 1 and fields[1] == "->"
    rest = fields[2:] if blocked else fields[1:]
    if len(rest) < 5 or not rest[3].lstrip("-").isdigit():
        return None
    return blocked, rest[0], rest[4], int(rest[3])


def _file_key(pid: int, fd: int) -> "str | None":
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


def locks_waited(pid: int) -> "str | None":
    """The file PID is blocked on in /proc/locks (a waiting flock or F_SETLKW), with its holder."""
    lines = [p for p in map(_lock_parts, _locks()) if p]
    for blocked, kind, key, owner in lines:
        if blocked and owner == pid:
            path = _path_of_key(pid, key) or f"the file with device:inode {key}"
            holders = [other for b, _, k, other in lines if not b and k == key and other != pid]
            held = f", held by pid {holders[0]} {command_of(holders[0])}" if holders else ""
            return f"{path} ({kind}){held}"
    return None


def _path_of_key(pid: int, key: str) -> "str | None":
    try:
        fds = os.listdir(f"/proc/{pid}/fd")
    except OSError:
        return None
    for fd in fds:
        if _file_key(pid, int(fd)) == key:
            return fd_target(pid, int(fd))
    return None


def stdin_terminal(pid: int) -> "str | None":
    """The terminal on PID's stdin, if it reads one."""
    target = fd_target(pid, 0)
    if target and (target.startswith(("/dev/pts/", "/dev/tty")) or target == "/dev/console"):
        return target
    return None
