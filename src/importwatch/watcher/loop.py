"""The watcher process's main loop: follows the traced process's lines, reports its stalls and death from outside.

It runs as `python -I -S`, started by tracing/watcher_launch.py; what it reports: see Watcher. Everything it
writes carries the traced pid.
"""

from __future__ import annotations

import os
import sys

from importwatch.events import DIED, EXIT, FORK, OUTSIDE, VERDICT, WARNING, render
from importwatch.watcher.report import Composing, culprit_of, describe
from importwatch.watcher.torn import end_torn_lines

TYPE_CHECKING = False
if TYPE_CHECKING:
    from importwatch.config import Settings
    from importwatch.events.read import Event
    from importwatch.facts import stacks
    from importwatch.facts.process import ThreadSample
    from importwatch.inflight import Started
    from importwatch.tracing.ring import RingReader
    from importwatch.tracing.sink import Sink

# The outside report comes this long after the threshold, so it follows the in-process STALL
# report and faulthandler's dump (armed 0.3 s after it) instead of interleaving with them.
REPORT_DELAY = 0.5
SAMPLE_INTERVAL = 0.25
# How often the watcher reads the feed's ring: nothing wakes it per line (tracing/ring.py). A step is
# seen this much late at most; the ring holds far more than the busiest burst of lines writes in it.
FEED_INTERVAL = 0.1
# With --exit-on-stall, how long the watcher lets the program end itself before killing it.
EXIT_GRACE = 1.5
# The longest a debugger may keep the process stopped to read its native stacks.
STACKS_TIMEOUT = 10.0
# Reports repeat while a stall lasts, each interval twice the one before (as the watchdog's).
_GROWTH = 2.0


