"""A thread waiting for a runtime's thread pool in a process that has no such threads (a fork child).

OpenMP runtimes keep a pool of worker threads between parallel regions. fork() copies only the
thread that called it: in a child forked after the parent ran a region, the runtime still
believes its pool exists, and the next region waits on a futex for threads that will never come.
Seen from /proc: the program's only thread is in futex(2), and the code that made the call (the
syscall's program counter, else, from outside, the return addresses on its stack) is the runtime's.

Imports nothing but os and procstat at its top: the stall report loads it inside the traced
process, where every import of ours would be a line in the program's log.
"""

# Run from memory at a stall (tracing/standby.py), this module may import nothing that start-up holds back
# from the program (tracing/handback.py).
import os

from importwatch.facts import procstat

TYPE_CHECKING = False
if TYPE_CHECKING:
    from importwatch.facts.process import CodeRanges, ThreadSample

# Thread-pool runtimes by the stem of their library's file name, and how to name them.
RUNTIMES = {
    "libgomp": "GNU OpenMP (libgomp)",
    "libiomp5": "Intel OpenMP (libiomp5)",
    "libomp": "LLVM OpenMP (libomp)",
}
FUTEX = {"x86_64": 202, "aarch64": 98, "ppc64le": 221, "s390x": 238}.get(os.uname().machine)
FIX = (
    "start the workers with the spawn method (multiprocessing.set_start_method('spawn'), "
    "or the DataLoader's multiprocessing_context='spawn'), or run no parallel region before fork()"
)


def orphaned_wait(pid: int, sample: "ThreadSample", code: "CodeRanges") -> "str | None":
    """The pool runtime's library when thread SAMPLE (of PID) waits on a futex in its code and no other
    thread of PID could wake it (procstat.has_waker); None when not so."""
    from importwatch.facts import process

    call = sample.syscall
    if call is None or FUTEX is None or call[0] != FUTEX or procstat.has_waker(pid, sample.tid):
        return None
    library = code.library_at(call[-1])
    if library is not None and is_runtime(library):
        return library
    # Through libc (pthread_cond_wait): the runtime's return addresses are further up its stack.
    on_stack = process.libraries_on_stack(pid, sample, code, depth=1 << 12)
    return next((path for path in on_stack if is_runtime(path)), None)


def own_orphaned_wait(tid: int) -> "str | None":
    """orphaned_wait for thread TID of this process, read from /proc/self with os alone.

    Only the syscall's program counter is read (no stack walk): a runtime that waits through libc
    is told by the watcher and inspect, which look at the stack from outside.
    """
    words = (procstat.read_file(f"/proc/self/task/{tid}/syscall") or b"").split()
    try:
        if FUTEX is None or len(words) < 2 or int(words[0]) != FUTEX or procstat.has_waker("self", tid):
            return None
        pc = int(words[-1], 16)
    except ValueError:
        return None
    library = _own_library_at(pc)
    return library if library is not None and is_runtime(library) else None


def orphaned_pool(library: str, parent: "int | None") -> str:
    """In words: the thread waits in LIBRARY's pool, which has no threads in this process.

    PARENT is the pid of the process this one was forked from, when known.
    """
    runtime = RUNTIMES.get(_stem(library), os.path.basename(library))
    where = f"{runtime}'s thread pool ({os.path.basename(library)})"
    if parent is None:
        return (
            f"waits for {where}, whose threads do not exist in this process (its only thread): "
            f"a pool inherited across fork(); {FIX}"
        )
    return (
        f"fork child of {parent}; waits for {where}: the parent ran a parallel region before fork(), "
        f"and the pool's threads stayed in the parent; {FIX}"
    )


def is_runtime(path: str) -> bool:
    return _stem(path) in RUNTIMES


def _stem(path: str) -> str:
    """libgomp.so.1.0.0 -> libgomp; a wheel's vendored libgomp-a34b3233.so.1 too."""
    return os.path.basename(path).split(".so", 1)[0].split("-", 1)[0]


def _own_library_at(address: int) -> "str | None":
    """The file mapped executable at ADDRESS in this process."""
    maps = procstat.read_file("/proc/self/maps", 1 << 26) or b""
    for line in maps.splitlines():
        fields = line.split(None, 5)
        if len(fields) < 6 or b"x" not in fields[1]:
            continue
        low, _, high = fields[0].partition(b"-")
        if int(low, 16) <= address < int(high, 16):
            return fields[5].decode("utf-8", "backslashreplace").removesuffix(" (deleted)")
    return None
