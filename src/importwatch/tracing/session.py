"""Switches tracing on, once per process: the .pth, the runner, the pytest plugin and install() all come here.

Owns what is installed, and takes it out again.
"""

import _frozen_importlib as _bootstrap
import _signal  # not signal: that one imports enum at start-up
import _thread
import faulthandler
import os
import sys
import time

from importwatch import config
from importwatch.events import FORK, IMPORT, PHASE, STEP
from importwatch.facts import procstat
from importwatch.tracing import banner, phases
from importwatch.tracing.accelerator import ACCELERATOR
from importwatch.tracing.descriptors import learn_limits
from importwatch.tracing.doors import Doors
from importwatch.tracing.faults import SharedFaulthandler
from importwatch.tracing.handback import Held
from importwatch.tracing.hook import NEVER, NO_COVER, Tracer, as_importlib_frame, hidden
from importwatch.tracing.native import NativeLoads
from importwatch.tracing.sink import CLOCKS, Sink
from importwatch.tracing.standby import Standby
from importwatch.tracing.watchdog import Watchdog

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any, Callable

    from importwatch.config import Settings
    from importwatch.tracing.blocking import BlockingSteps

# Python 3.12+ warns at os.fork() when the process has more than one thread, counted by the kernel
# (/proc/self/stat); from 3.13 after the after-fork hooks have run, so also a thread they start.
_FORK_WARNS = sys.version_info >= (3, 12)
# How long a fork may wait for the threads we ended to be gone from the kernel's count.
_THREADS_GONE_WAIT = 0.05
# How long a fork may wait for the watcher's start under way (a thread of ours: see watcher_launch).
_WATCHER_START_WAIT = 1.0
# The modules whose init steps tracing/blocking.py wraps (BlockingSteps._targets, which a test
# holds to this list). That module, the costliest of ours at start-up, is imported only when one
# of them is: most programs never import them.
BLOCKING_TARGETS = (
    "torch.distributed.distributed_c10d",
    "torch.cuda",
    "torch.utils.cpp_extension",
    "multiprocessing.popen_fork",
)


