"""Another process's stacks, read from outside by a helper program, and its output parsed per thread.

One module for both readers. The watcher's (read_native_stacks) wants every thread's native stack
quickly and keeps the process stopped until the report is out: gdb, driven through its stdin, else
pystack or py-spy with native frames. inspect's (read_stacks) wants the Python frames and never
holds the process: py-spy reads them without stopping it (--nonblocking), pystack (--no-block)
when py-spy is absent or read nothing, gdb the native frames and the Python ones through the
interpreter's debug symbols (gdb_frames.py, sourced by its absolute path). No debugger is
started where it could change the process: on one that is stopped (attaching and detaching may
let it run on, and its parent would see it) or that another debugger holds. Both share the
checks (ptrace_blocker, TracerPid), the way to find a helper (never from the working
directory), to run it and to quote its last line, and one Stacks.
"""

import os
import subprocess
import time

from importwatch.facts import process

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable, Iterator

HELPER_TIMEOUT = 60.0
BOOTSTRAP = ("<frozen importlib._bootstrap>", "<frozen importlib._bootstrap_external>")
# importlib's functions whose first argument is the module name an import is for.
NAMED = ("_find_and_load", "_find_and_load_unlocked", "_lock_unlock_module")
# Frames whose arguments and locals say what a thread waits for (tools/inspection/waitfor.py), and
# threading's that say which Thread object a thread is and which one it joins (tools/inspection/cycles.py);
# and every frame outside importlib, whose locals may hold the address a retry loop connects to.
KEPT = ("addpackage", "getaddrinfo", "join", "_wait_for_tstate_lock", "_bootstrap")
# The markers gdb_frames.py prints: one thread, one frame, the end and how it went.
THREAD, FRAME, END = "@@importwatch-thread", "@@importwatch-frame", "@@importwatch-end"
# The notes of a Python-frame reader that read nothing, dropped once another one read them.
READ_NONE = ("py-spy read no", "pystack read no")
GDB_SCRIPT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "gdb_frames.py")

_GDB_END = "@@importwatch: end of stacks@@"


class StackFrame:
    """One Python frame: function, file, line (None when unknown), the module name importlib was given."""

    __slots__ = ("argument", "filename", "function", "line", "values")

    def __init__(self, function: str, filename: str, line: "int | None" = None, argument: str = "") -> None:
        self.function = function
        self.filename = filename
        self.line = line
        self.argument = argument
        self.values: dict[str, str] = {}  # arguments and locals as printed (see KEPT)

    def keep(self, stripped: str) -> None:
        """Keep a `name: value` line of the frame's arguments or locals, when its function is KEPT."""
        if self.function.rsplit(".", 1)[-1] in KEPT or not self.in_importlib:
            name, colon, value = stripped.partition(": ")
            if colon:
                self.values.setdefault(name, value.strip("\"'"))

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
    """What a stack reader read of a process. inspect's read: per thread id, Python frames (`python`)
    and native frames (`native`), innermost first, and Python's thread names (`names`); `unseen`, why
    some could not be read. The watcher's read: `threads`, gdb's stack per thread (tid, header,
    frames shortened), else a helper's whole output as one block. `tool`: who read them; `seconds`:
    how long reading took.

    gdb, when it read them for the watcher, keeps the process stopped until release(): its stacks
    can be written while it cannot move on, even when moving on means ending (faulthandler's exit
    is due).
    """

    __slots__ = ("_gdb", "names", "native", "python", "seconds", "threads", "tool", "unseen")

    def __init__(
        self,
        tool: str = "",
        threads: "list[tuple[int | None, str, list[str]]] | None" = None,
        seconds: float = 0.0,
        gdb: "subprocess.Popen | None" = None,
    ) -> None:
        self.tool = tool
        self.threads = threads if threads is not None else []
        self.seconds = seconds
        self._gdb = gdb
        self.python: dict[int, list[StackFrame]] = {}
        self.native: dict[int, list[str]] = {}
        self.names: dict[int, str] = {}
        self.unseen: list[str] = []

    def read_with(self, tool: str) -> None:
        self.tool = f"{self.tool}, {tool}" if self.tool else tool

    @property
    def holding(self) -> bool:
        """Whether gdb still holds the process stopped (until release())."""
        return self._gdb is not None

    def release(self) -> None:
        """Let the process go on: gdb detaches and quits (killed if it does not)."""
        gdb, self._gdb = self._gdb, None
        if gdb is not None:
            _end_gdb(gdb, b"detach\nquit\n")


