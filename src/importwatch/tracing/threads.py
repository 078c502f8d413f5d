"""Threads of ours, started with every signal blocked: a signal the program blocked (to take it with
sigwait, or to hold it off around a critical section) must never land in one of them instead.

A new thread inherits its creator's signal mask, so the mask is set in the creating thread around
the start and put back at once: the new thread blocks everything from its first instruction.
faulthandler's timer thread blocks every signal itself, but only once it runs; arming it through
`masked` closes that window too.
"""

import _signal  # not signal: that one imports enum at start-up
import _thread
import sys

from importwatch.tracing.accelerator import ACCELERATOR

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any, Callable

# Before 3.12 a new thread's state carries its starter's ident until the thread runs: a program's
# PyThreadState_SetAsyncExc aimed at the starting thread (its own) could land in ours and end it. So
# a starter that may be the program's thread waits until ours runs (Watchdog._start_heartbeat).
BORROWS_IDENT = sys.version_info < (3, 12)
# SIGKILL and SIGSTOP cannot be blocked (the kernel ignores them in a mask), nor glibc's own two.
_EVERY = frozenset(_signal.valid_signals())
# Runs a function unseen by trace and profile functions (_speedups_untraced.h); None without C.
_UNTRACED = getattr(ACCELERATOR, "untraced", None)


def masked(function: "Callable[..., Any]", *args: "Any", **kwargs: "Any") -> "Any":
    """FUNCTION(*ARGS, **KWARGS) with every signal blocked in this thread, then the mask as it was.

    Putting the mask back runs the program's handler for a signal that arrived meanwhile, here, as
    Python runs it at any point of the program (a KeyboardInterrupt raised from here is the program's).
    """
    old = _signal.pthread_sigmask(_signal.SIG_BLOCK, _EVERY)
    try:
        return function(*args, **kwargs)
    finally:
        _signal.pthread_sigmask(_signal.SIG_SETMASK, old)


def start(function: "Callable[..., Any]", args: tuple = ()) -> int:
    """Start FUNCTION(*ARGS) in a new thread that blocks every signal; returns its ident. With the C
    accelerator all the thread runs is unseen by trace and profile functions, the program's own (3.12's
    threading.settrace_all_threads and sys.monitoring reach every thread) included."""
    if _UNTRACED is not None:
        function, args = _UNTRACED, (function, *args)
    return masked(_thread.start_new_thread, function, args)
