"""The children the offline tools run (bisect's tries, doctor's checks): their process group killed, and the
last line of their stderr read."""

from __future__ import annotations

import os
import signal

from importwatch.facts.stacks import last_line

TYPE_CHECKING = False
if TYPE_CHECKING:
    import subprocess

# How much of the end of a child's stderr is read for its last line (a traceback's message).
TAIL_BYTES = 1 << 16


def kill_group(child: subprocess.Popen) -> None:
    """SIGKILL the whole process group CHILD leads (started with start_new_session), then reap CHILD.

    What it started goes too: a fixture's own children never outlive the try or the check.
    """
    try:
        os.killpg(child.pid, signal.SIGKILL)
    except OSError:
        pass  # the group is empty already
    child.wait()


def last_line_of(path: str, skip: tuple[str, ...] = ("[importwatch ",)) -> str | None:
    """The last line of the file at PATH (a child's stderr) that is not blank and starts with none of SKIP,
    stripped (stacks.last_line); None when there is none or the file cannot be read."""
    try:
        with open(path, "rb") as file:
            file.seek(0, os.SEEK_END)
            file.seek(max(0, file.tell() - TAIL_BYTES))
            text = file.read().decode("utf-8", "replace")
    except OSError:
        return None
    return last_line(text, None, skip)