class Session:
    """Everything one active process has installed, and how to take it out again."""

    def __init__(self, settings: "Settings", stderr_fd: int = 2) -> None:
        self.settings = settings
        learn_limits(ACCELERATOR)  # before our first descriptor: where ours may go
        self.sink = Sink(stderr_fd)
        self.sink.set_stderr(settings.stderr)
        self.sink.on_lost = self._descriptor_lost
        self.tracer = Tracer(self.sink)
        # What our start-up imported that the program had not: out of sys.modules until it imports each.
        self.held = Held(self.tracer)
        # Our modules read at start-up and run at their first use (the stall report's: see standby.py),
        # outside the lending: they run in the heartbeat while the program imports in its own threads.
        self.standby = Standby()
        lending = self.held.lending(self.tracer.import_own)
        self.tracer.import_own = self.standby.serving(lending)  # type: ignore[method-assign]
        self.native = NativeLoads(self.tracer, self.standby)
        self.blocking: BlockingSteps | None = None  # see BLOCKING_TARGETS
        self._blocking_lock = _thread.allocate_lock()  # two threads may bring targets in at once
        self.doors = Doors(self.tracer)
        self.watchdog: Watchdog | None = None
        self.faults = SharedFaulthandler()
        self._usr1 = False
        self.spawning = False  # our own fork (starting the watcher): the fork hooks stay out of it
        threading = sys.modules.get("threading")
        self._main_ident = threading.main_thread().ident if threading is not None else _thread.get_ident()
        # This process has no interpreter main thread (see Watchdog.main_gone).
        self.main_gone = False
        self._forker = 0  # the thread that forks, between the fork hooks
        self._fork_alone = False  # no thread but the forking one was left at the fork
        # In a fork child, until its first import: the parent's pid (see _child_starts).
        self._child_of: int | None = None
        self._child_lock = _thread.allocate_lock()
        self._first_hooks: tuple | None = None  # see _await_first_event
        self._log_resolved = ("", "")  # the log path as given, and as resolved (see _log_template)

    def start(self, argv: "list[str]", warnings: "list[str]") -> None:
        self.sink.follow_partial_lines()
        self._open_log()
        for warning in warnings:
            self.sink.warn(warning)
        banner.write_banner(self.sink, argv)
        self._start_watcher()
        self.tracer.install()
        self.doors.install()  # waits for modules still initialising, bodies run by loaders
        self.native.install()
        if any(name in sys.modules for name in BLOCKING_TARGETS):
            self._blocking_steps()  # torch's init steps, wrapped now or when their modules arrive
        self._connect_arrivals()
        phases.bind(self.tracer)
        self.faults.install()
        self._start_faulthandler()
        self._start_watchdog()
        self.held.put_aside()

    def reconfigure(self, settings: "Settings") -> None:
        """The runner under IMPORTWATCH=1: its options win over what the .pth read."""
        old, self.settings = self.settings, settings
        self.sink.set_stderr(settings.stderr)
        if settings.log != old.log:
            self.sink.close_log()
            self._open_log()
            self._start_faulthandler()
        self._stop_watchdog()
        self._start_watchdog()
        watched = (settings.log, settings.timeout, settings.stderr)
        if self.sink.feed is not None and watched != (old.log, old.timeout, old.stderr):
            self.sink.close_feed()  # the old watcher sees the end of its feed and leaves
        if self.sink.feed is None:
            self._start_watcher()

    def stop(self) -> None:
        self._drop_first_hooks()
        self._stop_watchdog()
        self.tracer.on_start.clear()
        self.tracer.on_end.clear()
        phases.bind(None)
        if self.blocking is not None:
            self.blocking.uninstall()
        self.native.uninstall()
        self.doors.uninstall()
        self.tracer.uninstall()
        self.held.restore()
        if self._usr1:
            faulthandler.unregister(_signal.SIGUSR1)
            self._usr1 = False
        self.faults.uninstall()
        self.sink.close_feed()
        self.sink.close_log()
        self.sink.unfollow_partial_lines()
        self.sink.close_stderr()

    def _descriptor_lost(self) -> None:
        """The program closed or replaced our log's descriptor or stderr's copy: faulthandler's dumps of ours,
        a crash's and the timer's, no longer go to that number."""
        self._start_faulthandler()
        if self.sink.timer_at is not None:  # our timer is armed: with the number lost, maybe
            fd = self.sink.timer_fd()
            if self.faults.move_ours(fd):
                self.sink.timer_armed(fd)

    def _open_log(self) -> None:
        if self.settings.log:
            self.tracer.import_own("importwatch.safefile")  # what opens it: ours, not the program's import
            pid, rank = self.sink.pid, self.sink.rank
            shown = config.expand_log_path(self.settings.log, pid, rank)
            self.sink.open_log(config.expand_log_path(self._log_template(), pid, rank), shown)

    def _log_template(self) -> str:
        """The log path as given, its folder resolved once, at start: a fork child that chdir'd after the
        start opens its own `{pid}` log beside its parent's, not in its working folder."""
        given = self.settings.log or ""
        if self._log_resolved[0] != given:
            try:
                self._log_resolved = (given, os.path.abspath(os.path.expanduser(given)))
            except OSError:  # no working folder any more: as given
                self._log_resolved = (given, given)
        return self._log_resolved[1]

    # -- the tracer's callbacks: connected here, and nowhere else --------------------
    def _connect_arrivals(self) -> None:
        """What runs when a module arrives: torch's banner lines, and each part's wrappers.

        Two parts waiting for one module both run, each on its own (see Tracer.safely).
        """
        tracer = self.tracer
        tracer.on_start["torch"] = lambda _: banner.torch_before(
            self.sink, self.native.fact("cuda"), *self.native.torch_facts()
        )
        tracer.on_end["torch"] = lambda torch: banner.torch_loaded(self.sink, torch)
        tracer.on_start["sitecustomize"] = tracer.on_start["usercustomize"] = tracer.absent_once
        arrivals = [*self.doors.arrivals().items(), *self.native.arrivals().items()]
        arrivals += [
            (name, self._blocking_arrives(name)) for name in BLOCKING_TARGETS if name not in sys.modules
        ]
        for name, wrap in arrivals:
            previous = tracer.on_end.get(name)
            tracer.on_end[name] = wrap if previous is None else _both(tracer, previous, wrap)

    def _blocking_steps(self) -> "BlockingSteps":
        """tracing/blocking.py's wrappers, imported (without a line) and installed at the first need."""
        with self._blocking_lock:
            if self.blocking is None:
                blocking = self.tracer.import_own("importwatch.tracing.blocking")
                self.blocking = blocking.BlockingSteps(self.tracer)
                self.blocking.install()
            return self.blocking

    def _blocking_arrives(self, name: str) -> "Callable[[Any], None]":
        def arrive(module: "Any") -> None:
            if self.blocking is None:
                self._blocking_steps()  # its install wraps each target there, this one included
            else:
                self.blocking.arrive(name, module)

        arrive.__qualname__ = f"BlockingSteps.arrive({name})"  # how an internal error names it
        return arrive

    def _start_watchdog(self) -> None:
        """The watchdog, told of each step by the tracer from before its heartbeat starts."""
        if self.settings.timeout <= 0:
            return
        settings, tracer = self.settings, self.tracer
        watchdog = Watchdog(tracer, settings.timeout, settings.exit_on_stall, self.faults, self.standby)
        watchdog.main_gone = self.main_gone
        self.watchdog = watchdog
        tracer.on_progress = watchdog.step_ended
        tracer.on_gil_held = watchdog.gil_held
        tracer.on_gil_released = watchdog.gil_released
        tracer.on_deadline = watchdog.step_begins
        watchdog.start()

    def _stop_watchdog(self, forget: bool = True) -> None:
        """Stop the watchdog, then tell the tracer that nothing listens any more; FORGET it too."""
        watchdog = self.watchdog
        if watchdog is None:
            return
        watchdog.stop()
        tracer = self.tracer
        if tracer.on_progress == watchdog.step_ended:
            tracer.progress_due = NEVER
            tracer.on_progress = tracer.on_gil_held = tracer.on_gil_released = tracer.on_deadline = None
            tracer.cover = NO_COVER
        if forget:
            self.watchdog = None

    def _start_watcher(self) -> None:
        """The watcher process (watcher/), when asked for: it sees from outside what no thread here can."""
        if not self.settings.watcher:
            return
        from importwatch.tracing import watcher_launch

        self.spawning = True
        try:
            why = watcher_launch.launch(self.sink, self.settings, self.tracer.import_own)
        except OSError as error:
            why = str(error)
        finally:
            self.spawning = False
        if why is not None:
            self.sink.warn(f"no watcher process: {why}")
            return
        self.native.tell_mapped = True  # at the first native load (see NativeLoads.tell_mapped)

    def _start_faulthandler(self) -> None:
        """Fatal signals dump every thread's stack to the text log; SIGUSR1 too when asked for.

        Never to stderr of our own accord: a crash prints there what it prints under plain
        python (faulthandler's dump only when the program switched it on itself).
        """
        fd = self.sink.dump_fd()
        try:
            if fd == self.sink.stderr.fd:
                self.faults.disable_ours()
            else:
                self.faults.enable_ours(fd)
            # SIGUSR1 ends a process by default, and schedulers rely on it: changed only on request,
            # and never when the program has a handler of its own.
            if self.settings.dump_on_sigusr1 and (
                self._usr1 or _signal.getsignal(_signal.SIGUSR1) == _signal.SIG_DFL
            ):
                faulthandler.register(_signal.SIGUSR1, fd, all_threads=True, chain=False)
                self._usr1 = True
        except (OSError, ValueError, RuntimeError) as error:
            self.sink.warn(f"faulthandler unavailable: {error}")

    # -- fork ----------------------------------------------------------------
    def before_fork(self) -> None:
        """Leave at the fork only the threads the program has, and the timer as it armed it.

        Our heartbeat and our deadline's timer thread end here (see Watchdog.before_fork);
        on 3.12+ the fork then waits (briefly) until the kernel no longer counts them, if
        the program's warning about forking with threads depends on it.
        """
        self._forker = _thread.get_ident()
        self.sink.watcher_started(_WATCHER_START_WAIT)  # no start of ours under way across the fork
        threads = _count_threads() if _FORK_WARNS else 0
        timer_before = self.faults.thread_alive(CLOCKS.monotonic())
        ended = self.watchdog.before_fork() if self.watchdog is not None else False
        timer_after = self.faults.before_fork()
        expected = threads - ended - timer_before + timer_after
        self._fork_alone = _FORK_WARNS and expected <= 1
        if self._fork_alone and threads > expected:
            deadline = CLOCKS.monotonic() + _THREADS_GONE_WAIT
            while _count_threads() > expected and CLOCKS.monotonic() < deadline:
                time.sleep(0.0002)

    def after_fork(self, in_child: bool) -> None:
        self.faults.after_fork(in_child)
        if not in_child:
            # Where the program alone forked a single-threaded process, a heartbeat started
            # now would count for the warning (3.13 counts after these hooks): the next
            # step starts it (see Watchdog.after_fork).
            if self.watchdog is not None:
                self.watchdog.after_fork(False, restart=not self._fork_alone)
                if self._fork_alone and self.tracer.stacks.get(self._forker):
                    # Forked inside an import, which may now wait without another step: the
                    # heartbeat starts when the code that called fork runs its next line.
                    _on_next_line(sys._getframe(1), self.watchdog.wake_up)
            return
        self.sink.close_feed()  # the watcher follows this process, not its children
        parent = self.sink.pid
        self.sink.after_fork_in_child()
        self.tracer.after_fork_in_child()
        self.main_gone = self.main_gone or self._forker != self._main_ident
        self._main_ident = _thread.get_ident()
        self._child_lock = _thread.allocate_lock()
        self._blocking_lock = _thread.allocate_lock()  # another thread may have held it at the fork
        # Nothing more until the child's first event: a fork followed by exec costs nothing.
        self._child_of = parent
        self._await_first_event()
        if self.watchdog is not None:
            self.watchdog.on_wake = self._first_event
            self.watchdog.after_fork(True, main_gone=self.main_gone)

    def _await_first_event(self) -> None:
        """One-time wrappers that start the child at its first import, step or line.

        Before the tracer's own _find_and_load (every import), and on this sink's event()
        and this tracer's push() (checkpoints, phases, native loads): each takes itself
        out again at the first call, so the hot path is the same as before the fork.
        """
        self._drop_first_hooks()  # a child's child forked before the child's first event
        inner = _bootstrap._find_and_load
        sink, tracer, tracing = self.sink, self.tracer, self

        def _find_and_load(name: str, import_: "Callable") -> "Any":
            if name not in sys.modules:
                tracing._first_event()
            return inner(name, import_)

        def event(*args: "Any", **kwargs: "Any") -> None:
            tracing._first_event()
            sink.event(*args, **kwargs)

        def push(*args: "Any", **kwargs: "Any") -> "Any":
            tracing._first_event()
            return tracer.push(*args, **kwargs)

        first = hidden(as_importlib_frame(_find_and_load), binds=False) if self.tracer.installed else None
        self._first_hooks = (first, inner, event, push)
        if first is not None:
            _bootstrap._find_and_load = first
        sink.event = event  # type: ignore[method-assign]
        tracer.push = push  # type: ignore[method-assign]

    def _first_event(self) -> None:
        self._drop_first_hooks()
        self._child_starts()
        if self.watchdog is not None:
            self.watchdog.wake_up()  # calls back here first, which finds nothing left to do

    def _drop_first_hooks(self) -> None:
        with self._child_lock:
            hooks, self._first_hooks = self._first_hooks, None
        if hooks is None:
            return
        first, inner, event, push = hooks
        if first is not None and _bootstrap._find_and_load is first:
            _bootstrap._find_and_load = inner
        if self.sink.__dict__.get("event") is event:
            del self.sink.event
        if self.tracer.__dict__.get("push") is push:
            del self.tracer.push

    def _child_starts(self) -> None:
        """A fork child's own start, at its first step: its log file, and the line that names its parent."""
        with self._child_lock:
            parent, self._child_of = self._child_of, None
        if parent is None:
            return
        log = self.settings.log
        if log and ("{pid}" in log or os.path.isdir(os.path.expanduser(log))):
            self.sink.close_log()
            self._open_log()
            self._start_faulthandler()  # its descriptor was the parent's file, now closed
        # A watcher of its own: the parent's follows the parent alone, and a child that inherited
        # a runtime's thread pool (OpenMP) hangs where only a look from outside can see it.
        self._start_watcher()
        self._tell_watcher_in_flight()
        if self.watchdog is not None:
            self.watchdog.forked_from = parent
        self.sink.event(FORK, {"parent": parent})

    def _tell_watcher_in_flight(self) -> None:
        """What the forking thread had in flight (a fork inside an import), for a watcher started now."""
        stack = self.tracer.stacks.get(self._main_ident) if self.sink.feed is not None else None
        for depth, step in enumerate(stack or ()):
            if step.kind == "import":
                self.sink.feed_event(IMPORT, {"name": step.name}, depth)
            elif step.kind == "phase":
                self.sink.feed_event(PHASE, {"name": step.name, "timeout": step.timeout}, depth)
            else:  # a native load or a step: its start line's details are gone; its name is what counts
                self.sink.feed_event(STEP, {"name": step.name, "detail": "(in flight at fork)"}, depth)


