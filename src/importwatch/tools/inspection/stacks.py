"""Reads another process's stacks: py-spy, pystack and gdb run from outside, their output parsed per thread.

py-spy reads the Python frames without stopping the process (--nonblocking), and
pystack (--no-block) when py-spy is absent or read nothing; gdb reads the native frames, and the Python ones through the interpreter's debug
symbols (gdb_frames.py, sourced by its absolute path). Neither is started
where it could change the process: no debugger on a process that is stopped
(attaching and detaching may let it run on, and its parent would see it) or
that another debugger holds; there py-spy --nonblocking or pystack --no-block reads it, and
/proc tells the rest.
"""

from __future__ import annotations

import os

from importwatch.watcher import outside

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable, Iterator, Sequence

HELPER_TIMEOUT = 60.0
BOOTSTRAP = ("<frozen importlib._bootstrap>", "<frozen importlib._bootstrap_external>")
# importlib's functions whose first argument is the module name an import is for.
NAMED = ("_find_and_load", "_find_and_load_unlocked", "_lock_unlock_module")
# The markers gdb_frames.py prints: one thread, one frame, the end and how it went.
THREAD, FRAME, END = "@@importwatch-thread", "@@importwatch-frame", "@@importwatch-end"
# The notes of a Python-frame reader that read nothing, dropped once another one read them.
READ_NONE = ("py-spy read no", "pystack read no")
GDB_SCRIPT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "gdb_frames.py")


class StackFrame:
    """One Python frame: function, file, line (None when unknown), the module name importlib was given."""

    __slots__ = ("argument", "filename", "function", "line")

    def __init__(self, function: str, filename: str, line: int | None = None, argument: str = "") -> None:
        self.function = function
        self.filename = filename
        self.line = line
        self.argument = argument

    @property
    def in_importlib(self) -> bool:
        return self.filename in BOOTSTRAP

    def describe(self) -> str:
        where = f"{self.filename}:{self.line}" if self.line else self.filename
        return f"{self.function} ({where})"


def described_in_importlib(described: str) -> bool:
    """True when StackFrame.describe() wrote DESCRIBED for one of importlib's own frames."""
    return described.split(" (", 1)[-1].startswith(BOOTSTRAP)


class Stacks:
    """What the helpers read: Python frames and native frames per thread id, innermost first."""

    def __init__(self) -> None:
        self.tool = ""
        self.python: dict[int, list[StackFrame]] = {}
        self.native: dict[int, list[str]] = {}
        self.names: dict[int, str] = {}
        self.unseen: list[str] = []

    def read_with(self, tool: str) -> None:
        self.tool = f"{self.tool}, {tool}" if self.tool else tool


def held(pid: int) -> str | None:
    """Why no debugger may attach to PID without changing it (stopped, or held by another); else None."""
    tracer = outside.tracer_pid(pid)
    if tracer and tracer != os.getpid():
        return f"pid {tracer} ({outside.command_of(tracer)}) is debugging it"
    stat = outside.process_stat(pid)
    if stat is not None and stat.state in "Tt":
        return f"it is {stat.state_name}, and a debugger's attach and detach may let it run on"
    return None


def read_stacks(pid: int, native: bool, version: str | None) -> Stacks:
    """The stacks from py-spy, else pystack, and from gdb what they did not read (all of it when
    neither is installed); why not, when none can."""
    stacks = Stacks()
    blocked = outside.ptrace_blocker(pid)
    if blocked is not None:
        stacks.unseen.append(
            f"no stacks: {blocked}; run inspect as root, or: sudo sysctl kernel.yama.ptrace_scope=0"
        )
        return stacks
    gdb, pyspy = outside.find_program("gdb"), outside.find_program("py-spy")  # never from the cwd
    pystack = outside.find_program("pystack")
    hold = held(pid)
    if hold is not None:
        stacks.unseen.append(
            f"no native stacks: {hold}, so no debugger is attached to it: only py-spy --nonblocking "
            "or pystack --no-block and /proc read it"
        )
        gdb, native = None, False
    # py-spy first: it stops the process for a fraction of a second where gdb, reading the symbols
    # of every library mapped, takes seconds with torch loaded. gdb for what py-spy did not read.
    if pyspy:
        _pyspy(stacks, pyspy, pid, native and not gdb, may_stop=hold is None)
    if pystack and not stacks.python:
        _pystack(stacks, pystack, pid, native and not gdb and hold is None)
    if gdb and (not stacks.python or (native and not stacks.native)):
        _gdb(stacks, gdb, pid, native, version, python=not stacks.python)
        if stacks.python:
            stacks.unseen = [note for note in stacks.unseen if not note.startswith(READ_NONE)]
    if hold is not None and not pyspy and not pystack:
        stacks.unseen.append(
            "no Python frames: install py-spy (pip install py-spy) or pystack: they read them without attaching"
        )
    elif not gdb and not pyspy and not pystack:
        stacks.unseen.append(
            "no stacks: none of gdb, py-spy, pystack is installed; install one (apt install gdb, or "
            "pip install py-spy, or pip install pystack) for the Python import chain and the native frames"
        )
    elif not stacks.python and not stacks.unseen:
        stacks.unseen.append("no Python frames: install py-spy (pip install py-spy) or pystack to read them")
    return stacks