# -- the helpers ---------------------------------------------------------------------------------
def find_program(name: str) -> "str | None":
    """NAME's executable in the absolute folders of PATH, or None.

    An empty, `.` or relative entry means the working directory, where anyone who can
    write there could plant a `gdb` that then runs as us (root, often): those are skipped.
    """
    for folder in os.environ.get("PATH", os.defpath).split(os.pathsep):
        if not os.path.isabs(folder):
            continue
        candidate = os.path.join(folder, name)
        if os.path.isfile(candidate) and os.access(candidate, os.X_OK):
            return candidate
    return None


def run_helper(tool: str, command: "list[str]", timeout: float) -> "tuple[str, str] | str":
    """The stdout and stderr of TOOL (a stack reader) run as COMMAND, within TIMEOUT seconds; or why
    it failed."""
    # Nothing on its stdin; what it says is read as text, any byte it cannot decode replaced.
    quietly: dict = {"stdin": subprocess.DEVNULL, "capture_output": True, "text": True, "errors": "replace"}
    try:
        done = subprocess.run(command, timeout=timeout, **quietly)
    except (OSError, subprocess.SubprocessError) as error:
        return f"{tool} failed: {error}"
    return done.stdout, done.stderr


def last_line(text: str, default: "str | None" = "?", skip: "tuple[str, ...]" = ()) -> "str | None":
    """The last line of TEXT that is not blank and starts with none of SKIP, stripped: what a helper or
    a child said last, often its reason; DEFAULT when there is none."""
    for line in reversed(text.splitlines()):
        if line.strip() and not line.startswith(skip):
            return line.strip()
    return default


# -- the watcher's read: native stacks, the process held ---------------------------------------------
def read_native_stacks(pid: int, timeout: float = 10.0) -> "Stacks | str":
    """The watcher's read: every thread's native stack from the first debugger installed, or why there are none.

    A debugger stops every thread of the process while it reads them (gdb: a few
    tenths of a second, longer while it loads a big library's symbols), at most
    TIMEOUT seconds; it is never started while someone else's debugger holds the process.
    gdb's stacks come back with the process still stopped: call release().
    """
    blocked = process.ptrace_blocker(pid)
    if blocked is not None:
        return f"no native stacks: {blocked}; run as root, or: sudo sysctl kernel.yama.ptrace_scope=0"
    tracer = process.tracer_pid(pid)
    if tracer:
        return f"no native stacks: pid {tracer} {process.command_of(tracer)} is debugging it"
    path = find_program("gdb")
    if path is not None:
        return _gdb_stacks(path, pid, timeout)
    for tool, command in (
        ("pystack", ["remote", str(pid), "--native"]),
        ("py-spy", ["dump", "--native", "--pid", str(pid)]),
    ):
        path = find_program(tool)
        if path is None:
            continue
        began = time.monotonic()
        done = run_helper(tool, [path, *command], timeout)
        if isinstance(done, str):
            return done
        out, err = done
        if not out.strip():
            return f"{tool} showed nothing: {last_line(err)}"
        return Stacks(tool, [(None, "", out.splitlines())], time.monotonic() - began)
    return "no native stacks: install gdb, py-spy or pystack to see them"