# sys.monitoring tools that are free for anyone's use (0-2 and 5 are the debugger's, coverage's,
# profilers' and optimisers').
_TOOL_IDS = (4, 3)


def _on_next_line(frame: "Any", then: "Callable[[], None]") -> None:
    """Call THEN once the first frame up from FRAME that is not ours runs another line (3.12+)."""
    monitoring = getattr(sys, "monitoring", None)
    package = os.path.dirname(os.path.dirname(__file__)) + os.sep  # importwatch's frames, any folder
    while frame is not None and frame.f_code.co_filename.startswith(package):
        frame = frame.f_back
    if monitoring is None or frame is None:
        return
    tool = next((i for i in _TOOL_IDS if monitoring.get_tool(i) is None), None)
    if tool is None:
        return  # both taken: the next step starts the heartbeat, as without this
    code = frame.f_code
    events = monitoring.events.LINE | monitoring.events.PY_RETURN

    def fire(*_: object) -> object:
        if monitoring.get_tool(tool) == "importwatch":
            monitoring.set_local_events(tool, code, 0)
            monitoring.register_callback(tool, monitoring.events.LINE, None)
            monitoring.register_callback(tool, monitoring.events.PY_RETURN, None)
            monitoring.free_tool_id(tool)
            then()
        return monitoring.DISABLE

    monitoring.use_tool_id(tool, "importwatch")
    monitoring.register_callback(tool, monitoring.events.LINE, fire)
    monitoring.register_callback(tool, monitoring.events.PY_RETURN, fire)
    monitoring.set_local_events(tool, code, events)


