"""importwatch inspect PID: the command line, and the report assembled from what the readers find.

Everything is read, nothing is sent to the process, no signal and no code: /proc
(process.py, and facts/process.py's and facts/waits.py's verdicts on each thread),
its interpreter's search path asked in a separate process (interpreter.py), its
stacks through whichever helper is installed (facts/stacks.py), what they show (analysis.py),
the files it has mapped (libraries.py), the conclusions (verdicts.py),
and the text or JSON (render.py).
"""

from __future__ import annotations

import os
import sys
import time

from importwatch.facts import cuda, dists, waits
from importwatch.facts import process as proc
from importwatch.facts.stacks import read_stacks
from importwatch.masking import mask_argv
from importwatch.tools.inspection import process
from importwatch.tools.inspection.analysis import holders, import_state, load_of
from importwatch.tools.inspection.cycles import relations
from importwatch.tools.inspection.gilcross import gil_deadlock
from importwatch.tools.inspection.interpreter import interpreter_facts, search_path, version_from_maps
from importwatch.tools.inspection.libraries import find_torch_for, library_facts
from importwatch.tools.inspection.render import render, render_json, short_native
from importwatch.tools.inspection.verdicts import hang_problems, pool_problem, rerun_commands
from importwatch.tools.inspection.waitfor import asleep, waits_for
from importwatch.usage import UsageError, argument_parser, fail

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Sequence

    from importwatch.facts.cuda import TorchFacts
    from importwatch.facts.stacks import Stacks

EXIT_OK = 0
EXIT_PROBLEM = 1

# How long to watch the threads' CPU time to tell busy from waiting.
WINDOW = 0.5


# -- the command line ---------------------------------------------------------------------------
def _parser():

    parser = argument_parser(
        prog="importwatch inspect",
        description=(
            "Diagnose a running Python process started without importwatch, from outside: what each "
            "thread waits on, the import in flight, the shared object being initialised and what it "
            "needs. The process is never signalled nor changed; a debugger stops it only while it "
            "reads its stacks, and is never attached to a process that is stopped or already being "
            "debugged. Exit status 0 when nothing is suspect, 1 when a hang or problem is named, "
            "2 on bad usage."
        ),
    )
    parser.add_argument("pid", metavar="PID", help="the process to inspect")
    parser.add_argument("--json", action="store_true", help="print the report as one JSON object")
    parser.add_switch(
        "--native", True, "read the native (C) stacks too, with gdb, py-spy or pystack (default: on)"
    )
    return parser


def main(args: list[str]) -> int:
    """`importwatch inspect PID`: 0 nothing suspect, 1 a hang or problem named, 2 bad usage."""
    try:
        options = _parser().parse_args(args)
        pid = check_target(options.pid)
    except UsageError as error:
        return fail(f"inspect: {error}")
    except SystemExit as exit:  # --help
        return int(exit.code or 0)
    report = inspect(pid, native=options.native)
    sys.stdout.write(render_json(report) if options.json else render(report))
    sys.stdout.flush()
    return EXIT_PROBLEM if report["problems"] else EXIT_OK


def check_target(text: str) -> int:
    """The pid, once it names a live Python process this user may read; else a UsageError."""
    try:
        pid = int(text)
    except ValueError:
        raise UsageError(f"{text!r} is not a process id") from None
    if pid <= 0:
        raise UsageError(f"{text!r} is not a process id")
    if pid == os.getpid():
        raise UsageError("cannot inspect itself")
    stat = proc.process_stat(pid)
    if stat is None or stat.state in "ZX":
        raise UsageError(f"no such process: {pid}")
    try:
        # Opened here, not through proc.read_file: a refusal must be told from a process gone.
        with open(f"/proc/{pid}/maps", "rb") as file:
            maps = file.read(1 << 26).decode("utf-8", "replace")
    except PermissionError:
        raise UsageError(
            f"not permitted to read process {pid}{process.owner(pid)}: run inspect as that user, or as root"
        ) from None
    except OSError:
        raise UsageError(f"no such process: {pid}") from None
    name = os.path.basename(process.exe(pid) or "")
    if not (name.startswith("python") or "/libpython" in maps):
        raise UsageError(f"process {pid} ({proc.command_of(pid)}) is not a Python process")
    return pid


