"""Starts the watcher process at activation and silences it at exit (runs in the traced process).

The watcher itself (watcher/loop.py) follows the traced process's lines and reports its stalls and
death from outside.

How it is started (launch(), in the traced process, at activation):
- every text line the sink writes is appended to a ring in shared memory (sink.Feed,
  tracing/ring.py), which the watcher reads when it looks: no system call per line,
  and a slow or dead watcher costs nothing. The memfd is the watcher's to inherit; the
  program keeps only its mapping;
- a pipe tells the watcher of the end: nothing is written to it, and the watcher sees
  its end when the program exits or execs (the write end is close-on-exec). The traced
  process keeps the write end only; the lock on it is what hush takes;
- the watcher is started through an intermediate process that leaves at once: it is
  never the program's child, so the program's own os.wait() never sees it and it never
  becomes the program's zombie. With the C accelerator both processes share the
  program's memory until the exec (_speedups.spawn_detached: no copy of its page
  tables, which for a fork child of a process with torch loaded cost 10-20 ms), and a
  thread of ours does it, so the program never waits for the watcher's exec (the
  outcome is looked at later: Sink.watcher_started); the
  pure-Python twin double-forks (as does the C way where its thread cannot start),
  the watcher-to-be waiting for a go once the program has seen it was not adopted. It runs `python -I -S`, in its own session,
  with stdin and stdout on /dev/null; the stderr it holds is a dup of the program's,
  because the death line must still reach it after the program is gone. So it
  exits as soon as the program does (end of the feed, or the pidfd), and a
  pipe reader waiting for EOF on the program's stderr waits only milliseconds more.

Never a line after the program's exit: the watcher writes each burst of lines
holding an flock on the feed pipe, and the program, at its exit, takes that lock
and keeps it (hush). So a normal exit waits for a burst being written (a few
milliseconds, at most HUSH_WAIT) and the watcher says nothing more; after a death
it drops the rest of its report and writes only the death line.

What it reports: see watcher/loop.py.
"""

import errno
import os
import sys

from importwatch import config
from importwatch.facts import procstat
from importwatch.tracing.accelerator import ACCELERATOR
from importwatch.tracing.descriptors import high_descriptor, identity

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any, Callable

    from importwatch.config import Settings
    from importwatch.tracing.sink import Sink

# How long the program's exit waits for the watcher to finish the lines it is writing.
HUSH_WAIT = 1.0
# How long a second start waits for one under way (a few milliseconds; longer on a loaded machine).
_START_WAIT = 1.0
_HUSH_TRY = 0.002
# The folder importwatch is imported from: the watcher runs with -I -S, so it is put on its path.
_PACKAGE_ROOT = os.path.dirname(
    os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
)  # above importwatch/tracing/
# How hush takes the lock at the exit, chosen at the launch (no import is made at the exit): the C
# accelerator's lock_if_ours, else fcntl's flock (imported then, and held: tracing/handback.py). Called
# with the pipe's descriptor, device and inode: None when the descriptor is no longer that pipe.
_lock_now: "Callable[[int, int, int], bool | None] | None" = None
_ADOPTED = "this process is a child subreaper, so the watcher would be its child (its os.wait() would see it)"
_BOOT = "import sys; sys.path.insert(0, sys.argv.pop(1)); from importwatch.watcher.loop import main; sys.exit(main())"


