"""Ending a job for a stall (--exit-on-stall), from the heartbeat: what the stalled import started
goes with it, its stdout is written out where that can be done safely, and the line says so.

Loaded (without a line) when the watchdog starts with --exit-on-stall: nothing may be imported
while the program is stalled, perhaps inside the import system.
"""

import _thread
import os
import sys

from importwatch.events import EXIT
from importwatch.facts import family
from importwatch.tracing import threads

TYPE_CHECKING = False
if TYPE_CHECKING:
    from importwatch.tracing.sink import Sink

# How long the program's stdout may take to be written out before the job ends without it.
_FLUSH_WAIT = 0.5


def end_job(sink: "Sink", began_ago: float) -> None:
    """End this process with status 1: the program's stdout written out, then the processes the stalled
    step started (it began BEGAN_AGO seconds ago) and their descendants ended, then the EXIT line."""
    # The output first: once its child is gone, the stalled thread could run on meanwhile.
    flushed = _flush_program_output()
    ended = family.end(family.descendants(os.getpid(), family.boot_ticks(began_ago)))
    message = "--exit-on-stall"
    if ended:
        message += f"; ended what it started: {', '.join(ended).replace('(', '[').replace(')', ']')}"
    if not flushed:
        message += f"; its stdout could not be written out within {_FLUSH_WAIT:g} s"
    sink.event(EXIT, {"status": 1, "message": message})
    if sink.feed is not None:
        from importwatch.tracing.watcher_launch import hush  # loaded already: it started the watcher

        hush(sink)
    os._exit(1)


def _flush_program_output() -> bool:
    """Write out what the program's sys.stdout and sys.stderr hold (os._exit would drop it); False
    when that did not finish in time.

    A buffered stream has a lock, and the stalled thread may hold it (stalled in a write to a full
    pipe, say): a flush here would then wait for ever. So the flush runs in a thread of its own that
    is given _FLUSH_WAIT seconds, after which the job ends without it (os._exit ends that thread too).
    """
    done = _thread.allocate_lock()
    done.acquire()

    def flush() -> None:
        try:
            for stream in (sys.stdout, sys.stderr):
                try:
                    if stream is not None:
                        stream.flush()
                except Exception:  # a closed stream, a broken pipe: nothing to save there
                    pass
        finally:
            done.release()

    try:
        threads.start(flush)
    except RuntimeError:
        return False
    return done.acquire(timeout=_FLUSH_WAIT)
