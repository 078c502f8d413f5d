"""Switches tracing on, once per process: the .pth and the runner both come here. Owns what is installed."""

from __future__ import annotations

import _signal  # not signal: that one imports enum at start-up
import faulthandler
import os
import sys

from importwatch import banner, config, phases
from importwatch.blocking import BlockingSteps
from importwatch.hook import Tracer
from importwatch.log import Sink
from importwatch.native import NativeLoads
from importwatch.watchdog import Watchdog

TYPE_CHECKING = False
if TYPE_CHECKING:
    from importwatch.config import Settings


class Tracing:
    """Everything one active process has installed, and how to take it out again."""

    def __init__(self, settings: Settings, stderr_fd: int = 2) -> None:
        self.settings = settings
        self.sink = Sink(stderr_fd)
        self.tracer = Tracer(self.sink)
        self.native = NativeLoads(self.tracer)
        self.blocking = BlockingSteps(self.tracer)
        self.watchdog: Watchdog | None = None
        self._usr1 = False
        self.spawning = False  # our own fork (starting the watcher): the fork hooks stay out of it

    def start(self, argv: list[str], warnings: list[str]) -> None:
        self._open_log()
        for warning in warnings:
            self.sink.warn(warning)
        banner.write_banner(self.sink, argv)
        self._start_watcher()
        self.tracer.on_start["torch"] = lambda _: banner.torch_before(self.sink, *self.native.torch_facts())
        self.tracer.on_end["torch"] = lambda torch: banner.torch_loaded(self.sink, torch)
        self.tracer.install()
        self.native.install()
        self.blocking.install()  # torch's init steps, wrapped when (and if) their modules arrive
        phases.bind(self.tracer)
        self._start_faulthandler()
        self._start_watchdog()

    def reconfigure(self, settings: Settings) -> None:
        """The runner under IMPORTWATCH=1: its options win over what the .pth read."""
        old, self.settings = self.settings, settings
        if settings.log != old.log:
            self.sink.close_log()
            self._open_log()
            self._start_faulthandler()
        if self.watchdog is not None:
            self.watchdog.stop()
            self.watchdog = None
        self._start_watchdog()
        if self.sink.feed is not None and (settings.log, settings.timeout) != (old.log, old.timeout):
            self.sink.close_feed()  # the old watcher sees the end of its feed and leaves
        if self.sink.feed is None:
            self._start_watcher()

    def stop(self) -> None:
        if self.watchdog is not None:
            self.watchdog.stop()
            self.watchdog = None
        phases.bind(None)
        self.blocking.uninstall()
        self.native.uninstall()
        self.tracer.uninstall()
        if self._usr1:
            faulthandler.unregister(_signal.SIGUSR1)
            self._usr1 = False
        self.sink.close_feed()
        self.sink.close_log()

    def _open_log(self) -> None:
        if self.settings.log:
            self.sink.open_log(config.expand_log_path(self.settings.log, self.sink.pid, self.sink.rank))

    def _start_watchdog(self) -> None:
        if self.settings.timeout > 0:
            self.watchdog = Watchdog(self.tracer, self.settings.timeout, self.settings.exit_on_stall)
            self.watchdog.start()

    def _start_watcher(self) -> None:
        """The watcher process (sidecar.py), when asked for: it sees from outside what no thread here can."""
        if not self.settings.watcher:
            return
        from importwatch import sidecar

        self.spawning = True
        try:
            settings = self.settings
            why = sidecar.launch(self.sink, settings.timeout, self.sink.log_path, settings.exit_on_stall)
        except OSError as error:
            why = str(error)
        finally:
            self.spawning = False
        if why is not None:
            self.sink.warn(f"no watcher process: {why}")
            return
        # What is mapped now, told through the feed: the watcher's own first look at the maps
        # may come after the first dlopen has begun, and could not tell its libraries as new.
        for path in self.native.mapped_now():
            self.sink.feed_line(f"#mapped {path}")

    def _start_faulthandler(self) -> None:
        """Fatal signals and SIGUSR1 dump every thread's stack where our lines go."""
        fd = self.sink.dump_fd()
        try:
            if not faulthandler.is_enabled() or fd != 2:
                faulthandler.enable(fd, all_threads=True)
            # SIGUSR1 dumps on demand, unless the program has a handler of its own.
            if self._usr1 or _signal.getsignal(_signal.SIGUSR1) == _signal.SIG_DFL:
                faulthandler.register(_signal.SIGUSR1, fd, all_threads=True, chain=False)
                self._usr1 = True
        except (OSError, ValueError, RuntimeError) as error:
            self.sink.warn(f"faulthandler unavailable: {error}")

    # -- fork ----------------------------------------------------------------
    def before_fork(self) -> None:
        if self.watchdog is not None:
            self.watchdog.before_fork()

    def after_fork(self, in_child: bool) -> None:
        if in_child:
            self.sink.close_feed()  # the watcher follows this process, not its children
            parent = self.sink.pid
            self.sink.after_fork_in_child()
            self.tracer.after_fork_in_child()
            log = self.settings.log
            if log and ("{pid}" in log or os.path.isdir(os.path.expanduser(log))):
                self.sink.close_log()
                self._open_log()
                self._start_faulthandler()  # its descriptor was the parent's file, now closed
            # A worker that imports nothing new would otherwise leave no trace of its pid.
            self.sink.event("fork", f"fork child of {parent}", {"parent": parent})
        if self.watchdog is not None:
            self.watchdog.after_fork(in_child)


