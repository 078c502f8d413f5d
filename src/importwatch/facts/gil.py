"""Deadlocks that cross the GIL, seen from outside: the owner of the native mutex a thread waits for,
which threads' native stacks wait for the GIL, and which extension init holds it.

The shape: an extension's init runs holding the GIL (its PyInit, or a constructor inside dlopen)
and waits for a native mutex, whose owner waits for the GIL (a C thread calling back into Python
through PyGILState_Ensure, a Python thread back from Py_BEGIN_ALLOW_THREADS). The mutex's owner is
read from the futex word the waiter passed to futex(2) (task/TID/syscall, then mem: ptrace
permission): glibc keeps a normal mutex's owner tid next to its lock word, a PI or robust mutex's
in the lock word itself. Who waits for the GIL, and which init runs, only a native stack tells.
"""

import os
import struct

from importwatch.facts.process import read_memory

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable, Sequence

    from importwatch.facts.process import ThreadSample

DEADLOCK = "deadlock"  # the verdict of a relation across the GIL
GIL_WAIT = "waiting for the GIL"  # the state of a thread that does (it polls the GIL: /proc may say running)
_FUTEX = 202 if os.uname().machine == "x86_64" else 98
_WAIT, _LOCK_PI, _WAIT_BITSET, _LOCK_PI2 = 0, 6, 9, 13
_TID_MASK = 0x3FFFFFFF
# glibc's pthread_mutex_t on 64-bit Linux: int __lock; unsigned int __count; int __owner; ...
_OWNER_OFFSET = 8
# Where a thread waits for the GIL (take_gil may be inlined into the others).
GIL_TAKERS = (
    "take_gil",
    "PyGILState_Ensure",
    "PyEval_RestoreThread",
    "PyEval_AcquireThread",
    "PyEval_AcquireLock",
    "_PyEval_AcquireLock",
)
_MUTEX_LOCKS = (
    "pthread_mutex_lock",
    "__pthread_mutex_lock",
    "___pthread_mutex_lock",
    "__GI___pthread_mutex_lock",
)
_C_LIBRARY = ("libc.so", "libc-", "libpthread", "ld-linux", "ld-")
_INIT_CALLERS = ("call_init", "_dl_init")


def mutex_owner(pid: int, sample: "ThreadSample", tids: "Sequence[int]") -> "int | None":
    """The tid of the thread of PID (one of TIDS) that holds the mutex SAMPLE's thread waits for in
    futex(2); None when it waits for no mutex, or the owner cannot be read."""
    call = sample.syscall
    if not call or len(call) < 4 or call[0] != _FUTEX:
        return None
    address, operation, expected = call[1], call[2] & 0x7F, call[3]
    if operation not in (_WAIT, _WAIT_BITSET, _LOCK_PI, _LOCK_PI2):
        return None
    data = read_memory(pid, address, _OWNER_OFFSET + 4)
    if not data or len(data) < _OWNER_OFFSET + 4:
        return None
    lock, owner = struct.unpack_from("I", data)[0], struct.unpack_from("i", data, _OWNER_OFFSET)[0]
    others = set(tids) - {sample.tid}
    if operation in (_LOCK_PI, _LOCK_PI2) or lock & _TID_MASK in others:  # PI and robust: the tid is the word
        return lock & _TID_MASK if lock & _TID_MASK in others else None
    # A normal mutex's waiters wait for the value 2 (locked, with waiters); a condition variable's
    # futex words hold other values, and no tid beside them.
    if expected == 2 and lock == 2 and owner in others:
        return owner
    return None


def mutex_words(pid: int, sample: "ThreadSample") -> "str | None":
    """'waiting for a mutex held by tid N' for a thread in futex(2) on a mutex another thread holds."""
    try:
        tids = [int(name) for name in os.listdir(f"/proc/{pid}/task")]
    except (OSError, ValueError):
        return None
    owner = mutex_owner(pid, sample, tids)
    return f"waiting for a mutex held by tid {owner}" if owner is not None else None


# -- native stacks -------------------------------------------------------------------------------------
def frame_parts(line: str) -> "tuple[str, str]":
    """The function and library of a native frame as gdb prints it (whole or shortened: '#3 f from
    /lib/x.so', '#3  0x7f.. in f (a=1) at x.c:4') or as py-spy and pystack are read ('f from x.so')."""
    text = line.strip()
    if text.startswith("#"):
        text = text.split(None, 1)[1] if " " in text else ""
        if text.startswith("0x") and " in " in text:
            text = text.split(" in ", 1)[1]
    library = text.rsplit(" from ", 1)[1].strip() if " from " in text else ""
    function = text.split(" (", 1)[0].split(" at ", 1)[0].split(" from ", 1)[0].strip()
    return function, library


