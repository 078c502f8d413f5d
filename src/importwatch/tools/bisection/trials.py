"""Runs one try of a program under the tracer in a child process and says how it ended: ok, hang or crash."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time

from importwatch import config
from importwatch.events import EXIT, IMPORT, IMPORT_END, NATIVE, STALL, START, VERDICT
from importwatch.events.read import parse_line
from importwatch.inflight import InFlight, Started
from importwatch.signame import signal_name
from importwatch.tools.children import kill_group, last_line_of

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Callable

OK = "ok"
HANG = "hang"
CRASH = "crash"
ERROR = "error"  # the program could not be started at all
STOPPED = "stopped"  # we stopped it: --max-time spent, or the search no longer needs it

# How often a running child's log is read.
_POLL = 0.02


class Terminated(KeyboardInterrupt):
    """SIGTERM or SIGHUP, raised where SIGINT raises KeyboardInterrupt: the same clean-up runs."""

    def __init__(self, signum: int) -> None:
        super().__init__(signum)
        self.signum = signum


def stop_status(stop: KeyboardInterrupt) -> tuple[str, int]:
    """How a run stopped by a signal says so, and its exit status (128 + the signal, as a shell's)."""
    if isinstance(stop, Terminated):
        return f"terminated by {signal_name(stop.signum)}", 128 + stop.signum
    return "interrupted", 128 + signal.SIGINT


class TerminationAsInterrupt:
    """While active, SIGTERM and SIGHUP raise Terminated in the main thread, as SIGINT raises
    KeyboardInterrupt: the try in flight (its process group) is killed and the temporary folder
    removed on the way out. Signals the caller ignores (nohup) stay ignored; a second signal
    during the clean-up is ignored, so that it runs to its end."""

    SIGNALS = (signal.SIGTERM, signal.SIGHUP)

    def __init__(self) -> None:
        self._previous: dict[int, object] = {}

    def __enter__(self) -> TerminationAsInterrupt:
        for signum in self.SIGNALS:
            try:
                if signal.getsignal(signum) == signal.SIG_DFL:
                    self._previous[signum] = signal.signal(signum, self._raise)
            except ValueError:  # not the main thread: signals stay as they are
                break
        return self

    def __exit__(self, *_: object) -> None:
        for signum, handler in self._previous.items():
            signal.signal(signum, handler)
        self._previous.clear()

    def _raise(self, signum: int, _frame: object) -> None:
        for other in self._previous:
            signal.signal(other, signal.SIG_IGN)
        raise Terminated(signum)


def grace(timeout: float) -> float:
    """How long past the stall threshold a silent child may live before we kill it ourselves.

    The child's own watchdog exits on a stall (heartbeat or faulthandler's timer);
    this is the backstop for a child that cannot even do that (stopped by a signal,
    faulthandler unavailable).
    """
    return 1.0 + timeout / 2


class LogState:
    """What a child's log says so far: the steps in flight per thread, what completed, what failed.

    Fed the log's text as it grows; lines are parsed with events.read.parse_line.
    """

    def __init__(self) -> None:
        self.started = False  # the tracer wrote its start line
        self.stalled_thread: tuple[int, str] | None = None  # (pid, thread) a stall report named
        self.exit_on_stall = False
        # Per (pid, thread): the imports and native loads in flight (phases and steps are not tried apart).
        self.flying = InFlight(kinds=(IMPORT, NATIVE))
        # Imports that failed all the way to the top: (pid, chain outermost first, the error raised).
        self.failures: list[tuple[int, list[str], str]] = []
        self.verdicts: list[tuple[int, int, str]] = []  # (seq, pid, "! text")
        self.pids: list[int] = []  # in order of appearance; the first is the child itself
        self._unwinding: dict[tuple[int, str], tuple[list[str], str]] = {}
        self._first_start: dict[str, int] = {}  # module: seq of its first start, in the first pid
        self._completed: dict[str, int] = {}  # module: seq of its start, once it ended well
        self._seq = 0
        self._rest = ""

    def feed(self, text: str) -> None:
        """Take the next piece of the log; a line cut short waits for its end."""
        text = self._rest + text
        lines = text.split("\n")
        self._rest = lines.pop()
        for line in lines:
            self.add(line)

    def add(self, line: str) -> None:
        event = parse_line(line)
        if event is None:
            return
        self._seq += 1
        key = (event.pid, event.thread)
        if event.pid not in self.pids:
            self.pids.append(event.pid)
        kind = event.kind
        if self.flying.follows(kind):
            self.flying.follow(event, key, seq=self._seq)
            if kind == IMPORT:
                self._unwinding.pop(key, None)
                if event.pid == self.pids[0]:
                    self._first_start.setdefault(event.name, self._seq)
            elif kind == NATIVE:
                self._unwinding.pop(key, None)
            elif kind == IMPORT_END:
                self._ended(key, event.name, event.error)
        elif kind == START:
            self.started = True
        elif kind == STALL:
            self.stalled_thread = (event.pid, event.fields.get("stalled") or event.thread)
        elif kind == EXIT:
            self.exit_on_stall = True
        elif kind == VERDICT:  # importwatch's own warnings are no verdict on the program
            self.verdicts.append((self._seq, event.pid, "! " + event.fields["verdict"]))

    def _ended(self, key: tuple[int, str], name: str, error: str | None) -> None:
        if error is None:
            self._unwinding.pop(key, None)
            if name in self._first_start and name not in self._completed:
                self._completed[name] = self._first_start[name]
            return
        # A failed import: its parents fail next while the error propagates; at the top the
        # whole chain is known, outermost first.
        names, first_error = self._unwinding.setdefault(key, ([], error))
        names.append(name)
        if not self.flying.chain(key):
            self.failures.append((key[0], list(reversed(names)), first_error))
            del self._unwinding[key]

    def completed(self, before: int | None = None) -> list[str]:
        """Imports of the process that ended well, each once, in the order they started.

        BEFORE: only those that started before event number BEFORE.
        """
        names = sorted(self._completed, key=self._completed.__getitem__)
        return [name for name in names if before is None or self._completed[name] < before]

    def culprit_stack(self) -> tuple[tuple[int, str] | None, list[Started]]:
        """The thread whose steps are in flight and most likely stuck, and its steps."""
        chains = self.flying.chains()
        if self.stalled_thread is not None:
            for key, stack in chains.items():
                if key[1] == self.stalled_thread[1] and key[0] == self.stalled_thread[0]:
                    return key, stack
        root = self.pids[0] if self.pids else None
        # A hung dlopen holds the GIL, so the stuck thread is the one with a native load on top.
        ranked = sorted(
            chains.items(),
            key=lambda item: (
                item[0][0] != root,
                item[1][-1].kind != NATIVE,
                item[0][1] != "MainThread",
                -len(item[1]),
            ),
        )
        return ranked[0] if ranked else (None, [])

    def failure(self, last_line: str) -> tuple[list[str], str]:
        """The failed import that ended the program: the one whose error python printed last.

        Imports may still happen after it (3.13 imports modules to print a traceback),
        so the error on the last line of stderr is what ties a failure to the exit.
        """
        root = self.pids[0] if self.pids else None
        for pid, chain, error in reversed(self.failures):
            if pid != root:
                continue
            # Python may print more than we logged (3.12's "Did you mean", a SyntaxError's
            # source line) or a qualified class name: the exception's class must match.
            raised = error.partition(":")[0].strip()
            shown = last_line.partition(":")[0].strip()
            if raised and (shown == raised or shown.endswith("." + raised)):
                return chain, error
        return [], ""

    def verdicts_since(self, seq: int, pid: int) -> list[str]:
        """The "! ..." lines the process wrote since event SEQ."""
        return [text for at, owner, text in self.verdicts if at >= seq and owner == pid]


class Outcome:
    """How one try ended, and what its log said about the imports in flight."""

    def __init__(self, kind: str, seconds: float, detail: str) -> None:
        self.kind = kind
        self.seconds = seconds
        self.detail = detail  # one line: "died by SIGSEGV", "stall report", "exit status 0"
        self.returncode: int | None = None
        self.chain: list[str] = []  # imports in flight (or that failed), outermost first
        self.failed = False  # the chain is of imports that failed, not of imports in flight
        self.native: str | None = None  # the file in dlopen, when one was in flight
        self.verdicts: list[str] = []  # "! ..." lines written while the chain was in flight
        # Imports that ended well before the culprit's package began importing, in the order they
        # started; those within it happen again whenever it is imported.
        self.completed: list[str] = []
        self.stderr_tail = ""

    def reproduces(self, kind: str, culprit: str) -> bool:
        """Whether this try ended the same way as the original run: same kind, same module stuck."""
        return self.kind == kind and culprit in self.chain


class Trials:
    """Runs tries of one program in fresh children, each under the tracer with the stall threshold.

    Every child runs in its own process group, which is killed when its try ends,
    so a fixture's own children do not outlive the try either.
    """

    def __init__(self, settings: config.Settings, workdir: str, deadline: float | None = None) -> None:
        self.settings = settings  # the tries' settings, given to each as options
        self.timeout = settings.timeout
        self.workdir = workdir  # where logs go; the caller removes it
        self.cwd = os.getcwd()
        # Our own variables are not the program's: none reaches a try but through its options.
        self.env = config.for_child()[0]
        self.deadline = deadline  # time.monotonic() after which every try is stopped
        self.stop = threading.Event()  # set: stop every running try
        self._count = 0
        self._lock = threading.Lock()

    def number(self) -> int:
        """The next try's number, counting from 1."""
        with self._lock:
            self._count += 1
            return self._count

    @property
    def count(self) -> int:
        return self._count

    def command(self, target: list[str], log: str) -> list[str]:
        options = config.for_child(self.settings.replace(log=log, exit_on_stall=True))[1]
        return [sys.executable, "-m", "importwatch", *options, *target]

    def run(
        self,
        target: list[str],
        number: int,
        env: dict[str, str] | None = None,
        first: bool = False,
        cancelled: Callable[[], bool] | None = None,
    ) -> Outcome:
        """Run TARGET (`-c CODE`, `-m MOD ...` or `SCRIPT ...`) once and classify how it ended.

        FIRST marks the user's own program: with nothing in flight it may run on
        quietly for a while (its imports are done); a `-c` try must end by itself.
        """
        log = os.path.join(self.workdir, f"try-{number}.jsonl")
        errors = os.path.join(self.workdir, f"try-{number}.stderr")
        state = LogState()
        started = time.monotonic()
        child: subprocess.Popen | None = None
        try:  # the child is killed whatever stops us, from the moment it exists (a signal: see Terminated)
            with open(os.devnull, "rb") as stdin, open(errors, "wb") as stderr:
                child = subprocess.Popen(
                    self.command(target, log),
                    stdin=stdin,
                    stdout=subprocess.DEVNULL,
                    stderr=stderr,
                    cwd=self.cwd,
                    env=self.env if env is None else env,
                    start_new_session=True,
                )
            why = self._watch(child, log, state, cancelled)
        finally:
            if child is not None:
                kill_group(child)
        tail = last_line_of(errors) or ""
        outcome = _classify(
            child.returncode, why, state, time.monotonic() - started, self.timeout, first, tail
        )
        outcome.stderr_tail = tail
        return outcome

    def _watch(
        self,
        child: subprocess.Popen,
        log: str,
        state: LogState,
        cancelled: Callable[[], bool] | None,
    ) -> str | None:
        """Follow the log until the child exits (None) or we must stop it (the reason why)."""
        offset = 0
        last_progress = time.monotonic()
        silent_limit = self.timeout + grace(self.timeout)
        while True:
            exited = child.poll() is not None
            offset, grown = _read_more(log, offset, state)
            now = time.monotonic()
            if grown:
                last_progress = now
            if exited:
                _read_more(log, offset, state)
                return None
            if self.stop.is_set() or (cancelled is not None and cancelled()):
                return STOPPED
            if self.deadline is not None and now >= self.deadline:
                return "max-time"
            if now - last_progress >= silent_limit:
                # In flight and silent: the watchdog should have ended it; it could not.
                # Nothing in flight: a try has nothing left to do but exit, and the user's
                # program is past its imports.
                return "silent"
            time.sleep(_POLL)


def _read_more(path: str, offset: int, state: LogState) -> tuple[int, bool]:
    try:
        with open(path, "rb") as file:
            file.seek(offset)
            data = file.read()
    except OSError:
        return offset, False
    if data:
        state.feed(data.decode("utf-8", "replace"))
    return offset + len(data), bool(data)


def _classify(
    returncode: int | None,
    why: str | None,
    state: LogState,
    seconds: float,
    timeout: float,
    first: bool,
    last_line: str,
) -> Outcome:
    key, stack = state.culprit_stack()
    failed, error = state.failure(last_line)
    if why in (STOPPED, "max-time"):
        outcome = Outcome(STOPPED, seconds, "stopped (--max-time)" if why == "max-time" else "stopped")
    elif why == "silent":
        if stack:
            outcome = Outcome(HANG, seconds, f"no progress for {seconds:.1f} s; killed")
        elif first:
            outcome = Outcome(OK, seconds, "imports done, the program was still running; stopped it")
        else:
            outcome = Outcome(HANG, seconds, f"still running {seconds:.1f} s after its imports; killed")
    elif not state.started:
        outcome = Outcome(ERROR, seconds, f"could not start (exit status {returncode})")
    elif state.stalled_thread is not None or state.exit_on_stall:
        outcome = Outcome(HANG, seconds, f"no progress for {timeout:g} s (stall report)")
    elif returncode is not None and returncode < 0:
        outcome = Outcome(CRASH, seconds, f"died by {signal_name(-returncode)}")
    elif stack:
        # Ended with an import in flight: faulthandler's timer ends a stall that holds the GIL
        # with status 1 and no report of ours; anything sooner is the process ending itself.
        if returncode == 1 and seconds >= timeout * 0.9:
            detail = f"no progress for {timeout:g} s (the GIL was held; faulthandler's timer ended it)"
            outcome = Outcome(HANG, seconds, detail)
        else:
            outcome = Outcome(CRASH, seconds, f"exited with status {returncode} during an import")
    elif returncode and failed:
        outcome = Outcome(CRASH, seconds, f"exit status {returncode} after a failed import: {error}")
    else:
        outcome = Outcome(OK, seconds, f"exit status {returncode}")
    outcome.returncode = returncode
    outcome.completed = state.completed()
    if stack:
        outcome.chain = [step.name for step in stack if step.kind == IMPORT]
        natives = [step.name for step in stack if step.kind == NATIVE]
        outcome.native = natives[-1] if natives else None
        top = outcome.chain[-1].partition(".")[0] if outcome.chain else None
        entered = [step.seq for step in stack if step.kind == IMPORT and step.name.partition(".")[0] == top]
        if entered:
            outcome.completed = state.completed(before=entered[0])
        if key is not None:
            outcome.verdicts = state.verdicts_since(stack[0].seq, key[0])
    elif outcome.kind == CRASH:
        outcome.chain, outcome.failed = failed, True
    return outcome