def _helper(stacks: Stacks, name: str, command: list[str]) -> tuple[str, str] | None:
    """The stdout and stderr of the helper NAME run as COMMAND; None, said in STACKS, when it failed."""
    done = outside.run_helper(name, command, HELPER_TIMEOUT)
    if isinstance(done, str):
        stacks.unseen.append(done)
        return None
    return done


def _take_python(stacks: Stacks, name: str, parse: Callable[[str, Stacks], None], out: str, err: str) -> None:
    """The Python stacks the helper NAME printed on OUT, parsed into STACKS; or why there are none."""
    parse(out, stacks)
    if not any(stacks.python.values()):
        stacks.python = {}
        stacks.unseen.append(f"{name} read no Python frames: {outside.last_line(err)}")
        return
    stacks.read_with(name)


# -- gdb ---------------------------------------------------------------------------------------------
def _gdb(stacks: Stacks, gdb: str, pid: int, native: bool, version: str | None, python: bool) -> None:
    command = [gdb, "-p", str(pid), "-batch", "-nx", "-ex", "set pagination off"]
    if native:
        command += ["-ex", "thread apply all bt"]
    if python:
        command += ["-x", GDB_SCRIPT]  # -ex and -x run in the order given
    done = _helper(stacks, "gdb", command)
    if done is None:
        return
    out, err = done
    stacks.read_with("gdb")
    status = parse_gdb(out, stacks)
    if python and (not status.startswith("ok") or not any(stacks.python.values())):
        stacks.python = {}
        why = status.partition(" ")[2] or outside.last_line(err, "no output")
        minor = ".".join((version or "").split(".")[:2])
        stacks.unseen.append(
            f"gdb could not read Python's frames ({why.strip()[:160]}): it reads them through the "
            f"interpreter's debug symbols (python{minor}-dbg, or a Python built with -g); "
            "py-spy needs none (pip install py-spy)"
        )
    if native and not stacks.native:
        stacks.unseen.append(f"gdb showed no native stacks: {outside.last_line(err)}")


def parse_gdb(out: str, stacks: Stacks) -> str:
    """gdb's backtraces and gdb_frames.py's lines into STACKS; that script's end status."""
    native_lines: list[str] = []
    thread: int | None = None
    python_thread: int | None = None
    status = ""
    for line in out.splitlines():
        if line.startswith(THREAD):
            python_thread = int(line.split("\t")[1] or 0)
            stacks.python.setdefault(python_thread, [])
        elif line.startswith(FRAME):
            _, function, filename, argument = [*line.split("\t"), "", "", ""][:4]
            if python_thread is not None:
                stacks.python[python_thread].append(StackFrame(function, filename, None, argument))
        elif line.startswith(END):
            status = " ".join(line.split("\t", 2)[1:])
        elif line.startswith("Thread ") and "(LWP " in line:
            thread = int(line.split("(LWP ", 1)[1].split(")", 1)[0])
            native_lines = stacks.native.setdefault(thread, [])
        elif line.startswith("#") and thread is not None:
            native_lines.append(line)
    stacks.python.pop(0, None)  # a thread state whose LWP gdb did not know
    return status


# -- py-spy ------------------------------------------------------------------------------------------
def _pyspy(stacks: Stacks, pyspy: str, pid: int, native: bool, may_stop: bool) -> None:
    # Without native frames py-spy reads the memory without stopping the process at all; a hung
    # process's frames hold still. Should that read come out torn (a busy process), it stops it,
    # unless it must not be touched (MAY_STOP false: stopped, or held by another debugger).
    tries = [["--native"]] if native else [["--nonblocking"], []] if may_stop else [["--nonblocking"]]
    for extra in tries:
        done = _helper(stacks, "py-spy", [pyspy, "dump", "--pid", str(pid), "--locals", *extra])
        if done is None:
            return
        if "\n    " in done[0]:  # a frame line
            break
    _take_python(stacks, "py-spy", parse_pyspy, *done)