def _in_c_library(function: str, library: str) -> bool:
    """A frame of the C library's own, or of the interpreter's wrappers of its waits (PyCOND_...)."""
    if function.startswith(("PyCOND_", "PyMUTEX_")):
        return True
    if library:
        return os.path.basename(library).startswith(_C_LIBRARY)
    return function.startswith(("_", "futex", "pthread_", "lll_", "sem_", "syscall", "clone", "start_thread"))


def waits_for_gil(frames: "Sequence[str]") -> bool:
    """True when a native stack (innermost first) waits for the GIL: past the C library's own frames,
    the first is one of the interpreter's GIL takers (a stack that only passed one on its way to
    some other wait is not waiting for it)."""
    for line in frames:
        function, library = frame_parts(line)
        if function in GIL_TAKERS:
            return True
        if function and not _in_c_library(function, library):
            return False
    return False


def waits_for_mutex(frames: "Sequence[str]") -> bool:
    """True when a native stack (innermost first) is in pthread_mutex_lock."""
    return any(frame_parts(line)[0] in _MUTEX_LOCKS for line in frames[:8])


def init_running(frames: "Sequence[str]") -> "str | None":
    """The extension init a native stack (innermost first) runs: 'PyInit_X', or 'the constructor of
    libY.so' (the function the dynamic loader's call_init called); None when it runs neither."""
    for index, line in enumerate(frames):
        function, _ = frame_parts(line)
        if function.startswith("PyInit_"):
            return function
        if function in _INIT_CALLERS and index:
            inner, library = frame_parts(frames[index - 1])
            return (
                f"the constructor of {os.path.basename(library)}" if library else f"the constructor {inner}"
            )
    return None


# -- the relation ------------------------------------------------------------------------------------
class Crossing:
    """A thread that holds the GIL in an extension's init (HOLDER) and waits for a native mutex: the
    mutex's owner (OWNER, None when it cannot be read), the threads whose native stacks wait for the
    GIL (WAITERS, empty without stacks), and the init it runs (INIT, None without a stack)."""

    __slots__ = ("holder", "init", "owner", "stacks", "waiters")

    def __init__(
        self, holder: int, init: "str | None", owner: "int | None", waiters: "list[int]", stacks: bool
    ):
        self.holder = holder
        self.init = init
        self.owner = owner
        self.waiters = waiters
        self.stacks = stacks  # whether the other threads' native stacks were read

    @property
    def deadlock(self) -> bool:
        """The owner waits for the GIL (or, the owner unread, some thread does)."""
        return self.owner in self.waiters if self.owner is not None else bool(self.waiters)

    def sentence(self, name: "Callable[[int], str]", where: str) -> "tuple[str, str]":
        """The relation in one line, as a verdict (DEADLOCK, or "waiting" when the owner's wait is not
        known) and its words; NAME gives a thread's 'NAME (tid N)', WHERE the init without a stack."""
        holder = name(self.holder)
        head = f"{holder} holds the GIL in {self.init or where} and waits for a mutex"
        if self.owner is not None:
            owner = name(self.owner)
            if self.deadlock:
                return DEADLOCK, f"{head} held by {owner}; {owner} waits for the GIL"
            if self.stacks:
                return "waiting", f"{head} held by {owner}"
            return "waiting", (
                f"{head} held by {owner}; if that thread waits for the GIL (a callback into Python), "
                "it is a deadlock: no native stacks to tell (install gdb)"
            )
        waiters = ", ".join(name(tid) for tid in self.waiters)
        return DEADLOCK, f"{head} (its owner cannot be read); {waiters} waits for the GIL"

    def words_for(self, tid: int, name: "Callable[[int], str]") -> "str | None":
        """What TID's part in the relation is, for its own line; None when it has none."""
        holder = name(self.holder)
        if tid in self.waiters and tid == self.owner:
            return f"{holder} holds the GIL and waits for the mutex this thread holds"
        if tid in self.waiters:
            return f"{holder} holds the GIL"
        if tid == self.owner:
            return f"it holds the mutex {holder} waits for"
        return None


def crossing(
    pid: int, samples: "dict[int, ThreadSample]", holder: int, native: "dict[int, list[str]]", in_load: bool
) -> "Crossing | None":
    """The relation around HOLDER, when it waits for a native mutex while holding the GIL (IN_LOAD: it is
    in an extension's load, so its init holds the GIL; else its native stack must show PyInit or a
    constructor); NATIVE: the native stacks read, per tid (empty when none)."""
    sample = samples.get(holder)
    frames = native.get(holder, [])
    init = init_running(frames)
    if sample is None or not (in_load or init):
        return None
    owner = mutex_owner(pid, sample, list(samples))
    if owner is None and not waits_for_mutex(frames):
        return None
    waiters = [tid for tid, lines in native.items() if tid != holder and waits_for_gil(lines)]
    if owner is None and not waiters:
        return None
    return Crossing(holder, init, owner, waiters, bool(native))


def in_futex(sample: "ThreadSample") -> bool:
    """True when the thread is blocked in futex(2) (a mutex, a condition, a semaphore)."""
    return bool(sample.syscall) and sample.syscall[0] == _FUTEX
