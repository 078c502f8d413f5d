"""The sink: writes each event, rendered by the event model (importwatch.events) as one ASCII line of text or JSON,
flushed, to stderr, the log file and the watcher's feed (a ring in shared memory)."""

import _thread
import errno
import os
import sys
import time

from importwatch.events import BUSY, DIED, EXIT, RESUMED, VERDICT, WARNING, escape, json_line, render
from importwatch.tracing.accelerator import ACCELERATOR, SINK_BASE
from importwatch.tracing.descriptors import (
    STDERR,
    Channel,
    close_if_ours,
    high_descriptor,
    identity,
    own_stderr,
)

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Callable

    from importwatch.tracing.ring import Feed, Ring


class Clocks:
    """The time module's clocks as they were when importwatch was imported, out of the program's reach.

    A program (freezegun, a test's monkeypatch) may replace time.time, time.monotonic,
    time.localtime or time.strftime, and freezegun also replaces every module-level name
    that refers to the real function; the attributes of an object are left alone. So our
    stamps, ages and deadlines read these: never a frozen clock, never a false stall.
    """

    __slots__ = ("localtime", "monotonic", "strftime", "wall")

    def __init__(self) -> None:
        self.wall = time.time
        self.monotonic = time.monotonic
        self.localtime = time.localtime
        self.strftime = time.strftime


CLOCKS = Clocks()

# Bound once: event() runs twice per import.
_write = os.write
_get_ident = _thread.get_ident

PREFIX = "importwatch"

# The kinds of event that --stderr stalls still writes to stderr (besides stall* and outside*): a
# stall, a verdict, a death, our own failure. Not the start and env lines: until there is something
# to report, a quiet program's stderr is byte for byte plain python's.
_LOUD = frozenset((VERDICT, WARNING, RESUMED, BUSY, EXIT, DIED))


def rank_from_env(environ: "dict[str, str] | os._Environ[str]" = os.environ) -> "int | None":
    """The process's rank in a distributed job: RANK, else LOCAL_RANK, when set to a number."""
    for name in ("RANK", "LOCAL_RANK"):
        value = environ.get(name, "").strip()
        if value.isascii() and value.isdigit():
            return int(value)
    return None


class _LoudKinds(dict):
    """Per kind of event, whether --stderr stalls writes it to stderr: decided once per kind, never changed
    (the C hook keeps the answers it has read: _speedups_route.h)."""

    def __missing__(self, kind: str) -> bool:
        loud = kind in _LOUD or kind.startswith(("stall", "outside"))
        self[kind] = loud
        return loud


class _NoKinds(dict):
    """--stderr none: no kind of event goes to stderr (each kind kept once asked, as _LoudKinds keeps it)."""

    def __missing__(self, kind: str) -> bool:
        self[kind] = False
        return False