def _thread_lines(out: str, header: str, word: int, base: int) -> Iterator[tuple[int, str, str, bool]]:
    """A stack reader's OUT as (thread, line, stripped line, whether it is the thread's header).

    A thread's lines follow a line starting with HEADER whose WORDth word is the thread's number (in
    BASE; 0: as Python reads it). Blank lines, and lines under no header or one without a number, are
    left out.
    """
    thread = None
    for line in out.splitlines():
        stripped = line.strip()
        if line.startswith(header):
            try:
                thread = int(line.split()[word], base)
            except (IndexError, ValueError):
                thread = None
                continue
            yield thread, line, stripped, True
        elif thread is not None and stripped:
            yield thread, line, stripped, False


def parse_pyspy(out: str, stacks: Stacks) -> None:
    """`py-spy dump --locals` into STACKS: thread names, Python frames with importlib's module name,
    native frames (with --native) as 'function from library'."""
    frames: list[StackFrame] = []
    section = ""
    for thread, line, stripped, header in _thread_lines(out, "Thread ", 1, 0):
        if header:
            if ': "' in line:
                stacks.names[thread] = line.rsplit(': "', 1)[1].rstrip('"')
            frames = stacks.python.setdefault(thread, [])
        elif line.startswith("    ") and not line.startswith("        "):
            function, _, where = stripped.rpartition(" (")
            where = where.rstrip(")")
            filename, colon, number = where.rpartition(":")
            if colon and number.isdigit():
                frames.append(StackFrame(function, filename, int(number)))
            else:
                stacks.native.setdefault(thread, []).append(f"{function} from {where}")
            section = ""
        elif stripped in ("Arguments:", "Locals:"):
            section = stripped
        elif section == "Arguments:" and stripped.startswith("name: ") and frames:
            frame = frames[-1]
            if frame.function.endswith(NAMED):
                frame.argument = stripped[6:].strip('"')


# -- pystack -----------------------------------------------------------------------------------------
def _pystack(stacks: Stacks, pystack: str, pid: int, native: bool) -> None:
    # --no-block reads the memory without stopping the process; pystack reads native frames only
    # while it holds the process stopped, so those are asked for only where it may be stopped.
    command = [pystack, "remote", str(pid), "--locals", "--no-color"]
    command.append("--native" if native else "--no-block")
    done = _helper(stacks, "pystack", command)
    if done is not None:
        _take_python(stacks, "pystack", parse_pystack, *done)


def parse_pystack(out: str, stacks: Stacks) -> None:
    """`pystack remote --locals [--native]` into STACKS: Python frames with importlib's module name and
    native frames (with --native) as 'function from library', innermost first as the others give them.

    pystack prints each thread's frames outermost first (most recent call last); its name in
    parentheses is the OS thread's, which /proc gives too, so it is not kept as the Python name.
    """
    frames: list[StackFrame] = []
    native: list[str] = []
    section = ""
    for thread, _line, stripped, header in _thread_lines(out, "Traceback for thread ", 3, 10):
        if header:
            frames, native = stacks.python.setdefault(thread, []), stacks.native.setdefault(thread, [])
        elif stripped.startswith(("(Python) File ", "(C) File ")):
            kind, _, rest = stripped.partition(" File ")
            filename, _, rest = rest.partition('", line ')
            number, _, function = rest.partition(", in ")
            filename = filename.strip('"')
            if kind == "(Python)":
                frames.insert(0, StackFrame(function, filename, int(number) if number.isdigit() else None))
            else:
                name, _, library = function.partition(" (")
                library = library.rpartition("(")[2].rstrip(")") if "(" in library else library.rstrip(")")
                native.insert(0, f"{name} from {library or filename}")
            section = ""
        elif stripped in ("Arguments:", "Locals:"):
            section = stripped
        elif section == "Arguments:" and stripped.startswith("name: ") and frames:
            frame = frames[0]
            if frame.function.endswith(NAMED):
                frame.argument = stripped[6:].strip('"')
    for tid in [tid for tid, lines in stacks.native.items() if not lines]:
        del stacks.native[tid]


def short_native(lines: Sequence[str], limit: int = 16) -> list[str]:
    """A thread's native frames for the report: gdb's shortened to function and library, at most LIMIT."""
    if lines and lines[0].startswith("#"):
        shown = [outside.short_frame(line) for line in lines[:limit]]
        if len(lines) > limit:
            shown.append("...")
        return shown
    return [line.strip() for line in lines[:limit]]
