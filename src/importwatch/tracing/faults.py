"""faulthandler shared with the program: its one timer serves both deadlines, and reads back as the program set it.

faulthandler has one timer and one fatal-signal handler per process. The
watchdog needs the timer (only faulthandler's C thread can dump while a dlopen
holds the GIL), and the program may arm it too (`dump_traceback_later(60,
exit=True)`, pytest's `faulthandler_timeout`). So while tracing is on, the
module's functions are replaced by ones that record what the program asked
for, and the C timer is armed for whichever deadline comes first; when it is
the program's, with the program's own file, repeat and exit, exactly as it
asked. `is_enabled()` answers what the program set, not what we set.

What cannot be shared (the README's Limits say it too): when our deadline came
first and fired while the GIL was held, the program's later deadline is armed
again only once Python runs again, so its dump (and exit) may come late; a
repeating timer of the program's restarts its period then. Fatal-signal dumps of
ours go to the text log only, never to stderr (a crash prints there what it prints
under plain python); when the program switched faulthandler on itself, they go
where it asked, not to our log; when it disables it, ours stays on (is_enabled()
reads False).
"""

import _thread
import faulthandler
import sys

from importwatch.tracing import threads
from importwatch.tracing.hook import door, look_like
from importwatch.tracing.sink import CLOCKS

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any, Callable

_NAMES = ("enable", "disable", "is_enabled", "dump_traceback_later", "cancel_dump_traceback_later")
# The shortest delay we arm: faulthandler refuses 0, and a deadline already passed is due at once.
_SOON = 0.01


class _Request:
    """A deadline the program or the watchdog asked for."""

    __slots__ = ("deadline", "exit", "file", "ours", "period", "repeat")

    def __init__(self, deadline: float, period: float, repeat: bool, file: object, exit: bool, ours: bool):
        self.deadline, self.period, self.repeat = deadline, period, repeat
        self.file, self.exit, self.ours = file, exit, ours


def _no_event(*args: "Any", **kwargs: "Any") -> None:
    """A door's enter that starts nothing: what it stands in for is just called."""


def _bind(timeout: float, repeat: bool = False, file: object = None, exit: bool = False):
    """dump_traceback_later's own signature, to read what the program passed."""
    return timeout, repeat, file, exit