class Watcher(Composing):
    """Follows one traced process through its feed; reports stalls and a death from outside.

    A stall is something in flight and no start or end line for TIMEOUT seconds. The
    report says, per thread, the state, the wait channel, whether CPU time advanced
    (busy, waiting or stopped), what a blocked call waits on, the libraries mapped
    since the native load in flight began and the one most likely initialising, the
    "!" lines written for that load, and the native stacks when a debugger is there.
    """

    stacks_timeout = STACKS_TIMEOUT

    def __init__(
        self,
        sink: Sink,
        pid: int,
        feed: int,
        ring: RingReader,
        timeout: float,
        start: int | None,
        exit_on_stall: bool,
    ) -> None:
        from importwatch.facts.mapped import MappedObjects
        from importwatch.inflight import InFlight

        self.sink = sink
        self.pid = pid
        self.feed = feed  # the pipe: its end is the program's, and its lock keeps us quiet at the exit
        self.ring = ring  # the program's lines
        self.timeout = timeout
        self.start_time = start
        self.exit_on_stall = exit_on_stall
        # Per thread name; the feed may lose lines, and the indentation is what still holds then.
        self.flying = InFlight(by_depth=True)
        self.tids: dict[str, int] = {"MainThread": pid}
        self.progress = 0.0
        self.clean = False  # the program said it exits (atexit, or --exit-on-stall)
        self.reports = 0  # stall reports for the current stall
        self.lost = 0  # bytes of lines the ring turned over before we read them
        self.samples: list[tuple[float, dict[int, ThreadSample]]] = []
        self.mapped = MappedObjects(pid)
        self.mapped_before: dict[str, None] = dict(self.mapped.paths)
        self.told_mapped = False  # the program sent its own list of what was mapped at its start
        self._buffer = b""
        self._pidfd: int | None = None
        self.silent = False  # the program has exited, or died: no more report lines
        self.stacks_for: Started | None = None  # the stalled step whose stacks were shown
        self.timer_tids: set[int] = set()  # faulthandler's timer threads seen so far
        self.told_foreign = False  # said once that someone else's debugger holds the process
        self.busy_told = False  # the program's own watchdog found the stalled thread busy
        self.told: tuple[Started | None, str | None] = (None, None)  # the last report's step and verdict
        self.parent: int | None = None  # the process this one was forked from, when it said so
        # The native stacks read before a headline, per tid, and the step they were read for.
        self.native_for: tuple[Started | None, dict[int, list[str]]] = (None, {})

    # -- the main loop -------------------------------------------------------------------
    def run(self) -> int:
        import select
        import time

        from importwatch.facts import process

        try:
            self._pidfd = os.pidfd_open(self.pid)
        except (AttributeError, OSError):
            self._pidfd = None  # Linux < 5.3 or Python < 3.9: poll /proc instead
        if not process.alive(self.pid, self.start_time):
            self._read_ring()
            return self.ended()
        poller = select.poll()
        poller.register(self.feed, select.POLLIN)
        if self._pidfd is not None:
            poller.register(self._pidfd, select.POLLIN)
        while True:
            wait = self._next_wakeup(time.monotonic())
            events = poller.poll(max(wait, 0.0) * 1000)
            self._read_ring()
            for fd, _ in events:
                if fd == self.feed:
                    if not os.read(self.feed, 1 << 16):  # nothing is written there: this is the end
                        self._read_ring()
                        return self.ended()
                elif fd == self._pidfd:
                    self._read_ring()
                    return self.ended()
            if self._pidfd is None and not process.alive(self.pid, self.start_time):
                self._read_ring()
                return self.ended()
            self.tick(time.monotonic())

    def _next_wakeup(self, now: float) -> float:
        wait = FEED_INTERVAL
        if self.timeout > 0 and self._in_flight():
            wait = min(wait, self._due() - now)
        return wait

    def _due(self) -> float:
        # With --exit-on-stall, faulthandler may end a GIL-held stall 0.3 s after the threshold:
        # report at the threshold, so the outside view is out before the process is gone.
        delay = 0.0 if self.exit_on_stall and self.reports == 0 else REPORT_DELAY
        return self.progress + self.timeout * _GROWTH**self.reports + delay

    def _read_ring(self) -> None:
        """Take the lines the program appended since the last look."""
        import time

        data, lost = self.ring.read()
        if lost:
            self.lost += lost
            # What is left of a line whose start was lost is no line; the indentation of the next ones
            # still places them (see InFlight).
            self._buffer = b""
            data = data[data.find(b"\n") + 1 :] if b"\n" in data else b""
        if data:
            self.take(data, time.monotonic())

    # -- following the feed ------------------------------------------------------------------
    def take(self, data: bytes, now: float) -> None:
        """Apply the complete lines in DATA (a partial last line waits for the rest)."""
        from importwatch.events.read import parse_line
        from importwatch.watcher.stamps import Stamps

        data = self._buffer + data
        lines = data.split(b"\n")
        self._buffer = lines.pop()
        stamps = Stamps(now)  # each line timed from its stamp
        for raw in lines:
            line = raw.decode("ascii", "replace")
            if line.startswith("#"):
                self._control(line)
                continue
            event = parse_line(line)
            if event is not None:
                self.apply(event, stamps.written(event))

    def _control(self, line: str) -> None:
        word, _, rest = line[1:].partition(" ")
        if word == "exit":
            self.clean = True
        elif word == "thread":
            name, _, tid = rest.rpartition(" ")
            if tid.isdigit():
                self.tids[name] = int(tid)
        elif word == "mapped" and rest:
            if not self.told_mapped:  # the program's own list replaces our first look
                self.told_mapped = True
                self.mapped_before = {}
            self.mapped_before[rest] = None

    def apply(self, event: Event, now: float) -> None:
        """One event: starts and ends move the per-thread stacks; both count as progress."""
        kind = event.kind
        if self.flying.follows(kind):
            self.flying.follow(event, event.thread, now)
            if kind == "native_end":
                self._after_native_end(event)
            self._progress(now)
        elif kind == "checkpoint":
            self._progress(now)
        elif kind == "busy":
            self.busy_told = True
        elif kind in (VERDICT, WARNING):
            self.flying.warn(event.thread, render(kind, event.fields))
        elif kind == EXIT and event.fields.get("status") is not None:  # the program ends itself
            self.clean = True
        elif kind == FORK and event.pid == self.pid:
            self.parent = event.fields["parent"]

    def _progress(self, now: float) -> None:
        self.busy_told = False
        if self.reports:
            self.reports = 0
        self.progress = max(self.progress, now)  # never back: an unplaceable stamp counts as its reading
        self.samples.clear()

    def _after_native_end(self, event: Event) -> None:
        # The baseline for "mapped since the load in flight began": what was mapped when the
        # watcher started, plus what every load since has said it mapped. Told by the program
        # itself, it cannot race the next dlopen the way a fresh read of the maps would. The maps
        # name files by their real paths; the program may have listed them as the loader found them.
        self.mapped_before[os.path.realpath(event.name)] = None
        self.mapped_before.update(
            dict.fromkeys(os.path.realpath(path) for path in event.fields.get("mapped", ()))
        )

    def _in_flight(self) -> dict[str, list[Started]]:
        return self.flying.chains()

    # -- stalls -------------------------------------------------------------------------------
    def tick(self, now: float) -> None:
        """Between lines: sample the threads' CPU time, and report when a stall is due."""
        from importwatch.facts import process

        if not self._in_flight():
            return
        if not self.samples or now - self.samples[-1][0] >= SAMPLE_INTERVAL * 0.9:
            self.samples.append((now, process.sample_threads(self.pid)))
            # Keep enough to measure the last second (or the last threshold, when shorter).
            while len(self.samples) > 2 and now - self.samples[1][0] >= self._window():
                self.samples.pop(0)
        if self.timeout > 0 and now >= self._due():
            self.report(now)

    def _window(self) -> float:
        return min(1.0, self.timeout) if self.timeout > 0 else 1.0

    def report(self, now: float) -> None:
        """The outside report of a stall; see the class docstring."""
        self.reports += 1
        seen = self._look()
        early = self._stacks_first(seen)
        try:
            self._report(now, seen, early)
        finally:
            self._let_go(early)

    def _report(self, now: float, seen: tuple, early: stacks.Stacks | str | None) -> None:
        from importwatch.facts import gil, process

        native = self.native_for[1] if self.native_for[0] is self.stacks_for else None
        lines = self._report_lines(now, seen, native)
        verdict = lines[0][1].get("verdict") if lines else None
        chains = self._in_flight()
        told, self.told = self.told, (chains[culprit_of(chains)][-1] if chains else None, verdict)
        verdict = process.WAITING if verdict == gil.DEADLOCK else verdict  # for what is done next
        repeat = bool(lines) and told == self.told
        if repeat:  # the same step, in the same state: its headline alone, said to be a repeat
            kind, fields = lines[0]
            lines = [(kind, {**fields, "report": self.reports, "after": round(now - self.progress, 1)})]
        if not self._say(lines) or not self.reports:
            return  # the program exited, died or moved on meanwhile
        # With --exit-on-stall the program's watchdog may be timing a busy thread's CPU use to decide
        # whether to exit, and a debugger's stop would look like idleness: the stacks wait for a
        # later report, once the program has said the thread is busy.
        deciding = verdict == process.BUSY and self.exit_on_stall and not self.busy_told
        if verdict in (process.WAITING, process.BUSY) and not deciding:
            self._stacks(early)  # last, as a debugger takes a while: the lines above are out already
        self._let_go(early)  # before --exit-on-stall waits for the program to end itself
        # Never a program whose own watchdog has found the thread busy: from here a thread waiting
        # for the GIL on a loaded machine can look idle.
        ends = verdict in (process.WAITING, process.STOPPED) and not self.busy_told
        if self.exit_on_stall and self.reports and ends:
            self._end_stalled(verdict)

    def _say(self, lines: list[tuple[str, dict]]) -> bool:
        """Write LINES at once, unless the program has exited or died meanwhile; False when not."""
        if not self._hold():
            return False
        try:
            return self._write(lines)
        finally:
            self._release()

    def _hold(self) -> bool:
        """Take the lock the program takes at its exit (see hush); False when it is exiting or gone."""
        import fcntl

        if self.silent:
            return False
        self._read_ring()
        if self.clean or not self._alive():
            self.silent = True
            return False
        try:
            fcntl.flock(self.feed, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            self.silent = True  # the program holds it: it is exiting
            return False
        except OSError:
            pass  # no lock on this pipe: the checks above must do
        return True

    def _release(self) -> None:
        import fcntl

        try:
            fcntl.flock(self.feed, fcntl.LOCK_UN)
        except OSError:
            pass

    def _write(self, lines: list[tuple[str, dict]], only: str | None = None) -> bool:
        """LINES, while the lock is held; none if the program died meanwhile (only the death line is due).
        ONLY: "log" or "stderr" for lines that go to one of them (see Sink.event)."""
        if not self._alive():
            self.silent = True
            return False
        end_torn_lines(self.sink, [kind for kind, _ in lines], only)
        for kind, fields in lines:
            self.sink.event(kind, fields, only=only)
        return True

    def _write_stacks(self, short: list[str], full: list[str]) -> None:
        """The stacks whole to the log and folded on the terminal, which says where the rest is."""
        if self.sink.log_path is None:
            self._write([(OUTSIDE, {"message": line}) for line in short])
            return
        self._write([(OUTSIDE, {"message": line}) for line in full], only="log")
        short = [*short, f"full stacks in {self.sink.log_path}"]
        self._write([(OUTSIDE, {"message": line}) for line in short], only="stderr")

    def _alive(self) -> bool:
        from importwatch.facts import process

        if self._pidfd is not None:
            import select

            return not select.select([self._pidfd], [], [], 0)[0]
        return process.alive(self.pid, self.start_time)

    def _stacks(self, early: stacks.Stacks | str | None = None) -> None:
        """Every thread's native stack, the stalled thread's first, ours in one line each.

        Read once per stalled step: a report that finds the same step still in flight
        says so in one line. The debugger stops the process while it reads; the
        samples taken before are dropped, so no busy-or-waiting verdict spans the stop.
        EARLY: the stacks _stacks_first read for this report, still holding the process.
        """
        from importwatch.facts import stacks

        chains = self._in_flight()
        culprit_name = culprit_of(chains)
        step = chains[culprit_name][-1]
        if early is None:
            if step is self.stacks_for:
                return  # shown in an earlier report of this stall
            self.stacks_for = step
        # The lock is held from before the debugger attaches until the stacks are out: a program
        # that ends meanwhile waits for them in hush (it is stopped for most of that time anyway).
        if not self._hold():
            return
        try:
            found = stacks.read_native_stacks(self.pid, STACKS_TIMEOUT) if early is None else early
            try:
                # Written while gdb still holds the process: it cannot end (nor exit, were
                # faulthandler's exit due) before its stacks are out.
                self._write_stacks(*self._stack_lines(found, chains, culprit_name))
            finally:
                if early is None and not isinstance(found, str):
                    found.release()
            self.samples.clear()  # they span the stop
        finally:
            self._release()

    def _end_stalled(self, verdict: str) -> None:
        """--exit-on-stall: the program ends itself when it can; kill it when it cannot (stopped).

        Never while someone else's debugger holds it: a person is looking at it.
        """
        import time

        from importwatch.facts import process

        # The program's own watchdog ends it with status 1 when it can act (within a second
        # of the threshold); the watcher steps in only when it cannot, as in a stopped process.
        deadline = time.monotonic() + EXIT_GRACE
        while True:
            stat = process.process_stat(self.pid)
            if stat is None or stat.state in "ZX":
                return  # it ended by itself
            if time.monotonic() >= deadline:
                break
            time.sleep(0.05)
        if verdict == process.STOPPED and stat.state not in "tT":
            return  # stopped no more (a debugger let go): its own watchdog can act now
        tracer = process.tracer_pid(self.pid)
        if tracer and not process.traced_by_us(self.pid, tracer):
            if not self.told_foreign:
                self.told_foreign = True
                who = f"pid {tracer} {process.command_of(tracer)}"
                self._say(
                    [
                        (
                            OUTSIDE,
                            {
                                "message": f"{who} is debugging it: left as it is, not killed (--exit-on-stall)"
                            },
                        )
                    ]
                )
            return
        from importwatch.facts import family

        # Found before the program dies: then they would be PID 1's, and run on for ever.
        started = [each for each in family.descendants(self.pid) if each[0] != os.getpid()]
        message = f"the program is {verdict}, not busy: killing it"
        if started:
            message += f" and what it started: {', '.join(f'{pid} {name}' for pid, name in started)}"
        said = self._say([(EXIT, {"status": None, "message": message})])
        if not said:
            return
        self.clean = True
        try:
            os.kill(self.pid, 9)
        except OSError:
            pass
        family.end(started)

    # -- the end -------------------------------------------------------------------------------
    def ended(self) -> int:
        """The program is gone (or has exec'd): one line if it died with something in flight."""
        import select
        import time

        from importwatch.facts import process

        if self._pidfd is not None:
            select.select([self._pidfd], [], [], 1.0)
        status = None
        deadline = time.monotonic() + 1.0
        while True:
            stat = process.process_stat(self.pid)
            if stat is None or (self.start_time is not None and stat.start != self.start_time):
                if self._pidfd is not None:
                    status = process.reaped_status(self._pidfd)
                break
            if stat.state in "ZX":
                status = stat.exit_code
                break
            if time.monotonic() > deadline:
                return 0  # alive without its feed: it exec'd another program
            time.sleep(0.005)
        chains = self._in_flight()
        if self.clean or not chains:
            return 0
        now = time.monotonic()
        name = culprit_of(chains)
        stack = chains[name]
        chain = " > ".join(describe(step, now) for step in stack)
        if status is None:
            how = "ended without a clean exit (its exit status was gone before the watcher could read it)"
        else:
            how = process.describe_status(status)
            if os.WIFEXITED(status) and self.exit_on_stall and self.reports and os.WEXITSTATUS(status) == 1:
                how += ", ended by --exit-on-stall after the stall report"
            elif os.WIFEXITED(status):
                how += " without a clean exit (os._exit, or exit() called from C)"
        seconds = round(now - stack[0].start, 1)
        fields = {"process": self.pid, "how": how, "seconds": seconds, "chain": f"{name}: {chain}"}
        # Once the parent has reaped the program it has seen the end and may have said so (a
        # shell's prompt, a parent's "done"): a line of ours after that reads as news from a later
        # program, so the death line goes to the log only.
        only = None if self._unreaped() else "log"
        end_torn_lines(self.sink, [DIED], only)
        self.sink.event(DIED, {**fields, "status": status}, only=only)
        return 0

    def _unreaped(self) -> bool:
        """Whether the dead program is still a zombie: its parent has not yet seen its end, so a line
        written now comes before whatever the parent does next. A parent that reads the program's
        stderr pipe to its end before it reaps (subprocess.run) always gets the line: the watcher
        holds that pipe open until it has written."""
        from importwatch.facts import process

        stat = process.process_stat(self.pid)
        if stat is None or (self.start_time is not None and stat.start != self.start_time):
            return False
        return stat.state == "Z"  # X: the parent is reaping it now


def main(args: list[str] | None = None) -> int:
    """`... --pid PID --feed FD --ring FD [--start TICKS] [--log-fd FD] -- SETTINGS`, as watcher_launch writes it.

    The words before `--` say which process to watch and the descriptors it handed down;
    SETTINGS are the traced process's own, as config.to_options wrote them.
    """
    import signal

    plumbing, settings = _parse(sys.argv[1:] if args is None else args)
    feed, ring_fd, log_fd = plumbing["--feed"], plumbing["--ring"], plumbing.get("--log-fd")
    ring = _map_ring(ring_fd)  # and its descriptor closed: the mapping is what we keep of it
    _close_inherited(keep={0, 1, 2, feed, log_fd})
    # The terminal's signals are the program's business; the watcher leaves when the program does.
    for name in ("SIGINT", "SIGHUP", "SIGTSTP", "SIGTTIN", "SIGTTOU", "SIGPIPE", "SIGQUIT"):
        signal.signal(getattr(signal, name), signal.SIG_IGN)
    from importwatch.tracing.sink import Sink

    sink = Sink()
    sink.set_stderr(settings.stderr)
    sink.pid = plumbing["--pid"]  # every line is about the traced process
    sink.set_rank(sink.rank)
    if log_fd is not None:
        os.set_inheritable(log_fd, False)
        sink.adopt_log(log_fd, settings.log or f"descriptor {log_fd}")
    start = plumbing.get("--start")
    watcher = Watcher(sink, sink.pid, feed, ring, settings.timeout, start, settings.exit_on_stall)
    try:
        return watcher.run()
    except Exception as error:  # say it and go: a watcher must never hang around broken
        sink.warn(f"the watcher stopped: {type(error).__name__}: {error}")
        return 1


def _parse(args: list[str]) -> tuple[dict[str, int], Settings]:
    """main's command line: the numbers before `--`, by option, and the settings after it."""
    from importwatch import config

    split = args.index("--") if "--" in args else len(args)
    words = args[:split]
    if len(words) % 2 or not all(word.lstrip("-").isdigit() for word in words[1::2]):
        raise SystemExit(f"importwatch watcher: bad command line {args!r}")
    plumbing = {name: int(value) for name, value in zip(words[::2], words[1::2])}
    if not {"--pid", "--feed", "--ring"} <= plumbing.keys():
        raise SystemExit("importwatch watcher: --pid, --feed and --ring are needed")
    try:
        return plumbing, config.from_options(args[split + 1 :])
    except config.ConfigError as error:
        raise SystemExit(f"importwatch watcher: {error}") from None


def _map_ring(fd: int) -> RingReader:
    """The program's ring (tracing/ring.py), mapped from FD, which is closed then."""
    from importwatch.tracing.ring import RingReader

    try:
        return RingReader(fd)
    except (OSError, ValueError) as error:
        raise SystemExit(f"importwatch watcher: cannot map the feed's ring: {error}") from None
    finally:
        os.close(fd)


def _close_inherited(keep: set[int]) -> None:
    """Close every descriptor the program let us inherit: its pipes must see EOF when it exits."""
    try:
        fds = [int(fd) for fd in os.listdir("/proc/self/fd")]
    except OSError:
        return
    for fd in fds:
        if fd not in keep:
            try:
                os.close(fd)
            except OSError:
                pass


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