def _both(
    tracer: "Tracer", first: "Callable[[Any], None]", then: "Callable[[Any], None]"
) -> "Callable[[Any], None]":
    """One arrival callback that runs two, each on its own: a failure of one never skips the other."""

    def both(module: "Any") -> None:
        tracer.safely(first, module)
        tracer.safely(then, module)

    both.__name__ = then.__name__
    return both


def _count_threads() -> int:
    """The process's threads as the kernel counts them (and as Python's fork warning does)."""
    fields = procstat.fields("/proc/self/stat")
    try:
        return int(fields[procstat.THREADS]) if fields is not None else 0
    except (IndexError, ValueError):
        return 0


_active: "Session | None" = None
_process_hooks = False


def _at_exit() -> None:
    """At a normal interpreter exit, after the program's own exit handlers (ours came first).

    The watcher is told, so it can tell a clean exit from a death; and the heartbeat stops
    before the interpreter tears down, since a daemon thread re-arming faulthandler after
    its module was unloaded can crash the exit (seen on 3.9). Last, the C accelerator takes our
    functions out of the collector's passes at finalisation, about 0.4 ms of a short program's exit.
    """
    if _active is None:
        return
    _active._stop_watchdog(forget=False)  # first: nothing of ours may fire while the exit waits in hush
    if _active.sink.feed is not None:
        from importwatch.tracing.watcher_launch import hush  # loaded already: it started the watcher

        hush(_active.sink)  # says `#exit` and keeps the watcher from writing after the exit
    # Last: our functions out of the collector's passes as the interpreter ends (_speedups_keep.h).
    keep = getattr(ACCELERATOR, "keep_to_the_end", None)
    if keep is not None:
        try:
            keep(sys.modules, "importwatch")
        except Exception:
            pass  # (a sys.modules the program replaced by no dict): a quicker exit missed, nothing more