def launch(
    sink: "Sink", settings: "Settings", import_own: "Callable[[str], Any]" = __import__
) -> "str | None":
    """Start the watcher for this process, with SETTINGS, and connect SINK's feed to it; returns why not, or
    None. IMPORT_OWN (Tracer.import_own) imports what it needs that is not ours, without a line."""
    executable = sys.executable and os.path.abspath(sys.executable)  # it runs from /
    refused = _refused(executable)
    if refused:
        return refused
    from importwatch.tracing import ring

    spawn = ACCELERATOR if hasattr(ACCELERATOR, "spawn_detached") else None
    if spawn is not None and spawn.child_subreaper():
        return _ADOPTED
    try:
        ring_fd, feed_ring = ring.create(ACCELERATOR, import_own)
    except (AttributeError, OSError) as error:  # no memfd_create (Linux < 3.17), or no memory
        return f"no shared memory for its feed ({getattr(error, 'strerror', None) or error})"
    try:
        read_fd, write_fd = _pipe(spawn, import_own)
        ring_fd = _above_stdio(ring_fd)
    except OSError:
        os.close(ring_fd)
        feed_ring.close()
        raise
    pid = os.getpid()
    start = _start_time(pid)
    # -B: the watcher writes no .pyc (into an editable install's source tree, say): a program run
    # with -B or PYTHONDONTWRITEBYTECODE=1 writes none, and one run without it writes its own.
    argv = [
        executable,
        "-I",
        "-S",
        "-B",
        "-c",
        _BOOT,
        _PACKAGE_ROOT,
        "--pid",
        str(pid),
        "--feed",
        str(read_fd),
        "--ring",
        str(ring_fd),
    ]
    argv += ["--start", str(start)]
    # The watcher writes to the descriptor the program opened, never re-opens the path: in a shared
    # folder the name may point elsewhere by then. The path it is given names that file.
    log_fd = sink.log.fd if settings.log and sink.log is not None and not sink.log.broken else None
    if log_fd is not None:
        argv += ["--log-fd", str(log_fd)]
    # Without IMPORTWATCH* the watcher never traces itself; -I drops the other PYTHON* variables.
    env, options = config.for_child(settings.replace(log=sink.log_path if log_fd is not None else None))
    argv += ["--", *options]
    stderr = sink.stderr.fd  # the pytest plugin writes to a copy of stderr taken before capture
    inherited = (read_fd, ring_fd, log_fd)
    if spawn is not None and _spawned(spawn, executable, argv, env, stderr, inherited, (ring_fd, read_fd)):
        # A thread of ours starts it, and closes the ring's and the pipe's read end then: the watcher
        # holds its own; the program, only the mapping.
        sink.attach_feed(write_fd, feed_ring, starting=_started)
        return None
    # The watcher-to-be waits for a go on GO.
    go_read, go_write = os.pipe()
    watcher = _double_fork(executable, argv, env, stderr, (go_read, go_write), inherited)
    os.close(ring_fd)  # the watcher-to-be holds its own; the program, only the mapping
    os.close(read_fd)  # the watcher's too
    # Orphaned by the intermediate child, the watcher goes to the nearest child subreaper: if that
    # is this process (PR_SET_CHILD_SUBREAPER survives exec), it is our child and must not run.
    adopted = watcher > 0 and _is_child(watcher)
    if not watcher or adopted:
        os.close(go_write)  # the watcher-to-be reads the end of the pipe and leaves
        if adopted:
            os.waitpid(watcher, 0)  # reaped here: the program's os.wait() never sees it
        os.close(write_fd)
        feed_ring.close()
        return _ADOPTED if adopted else "it could not be spawned"
    os.write(go_write, b"1")
    os.close(go_write)
    sink.attach_feed(write_fd, feed_ring)
    return None


def _spawned(
    spawn: "Any",
    executable: str,
    argv: "list[str]",
    env: "dict[str, str]",
    stderr: int,
    inherited: "tuple[int | None, ...]",
    closed: "tuple[int, ...]",
) -> bool:
    """The C way (_speedups.spawn_detached): a thread of ours starts the watcher while the program goes
    on, nothing of the program copied, no go needed (the subreaper was asked first); it closes CLOSED
    then. False where that thread could not be started: then the double fork tries."""
    try:
        spawn.spawn_started(_START_WAIT)  # an earlier start (a reconfiguration's) has ended
    except OSError:
        pass  # said where it was found, or never to be: that watcher is not this one
    try:
        spawn.spawn_detached(
            os.fsencode(executable),
            [os.fsencode(word) for word in argv],
            [os.fsencode(name) + b"=" + os.fsencode(value) for name, value in env.items()],
            stderr,
            tuple(fd for fd in inherited if fd is not None),
            closed,
        )
    except (OSError, ValueError, RuntimeError):  # ValueError: a descriptor it cannot pass on
        return False
    return True


def _started(wait: float) -> "int | None":
    """How the C start under way went (Sink.watcher_started): the watcher's pid, or None while under way.

    OSError where it failed; EBADF, from our thread, means a descriptor to hand on was no longer
    ours: the program closed it (a closerange at its start) before the watcher had its copy. It
    imports nothing: a step in a finaliser at the very end may be the first to look.
    """
    try:
        return ACCELERATOR.spawn_started(wait)
    except OSError as error:
        if error.errno == errno.EBADF:
            raise OSError(errno.EBADF, "the program closed its descriptors before it could start") from None
        raise


def _refused(executable: str) -> "str | None":
    """Why no watcher may be started from this process, or None."""
    if not executable:
        return "no python executable to run it with"
    threading = sys.modules.get("threading")
    if threading is not None and threading.active_count() > 1:
        return "the program already runs threads, and forking now could deadlock"
    if os.getpid() == 1:
        return "this process is PID 1, so the watcher would be its child (its os.wait() would see it)"
    return None


def _double_fork(
    executable: str,
    argv: "list[str]",
    env: "dict[str, str]",
    stderr: int,
    go: "tuple[int, int]",
    inherited: "tuple[int | None, ...]",
) -> int:
    """Fork a child that forks the watcher-to-be (waiting on GO's read end) and leaves at once.

    Returns the watcher-to-be's pid, or 0 when it could not be spawned. GO's read end is closed here.
    """
    # The intermediate child tells the watcher's pid on INFO.
    info_read, info_write = os.pipe()
    child = os.fork()
    if child == 0:  # pragma: no cover  (the intermediate child: fork again and leave at once)
        code = 1
        try:
            watcher = os.fork()
            if watcher == 0:
                _exec_watcher(executable, argv, env, stderr, go, inherited)
            os.write(info_write, str(watcher).encode("ascii"))
            code = 0
        finally:
            os._exit(code)
    os.close(go[0])
    os.close(info_write)
    _, status = os.waitpid(child, 0)
    told = os.read(info_read, 32)
    os.close(info_read)
    return int(told) if status == 0 and told.isdigit() else 0


