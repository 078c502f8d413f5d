"""What inspect concludes from the threads it read: the hang or problem each one shows, and the
command lines that rerun the program under importwatch to see more."""

from __future__ import annotations

import os

from importwatch.facts import process, waits
from importwatch.tools.commands import join, quote

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Sequence


def hang_problems(
    pid: int,
    threads: list[dict],
    stat: process.ProcessStat | None,
    samples: dict[int, process.ThreadSample],
) -> list[str]:
    """The process stopped, a thread hung in an import or a load, a thread waiting for stdin."""
    problems = []
    if stat is not None and stat.state in "Tt":
        # state_name already says "stopped" (or "stopped by a debugger"): it is not repeated.
        problems.append(f"process {pid} is {stat.state_name}: nothing runs; kill -CONT {pid} resumes it")
    for thread in threads:
        label = f"{thread['name']} (tid {thread['tid']})"
        idle = f", no CPU for {thread['last_ran']:.1f} s" if thread.get("last_ran") is not None else ""
        if thread["chain"] and thread["verdict"] == process.WAITING:
            problems.append(f"{label} hangs in import {' > '.join(thread['chain'])} {_where(thread, idle)}")
        elif thread.get("waits_for") and thread["verdict"] == process.WAITING:
            problems.append(f"{label} waits ({thread['verdict']}{idle}): {thread['waits_for']}")
        elif thread.get("load") and thread["verdict"] == process.WAITING:
            load = thread["load"]
            problems.append(
                f"{label} hangs loading {load['file'] or load['initialising']} ({load['how']}{idle})"
            )
        sample = samples.get(thread["tid"])
        if thread["verdict"] != process.BUSY and sample is not None and _reads_stdin(sample):
            problems.append(f"{label} waits for input on stdin: {waits.describe_fd(pid, 0)}")
    return problems


def pool_problem(
    pid: int,
    threads: list[dict],
    samples: dict[int, process.ThreadSample],
    code: process.CodeRanges,
    exe: str,
) -> list[str]:
    """The process's only thread waits for an OpenMP pool whose threads are not in it (a fork child
    of a parent that ran a parallel region): one line, the first, since it is the whole answer."""
    from importwatch.facts import pools

    for sample in samples.values():
        library = pools.orphaned_wait(pid, sample, code)
        if library is not None:
            break
    else:
        return []
    tid = sample.tid
    stat = process.process_stat(pid)
    parent = stat.ppid if stat is not None else None
    # Forked, not started: the parent runs the same program and has the runtime mapped.
    parent_maps = process.read_file(f"/proc/{parent}/maps", 1 << 26) if parent else None
    forked = parent_maps is not None and library.encode() in parent_maps and _exe(parent) == exe
    thread = next((t for t in threads if t["tid"] == tid), {"name": "thread", "tid": tid})
    return [
        f"{thread['name']} (tid {thread['tid']}) {pools.orphaned_pool(library, parent if forked else None)}"
    ]


def _exe(pid: int | None) -> str | None:
    try:
        return os.readlink(f"/proc/{pid}/exe")
    except OSError:
        return None


def _reads_stdin(sample: process.ThreadSample) -> bool:
    """True when the thread is blocked in a read of fd 0."""
    call = sample.syscall
    return (
        bool(call)
        and len(call) > 1
        and call[1] == 0
        and waits.SYSCALLS.get(call[0], ("",))[0] in ("read", "readv")
    )


def _where(thread: dict, idle: str) -> str:
    """Where in its import a waiting thread is: the lock and its holder, the load, or the frame."""
    text = f"({thread['verdict']}{idle})"
    if thread.get("lock_holder"):
        return text + f": waiting for the import lock of {thread['lock']}, held by {thread['lock_holder']}"
    if thread.get("load"):
        load = thread["load"]
        text += f": {load['how']}, loading {load['file'] or load['initialising']}"
        if load["initialising"] and load["initialising"] != load["file"]:
            text += f", initialising {load['initialising']}"
        return text
    if thread.get("waits_for"):
        return text + f": {thread['waits_for']}"
    if thread.get("doing"):
        return text + f": {thread['doing']}"
    return text


def rerun_commands(cmdline: Sequence[str], cwd: str | None, interpreter: str, search: Sequence[str]) -> dict:
    """The command lines that rerun the program under importwatch, and whether it must be installed first."""
    if not cmdline:
        return {}
    quoted = join(cmdline)
    prefix = f"cd {quote(cwd)} && " if cwd else ""
    commands = {"env": f"{prefix}IMPORTWATCH=1 {quoted}"}
    words = list(cmdline[1:])
    options = []
    while (
        words
        and words[0].startswith("-")
        and words[0] not in ("-m", "-c", "-")
        and not words[0].startswith(("-m", "-c"))
    ):
        options.append(words.pop(0))
    if os.path.basename(cmdline[0]).startswith("python"):
        rest = join([*options, "-m", "importwatch", *words])
        commands["module"] = f"{prefix}{quote(cmdline[0])} {rest}"
    installed = any(
        os.path.isfile(os.path.join(entry, "importwatch", "__init__.py")) for entry in search if entry
    )
    if not installed:
        commands["install"] = f"{quote(interpreter)} -m pip install importwatch"
    return commands