def _gdb_stacks(path: str, pid: int, timeout: float) -> "Stacks | str":
    """gdb, driven through its stdin: attach, print every stack and a mark, then wait to be released."""
    import selectors

    began = time.monotonic()
    commands = f"set pagination off\nset confirm off\nthread apply all bt\necho {_GDB_END}\\n\n"
    try:
        gdb = subprocess.Popen(
            [path, "-nx", "-q", "-p", str(pid)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
        )
        gdb.stdin.write(commands.encode())
        gdb.stdin.flush()
    except OSError as error:
        return f"gdb failed: {error}"
    output = b""
    with selectors.DefaultSelector() as selector:
        selector.register(gdb.stdout, selectors.EVENT_READ)
        while _GDB_END.encode() + b"\n" not in output:
            left = began + timeout - time.monotonic()
            if left <= 0 or not selector.select(left):
                _end_gdb(gdb, b"")
                return f"gdb failed: no stacks within {timeout:g} s"
            data = os.read(gdb.stdout.fileno(), 1 << 16)
            if not data:
                _end_gdb(gdb, b"")
                return f"gdb showed nothing: {last_line(output.decode('utf-8', 'replace'))}"
            output += data
    text = output.decode("utf-8", "replace").split(_GDB_END + "\n")[0]
    threads = gdb_threads(text)
    if not threads:
        _end_gdb(gdb, b"detach\nquit\n")
        return f"gdb showed nothing: {last_line(text)}"
    return Stacks("gdb", threads, time.monotonic() - began, gdb)


def _end_gdb(gdb: "subprocess.Popen", commands: bytes) -> None:
    try:
        if commands:
            gdb.stdin.write(commands)
        gdb.stdin.close()
    except OSError:
        pass
    try:
        gdb.wait(5.0)
    except subprocess.TimeoutExpired:
        gdb.kill()  # a tracer that dies lets its tracee go
        gdb.wait()
    gdb.stdout.close()


def gdb_threads(output: str, frames: int = 24) -> "list[tuple[int | None, str, list[str]]]":
    """gdb's backtraces per thread: (LWP, "Thread N (LWP T)", frames shortened to function and library)."""
    threads: list[tuple[int | None, str, list[str]]] = []
    count = 0
    for line in output.splitlines():
        if line.startswith("Thread "):
            lwp = _lwp(line)
            threads.append((lwp, line.split(" (Thread 0x")[0] + (f" (LWP {lwp})" if lwp else ""), []))
            count = 0
        elif line.startswith("#") and threads:
            count += 1
            if count <= frames:
                threads[-1][2].append("  " + short_frame(line))
            elif count == frames + 1:
                threads[-1][2].append("  ...")
    return threads


def _lwp(line: str) -> "int | None":
    start = line.find("(LWP ")
    number = line[start + 5 : line.find(")", start)] if start >= 0 else ""
    return int(number) if number.isdigit() else None


def short_frame(line: str) -> str:
    """'#3  0x7f.. in my_ctor (a=1) at x.c:4' -> '#3 my_ctor at x.c:4'; ' from /lib/x.so' kept."""
    number, _, rest = line.partition(" ")
    rest = rest.strip()
    if " in " in rest and rest.startswith("0x"):
        rest = rest.split(" in ", 1)[1]
    function, paren, tail = rest.partition(" (")
    where = ""
    for marker in (" from ", " at "):
        if marker in tail:
            where = marker + tail.rsplit(marker, 1)[1]
            break
    return f"{number} {function}{where}" if paren else f"{number} {rest}"


# -- inspect's read: Python frames, the process never held -------------------------------------------
def held(pid: int) -> "str | None":
    """Why no debugger may attach to PID without changing it (stopped, or held by another); else None."""
    tracer = process.tracer_pid(pid)
    if tracer and tracer != os.getpid():
        return f"pid {tracer} ({process.command_of(tracer)}) is debugging it"
    stat = process.process_stat(pid)
    if stat is not None and stat.state in "Tt":
        return f"it is {stat.state_name}, and a debugger's attach and detach may let it run on"
    return None


def read_stacks(pid: int, native: bool, version: "str | None") -> "Stacks":
    """inspect's read, which never holds the process: the stacks from py-spy, else pystack, and from gdb what they did not read (all of it when
    neither is installed); why not, when none can."""
    stacks = Stacks()
    blocked = process.ptrace_blocker(pid)
    if blocked is not None:
        stacks.unseen.append(
            f"no stacks: {blocked}; run inspect as root, or: sudo sysctl kernel.yama.ptrace_scope=0"
        )
        return stacks
    gdb, pyspy = find_program("gdb"), find_program("py-spy")  # never from the cwd
    pystack = find_program("pystack")
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


def _helper(stacks: "Stacks", name: str, command: "list[str]") -> "tuple[str, str] | None":
    """The stdout and stderr of the helper NAME run as COMMAND; None, said in STACKS, when it failed."""
    done = run_helper(name, command, HELPER_TIMEOUT)
    if isinstance(done, str):
        stacks.unseen.append(done)
        return None
    return done


def _take_python(
    stacks: "Stacks", name: str, parse: "Callable[[str, Stacks], None]", out: str, err: str
) -> None:
    """The Python stacks the helper NAME printed on OUT, parsed into STACKS; or why there are none."""
    parse(out, stacks)
    if not any(stacks.python.values()):
        stacks.python = {}
        stacks.unseen.append(f"{name} read no Python frames: {last_line(err)}")
        return
    stacks.read_with(name)


# -- gdb ---------------------------------------------------------------------------------------------
def _gdb(stacks: "Stacks", gdb: str, pid: int, native: bool, version: "str | None", python: bool) -> None:
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
        why = status.partition(" ")[2] or last_line(err, "no output")
        minor = ".".join((version or "").split(".")[:2])
        stacks.unseen.append(
            f"gdb could not read Python's frames ({why.strip()[:160]}): it reads them through the "
            f"interpreter's debug symbols (python{minor}-dbg, or a Python built with -g); "
            "py-spy needs none (pip install py-spy)"
        )
    if native and not stacks.native:
        stacks.unseen.append(f"gdb showed no native stacks: {last_line(err)}")


def parse_gdb(out: str, stacks: "Stacks") -> str:
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
            thread = _lwp(line)
            native_lines = stacks.native.setdefault(thread, []) if thread is not None else []
        elif line.startswith("#") and thread is not None:
            native_lines.append(line)
    stacks.python.pop(0, None)  # a thread state whose LWP gdb did not know
    return status


# -- py-spy ------------------------------------------------------------------------------------------
def _pyspy(stacks: "Stacks", pyspy: str, pid: int, native: bool, may_stop: bool) -> None:
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


def _thread_lines(out: str, header: str, word: int, base: int) -> "Iterator[tuple[int, str, str, bool]]":
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


def parse_pyspy(out: str, stacks: "Stacks") -> None:
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
        elif section and frames:
            frame = frames[-1]
            frame.keep(stripped)
            if section == "Arguments:" and stripped.startswith("name: ") and frame.function.endswith(NAMED):
                frame.argument = stripped[6:].strip('"')


# -- pystack -----------------------------------------------------------------------------------------
def _pystack(stacks: "Stacks", pystack: str, pid: int, native: bool) -> None:
    # --no-block reads the memory without stopping the process; pystack reads native frames only
    # while it holds the process stopped, so those are asked for only where it may be stopped.
    command = [pystack, "remote", str(pid), "--locals", "--no-color"]
    command.append("--native" if native else "--no-block")
    done = _helper(stacks, "pystack", command)
    if done is not None:
        _take_python(stacks, "pystack", parse_pystack, *done)


def parse_pystack(out: str, stacks: "Stacks") -> None:
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
        elif section and frames:
            frame = frames[0]
            frame.keep(stripped)
            if section == "Arguments:" and stripped.startswith("name: ") and frame.function.endswith(NAMED):
                frame.argument = stripped[6:].strip('"')
    for tid in [tid for tid, lines in stacks.native.items() if not lines]:
        del stacks.native[tid]
