"""Stall detection: a heartbeat thread for full reports, and faulthandler's GIL-free timer for the rest.

A Python thread cannot run while dlopen or a C constructor holds the GIL, so two mechanisms share
the work. The heartbeat, a plain ``_thread`` thread, sleeps until the next report is due (at most an
eighth of the threshold; a step that begins while it sleeps wakes it if its next look would come too
late) and writes the full report when it can run: the chains in flight in every thread, then
faulthandler's dump. It keeps faulthandler's C timer armed for the moment the first stall report is
due; if the GIL is held past that moment the heartbeat cannot cancel it, and faulthandler dumps the
stacks on time, its frames naming the file in dlopen (see native.py). A fork child's heartbeat starts
with the child's first step, and a heartbeat ends once the program's last thread has. The report's
own modules run at the first look that finds a step without progress (see standby.py).
"""

import _thread
import sys

from importwatch.events import BUSY, RESUMED, STALL_CONTEXT, STALL_THREADS
from importwatch.facts import procstat
from importwatch.tracing import threads
from importwatch.tracing.faults import SharedFaulthandler
from importwatch.tracing.hook import NEVER, NO_COVER
from importwatch.tracing.sink import CLOCKS

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Callable

    from importwatch.tracing.hook import TracedStep, Tracer
    from importwatch.tracing.standby import Standby

# Reports repeat while a stall lasts, each interval twice the one before.
_GROWTH = 2.0
# How late faulthandler may fire after the heartbeat would have reported.
_GRACE = 0.3
# And later still for a repeat of a report the heartbeat wrote (Python could run then): the watcher's
# gdb holds every thread while it reads stacks (a second or two on a loaded machine), and a timer
# that fires on release would dump raw stacks where one line is due.
_REPEAT_GRACE = 3.0
# A stalled thread running, or ready to run, at least this share of the time is busy, not stuck.
_BUSY = 0.5
# The stall report's modules, run at the first look that needs them (standby.py), each after what it imports.
KIT = (
    "importwatch.tracing.cpushare",
    "importwatch.facts.retry",
    "importwatch.facts.pools",
    "importwatch.facts.resolver",
    "importwatch.tracing.stalls",
    "importwatch.tracing.report",
)
# How long stop() waits for the heartbeat to end (it is woken first, so this is only a bound).
_STOP_WAIT = 1.0
# How long a heartbeat's starter waits for it to name itself where the kernel's threads cannot say which it is.
_NAMED_WAIT = 0.1
# In a process whose interpreter main thread is gone (a fork child of another thread), how often the
# heartbeat looks whether it is the last thread left: then it leaves, so the process can end.
_ALONE_LOOK = 0.05
# The longest the heartbeat sleeps while something is in flight: once nothing is, it leaves at its next
# look, so the process is single-threaded again at most this long after its last step (see start).
_IDLE_LOOK = 0.25


class _Kit:
    """The stall report's modules (KIT), run, and what the looks keep: the refusals seen."""

    def __init__(self, import_own: "Callable") -> None:
        self.cpushare, _, _, _, self.stalls, self.report = (import_own(name) for name in KIT)
        self.retries = self.stalls.Retries()