class SharedFaulthandler:
    """Installed on the faulthandler module while tracing is on; the watchdog arms through it."""

    def __init__(self) -> None:
        self.real = {name: getattr(faulthandler, name) for name in _NAMES}
        self._lock = _thread.RLock()
        self.program_enabled = self.real["is_enabled"]()  # -X faulthandler, PYTHONFAULTHANDLER
        self._our_fd: int | None = None
        self._program: _Request | None = None
        self._ours: _Request | None = None
        self._armed: _Request | None = None  # what the C timer is armed for now
        self._untouchable = False  # a fork child that inherited the program's armed timer
        self.installed = False

    # -- install -------------------------------------------------------------------------
    def install(self) -> None:
        """faulthandler's functions replaced by ours, each looking as the one it stands for (hook.door).

        With the C accelerator each is a door: the builtin is called by it, with our part before and
        after it and no frame of ours on the stack, so a call the builtin refuses raises its own error,
        its traceback as under plain python. is_enabled answers the program's setting, not the real one."""
        if self.installed:
            return
        self.installed = True
        for name in _NAMES:
            setattr(faulthandler, name, self._stand_in(name))

    def _stand_in(self, name: str) -> "Callable":
        if name == "is_enabled":  # the program's setting, not the builtin's answer

            def is_enabled() -> bool:
                return self.program_enabled

            look_like(is_enabled, self.real[name])
            # Through a door all the same: bound by no instance, as the builtin is not.
            return door(is_enabled, _no_event, _no_event, importing=False, binds=False)
        enter = getattr(self, f"_enter_{name}", self._take_lock)
        return door(self.real[name], enter, getattr(self, f"_leave_{name}"), importing=False)

    def uninstall(self) -> None:
        """Put faulthandler's own functions back, with the program's timer and state as it set them."""
        if not self.installed:
            return
        with self._lock:
            self._ours = None
            self._sync(CLOCKS.monotonic())
            if not self.program_enabled and self._our_fd is not None:
                self.real["disable"]()
            self._our_fd = None
        for name in _NAMES:
            setattr(faulthandler, name, self.real[name])
        self.installed = False

    # -- our side -----------------------------------------------------------------------
    def enable_ours(self, fd: int) -> None:
        """Fatal signals dump to FD (our text log), unless the program switched faulthandler on itself
        (`-X faulthandler`, PYTHONFAULTHANDLER, enable()): then its dump goes where it asked."""
        with self._lock:
            self._our_fd = fd
            if not self.program_enabled:
                self.real["enable"](fd, all_threads=True)

    def disable_ours(self) -> None:
        """No dump of ours on a fatal signal (no text log to take it); the program's, if it asked, stays."""
        with self._lock:
            if self._our_fd is not None and not self.program_enabled:
                self.real["disable"]()
            self._our_fd = None

    def arm_ours(self, deadline: float, now: float, fd: int, exit: bool) -> None:
        """The watchdog's deadline (a CLOCKS.monotonic() value); the earlier of it and the program's is armed."""
        with self._lock:
            self._ours = _Request(deadline, 0.0, False, fd, exit, ours=True)
            self._sync(now)

    def move_ours(self, fd: int) -> bool:
        """Our deadline, if one is pending, dumped to FD from now on (the descriptor it was armed with is no
        longer ours); whether there was one."""
        with self._lock:
            ours = self._ours
            if ours is None or ours.file == fd:
                return False
            self._ours = _Request(ours.deadline, 0.0, False, fd, ours.exit, ours=True)
            self._sync(CLOCKS.monotonic())
            return True

    def cancel_ours(self) -> None:
        with self._lock:
            if self._ours is not None:
                self._ours = None
                self._sync(CLOCKS.monotonic())

    def thread_alive(self, now: float) -> bool:
        """Whether faulthandler's timer thread runs now (armed, and not yet fired once for good)."""
        armed = self._armed
        return armed is not None and (armed.repeat or now < armed.deadline)

    def holds_ours(self, deadline: float) -> bool:
        """True when the C timer is armed for our DEADLINE now."""
        armed = self._armed
        return armed is not None and armed.ours and armed.deadline == deadline

    # -- fork -----------------------------------------------------------------------
    def before_fork(self) -> bool:
        """Leave the C timer as the program alone would have it at the fork; held until after_fork.

        Our deadline is cancelled (its thread would be missing in the child, whose exit
        would then wait for it for ever); the program's, if pending, is armed, so that
        the fork sees the threads plain python would see. Returns whether the C timer
        is armed across the fork (then for the program).
        """
        self._lock.acquire()
        if self._ours is not None:
            self._ours = None
            self._sync(CLOCKS.monotonic())
        return self._armed is not None

    def after_fork(self, in_child: bool) -> None:
        if in_child:
            self._lock = _thread.RLock()
            self._ours = None
            # The program's timer thread did not come along: touching the timer would wait for it for
            # ever (as the program's own cancel at exit will, exactly as under plain python).
            self._untouchable = self._armed is not None
            return
        self._lock.release()

    # -- the C timer --------------------------------------------------------------
    def _sync(self, now: float) -> None:
        """Arm the C timer for the earliest deadline pending, or cancel it when none is."""
        if self._untouchable:
            return
        program = self._program
        if program is not None and self._armed is program and not program.repeat and now >= program.deadline:
            self._program = program = None  # it fired (and the program lived on): done, as under plain python
        ours = self._ours
        want = ours if ours is not None and (program is None or ours.deadline < program.deadline) else program
        if want is self._armed:
            return
        if want is None:
            self.real["cancel_dump_traceback_later"]()
        elif want.ours:
            # Each arming starts faulthandler's timer thread: with every signal blocked (see threads.py).
            threads.masked(
                self.real["dump_traceback_later"],
                max(want.deadline - now, _SOON),
                repeat=False,
                file=want.file,
                exit=want.exit,
            )
        else:
            # Armed again after our earlier deadline: the first dump when it is due, the repeats
            # at its period from then (faulthandler has one timeout for both).
            timeout = want.period if want.repeat else max(want.deadline - now, _SOON)
            threads.masked(
                self.real["dump_traceback_later"], timeout, repeat=want.repeat, file=want.file, exit=want.exit
            )
            if want.repeat:
                want.deadline = now + timeout
        self._armed = want

    # -- the program's side: faulthandler's functions as the program calls them -------------------
    # Each door's enter takes our lock and returns what its leave needs; the builtin runs between them
    # (it checks the arguments and raises as it would without us), and its leave records what the
    # program set, then lets the lock go: called whether the builtin returned or raised.
    def _take_lock(self, *args: "Any", **kwargs: "Any") -> bool:
        """The enter of enable, disable and the cancel, whose leave needs nothing more (arguments the
        builtin refuses end in its error, and their leave changes nothing)."""
        self._lock.acquire()
        return True

    def _leave_enable(self, token: bool, error: "BaseException | None") -> None:
        try:
            if error is None:
                self.program_enabled = True
        finally:
            self._lock.release()

    def _leave_disable(self, token: bool, error: "BaseException | None") -> None:
        try:
            if error is None:
                self.program_enabled = False
                if self._our_fd is not None:  # ours stays on for fatal signals
                    try:
                        self.real["enable"](self._our_fd, all_threads=True)
                    except (OSError, ValueError, RuntimeError):
                        pass
        finally:
            self._lock.release()

    def _enter_dump_traceback_later(self, *args: "Any", **kwargs: "Any") -> tuple:
        try:
            asked = _bind(*args, **kwargs)
        except TypeError:
            asked = None  # the builtin refuses them, with its own words
        self._lock.acquire()
        return CLOCKS.monotonic(), asked

    def _leave_dump_traceback_later(self, token: tuple, error: "BaseException | None") -> None:
        now, asked = token
        try:
            if error is None and asked is not None:  # the builtin armed the timer for the program
                timeout, repeat, file, exit = asked
                if file is None:
                    file = sys.stderr
                request = _Request(
                    now + float(timeout), float(timeout), bool(repeat), file, bool(exit), ours=False
                )
                self._program = self._armed = request
                self._untouchable = False  # re-armed by the program itself: a thread of this process
                self._sync(now)
        finally:
            self._lock.release()

    def _leave_cancel_dump_traceback_later(self, token: bool, error: "BaseException | None") -> None:
        # The builtin cancelled whatever was armed, ours too: our deadline, if any, is armed again (not in
        # a fork child that inherited the program's timer, whose own cancel waits as under plain python).
        try:
            if error is None:
                self._program = self._armed = None
                self._sync(CLOCKS.monotonic())
        finally:
            self._lock.release()