def _exec_watcher(
    executable: str,
    argv: "list[str]",
    env: "dict[str, str]",
    stderr: int,
    go: "tuple[int, int]",
    inherited: "tuple[int | None, ...]",
) -> None:  # pragma: no cover  (the watcher-to-be, forked: it execs or leaves)
    """Wait for the go, then become the watcher: its own session, no terminal, stdin and stdout on
    /dev/null, STDERR on 2, the INHERITED descriptors kept, and a working directory where nobody else
    can put a program or module."""
    go_read, go_write = go
    os.close(go_write)  # so that the parent's close is the end of the pipe
    if os.read(go_read, 1) != b"1":
        os._exit(0)
    os.setsid()
    os.chdir("/")
    for fd, mode in ((0, os.O_RDONLY), (1, os.O_WRONLY)):
        null = os.open(os.devnull, mode)
        if null != fd:
            os.dup2(null, fd)
            os.close(null)
    if stderr != 2:
        os.dup2(stderr, 2)
    for fd in inherited:
        if fd is not None:
            os.set_inheritable(fd, True)
    os.execve(executable, argv, env)


def _is_child(pid: int) -> bool:
    """Whether PID is a child of this process (the call reaps it only if it has ended already)."""
    try:
        os.waitpid(pid, os.WNOHANG)
    except ChildProcessError:
        return False
    return True


def hush(sink: "Sink") -> None:
    """At the program's exit: tell the watcher, let it finish the lines it is writing, silence it.

    The lock taken here is held until the process is gone, so once the parent has
    the exit status no line of the watcher follows the program's own last output.
    """
    import time

    feed = sink.feed
    lock_now = _lock_now
    if feed is None or feed.closed or feed.ident is None or lock_now is None:
        return  # (closed: the program took the pipe's number over, and a lock there would be on its file)
    sink.watcher_started()  # where its start failed, said (and nothing to silence)
    if sink.feed is None:
        return
    sink.feed_line("#exit")
    # Counted in tries, not by the clock: a debugger that stops this process meanwhile (the
    # watcher's, reading stacks it will write once it lets go) must not use up the wait. Each try
    # looks first that the number is still our pipe's: the program may have put a file of its own
    # there since our last look (no step checks this descriptor, which nothing is written to).
    for _ in range(int(HUSH_WAIT / _HUSH_TRY)):
        try:
            taken = lock_now(feed.fd, *feed.ident)
        except OSError:
            return
        if taken is None:
            feed.closed = True
            return
        if taken:
            return
        time.sleep(_HUSH_TRY)
    # A watcher stopped or stuck while holding it: the exit does not wait longer.


def _pipe(accelerator: "Any", import_own: "Callable[[str], Any]") -> "tuple[int, int]":
    """A pipe whose ends are above 2 (stdin may be closed): the watcher's sign of the end, and the lock of hush.

    Also chooses how hush will take that lock: with the C ACCELERATOR, no fcntl at start-up; else
    fcntl through IMPORT_OWN (held at exit, tracing/handback.py, or the program's; never imported then).
    """
    global _lock_now
    if _lock_now is None:
        _lock_now = getattr(accelerator, "lock_if_ours", None)  # (none in a build older than this file)
        if _lock_now is None:
            fcntl = import_own("fcntl")

            def flock_if_ours(fd: int, device: int, inode: int, fcntl: "Any" = fcntl) -> "bool | None":
                if identity(fd) != (device, inode):
                    return None
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                except BlockingIOError:
                    return False
                return True

            _lock_now = flock_if_ours
    read_fd, write_fd = os.pipe()
    return _above_stdio(read_fd), _above_stdio(write_fd)


def _above_stdio(fd: int) -> int:
    """A close-on-exec copy of FD in its place, where our other descriptors go (descriptors.py), never at
    0, 1 or 2: the watcher-to-be puts /dev/null on 0 and 1.

    Even those that the watcher's start closes again take no number of the program's while the
    program runs beside that start (its first files would get other numbers, a scan would find them).
    No fcntl's F_DUPFD, whose import would be one more module at start-up, or an import in a fork
    child's log.
    """
    moved = high_descriptor(fd)
    if moved <= 2:
        os.close(moved)
        raise OSError(errno.EMFILE, "no descriptor free above 2 for the watcher's pipe")
    return moved


def _start_time(pid: int) -> int:
    fields = procstat.fields(f"/proc/{pid}/stat")
    if fields is None:
        raise OSError(f"cannot read /proc/{pid}/stat")
    return int(fields[procstat.START_TIME])