# -- the report -------------------------------------------------------------------------------------
class _Target:
    """What the whole report reads about the process: read once, before its threads are watched."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.cmdline = process.cmdline(pid)
        self.exe = process.exe(pid) or ""
        self.cwd = process.cwd(pid)
        self.environ = process.environ(pid)
        self.stat = proc.process_stat(pid)
        self.unseen: list[str] = []
        if self.environ is None:
            self.unseen.append("its environment (/proc/PID/environ is not readable)")
        self.mapped = process.mapped_objects(pid)
        argv0 = self.cmdline[0] if self.cmdline else self.exe
        version, asked, self.interpreter, why = interpreter_facts(
            pid, self.exe, argv0, self.cwd, self.environ
        )
        if why:
            self.unseen.append(why)
        self.version = version or version_from_maps(self.exe, self.mapped)
        self.search = search_path(asked, self.cmdline, self.cwd, self.mapped)
        self.code: proc.CodeRanges | None = None  # read when a thread without native frames needs it

    def code_ranges(self) -> proc.CodeRanges:
        if self.code is None:
            self.code = proc.CodeRanges(self.pid)
        return self.code


def inspect(pid: int, native: bool = True) -> dict:
    """Every fact inspect reads about PID, and the problems it names, as the JSON object --json prints."""
    target = _Target(pid)
    before = proc.sample_threads(pid)
    time.sleep(WINDOW)
    samples = proc.sample_threads(pid, detail=True)
    ran = process.last_ran(pid, list(samples))
    stacks = read_stacks(pid, native, target.version)
    unseen = target.unseen + stacks.unseen
    if samples and all(sample.syscall is None for sample in samples.values()):
        blocked = proc.ptrace_blocker(pid)
        if blocked:
            unseen.append(f"the system calls threads are blocked in: {blocked}")
    torch = find_torch_for(target.mapped, target.search, target.environ or {})
    driver = cuda.driver_version()
    threads = [_thread(target, sample, before.get(tid), ran, stacks) for tid, sample in samples.items()]
    holders(threads)
    deadlock = gil_deadlock(pid, threads, samples, stacks.native)
    libraries = _libraries(threads, torch, driver)
    # Who waits for whom comes first: a deadlock's one line is the answer, each thread's wait its detail.
    problems = [deadlock] if deadlock else []
    problems += pool_problem(pid, threads, samples, target.code_ranges(), target.exe)
    problems += relations(pid, threads, stacks.python) + hang_problems(pid, threads, target.stat, samples)
    problems += [f"! {text}" for lib in libraries for text in lib["verdicts"]]
    # A report is pasted into tickets: secret-looking values are masked there too, the rerun
    # commands included (the person rerunning types the secret back in).
    cmdline = mask_argv(target.cmdline)
    return {
        "pid": pid,
        "cmdline": cmdline,
        "exe": target.exe,
        "interpreter": target.interpreter,
        "cwd": target.cwd,
        "python": target.version,
        "started": process.started(target.stat),
        "state": target.stat.state_name if target.stat else None,
        "idle": min(ran.values()) if ran else None,
        "tool": stacks.tool or None,
        "torch": {"path": torch.path, "version": torch.version, "build": torch.build} if torch else None,
        "driver": driver,
        "threads": threads,
        "libraries": libraries,
        "problems": problems,
        "unseen": unseen,
        "rerun": rerun_commands(cmdline, target.cwd, target.interpreter, target.search),
    }


def _thread(
    target: _Target,
    sample: proc.ThreadSample,
    before: proc.ThreadSample | None,
    ran: dict[int, float],
    stacks: Stacks,
) -> dict:
    """One thread's entry: its state and verdict from /proc, its import and load from its stacks."""
    pid, tid = target.pid, sample.tid
    share = proc.cpu_share(before, sample, WINDOW)
    what = proc.verdict(sample, share)
    frames = stacks.python.get(tid, [])
    imports = import_state(frames)
    native_lines = stacks.native.get(tid, [])
    entry: dict = {
        "tid": tid,
        "name": stacks.names.get(tid) or ("MainThread" if tid == pid else sample.comm),
        "state": sample.state_name,
        "wchan": sample.wchan or None,
        "verdict": what,
        "cpu": round(share, 3) if share is not None else None,
        "last_ran": round(ran[tid], 3) if tid in ran else None,
        "waits_on": waits.waits_on(pid, sample) if what != proc.BUSY else None,
        "waits_for": waits_for(pid, frames, target.version, ran.get(tid), asleep(sample.syscall)),
        **imports,
        "python": [frame.describe() for frame in frames],
        "native": short_native(native_lines),
    }
    # Without a native stack, the libraries whose code addresses lie on its stack stand in.
    on_stack = [] if native_lines else proc.libraries_on_stack(pid, sample, target.code_ranges())
    load = load_of(imports, native_lines, on_stack, target.exe, target.search, target.mapped)
    if load is not None:
        entry["load"] = load
    return entry


def _libraries(threads: Sequence[dict], torch: TorchFacts | None, driver: str | None) -> list[dict]:
    """The facts and verdicts of each shared object being loaded or initialised, each once."""
    owners = dists.Owners()
    libraries: dict[str, dict] = {}
    for thread in threads:
        load = thread.get("load") or {}
        for path in (load.get("file"), load.get("initialising")):
            if path and path not in libraries:
                libraries[path] = library_facts(path, torch, driver, owners)
    return list(libraries.values())