class Sink(SINK_BASE):  # type: ignore[misc,valid-type]
    """Writes one line per event, prefixed with pid, time and thread, to every open channel.

    Each line goes out in a single os.write per channel: nothing is buffered, a
    hung or killed process has already written everything it announced, and
    lines from several processes appending to one file never interleave.

    With the C accelerator the class derives from _speedups.Counted (SINK_BASE),
    which counts every attribute set: the C hook reads what emit reads of the sink
    once, and again after a set (_speedups_route.h). So change the sink's state by
    setting its attributes, never through its __dict__.
    """

    def __init__(self, stderr_fd: int = STDERR) -> None:
        # STDERR_FD is fd 2, or a copy of it taken before pytest's capture redirects fd 2 (the pytest
        # plugin). Either way our lines go to a copy of our own (see own_stderr).
        self.stderr_is_fd2 = stderr_fd == STDERR
        self.stderr = own_stderr(stderr_fd)
        self._now = CLOCKS.wall
        self.log: Channel | None = None
        self.structured = False  # a JSON log writes each event's fields: only then need they be made
        self.feed: Feed | None = None
        # (fd, device, inode) of each descriptor of ours that lines are written to (stderr's copy, the
        # log) as check_descriptors last found it, for the C hook's look without a call; None once one
        # of ours has changed since (the check then runs).
        self.guards: tuple[tuple[int, int, int], ...] | None = None
        self._own_threads: dict[int, str] = {}
        self._own_tids: dict[int, int] = {}  # their kernel thread ids, for a watcher started later
        self.pid = 0
        self.rank: int | None = None
        self.main_thread = 0
        self._second = -1
        self._clock = ""
        self._msec = -1
        self._stamp = ""
        self._head = ""
        self._prefix = ""  # head and stamp of a main-thread line, made once per millisecond
        self._loud: dict[str, bool] | None = None  # None: every kind to stderr (--stderr all)
        self.stderr_mode = "all"
        self._null: Channel | None = None  # /dev/null, for faulthandler's timer (see timer_fd)
        # The program's last write to sys.stderr did not end its line: ours starts a new one.
        self.partial = False
        # (stream, our write, our flush) while installed
        self._stderr_write: tuple[object, object, object] | None = None
        # Told when a descriptor of ours is lost (the log, or stderr's copy, made anew or not): where
        # faulthandler dumps must move.
        self.on_lost: Callable[[], None] | None = None
        # The descriptor faulthandler's timer is armed with (timer_armed), or None: while it is stderr's
        # copy, the hook's guards hold that copy too (see check_descriptors).
        self.timer_at: int | None = None
        self.after_fork_in_child()

    # -- set-up ------------------------------------------------------------
    def open_log(self, path: str, shown: "str | None" = None) -> bool:
        """Append to PATH from now on (JSON Lines when it ends in .jsonl); on failure say so once. SHOWN is
        PATH as the user gave it (relative), for what we say.

        Logs often live in shared, world-writable folders, where another user may have
        put something at PATH first: a symlink is never followed, a FIFO or device never
        waited on, and only a regular file of our own (or a new one, mode 0600) is taken.
        """
        # Loaded where a log is opened, never at a start without one; by Session._open_log as ours (no line).
        from importwatch import safefile

        opened, path = path, shown or path  # PATH as opened; as the user gave it, in what we say
        fd = safefile.open_log(opened, path)
        if isinstance(fd, str):
            self.warn(f"{fd}; logging to stderr only")
            return False
        self.adopt_log(fd, path)
        return True

    def adopt_log(self, fd: int, path: str) -> None:
        """Append to FD, opened (by open_log, maybe in another process) from PATH, from now on."""
        self.close_log()
        fd = high_descriptor(fd)
        self.log = Channel(fd, path, json=path.endswith(".jsonl"), ident=identity(fd))
        self.structured = self.log.json
        self.guards = None

    def close_stderr(self) -> None:
        """Close our copy of stderr (tracing stops): nothing of ours writes to stderr after this."""
        stderr = self.stderr
        if not stderr.broken:
            stderr.broken = True
            close_if_ours(stderr.fd, stderr.ident)

    def close_log(self) -> None:
        if self.log is not None:
            close_if_ours(self.log.fd, self.log.ident)
            self.log = None
            self.structured = False

    def set_stderr(self, mode: str) -> None:
        """What goes to stderr: every line ("all"), what says something is wrong ("stalls"), or none."""
        self.stderr_mode = mode
        self._loud = None if mode == "all" else _LoudKinds() if mode == "stalls" else _NoKinds()
        self.guards = None  # whether stderr's copy is among them (see check_descriptors)

    def loud(self, kind: str) -> bool:
        """Whether a line of KIND goes to stderr."""
        return self._loud is None or self._loud[kind]

    def follow_partial_lines(self) -> None:
        """Note whether the program's output on stderr ends its line, as it reaches the descriptor.

        When it did not (`Loading model... `), our next line on stderr starts with
        a newline, rather than being glued to the program's. A line-buffered
        sys.stderr (python's own, unless -u or PYTHONUNBUFFERED) holds a line without
        its end until a newline or a flush: then nothing reached the descriptor yet,
        and our lines come first, each whole. The cost is the program's: a comparison
        or two more per write to sys.stderr (and per flush). With the C accelerator no
        frame of ours is below the stream's own method (a failing write has plain
        python's traceback), and what stands in its place reads as that method.
        """
        stream = sys.stderr
        if self._stderr_write is not None or not self.stderr_is_fd2 or stream is None:
            return
        try:
            if stream.fileno() != STDERR or "write" in vars(stream) or "flush" in vars(stream):
                return
            through = bool(stream.write_through)  # every write reaches the descriptor at once
            by_line = bool(stream.line_buffering)
        except (AttributeError, OSError, ValueError, TypeError):
            return  # not a file on fd 2, or no instance dict to hold our write
        follow = getattr(ACCELERATOR, "follow", None)
        if follow is not None:  # no frame of ours below the stream's write (_speedups_follow.h)
            write, flush = follow(stream.write, stream.flush, self, through, by_line)
        else:
            write, flush = self._followers(stream.write, stream.flush, through, by_line)
        try:
            stream.write = write
            if not through:
                stream.flush = flush
        except (AttributeError, TypeError):
            vars(stream).pop("write", None)
            return
        self._stderr_write = (stream, write, flush)

    def _followers(
        self, original_write: "Callable", original_flush: "Callable", through: bool, by_line: bool
    ) -> "tuple[Callable, Callable]":
        """The pure-Python twin of the C accelerator's follow: the stream's write and flush, each with the
        note after it (a frame of ours below the stream's own)."""
        sink = self
        held = [False]  # whether what the stream holds, once out, leaves a line unended

        def write(text: str) -> int:
            written = original_write(text)
            if text:
                held[0] = text[-1] != "\n"
                if (through or (by_line and ("\n" in text or "\r" in text))) and sink.partial is not held[0]:
                    sink.partial = held[0]  # only a change: each set makes the C hook read the sink again
            return written

        def flush() -> None:
            original_flush()
            if sink.partial is not held[0]:
                sink.partial = held[0]

        return write, flush

    def unfollow_partial_lines(self) -> None:
        if self._stderr_write is not None:
            stream, write, flush = self._stderr_write
            self._stderr_write = None
            if vars(stream).get("write") is write:
                del stream.write
            if vars(stream).get("flush") is flush:
                del stream.flush

    def check_descriptors(self) -> None:
        """Stop writing to a descriptor of ours that the program closed or put something else at.

        Ours sit just below fd 1024, close-on-exec, so a program's close of fd 2, its
        open files and its children never meet them: no write checks anything. A write to
        one the program closed (a closerange) fails with EBADF and is caught there; one
        whose number the program then reused (a dup2 onto it, its thousandth open file)
        is found here, when the program's own code may have done it: at each step that
        begins with nothing in flight on its thread (Tracer), and at each of the
        heartbeat's looks. One fstat per descriptor of ours, never per line.

        The hook's guards (the C hook's look at each such step) hold only the descriptors
        that steps' lines go to. They leave out the watcher's pipe: nothing is written to
        it, and its one use, the lock at the exit, looks at it itself first
        (watcher_launch.hush). Under --stderr stalls or none they leave out stderr's copy
        too while faulthandler's timer is not armed with it: a line written to it looks
        first (see _looked_at), and so does the arming (timer_fd). A quiet import then makes
        no system call at all. A copy found lost (see _stderr_again) re-arms the timer.
        """
        self._look_at_stderr()
        stderr = self.stderr
        log = self.log
        if log is not None and not log.broken and identity(log.fd) != log.ident:
            self._log_lost(log)
        feed = self.feed
        if feed is not None and feed.starting is not None:
            self.watcher_started()
            feed = self.feed
        if feed is not None and not feed.closed and identity(feed.fd) != feed.ident:
            feed.closed = True  # the pipe's end told the watcher we were gone: nobody reads the ring now
        used = self._loud is None or self.timer_at == stderr.fd  # a step's line, or the timer's dump
        live = [(stderr.fd, stderr.ident)] if not stderr.broken and used else []
        live += [(log.fd, log.ident)] if log is not None and not log.broken else []
        # While the watcher's start is under way (a few milliseconds), no guards: each step with nothing
        # in flight then comes here, so a start that failed is said at once.
        starting = feed is not None and feed.starting is not None
        self.guards = None if starting else tuple((fd, *ident) for fd, ident in live if ident is not None)

    def _look_at_stderr(self, arming: bool = False) -> None:
        """Stop writing to our copy of stderr if the program closed it or put something else at its number
        (a new copy, where fd 2 is still the stderr we started with). ARMING: the timer is being armed."""
        stderr = self.stderr
        if not stderr.broken and identity(stderr.fd) != stderr.ident:
            self._stderr_again(arming=arming)

    def _looked_at(self, arming: bool = False) -> bool:
        """Whether stderr's copy may take a line now: under --stderr stalls or none the hook's look at each
        step may leave it out (see check_descriptors), so it is looked at before each line it gets."""
        if self._loud is not None:
            self._look_at_stderr(arming)
        return not self.stderr.broken

    def timer_armed(self, fd: "int | None") -> None:
        """faulthandler's timer is armed with FD from now on (None: not armed)."""
        if fd != self.timer_at:
            self.timer_at = fd
            self.guards = None  # whether stderr's copy is among them

    def _log_lost(self, log: "Channel") -> None:
        if log.broken and log.ident is None:
            return  # said already (the heartbeat and a write may both find it)
        log.broken = True
        log.ident = None  # never closed by us: the number may be the program's now
        self.warn(
            f"the program closed or replaced the log file's descriptor ({log.fd}, {log.name}); "
            "logging to stderr only"
        )
        if self.on_lost is not None:
            self.on_lost()

    def attach_feed(
        self, fd: int, ring: "Ring", starting: "Callable[[float], int | None] | None" = None
    ) -> None:
        """From now on every text line also goes to the watcher's RING; the pipe FD tells it of the end (see Feed).

        STARTING: how the watcher's start in the background went, looked at by watcher_started.
        """
        from importwatch.tracing.ring import Feed  # loaded by the watcher's launch already

        self.close_feed()
        self.feed = Feed(fd, ring, starting)
        self.guards = None
        for ident, name in self._own_threads.items():  # named before there was a watcher (a fork child's)
            self.feed.announce(ident, name, self._own_tids[ident])

    def watcher_started(self, wait: float = 0.0) -> None:
        """Once the watcher's start in the background has ended (waiting up to WAIT seconds): where it
        failed, say so once and stop feeding it. Looked at with our descriptors, at a fork and at exit."""
        feed = self.feed
        starting = feed.starting if feed is not None else None
        if starting is None:
            return
        feed.starting = None  # this thread looks (the heartbeat's and the program's may both come here)
        try:
            if starting(wait) is None:
                feed.starting = starting  # still under way: looked at again
                return
        except OSError as error:
            self.close_feed()
            self.warn(f"no watcher process: {error.strerror or error}")

    def close_feed(self) -> None:
        if self.feed is not None:
            self.feed.close()
            self.feed = None

    def feed_line(self, line: str) -> None:
        """A line for the watcher only (`#exit`)."""
        if self.feed is not None:
            self.feed.send(line.encode("ascii") + b"\n")

    def feed_event(self, kind: str, fields: dict, depth: int = 0) -> None:
        """An event for the watcher only, as the main thread's: what was in flight before it started."""
        if self.feed is None:
            return
        body = render(kind, fields, depth)
        if not (body.isascii() and body.isprintable()):
            body = escape(body)
        self._set_stamp(int(self._now() * 1000))
        self.feed.send((self._prefix + body + "\n").encode("ascii"))

    @property
    def log_path(self) -> "str | None":
        return self.log.name if self.log is not None else None

    def dump_fd(self) -> int:
        """Where faulthandler writes (it takes one descriptor): the text log if writable, else stderr."""
        if self.log is not None and not self.log.broken and not self.log.json:
            return self.log.fd
        return self.stderr.fd

    def dumped_where(self) -> str:
        """Where faulthandler's own dump of a stall that held the GIL went: the terminal shows none when
        it went to the log (or nowhere, under --stderr none without a text log)."""
        fd = self.timer_fd()
        if fd == self.stderr.fd:
            return "above"
        if fd != self.dump_fd():
            return "nowhere kept (--stderr none, no text log), not on this terminal"
        return f"in {self.log_path}, not on this terminal"

    def timer_fd(self) -> int:
        """Where faulthandler's timer dumps a stall that holds the GIL: dump_fd(), but never stderr
        under --stderr none, nor a copy of stderr that is no longer ours (then /dev/null: the timer takes a
        descriptor, and may have to end the job)."""
        fd = self.dump_fd()
        if fd == self.stderr.fd:
            self._looked_at(arming=True)
            fd = self.dump_fd()  # (a copy made anew has a number of its own)
        if fd != self.stderr.fd or (self.loud("stall") and not self.stderr.broken):
            return fd
        null = self._null
        if null is None or identity(null.fd) != null.ident:  # the program may have closed or reused it
            try:
                fd = high_descriptor(os.open(os.devnull, os.O_WRONLY | os.O_CLOEXEC))
            except OSError:
                return self.stderr.fd
            null = self._null = Channel(fd, os.devnull, ident=identity(fd))
        return null.fd

    def after_fork_in_child(self) -> None:
        self._own_threads.clear()  # only the forking thread, never ours, goes on in the child
        self._own_tids.clear()
        self.pid = os.getpid()
        self.main_thread = _thread.get_ident()
        self.set_rank(rank_from_env())

    def set_rank(self, rank: "int | None") -> None:
        """Lines of a distributed job carry the process's rank after the pid: `[importwatch 4711 r1 ...`."""
        self.rank = rank
        self._head = f"[{PREFIX} {self.pid} " if rank is None else f"[{PREFIX} {self.pid} r{rank} "
        self._msec = -1  # the next line makes its prefix anew

    # -- writing -------------------------------------------------------------
    def event(self, kind: str, fields: dict, depth: int = 0, only: "str | None" = None) -> None:
        """Write one event of KIND (see importwatch.events) with FIELDS, at DEPTH in its thread (nested kinds).

        ONLY: "log" for detail the terminal leaves out (the watcher's full stacks), "stderr" for
        the terminal's short form of it.
        """
        loud = self._loud  # emit's first test, before rendering: a line that goes nowhere costs nothing more
        if loud is not None and self.log is None and self.feed is None and not loud[kind]:
            return
        body = render(kind, fields, depth)
        if not (body.isascii() and body.isprintable()):
            body = escape(body)
        self.emit(kind, body, fields, only)

    def emit(self, kind: str, body: str, fields: "dict | None" = None, only: "str | None" = None) -> None:
        """event() for a BODY rendered already (events.render) and known to be printable ASCII: the
        import hook's path, which renders its two lines inline.

        This runs twice per import: it formats with one concatenation and writes
        with one os.write per channel, and does nothing else when nothing goes wrong.
        The C hook (tracing/_speedups.c, fast_emit) does the same for its common case:
        a change here is one there too (tests/test_accelerator.py compares the bytes).
        """
        loud = self._loud
        if loud is not None and self.log is None and self.feed is None and not loud[kind]:
            return  # --stderr stalls or none, and no log or watcher: this line goes nowhere
        now = self._now()
        msec = int(now * 1000)
        if msec != self._msec:
            self._set_stamp(msec)
        ident = _get_ident()
        if ident == self.main_thread:
            thread = None
            text = (self._prefix + body + "\n").encode("ascii")
        else:
            thread = self.thread_name(ident)
            text = f"{self._head}{self._stamp} {thread}] {body}\n".encode("ascii")
        size = len(text)
        stderr = self.stderr
        if not stderr.broken and only != "log" and (loud is None or (loud[kind] and self._looked_at())):
            line = text
            if self.partial:  # the program's own line is not ended: ours starts on a new one
                self.partial = False
                line = b"\n" + text
            try:
                written = _write(stderr.fd, line)
                if written != len(line):  # rare: a non-blocking stderr took part of it
                    stderr.write(line[written:])
            except OSError as error:
                if not self._stderr_again(error):
                    stderr.broken = True  # nowhere left to say it
                elif stderr.write(line) is not None:
                    stderr.broken = True
        if only == "stderr":
            return
        feed = self.feed
        if feed is not None:
            if thread is not None and ident not in feed.threads:
                feed.announce(ident, thread)
            feed.send(text)
        log = self.log
        if log is not None and not log.broken:
            if log.json:
                text = json_line(now, self.pid, thread, self.rank, kind, body, fields)
                size = len(text)
            try:
                if _write(log.fd, text) != size:
                    raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))  # a full disk writes short
            except OSError as error:
                if error.errno == errno.EBADF:
                    self._log_lost(log)
                    return
                log.broken = True
                self.warn(f"cannot write log file {log.name}: {error.strerror}; logging to stderr only")

    def _set_stamp(self, msec: int) -> None:
        """HH:MM:SS.mmm, with strftime once a second at most.

        Most events fall in a millisecond of their own, so this runs for most lines:
        the milliseconds are cut from str(1000 + ms), cheaper than a format spec. The C
        hook has a twin of the same-second case (new_stamp in _speedups_emit.h): change both.
        """
        self._msec = msec
        second = msec // 1000
        if second != self._second:
            self._second = second
            self._clock = CLOCKS.strftime("%H:%M:%S.", CLOCKS.localtime(second))
        self._stamp = self._clock + str(1000 + msec - second * 1000)[1:]
        self._prefix = self._head + self._stamp + "] "

    def raw(self, data: bytes, to_stderr: bool = True, to_log: bool = True) -> None:
        """Bytes as they are, to stderr (unless --stderr none) and a text log: a report's stacks."""
        if to_stderr and self.loud("stall") and self._looked_at():
            if self.partial:
                self.partial = False
                data = b"\n" + data
            self._write(self.stderr, data)
        if to_log and self.log is not None and not self.log.json:
            self._write(self.log, data)

    def warn(self, message: str) -> None:
        """A line about importwatch itself."""
        self.event(WARNING, {"message": message})

    def name_thread(self, name: str) -> None:
        """Name one of our own threads (threading knows nothing of them), here and for the watcher."""
        ident = _thread.get_ident()
        self._own_threads[ident] = name
        self._own_tids[ident] = _thread.get_native_id()
        if self.feed is not None:
            self.feed.announce(ident, name)

    def own_threads(self) -> "list[int]":
        """The idents of our own threads that named themselves (name_thread)."""
        return list(self._own_threads)

    def thread_names(self) -> str:
        """Each Python thread as faulthandler's dump names it (0x and 16 hex digits), and by its name."""
        return ", ".join(
            f"0x{ident:016x} {self.thread_name(ident)}" for ident in sorted(sys._current_frames())
        )

    def thread_name(self, ident: int) -> str:
        """The threading name of a thread, or its native id; no spaces, so lines stay parseable."""
        if ident == self.main_thread:
            return "MainThread"
        own = self._own_threads.get(ident)
        if own is not None:
            return own
        # Never import threading here: the program may not use it.
        threading = sys.modules.get("threading")
        thread = threading._active.get(ident) if threading is not None else None
        if thread is not None:
            return escape(thread.name).replace(" ", "_").replace("]", ")")
        if ident == _thread.get_ident():
            return f"thread-{_thread.get_native_id()}"
        return f"thread-{ident:#x}"

    def _stderr_again(self, error: "OSError | None" = None, arming: bool = False) -> bool:
        """Our copy of stderr was closed or replaced under us (a closerange, a dup2; ERROR, when a write
        found it): a new copy, when fd 2 is still the stderr we started with, else none (broken). Asked
        when a check or a write failed, never per write. Either way faulthandler's timer, armed with the
        lost copy, is armed again (on_lost), unless it is being armed (ARMING)."""
        stderr = self.stderr
        if error is not None and error.errno != errno.EBADF:
            return False
        again = self.stderr_is_fd2 and identity(STDERR) == stderr.ident
        if again:
            try:
                stderr.fd = high_descriptor(os.dup(STDERR))
            except OSError:
                again = False
        stderr.broken = not again  # nowhere left to say it
        self.guards = None
        if self.on_lost is not None and not arming:
            self.on_lost()
        return again

    def _write(self, channel: "Channel", data: bytes) -> None:
        error = channel.write(data)
        if error is not None and channel is self.stderr and self._stderr_again(error):
            error = channel.write(data)
        if error is not None and channel is not self.stderr:
            if error.errno == errno.EBADF:
                self._log_lost(channel)
                return
            self.warn(f"cannot write log file {channel.name}: {error.strerror}; logging to stderr only")