class Watchdog:
    """Watches the steps in flight of one Tracer and reports those that make no progress."""

    def __init__(
        self,
        tracer: "Tracer",
        timeout: float,
        exit_on_stall: bool = False,
        faults: "SharedFaulthandler | None" = None,
        standby: "Standby | None" = None,
    ) -> None:
        self.tracer = tracer
        self.faults = SharedFaulthandler() if faults is None else faults  # the timer, shared with the program
        self.sink = tracer.sink
        self.timeout = timeout
        self.exit_on_stall = exit_on_stall
        # The finest look, and the longest sleep while something is in flight. A deadline armed is moved
        # later at most every `longest` seconds: each arming starts a thread (see _cover), and a heartbeat
        # that wakes wrests the GIL from the program. So a stall that holds the GIL may be dumped up to
        # `longest` early (an eighth of the threshold); stalls that leave it free are reported when due.
        self.interval = min(0.25, timeout / 4)
        self.longest = max(self.interval, timeout / 8)
        self._running = False
        self._generation = 0
        self._lock = _thread.RLock()  # arming and stopping, from the heartbeat, the program and atexit
        self._wake = self._new_wake()
        self._next_look = 0.0  # when the heartbeat looks next, unless woken
        self._armed_for: float | None = None  # the deadline faulthandler is armed for
        self._stalled: dict[int, tuple[TracedStep, float, int]] = {}  # ident: frame, since, reports
        self._gone: _thread.LockType | None = None  # released when the heartbeat has ended
        self._heartbeat_ident = 0
        # On, but with no heartbeat yet: after a fork, the next step starts it (see after_fork).
        self._dormant = False
        self._forking = False  # between before_fork and after_fork: nothing starts a heartbeat
        # Run once when the dormant watchdog wakes, before the step that woke it is logged.
        self.on_wake: Callable[[], None] | None = None
        # The interpreter's main thread is not in this process (a fork child of another thread):
        # no exit handler will ever stop the heartbeat, which must not outlive the program's threads.
        self.main_gone = False
        self.forked_from: int | None = None  # in a fork child, the parent's pid (set at its first step)
        self._reporting = _thread.allocate_lock()  # held while a report is written (see report)
        self._kit: _Kit | None = None  # the stall report's modules, once run (see _ready)
        if standby is None or not standby.read(KIT):
            self._ready()
        # Loaded now: nothing may be imported once the program is stalled (see tracing/ending.py).
        self._ending = None
        if exit_on_stall:
            tracer.import_own("importwatch.facts.family")  # ending's own import, else traced
            self._ending = tracer.import_own("importwatch.tracing.ending")

    # -- life cycle ---------------------------------------------------------------
    def start(self) -> None:
        """On, with no thread yet: the first step starts the heartbeat (see wake_up and _idle). Our threads
        live only while something is in flight: some calls need a single-threaded process (unshare(CLONE_NEWUSER))."""
        if self._running:
            return
        self._running = True
        self._dormant = True
        self._tell_due()

    def _start_heartbeat(self) -> None:
        self._generation += 1
        self._gone = _thread.allocate_lock()  # held by the heartbeat until it has ended
        self._gone.acquire()
        tasks = procstat.tasks() if self.sink.feed is not None else None
        named = _thread.allocate_lock()  # held until the heartbeat has named itself
        named.acquire()
        threads.start(self._heartbeat, (self._generation, self._gone, named))  # every signal blocked
        # Told now, for the watcher: the heartbeat names itself only once it runs, and a program that holds
        # the GIL from its first import on (a hung dlopen) never lets it. Where another thread came meanwhile
        # (the program's, faulthandler's timer), the GIL is given up for it to do so; before 3.12, always.
        new = () if tasks is None else procstat.tasks() - tasks
        if len(new) == 1:
            self.sink.feed_line(f"#thread importwatch-heartbeat {next(iter(new))}")
        if threads.BORROWS_IDENT or (tasks is not None and len(new) != 1):
            named.acquire(timeout=_NAMED_WAIT)

    def wake_up(self) -> None:
        """The first step since a fork: start the heartbeat (and the child's own start, on_wake)."""
        with self._lock:
            if not self._dormant or self._forking or not self._running:
                return
            self._dormant = False
            on_wake, self.on_wake = self.on_wake, None
        if on_wake is not None:
            on_wake()
        self._tell_due()
        self._start_heartbeat()

    def stop(self) -> None:
        with self._lock:
            was_running, self._running = self._running, False
            self._dormant = False
            self._generation += 1
            self._disarm()
        self.wake()
        if was_running:
            self._await_heartbeat()

    def _await_heartbeat(self) -> bool:
        """Let the woken heartbeat end before the interpreter finalises (stop() runs at exit): a thread
        still starting or waking while Python shuts down is a known way to crash it (a SIGSEGV at exit,
        seen once on 3.9, not reproduced, with this thread alive). It costs about 0.7 ms at exit."""
        gone = self._gone
        if gone is None or _thread.get_ident() == self._heartbeat_ident:
            return False
        if gone.acquire(timeout=_STOP_WAIT):
            gone.release()
            self._gone = None
            return True
        return False

    def step_begins(self, timeout: "float | None") -> None:
        """A step began (see Tracer.on_deadline) with its own threshold TIMEOUT, or the watchdog's.

        While nothing was in flight nothing may be armed, and a step that holds the GIL at once would
        keep the heartbeat from arming it: cover it here. Wake the heartbeat only if its next look comes
        too late for this step. The hooks call it only outside the cover that _tell_due publishes."""
        limit = self.timeout if timeout is None else timeout
        if limit <= 0:
            if self._dormant:
                self.wake_up()
            return
        now = CLOCKS.monotonic()
        self._cover(now, limit)
        # Looked at after _cover, which takes the lock when the heartbeat has left (see _idle): a
        # heartbeat that left as this step began is started again, never missed.
        if self._dormant:
            self.wake_up()
        elif now + limit < self._next_look + self.interval:
            self.wake()

    def wake(self) -> None:
        """Have the heartbeat look now."""
        try:
            self._wake.release()
        except RuntimeError:
            pass  # already woken

    @staticmethod
    def _new_wake() -> "_thread.LockType":
        """A lock held until wake() releases it: the heartbeat sleeps by waiting for it."""
        wake = _thread.allocate_lock()
        wake.acquire()
        return wake

    # -- fork ------------------------------------------------------------------------------
    def before_fork(self) -> bool:
        """End the heartbeat and cancel our deadline, and keep them so until after_fork; True if it ran.

        Two reasons. A thread of ours alive at the fork is one more thread for Python's 3.12+ warning
        about forking a multi-threaded process (plain python would print it only for the program's own
        threads). And a timer armed at the fork has no thread in the child, whose cancel (at its exit,
        or our next arming) would then wait for that thread for ever. So the lock that arming takes is
        held from here across the fork: no other thread can arm the timer between the cancel and the
        fork. The heartbeat is ended first, without the lock, since it may be waiting for it."""
        with self._lock:
            self._forking = True  # no heartbeat starts from here on (see wake_up)
            beating = self._gone is not None
            self._generation += 1
        self.wake()
        ended = beating and self._await_heartbeat()
        self._lock.acquire()  # released in after_fork, in the parent; the child makes a new one
        self._disarm()
        return ended

    def after_fork(self, in_child: bool, restart: bool = True, main_gone: bool = False) -> None:
        """Back from the fork: the heartbeat again now (RESTART), or at the next step (see wake_up).

        The child always waits for its first step: a fork followed by exec (subprocess's preexec_fn)
        then costs no thread and prints nothing. MAIN_GONE: the child of a thread other than the
        interpreter's main one, which ends when its threads do."""
        if in_child:
            self._lock = _thread.RLock()  # held across the fork by the parent's before_fork
            self._reporting = _thread.allocate_lock()  # the heartbeat may have held it at the fork
            self._wake = self._new_wake()
            self._gone = None  # the parent's heartbeat: no thread here will release it
            self._stalled.clear()
            self._armed_for = None
            self.main_gone = self.main_gone or main_gone
            restart = False
        self._forking = False
        if not in_child:
            self._lock.release()
        if not self._running:
            return
        if restart:
            self._tell_due()
            self._start_heartbeat()
        else:
            self._dormant = True
            self._tell_due()  # the next step's end wakes it, as does the next step's start

    # -- the heartbeat ----------------------------------------------------------------
    def _heartbeat(self, generation: int, gone: "_thread.LockType", named: "_thread.LockType") -> None:
        try:
            self._heartbeat_ident = _thread.get_ident()
            self._beat(generation, named)
        finally:
            gone.release()

    def _beat(self, generation: int, named: "_thread.LockType") -> None:
        try:
            self.sink.name_thread("importwatch-heartbeat")  # so the watcher can tell it apart
        finally:
            named.release()  # its starter may be waiting (see _start_heartbeat)
        wake = self._wake
        pause = self.interval
        while self._running and generation == self._generation:
            if self.main_gone:
                pause = min(pause, _ALONE_LOOK)
            self._tell_due(CLOCKS.monotonic() + pause)  # the next look, set with the cover it allows
            wake.acquire(timeout=pause)
            if not self._running or generation != self._generation:
                break  # stopped while asleep: the interpreter may be finalising
            if self.main_gone and len(sys._current_frames()) <= 1:  # the program's last thread has gone
                self._leave()
                break
            try:
                self.sink.check_descriptors()
                pause = min(self.check(CLOCKS.monotonic()), _IDLE_LOOK)
            except Exception as error:  # never let the watchdog die silently
                self.sink.warn(f"watchdog error: {type(error).__name__}: {error}")
                pause = self.interval
            if self._idle(generation):
                break

    def _idle(self, generation: int) -> bool:
        """Nothing in flight: cancel our deadline, and leave until the next step (see start); True if so.

        Decided under the lock, on the tracer's chains as a step's start makes them: a thread has its
        chain before it calls step_begins, whose _cover takes this lock once we have disarmed, and then
        finds the watchdog dormant. One whose step began in here before we were dormant (the GIL may
        change hands) found the deadline still armed and called nothing: the chains are read again."""
        with self._lock:
            if self.tracer.stacks or self._stalled or self._forking or generation != self._generation:
                return False
            if not self._running:
                return False
            self._disarm()
            self._dormant = True
            if self.tracer.stacks:  # a step began meanwhile: stay, and arm for it at the next look
                self._dormant = False
                return False
            self._gone = None  # ending now: nothing to wait for (see _leave)
            self._tell_due()
            return True

    def _leave(self) -> None:
        """The program's last thread has gone: cancel our deadline and let the process end as it would."""
        with self._lock:
            if self._forking:
                return
            self._disarm()
            self._dormant = True  # should a thread appear after all, its next step starts a heartbeat
            self._gone = None
            self._tell_due()

    def check(self, now: float) -> float:
        """One look at what is in flight: report stalls, keep faulthandler's deadline current.

        Returns how long the heartbeat may sleep: until the next report is due, or the armed deadline
        needs moving, and never longer than `longest`."""
        if self._armed_for is not None and now >= self._armed_for:
            with self._reporting:  # faulthandler dumped while the GIL was held; Python runs again
                fired = self._fired(now)
                if fired:
                    self._say_fired()
            if fired:
                return self.interval  # that stall has its dump: look again before reporting it
        chains, kit = self.tracer.in_flight(), self._kit
        if kit is None and any(chain[-1].progress <= now - self.interval for chain in chains.values()):
            kit = self._ready()  # a step has gone a look without progress: a report may come
        if kit is not None:
            chains = kit.retries.look(chains, now - self.interval)  # counts refusals too
        if not chains:
            self._disarm()
            return self.longest
        due: float | None = None
        deadline = 0.0
        for ident, chain in chains.items():
            top = chain[-1]
            limit = self._limit(top)
            if limit <= 0:
                continue  # a phase that asked never to be reported
            since, reports = self._stall(ident, top)
            next_report = since + limit * _GROWTH**reports
            if now >= next_report:
                self.report(now, chains, ident)
                return self.interval  # another chain may be due as well
            fires = next_report + _GRACE + (_REPEAT_GRACE if reports else 0.0)
            deadline = fires if due is None else min(deadline, fires)
            due = next_report if due is None else min(due, next_report)
        if due is None:
            self._disarm()  # nothing in flight may be reported: no deadline, not even a guard's
            return self.longest
        self._arm(deadline, now)
        pause = min(due - now, self.longest)
        armed = self._armed_for
        if armed is not None:
            pause = min(pause, armed - now - self.interval)  # wake in time to move it, if it must move
        return max(pause, 0.005)

    # -- reports ---------------------------------------------------------------------
    def report(self, now: float, chains: "dict[int, list[TracedStep]]", culprit: int) -> None:
        """Write a stall report: every chain in flight, then every thread's stack.

        Written whole under `_reporting`, which a RESUMED line takes too: the end of a stall is never
        told in the middle of its own report."""
        with self._reporting:
            self._report(now, chains, culprit)

    def _report(self, now: float, chains: "dict[int, list[TracedStep]]", culprit: int) -> None:
        kit = self._ready()
        self._disarm()
        top = chains[culprit][-1]
        since, reports = self._stall(culprit, top)
        reports += 1
        self._stalled[culprit] = (top, since, reports)
        self._fold_in(now, chains, culprit, kit.stalls.waits(chains))
        self._tell_due()
        sink = self.sink
        # Looked at first, briefly: the headline says whether the thread is busy or stuck. A look that a
        # debugger's stop spoils is taken again, longer, after the report, for --exit-on-stall's decision.
        share = self._cpu_share(culprit, kit.cpushare.FIRST_STEPS)
        busy = share is not None and share >= _BUSY
        stall, forked = (since, reports), self.forked_from
        kit.report.write(sink, self.tracer, chains, culprit, now, stall, share, busy, kit.retries, forked)
        if share is None and self.exit_on_stall:
            share = self._cpu_share(culprit)
            if share is not None and share >= _BUSY:
                busy = True
                sink.event(BUSY, kit.report.busy_fields(sink.thread_name(culprit), min(share, 1.0)))
        debugger = procstat.tracer_pid() if share is None else 0
        # Looked at after the report: a step that ended meanwhile (during the CPU look) has its end
        # line written already (step_ended then waits for this report).
        ended = self._stalled.get(culprit, (None,))[0] is not top
        on_chain = any(each is top for each in self.tracer.stacks.get(culprit, ()))  # still in flight
        ends = self.exit_on_stall and not busy and not ended and on_chain
        if ends and debugger:
            text = f"--exit-on-stall does not end it: a debugger, pid {debugger}, is attached"
            sink.event(STALL_CONTEXT, {"context": text})
        elif ends:
            # Timed afresh: NOW is from before the CPU look and the stacks.
            self._ending.end_job(sink, CLOCKS.monotonic() - chains[culprit][0].start)  # never returns
        self._arm(since + self._limit(top) * _GROWTH**reports + _GRACE + _REPEAT_GRACE, now)

    def _thread_map(self) -> None:
        """Each thread as faulthandler's dump names it (its address), and by name."""
        self.sink.event(STALL_THREADS, {"threads": self.sink.thread_names()})

    def _fold_in(self, now: float, chains: "dict[int, list[TracedStep]]", culprit: int, found: dict) -> None:
        """Count this report for every other chain whose report is due as well, or that waits for the
        culprit's module lock or holds the one it waits for (FOUND: stalls.waits): one report tells them all."""
        related = {waiter for waiter, (owner, _) in found.items() if owner == culprit}
        related.add(found.get(culprit, (0, ""))[0])
        for ident, chain in chains.items():
            top = chain[-1]
            limit = self._limit(top)
            if ident == culprit or limit <= 0:
                continue
            since, reports = self._stall(ident, top)
            if ident in related or now + self.interval >= since + limit * _GROWTH**reports:
                self._stalled[ident] = (top, since, reports + 1)

    def _ready(self) -> "_Kit":
        """The stall report's modules, run now if they have not been (see standby.py)."""
        kit = self._kit
        if kit is None:
            kit = self._kit = _Kit(self.tracer.import_own)
        return kit

    def _cpu_share(self, ident: int, steps: "int | None" = None) -> "float | None":
        """The share of a CPU thread IDENT used just now (see cpushare.share); None when unknown."""
        tid = self.tracer.native_ids.get(ident)
        cpushare = self._ready().cpushare
        return None if tid is None else cpushare.share(tid, cpushare.STEPS if steps is None else steps)

    def _limit(self, frame: "TracedStep") -> float:
        """A step's stall threshold: its own timeout (a phase's), or the watchdog's."""
        return self.timeout if frame.timeout is None else frame.timeout

    def _stall(self, ident: int, top: "TracedStep") -> "tuple[float, int]":
        """When TOP's wait began, and how many stall reports it has had so far."""
        # A step with its own timeout is timed from its start; any other from its last progress.
        began = top.progress if top.timeout is None else top.start
        stalled = self._stalled.get(ident)
        if stalled is None or stalled[0] is not top or began > stalled[1]:
            return began, 0  # a new step since, or progress inside it (a checkpoint)
        return stalled[1], stalled[2]

    def step_ended(self, now: float, failure: "str | None" = None) -> None:
        """Called by the tracer at a step's end once it is due (see _tell_due): say when a stalled
        thread moved on. FAILURE: how the step failed, if it did."""
        if self._dormant:
            self.wake_up()
        if not self._stalled and (self._armed_for is None or now < self._armed_for):
            return
        ident = _thread.get_ident()
        if ident not in self._stalled and (self._armed_for is None or now < self._armed_for):
            return  # another thread's stall: this thread never waits for its report
        with self._reporting:  # after the report of this stall, if one is being written
            self._resumed(now, ident, failure)

    def _resumed(self, now: float, ident: int, failure: "str | None") -> None:
        stalled = self._stalled.pop(ident, None)
        if stalled is not None:
            self._tell_due()
            frame, since, _ = stalled
            # Ctrl-C at a stall is how most stalls end: say so, not that the step ended.
            interrupted = (failure or "").startswith("KeyboardInterrupt")
            fields = {"name": frame.name, "seconds": round(now - since, 1), "interrupted": interrupted}
            self.sink.event(RESUMED, {**fields, "dumped": None})
        elif self._fired(now):
            self._say_fired()

    def _say_fired(self) -> None:
        """Python runs again after faulthandler dumped a stall on its own: where that dump went, and
        the names of the threads it gave by address only."""
        self.sink.event(RESUMED, {"dumped": self.sink.dumped_where()})
        self._thread_map()

    def _tell_due(self, next_look: "float | None" = None) -> None:
        """Tell the tracer when a step's end needs step_ended and a thread's first step step_begins, after
        each change of what they read (NEXT_LOOK: the heartbeat's next look, about to be set).

        Step ends: at once while a thread is stalled, once the armed deadline has passed (faulthandler
        may have dumped), never while nothing is armed. First steps: outside the cover, where
        step_begins(None) would act (asleep, the armed deadline not standing for the step, or the next
        look too late), a microsecond in from each bound. Set under the lock: the last update wins."""
        with self._lock:
            armed = self._armed_for
            due = NEVER if armed is None else armed
            self.tracer.progress_due = 0.0 if self._stalled or self._dormant else due
            look, limit = self._next_look if next_look is None else next_look, self.timeout
            if armed is None or self._dormant or not limit > 0:
                self.tracer.cover = NO_COVER
            else:  # a step that begins at `start` has the armed deadline for its own
                start = armed - limit - _GRACE
                low = max(start, look + self.interval - limit)
                self.tracer.cover = (low + 1e-6, start + self.longest - 1e-6)
            self._next_look = look

    def gil_held(self, frame: "TracedStep") -> None:
        """Before a dlopen: the heartbeat may not run again until it returns, so the C timer must be armed."""
        if self._dormant:
            self.wake_up()
        self._cover(frame.start, self.timeout)

    def _cover(self, start: float, limit: float) -> None:
        """See that faulthandler's timer is armed for a step that began at START with threshold LIMIT.

        Arming starts a thread in faulthandler and cancelling joins it, about 70 us each: too dear for
        every one of the tens of dlopens an `import torch` makes in a burst. So a deadline already armed is
        kept when due no later than this step's own and less than `longest` earlier, as the heartbeat's is."""
        deadline = start + limit + _GRACE
        armed = self._armed_for
        if armed is None or armed > deadline or armed <= deadline - self.longest:
            self._arm(deadline, start)

    def gil_released(self, frame: "TracedStep") -> None:
        """After a dlopen: say so if faulthandler reported it. A timer still armed is left for the
        heartbeat's next look, which re-arms it for what is in flight then or cancels it; cancelling here
        would cost each load a thread join (see _cover)."""
        armed = self._armed_for
        if armed is None:
            return
        now = CLOCKS.monotonic()
        if now < armed:
            return
        with self._reporting:
            if self._fired(now):
                seconds = round(now - frame.start, 1)
                fields = {"name": frame.name, "seconds": seconds, "interrupted": False}
                self.sink.event(RESUMED, {**fields, "dumped": self.sink.dumped_where()})
                self._thread_map()  # faulthandler's dump named the threads by address only

    def _fired(self, now: float) -> bool:
        """Whether faulthandler's timer has fired (its deadline passed, never cancelled): true once per
        firing, for whoever sees it first, the heartbeat or the thread whose step ended."""
        with self._lock:
            armed = self._armed_for
            if armed is None or now < armed:
                return False
            self._armed_for = None
            self.sink.timer_armed(None)
            # Spent: the C timer holds no deadline of ours now, and the program's, if it has one, must be
            # armed again at once. Nothing else would: with nothing left in flight, _disarm sees no
            # deadline of ours to cancel (the program's deadline was lost so, for good).
            self.faults.cancel_ours()
            self._tell_due()  # under the lock: no step may find the cover of a deadline no longer armed
        return True

    # -- faulthandler's timer -------------------------------------------------------------
    def _arm(self, deadline: float, now: float) -> None:
        """Have faulthandler dump at DEADLINE, unless what is armed may stand (see __init__).

        A deadline armed may stand when it is no later than DEADLINE, less than `longest` earlier, and
        not so near that the heartbeat could not move it in time."""
        with self._lock:  # never re-armed after stop(): faulthandler is unloaded at exit
            if not self._running:
                return
            armed = self._armed_for
            if (
                armed is not None
                and deadline - self.longest < armed <= deadline
                and armed - now > 2 * self.interval
                and self.faults.holds_ours(armed)  # not replaced by an earlier deadline of the program's
            ):
                return
            self._arm_now(deadline, now)

    def _arm_now(self, deadline: float, now: float) -> None:
        fd = self.sink.timer_fd()
        try:
            self.faults.arm_ours(deadline, now, fd, self.exit_on_stall)
        except (OSError, ValueError, RuntimeError) as error:
            self.sink.warn(f"cannot arm faulthandler's timer: {error}")
            return
        self._armed_for = deadline
        self.sink.timer_armed(fd)
        self._tell_due()

    def _disarm(self) -> None:
        with self._lock:
            if self._armed_for is not None:
                self.faults.cancel_ours()
                self._armed_for = None
                self.sink.timer_armed(None)
                self._tell_due()