def active() -> "Session | None":
    """The tracing installed in this process, if any."""
    return _active


def activate(
    settings: "Settings | None" = None,
    warnings: "list[str] | None" = None,
    argv: "list[str] | None" = None,
    stderr_fd: int = 2,
) -> "Session":
    """Switch tracing on; a second call keeps what is installed and applies new settings."""
    global _active
    if settings is None:
        settings, env_warnings = config.merge()
        warnings = [*(warnings or []), *env_warnings]
    if _active is not None:
        if settings is not _active.settings:
            _active.reconfigure(settings)
        return _active
    tracing = Session(settings, stderr_fd)
    _active = tracing
    _register_process_hooks()
    if argv is None:
        argv = list(getattr(sys, "orig_argv", None) or sys.argv or [])
    tracing.start(argv, warnings or [])
    return tracing


def activate_from_env() -> None:
    """The .pth's entry point: never raises, whatever goes wrong."""
    if _active is not None:
        return  # a .pth can run twice when site-packages is on sys.path twice
    try:
        runner = os.environ.pop(config.ENV_RUNNER, None)  # and out of the C environment
        if runner is None:
            activate()
        else:  # the runner exec'd this process: its settings, and the program's argv on the start line
            settings, warnings, skip = config.from_runner(runner)
            activate(settings, warnings, _command_line()[skip:])
    except Exception as error:
        message = f"[importwatch {os.getpid()}] ! tracing is off: {type(error).__name__}: {error}\n"
        try:
            os.write(2, message.encode("ascii", "backslashreplace"))
        except OSError:
            pass