_active: Tracing | None = None
_process_hooks = False


def _at_exit() -> None:
    """At a normal interpreter exit, after the program's own exit handlers (ours came first).

    The watcher is told, so it can tell a clean exit from a death; and the heartbeat stops
    before the interpreter tears down, since a daemon thread re-arming faulthandler after
    its module was unloaded can crash the exit (seen on 3.9).
    """
    if _active is None:
        return
    _active.sink.feed_line("#exit")
    if _active.watchdog is not None:
        _active.watchdog.stop()


def active() -> Tracing | None:
    """The tracing installed in this process, if any."""
    return _active


def activate(
    settings: Settings | None = None,
    warnings: list[str] | None = None,
    argv: list[str] | None = None,
    stderr_fd: int = 2,
) -> Tracing:
    """Switch tracing on; a second call keeps what is installed and applies new settings."""
    global _active
    if settings is None:
        settings, env_warnings = config.from_env()
        warnings = [*(warnings or []), *env_warnings]
    if _active is not None:
        if settings is not _active.settings:
            _active.reconfigure(settings)
        return _active
    tracing = Tracing(settings, stderr_fd)
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
        activate()
    except Exception as error:
        message = f"[importwatch {os.getpid()}] ! tracing is off: {type(error).__name__}: {error}\n"
        try:
            os.write(2, message.encode("ascii", "backslashreplace"))
        except OSError:
            pass


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

    atexit.register(_at_exit)
    os.register_at_fork(
        before=_before_fork,
        after_in_parent=lambda: _after_fork(False),
        after_in_child=lambda: _after_fork(True),
    )


# Python 3.12 warns at os.fork() when other threads run; the only other thread may be
# our heartbeat, which is safe to fork past. Silence that one warning for that one call.
_FORK_WARNING = ("ignore", None, DeprecationWarning, None, 0)


def _before_fork() -> None:
    if _active is None or _active.spawning:
        return
    _active.before_fork()
    warnings = sys.modules.get("warnings")
    if warnings is not None and _only_our_threads():
        warnings.filters.insert(0, _FORK_WARNING)
        warnings._filters_mutated()


def _after_fork(in_child: bool) -> None:
    warnings = sys.modules.get("warnings")
    if warnings is not None and _FORK_WARNING in warnings.filters:
        warnings.filters.remove(_FORK_WARNING)
        warnings._filters_mutated()
    if _active is not None and not _active.spawning:
        _active.after_fork(in_child)


def _only_our_threads() -> bool:
    """True when no thread but the main one and our heartbeat is running."""
    threading = sys.modules.get("threading")
    if threading is not None and len(threading._active) + len(threading._limbo) > 1:
        return False
    try:
        with open("/proc/self/stat", "rb") as stat:
            fields = stat.read().rsplit(b")", 1)[1].split()
        return int(fields[17]) <= 2  # num_threads: ours and the caller
    except (OSError, IndexError, ValueError):
        return False
