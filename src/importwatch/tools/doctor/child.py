"""doctor's children: run one check in its own process group, killed at its time limit, watched from outside."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import importwatch
from importwatch import config
from importwatch.facts.procstat import read_file
from importwatch.tools.children import kill_group, last_line_of

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Sequence

SAMPLE_INTERVAL = 0.25

# The folder importwatch is imported from (site-packages, or a source tree).
_PACKAGE_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(importwatch.__file__)))


def child_env(extra_path: Sequence[str]) -> dict[str, str]:
    """Ours, minus IMPORTWATCH* settings (the child's options say all), plus folders given to --packages.

    The children run in a folder of their own (see run_child): a relative PYTHONPATH
    entry is made absolute from here, and importwatch itself stays importable when
    only the working directory held it.
    """
    env = config.for_child()[0]
    entries = [*extra_path, *env.get("PYTHONPATH", "").split(os.pathsep)]
    entries = [os.path.abspath(entry) for entry in entries if entry]
    if _PACKAGE_ROOT not in entries and _PACKAGE_ROOT not in sys.path[1:]:
        entries.append(_PACKAGE_ROOT)
    if entries:
        env["PYTHONPATH"] = os.pathsep.join(entries)
    return env


class _OutsideLook:
    """The outside view of a child while it runs: its main thread's state and CPU, sampled.

    The child's own watcher may stop it for a moment with a debugger, to read its
    native stacks: a look that finds it so is no verdict, and the CPU share is only
    measured between two looks with no such stop in between (a busy thread stopped
    would look idle).
    """

    def __init__(self, pid: int) -> None:
        from importwatch.facts import process, waits

        self.facts = (process, waits)
        self.pid = pid
        self.last = None  # (time, ThreadSample of the main thread), since no stop of ours
        self.view: str | None = None

    def sample(self) -> None:
        process, waits = self.facts
        try:
            if process.traced_by_us(self.pid):
                self.last = None  # the watcher's debugger holds it: the next share starts after it
                return
            now = time.monotonic()
            if self.last is not None and now - self.last[0] < SAMPLE_INTERVAL:
                return
            threads = process.sample_threads(self.pid, detail=True)
            main = threads.get(self.pid)
            tracer = process.tracer_pid(self.pid)
            # Stopped by a debugger that is ours now, or gone since: the watcher's, letting go.
            ours = process.traced_by_us(self.pid, tracer) or (
                main is not None and main.state == "t" and not tracer
            )
            if main is None or ours:
                self.last = None
                return
            share = process.cpu_share(self.last[1], main, now - self.last[0]) if self.last else None
            self.last = (now, main)
            if share is None and self.view is not None:
                # The first look after a stop of ours: a thread let go runs for a moment (a sleep
                # restarts, a read resumes) and looks busy. The view from before the stop stands
                # until a second look measures a share.
                return
            state = process.verdict(main, share)
            if state == process.GONE or _being_killed(self.pid):
                # Ended or ending (its watcher kills a stopped child; a stopped process runs for
                # a moment to die): the view from before the end stands.
                return
            cpu = f", {share * 100:.0f}% CPU" if share is not None else ""
            waiting = waits.waits_on(self.pid, main) if state != process.BUSY else None
            others = len(threads) - 1
            more = f"; {others} other thread{'s' if others != 1 else ''}" if others else ""
            shown = process.state_words(main.state_name, state)  # never "waiting: main thread running"
            self.view = f"{state}: main thread {shown}{cpu}" + (f", {waiting}" if waiting else "") + more
        except Exception:  # a look from outside may fail; the check goes on without it
            return


def _being_killed(pid: int) -> bool:
    """Whether PID has a SIGKILL pending or has ended: what it shows now is its end, not its hang."""
    status = read_file(f"/proc/{pid}/status", 1 << 16) or b""
    for line in status.splitlines():
        if line.startswith(b"State:") and line.split()[1:2] in ([b"Z"], [b"X"]):
            return True
        if line.startswith((b"SigPnd:", b"ShdPnd:")):
            try:
                if int(line.split()[1], 16) & (1 << (9 - 1)):
                    return True
            except (IndexError, ValueError):
                pass
    return not status


def run_child(
    command: list[str], limit: float, env: dict[str, str], stdout: int, stderr: int, cwd: str
) -> tuple[int | None, float, str | None]:
    """Run COMMAND in CWD, in its own process group; kill the group at LIMIT seconds.

    CWD is the check's own private folder: `python -c` and `-m` put the working
    directory first on sys.path, and a json.py left in the user's folder must not
    run, nor stand in for what the check names.
    Returns (exit status, or None when killed; seconds; the outside view just before the end).
    """
    started = time.monotonic()
    process = subprocess.Popen(
        command,
        stdin=subprocess.DEVNULL,
        stdout=stdout,
        stderr=stderr,
        env=env,
        cwd=cwd,
        start_new_session=True,
    )
    status: int | None = None
    try:  # from here on the group is killed whatever stops us (a signal: see trials.Terminated)
        watch = _OutsideLook(process.pid)
        while True:
            try:
                status = process.wait(0.05)
                break
            except subprocess.TimeoutExpired:
                pass
            if time.monotonic() - started >= limit:
                kill_group(process)
                status = None
                break
            watch.sample()
    finally:
        if process.returncode is None:
            kill_group(process)
    # Anything the child left behind in its group goes with it.
    kill_group(process)
    return status, time.monotonic() - started, watch.view


def last_error_line(path: str) -> str | None:
    """The last line of a traceback on the child's stderr: "RuntimeError: boom"."""
    return last_line_of(path, skip=("[importwatch ", " ", "\t"))
