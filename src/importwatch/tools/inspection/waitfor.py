"""What a thread waits for beyond imports, from its frames' arguments and locals (py-spy, pystack):
a .pth line site runs before the program starts, a DNS lookup and its host, a loop retrying a
connection (retryloop.py)."""

from __future__ import annotations

import os

from importwatch.facts import resolver, waits
from importwatch.tools.inspection.retryloop import retry_loop

# The syscalls time.sleep waits in.
_SLEEPS = ("clock_nanosleep", "nanosleep", "select", "pselect6")

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Sequence

    from importwatch.facts.stacks import StackFrame


def waits_for(
    pid: int, frames: Sequence[StackFrame], version: str | None, idle: float | None, asleep: bool = False
) -> str | None:
    """In words, what the thread with FRAMES (innermost first) waits for; None when nothing is known.

    IDLE is how long the thread has not run: a lookup blocked that long has had no answer. ASLEEP:
    the thread is in a sleep's syscall (a frame read without its line is then placed at a sleep).
    """
    if frames and frames[0].function.rsplit(".", 1)[-1] == "getaddrinfo" and _in(frames[0], "socket"):
        servers = resolver.queried(pid)
        host = frames[0].values.get("host")
        return resolver.lookup(host or None, servers[0] if servers else None, idle, pid)
    for frame in frames:
        if frame.function == "addpackage" and _in(frame, "site"):
            return "in site, before the program starts: " + _pth_line(pid, frame, version)
    if frames and not frames[0].in_importlib:
        return retry_loop(pid, frames[0], asleep)
    return None


def asleep(call: list[int] | None) -> bool:
    """Whether a thread's syscall CALL (/proc's syscall line) is a sleep: time.sleep's clock_nanosleep,
    or select before 3.11."""
    return bool(call) and waits.SYSCALLS.get(call[0], ("",))[0] in _SLEEPS  # type: ignore[index]


def _in(frame: StackFrame, module: str) -> bool:
    """Whether FRAME is in the standard module MODULE (`<frozen site>`, `.../socket.py`)."""
    return frame.filename in (f"<frozen {module}>", f"{module}.py") or frame.filename.endswith(
        f"/{module}.py"
    )


def _pth_line(pid: int, frame: StackFrame, version: str | None) -> str:
    """`running line N of /path/x.pth` from site.addpackage's arguments and locals, else what /proc shows."""
    values = frame.values
    path = values.get("fullname") or (
        os.path.join(values["sitedir"], values["name"]) if "sitedir" in values and "name" in values else None
    )
    if path is None:
        path = _open_pth(pid)  # site keeps the file open while its lines run, before 3.13
    number = values.get("n", "")
    if number.isdigit():
        # site's loop counts lines from 1 since 3.13, from 0 before.
        first = 0 if _at_least(version, (3, 13)) else 1
        where = f"line {int(number) + first} of {path or 'a .pth file'}"
    else:
        where = f"an import line of {path or 'a .pth file'}"
    return f"running {where}; python -m importwatch cannot start past it, IMPORTWATCH=1 shows its imports"


def _open_pth(pid: int) -> str | None:
    try:
        fds = os.listdir(f"/proc/{pid}/fd")
    except OSError:
        return None
    for fd in fds:
        try:
            target = os.readlink(f"/proc/{pid}/fd/{fd}")
        except OSError:
            continue
        if target.endswith(".pth"):
            return target
    return None


def _at_least(version: str | None, wanted: tuple[int, int]) -> bool:
    try:
        return tuple(int(part) for part in (version or "").split(".")[:2]) >= wanted
    except ValueError:
        return False