def _command_line() -> "list[str]":
    """This process's whole command line, the interpreter's flags included (3.9 has no sys.orig_argv)."""
    orig_argv = getattr(sys, "orig_argv", None)
    if orig_argv is not None:
        return list(orig_argv)
    fd = os.open("/proc/self/cmdline", os.O_RDONLY)
    try:
        data = b""
        while True:
            chunk = os.read(fd, 65536)
            if not chunk:
                break
            data += chunk
    finally:
        os.close(fd)
    return [os.fsdecode(word) for word in data.split(b"\0")[:-1]]


def before_exec() -> None:
    """This process becomes another program (the runner's exec): end tracing as at a normal exit."""
    _at_exit()
    deactivate()


def deactivate() -> None:
    """Take everything out again (tests, and importwatch.uninstall())."""
    global _active
    if _active is not None:
        _active.stop()
        _active = None


def _register_process_hooks() -> None:
    """Fork and exit hooks, once per process: neither can be taken back."""
    global _process_hooks
    if _process_hooks:
        return
    _process_hooks = True
    import atexit

    # Each unseen by the program's trace and profile functions (a debugger, a coverage tool: hook.hidden).
    atexit.register(hidden(_at_exit, binds=False))
    os.register_at_fork(
        before=hidden(_before_fork, binds=False),
        after_in_parent=hidden(lambda: _after_fork(False), binds=False),
        after_in_child=hidden(lambda: _after_fork(True), binds=False),
    )


def _before_fork() -> None:
    if _active is not None and not _active.spawning:
        _active.before_fork()


def _after_fork(in_child: bool) -> None:
    if _active is not None and not _active.spawning:
        _active.after_fork(in_child)
