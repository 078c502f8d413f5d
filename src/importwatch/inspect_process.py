"""importwatch inspect PID: diagnose a Python process started without importwatch, from outside.

Everything is read: /proc (outside.py's verdicts on each thread), the stacks
through whichever helper is installed (gdb, which stops the process only while
it reads them; else py-spy), and the files the process has mapped (their ELF
needs, the CUDA and torch they want, the distribution that owns them). Nothing
is sent to the process, no signal and no code: its own interpreter is asked for
its search path in a separate process, with site's code left unrun.
"""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
import time

from importwatch import cuda, dists, outside, scan
from importwatch.elf import cuda_needs, library_stem, read_dynamic
from importwatch.usage import UsageError, argument_parser, fail

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Sequence

EXIT_OK = 0
EXIT_PROBLEM = 1

# How long to watch the threads' CPU time to tell busy from waiting.
WINDOW = 0.5
HELPER_TIMEOUT = 60.0
INTERPRETER_TIMEOUT = 15.0
BOOTSTRAP = ("<frozen importlib._bootstrap>", "<frozen importlib._bootstrap_external>")
_TORCH_STEMS = ("libc10", "libtorch", "libshm", "libcaffe2")
_SYSTEM_DIRS = ("/lib/", "/lib64/", "/usr/lib/", "/usr/lib64/", "/usr/local/lib/")
_PY_THREAD, _PY_FRAME, _PY_END = "@@importwatch-thread", "@@importwatch-frame", "@@importwatch-end"

# Run inside gdb: walks every Python thread state from _PyRuntime through the
# debug information of libpython (3.9 to 3.13 name their fields differently) and
# prints each frame's function, file and, for importlib's lock and load
# functions, the module name they were called with.
_GDB_SCRIPT = r"""
import gdb

def _value(expression):
    try:
        return gdb.parse_and_eval(expression)
    except gdb.error:
        return None

def _text(obj):
    try:
        if obj is None or int(obj) == 0:
            return None
        ascii_obj = obj.cast(gdb.lookup_type("PyASCIIObject").pointer())
        state = ascii_obj["state"]
        if not int(state["compact"]) or not int(state["ascii"]):
            return "?"
        data = (ascii_obj + 1).cast(gdb.lookup_type("char").pointer())
        return data.string(length=min(int(ascii_obj["length"]), 1024))
    except (gdb.error, gdb.MemoryError):
        return None

def _field(value, *names):
    for name in names:
        try:
            return value[name]
        except gdb.error:
            continue
    return None

def _frames(tstate):
    cframe = _field(tstate, "cframe")  # 3.10 has one too, without current_frame
    frame = _field(cframe, "current_frame") if cframe is not None else None
    if frame is not None:
        new = True
    elif _field(tstate, "current_frame") is not None:
        frame, new = tstate["current_frame"], True
    else:
        frame, new = tstate["frame"], False
    code_type = gdb.lookup_type("PyCodeObject").pointer()
    count = 0
    while frame is not None and int(frame) != 0 and count < 512:
        count += 1
        try:
            if new:
                code = _field(frame, "f_code", "f_executable").cast(code_type)
                first, following = frame["localsplus"][0], frame["previous"]
            else:
                code, first, following = frame["f_code"], frame["f_localsplus"][0], frame["f_back"]
            name, filename = _text(code["co_name"]), _text(code["co_filename"])
            argument = ""
            if name in ("_find_and_load", "_find_and_load_unlocked", "_lock_unlock_module"):
                argument = _text(first) or ""
            print("@@importwatch-frame", name, filename, argument, sep="\t")
        except (gdb.error, gdb.MemoryError):
            print("@@importwatch-frame", "?", "?", "", sep="\t")
            return
        frame = following

try:
    lwps = {}
    for thread in gdb.selected_inferior().threads():
        try:
            lwps[int.from_bytes(thread.handle(), "little")] = thread.ptid[1]
        except Exception:
            pass
    interpreter = _value("_PyRuntime.interpreters.head")
    if interpreter is None:
        raise RuntimeError("no debug symbols for _PyRuntime")
    while interpreter is not None and int(interpreter) != 0:
        threads = _field(interpreter, "threads")  # 3.11+; 3.9 and 3.10 have tstate_head
        tstate = threads["head"] if threads is not None else interpreter["tstate_head"]
        while int(tstate) != 0:
            print("@@importwatch-thread", lwps.get(int(tstate["thread_id"]), 0), sep="\t")
            _frames(tstate)
            tstate = tstate["next"]
        interpreter = interpreter["next"]
except Exception as error:
    print("@@importwatch-end", "error", str(error).replace("\n", " "), sep="\t")
else:
    print("@@importwatch-end", "ok", sep="\t")
"""

# Run by the target's own interpreter with -S: its version and search path, as site would
# make it, the .pth files read for their folders but none of their code run.
_PATH_SCRIPT = r"""
import json, os, site, sys
known = set()
if hasattr(site, "venv"):
    site.venv(known)
dirs = []
try:
    dirs += site.getsitepackages()
except AttributeError:
    pass
# -I turns the user site off here; the program has it unless it runs in a venv or PYTHONNOUSERSITE.
if sys.prefix == sys.base_prefix and not os.environ.get("PYTHONNOUSERSITE"):
    dirs.append(site.getusersitepackages())
path = list(sys.path)
for folder in dirs:
    if not os.path.isdir(folder):
        continue
    path.append(folder)
    try:
        names = sorted(name for name in os.listdir(folder) if name.endswith(".pth"))
    except OSError:
        names = []
    for name in names:
        try:
            with open(os.path.join(folder, name), encoding="utf-8", errors="replace") as file:
                lines = file.read(1 << 16).splitlines()
        except OSError:
            continue
        for line in lines:
            line = line.strip()
            if line and not line.startswith(("#", "import ", "import\t")):
                entry = os.path.join(folder, line)
                if os.path.isdir(entry):
                    path.append(entry)
print(json.dumps({"version": sys.version.split()[0], "path": path, "prefix": sys.prefix}))
"""


# -- the command line ---------------------------------------------------------------------------
def _parser():
    import argparse

    parser = argument_parser(
        prog="importwatch inspect",
        description=(
            "Diagnose a running Python process started without importwatch, from outside: what each "
            "thread waits on, the import in flight, the shared object being initialised and what it "
            "needs. The process is never signalled nor changed; a debugger stops it only while it "
            "reads its stacks. Exit status 0 when nothing is suspect, 1 when a hang or problem is "
            "named, 2 on bad usage."
        ),
    )
    parser.add_argument("pid", metavar="PID", help="the process to inspect")
    parser.add_argument("--json", action="store_true", help="print the report as one JSON object")
    parser.add_argument(
        "--native",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="read the native (C) stacks too, with gdb or py-spy (default: on)",
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
    if options.json:
        sys.stdout.write(json.dumps(report, indent=2) + "\n")
    else:
        sys.stdout.write(render(report))
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
    stat = outside.process_stat(pid)
    if stat is None or stat.state in "ZX":
        raise UsageError(f"no such process: {pid}")
    try:
        with open(f"/proc/{pid}/maps", "rb") as file:
            maps = file.read(1 << 26).decode("utf-8", "replace")
    except PermissionError:
        owner = _owner(pid)
        raise UsageError(
            f"not permitted to read process {pid}{owner}: run inspect as that user, or as root"
        ) from None
    except OSError:
        raise UsageError(f"no such process: {pid}") from None
    exe = _exe(pid) or ""
    name = os.path.basename(exe)
    if not (name.startswith("python") or "/libpython" in maps):
        raise UsageError(f"process {pid} ({outside.command_of(pid)}) is not a Python process")
    return pid


def _owner(pid: int) -> str:
    try:
        uid = os.stat(f"/proc/{pid}").st_uid
    except OSError:
        return ""
    try:
        import pwd

        return f" (owned by {pwd.getpwuid(uid).pw_name})"
    except (ImportError, KeyError):
        return f" (owned by uid {uid})"


def _exe(pid: int) -> str | None:
    try:
        return os.readlink(f"/proc/{pid}/exe").removesuffix(" (deleted)")
    except OSError:
        return None


# -- facts about the process ----------------------------------------------------------------------
def _read(path: str, limit: int = 1 << 20) -> bytes | None:
    try:
        with open(path, "rb") as file:
            return file.read(limit)
    except OSError:
        return None


def _cmdline(pid: int) -> list[str]:
    data = _read(f"/proc/{pid}/cmdline") or b""
    return [word.decode("utf-8", "surrogateescape") for word in data.rstrip(b"\0").split(b"\0") if data]


def _environ(pid: int) -> dict[str, str] | None:
    data = _read(f"/proc/{pid}/environ", 1 << 22)
    if data is None:
        return None
    environ = {}
    for item in data.split(b"\0"):
        key, equals, value = item.partition(b"=")
        if equals and key:
            environ[key.decode("utf-8", "surrogateescape")] = value.decode("utf-8", "surrogateescape")
    return environ


def _cwd(pid: int) -> str | None:
    try:
        return os.readlink(f"/proc/{pid}/cwd")
    except OSError:
        return None


def _boot_time() -> float | None:
    for line in (_read("/proc/stat") or b"").splitlines():
        if line.startswith(b"btime "):
            return float(line.split()[1])
    return None


def _exec_start(path: str) -> float | None:
    """se.exec_start of a /proc .../sched file: when the thread last ran on a CPU, in ms."""
    for line in (_read(path, 1 << 16) or b"").splitlines():
        if line.startswith(b"se.exec_start"):
            try:
                return float(line.split(b":")[1])
            except (IndexError, ValueError):
                return None
    return None


def last_ran(pid: int, tids: Sequence[int]) -> dict[int, float]:
    """Seconds since each thread last used a CPU (the scheduler's clock against our own thread's)."""
    now = _exec_start("/proc/thread-self/sched")
    if now is None:
        return {}
    found = {}
    for tid in tids:
        then = _exec_start(f"/proc/{pid}/task/{tid}/sched")
        if then is not None:
            found[tid] = max(0.0, (now - then) / 1000.0)
    return found


def _invoked(pid: int, argv0: str, cwd: str | None, environ: dict[str, str], exe: str) -> str:
    """The interpreter as the program named it (a venv's bin/python), when it is the same file as EXE."""
    candidates = []
    if "/" in argv0:
        candidates.append(os.path.join(cwd or "/", argv0))
    else:
        candidates += [os.path.join(folder, argv0) for folder in environ.get("PATH", "").split(":") if folder]
    for candidate in candidates:
        if os.path.isfile(candidate) and os.path.realpath(candidate) == os.path.realpath(exe):
            return candidate
    return exe


def interpreter_facts(pid: int, exe: str, argv0: str, cwd: str | None, environ: dict[str, str] | None):
    """(version, sys.path as the program has it, interpreter path, why not) from its own interpreter.

    It runs isolated (-I -S: no PYTHON* variable, no user site, no .pth code), so nothing the
    program's folders hold runs; PYTHONPATH is added here. It is not run at all for a process of
    another user: that would run their files as this user.
    """
    environ = environ or {}
    python_path = [entry for entry in environ.get("PYTHONPATH", "").split(os.pathsep) if entry]
    if not os.path.basename(exe).startswith("python"):
        return (
            None,
            python_path,
            exe,
            f"the program runs in {exe}, which embeds Python: its search path is unknown",
        )
    invoked = _invoked(pid, argv0, cwd, environ, exe)
    try:
        owner = os.stat(f"/proc/{pid}").st_uid
    except OSError:
        owner = None
    if owner != os.geteuid():
        why = (
            f"its search path: {invoked} belongs to another user, and running it here would run "
            "their files as this user; the mapped libraries and PYTHONPATH stand in"
        )
        return None, python_path, invoked, why
    env = {key: value for key, value in environ.items() if not key.startswith("IMPORTWATCH")}
    env["PYTHONDONTWRITEBYTECODE"] = "1"
    try:
        done = subprocess.run(
            [invoked, "-I", "-S", "-c", _PATH_SCRIPT],
            env=env,
            cwd="/",
            stdin=subprocess.DEVNULL,
            capture_output=True,
            timeout=INTERPRETER_TIMEOUT,
        )
        facts = json.loads(done.stdout)
    except (OSError, subprocess.SubprocessError, ValueError) as error:
        return None, python_path, invoked, f"could not ask {invoked} for its search path: {error}"
    found = [entry for entry in facts.get("path", []) if isinstance(entry, str)]
    return facts.get("version"), python_path + found, invoked, None


def _version_from_maps(exe: str, mapped: Sequence[str]) -> str | None:
    for path in [exe, *mapped]:
        name = os.path.basename(path)
        for prefix in ("libpython", "python"):
            if name.startswith(prefix):
                version = name[len(prefix) :].split(".so", 1)[0].rstrip("dmu")
                if version[:1].isdigit():
                    return version
    return None


def mapped_objects(pid: int) -> list[str]:
    """The shared objects mapped in PID, in address order, each once."""
    data = _read(f"/proc/{pid}/maps", 1 << 26) or b""
    seen: dict[str, None] = {}
    for line in data.decode("utf-8", "surrogateescape").splitlines():
        fields = line.split(None, 5)
        if len(fields) == 6 and fields[5].startswith("/") and ".so" in os.path.basename(fields[5]):
            seen.setdefault(fields[5].removesuffix(" (deleted)"), None)
    return list(seen)


def module_of(path: str, search: Sequence[str]) -> str | None:
    """The module a shared object is, named from its path under the search path: fastkern._kernels."""
    real = os.path.realpath(path)
    for entry in sorted({os.path.realpath(entry or ".") for entry in search}, key=len, reverse=True):
        if real.startswith(entry.rstrip("/") + "/"):
            name = scan._module_of(real, entry)
            if name:
                return name
    return None


def _is_system(path: str, exe: str) -> bool:
    name = os.path.basename(path)
    return (
        path.startswith(_SYSTEM_DIRS)
        or name.startswith(("libpython", "ld-linux", "libc.so", "libpthread", "libdl"))
        or name == os.path.basename(exe)
        or os.path.realpath(path) == os.path.realpath(exe)
    )


def find_torch_for(mapped: Sequence[str], search: Sequence[str], environ: dict[str, str]):
    """torch as the process has it: the one whose libraries it mapped, else the one on its search path."""
    for path in mapped:
        folder = os.path.dirname(path)
        if library_stem(path).startswith(_TORCH_STEMS) and folder.endswith("/torch/lib"):
            facts = cuda.find_torch([os.path.dirname(os.path.dirname(folder))], environ)
            if facts is not None:
                return facts
    return cuda.find_torch([entry for entry in search if entry], environ)


# -- stacks -------------------------------------------------------------------------------------------
class Frame:
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


class Stacks:
    """What the helper read: Python frames and native frames per thread id, innermost first."""

    def __init__(self) -> None:
        self.tool = ""
        self.python: dict[int, list[Frame]] = {}
        self.native: dict[int, list[str]] = {}
        self.names: dict[int, str] = {}
        self.unseen: list[str] = []


def read_stacks(pid: int, native: bool, version: str | None) -> Stacks:
    """The stacks from py-spy, and from gdb what py-spy did not read (all of it when py-spy is not
    installed); why not, when neither can."""
    stacks = Stacks()
    blocked = outside.ptrace_blocker(pid)
    if blocked is not None:
        stacks.unseen.append(
            f"no stacks: {blocked}; run inspect as root, or: sudo sysctl kernel.yama.ptrace_scope=0"
        )
        return stacks
    gdb, pyspy = outside.find_program("gdb"), outside.find_program("py-spy")  # never from the cwd
    # py-spy first: it stops the process for a fraction of a second where gdb, reading the symbols
    # of every library mapped, takes seconds with torch loaded. gdb for what py-spy did not read.
    if pyspy:
        _pyspy(stacks, pyspy, pid, native and not gdb)
    if gdb and (not stacks.python or (native and not stacks.native)):
        _gdb(stacks, gdb, pid, native, version, python=not stacks.python)
        if stacks.python:
            stacks.unseen = [note for note in stacks.unseen if not note.startswith("py-spy read no")]
    if not gdb and not pyspy:
        stacks.unseen.append(
            "no stacks: neither gdb nor py-spy is installed; install one (apt install gdb, or "
            "pip install py-spy) for the Python import chain and the native frames"
        )
    elif not stacks.python and not stacks.unseen:
        stacks.unseen.append("no Python frames: install py-spy (pip install py-spy) to read them")
    return stacks


def _helper(command: list[str]) -> tuple[str, str]:
    done = subprocess.run(
        command,
        stdin=subprocess.DEVNULL,
        capture_output=True,
        timeout=HELPER_TIMEOUT,
        text=True,
        errors="replace",
    )
    return done.stdout, done.stderr


def _gdb(stacks: Stacks, gdb: str, pid: int, native: bool, version: str | None, python: bool) -> None:
    command = [gdb, "-p", str(pid), "-batch", "-nx", "-ex", "set pagination off"]
    if native:
        command += ["-ex", "thread apply all bt"]
    if python:
        command += ["-ex", f"python exec(bytes.fromhex('{_GDB_SCRIPT.encode().hex()}').decode())"]
    try:
        out, err = _helper(command)
    except (OSError, subprocess.SubprocessError) as error:
        stacks.unseen.append(f"gdb failed: {error}")
        return
    stacks.tool = f"{stacks.tool}, gdb" if stacks.tool else "gdb"
    thread = None
    native_lines: list[str] = []
    python_thread: int | None = None
    status = ""
    for line in out.splitlines():
        if line.startswith(_PY_THREAD):
            python_thread = int(line.split("\t")[1] or 0)
            stacks.python.setdefault(python_thread, [])
        elif line.startswith(_PY_FRAME):
            _, function, filename, argument = [*line.split("\t"), "", "", ""][:4]
            if python_thread is not None:
                stacks.python[python_thread].append(Frame(function, filename, None, argument))
        elif line.startswith(_PY_END):
            status = line.split("\t", 2)[1:]
            status = " ".join(status)
        elif line.startswith("Thread ") and "(LWP " in line:
            thread = int(line.split("(LWP ", 1)[1].split(")", 1)[0])
            native_lines = stacks.native.setdefault(thread, [])
        elif line.startswith("#") and thread is not None:
            native_lines.append(line)
    stacks.python.pop(0, None)
    if python and (not status.startswith("ok") or not any(stacks.python.values())):
        stacks.python = {}
        why = status.partition(" ")[2] or (err.strip().splitlines() or ["no output"])[-1]
        minor = ".".join((version or "").split(".")[:2])
        stacks.unseen.append(
            f"gdb could not read Python's frames ({why.strip()[:160]}): it reads them through the "
            f"interpreter's debug symbols (python{minor}-dbg, or a Python built with -g); "
            "py-spy needs none (pip install py-spy)"
        )
    if native and not stacks.native:
        stacks.unseen.append(f"gdb showed no native stacks: {(err.strip().splitlines() or ['?'])[-1]}")


def _pyspy(stacks: Stacks, pyspy: str, pid: int, native: bool) -> None:
    # Without native frames py-spy reads the memory without stopping the process at all; a hung
    # process's frames hold still. Should that read come out torn (a busy process), it stops it.
    tries = [["--native"]] if native else [["--nonblocking"], []]
    for extra in tries:
        try:
            out, err = _helper([pyspy, "dump", "--pid", str(pid), "--locals", *extra])
        except (OSError, subprocess.SubprocessError) as error:
            stacks.unseen.append(f"py-spy failed: {error}")
            return
        if "\n    " in out:  # a frame line
            break
    thread = None
    frames: list[Frame] = []
    section = ""
    for line in out.splitlines():
        stripped = line.strip()
        if line.startswith("Thread "):
            word = line.split()[1]
            try:
                thread = int(word, 0)
            except ValueError:
                thread = None
                continue
            if ': "' in line:
                stacks.names[thread] = line.rsplit(': "', 1)[1].rstrip('"')
            frames = stacks.python.setdefault(thread, [])
        elif thread is None or not stripped:
            continue
        elif line.startswith("    ") and not line.startswith("        "):
            function, _, where = stripped.rpartition(" (")
            where = where.rstrip(")")
            filename, colon, number = where.rpartition(":")
            if colon and number.isdigit():
                frames.append(Frame(function, filename, int(number)))
            else:
                stacks.native.setdefault(thread, []).append(f"{function} from {where}")
            section = ""
        elif stripped in ("Arguments:", "Locals:"):
            section = stripped
        elif section == "Arguments:" and stripped.startswith("name: ") and frames:
            frame = frames[-1]
            if frame.function.endswith(("_find_and_load", "_find_and_load_unlocked", "_lock_unlock_module")):
                frame.argument = stripped[6:].strip('"')
    if not any(stacks.python.values()):
        stacks.python = {}
        stacks.unseen.append(f"py-spy read no Python frames: {(err.strip().splitlines() or ['?'])[-1]}")
        return
    stacks.tool = f"{stacks.tool}, py-spy" if stacks.tool else "py-spy"


# -- what each thread is doing --------------------------------------------------------------------
def import_state(frames: Sequence[Frame]) -> dict:
    """From one thread's Python frames (innermost first): the import chain, and where in it it is."""
    # _lock_unlock_module counts too: importing a module another thread is initialising waits there,
    # called by the import machinery in C without a _find_and_load frame.
    chain = [
        frame.argument
        for frame in reversed(frames)
        if frame.function.endswith(("_find_and_load", "_lock_unlock_module"))
    ]
    chain = [name for index, name in enumerate(chain) if name and (index == 0 or chain[index - 1] != name)]
    state: dict = {"chain": chain, "doing": None, "lock": None}
    if not chain:
        return state
    for frame in frames:
        if frame.in_importlib:
            short = frame.function.rsplit(".", 1)[-1]
            if short == "acquire":
                lock = next(
                    (f.argument for f in frames if f.function.endswith("_lock_unlock_module") and f.argument),
                    chain[-1],
                )
                state["lock"] = lock
                state["doing"] = f"waiting for the import lock of {lock}"
                break
            if short == "create_module":
                state["doing"] = "loading the extension (dlopen, then its PyInit)"
                break
            continue
        if frame.function == "<module>":
            state["doing"] = f"running the module's code at {frame.describe()}"
            break
        state["doing"] = f"in {frame.describe()}"
        break
    return state


def _native_function(line: str) -> str:
    """The function of a gdb frame ('#1  0x7f.. in dlopen (...) from /lib/libc.so.6') or of a py-spy
    frame as read here ('dlopen from libc.so.6')."""
    if line.startswith("#"):
        rest = line.split(None, 1)[1] if " " in line else ""
        if rest.startswith("0x") and " in " in rest:
            rest = rest.split(" in ", 1)[1]
        return rest.split(" (", 1)[0].strip()
    return line.split(" from ", 1)[0].strip()


def native_facts(lines: Sequence[str], exe: str, mapped: Sequence[str]) -> dict:
    """From one thread's native frames (innermost first): the file in dlopen, whether a constructor
    or a PyInit runs, and the innermost library that is not the system's or Python's."""
    facts: dict = {"dlopen": False, "file": None, "constructor": False, "init": None, "library": None}
    for line in lines:
        function = _native_function(line)
        if "pathname=" in line and "FindSharedFuncptr" in line and '"' in line:
            facts["file"] = line.split("pathname=", 1)[1].split('"', 2)[1]
        if function in ("dlopen", "_dl_open", "dlopen_implementation", "___dlopen", "__dlopen") or (
            function.startswith("dlopen@")
        ):
            facts["dlopen"] = True
            # Code of a library that runs inside dlopen, called through ld.so, is a constructor.
            facts["constructor"] = facts["constructor"] or facts["library"] is not None
        if function in ("_dl_init", "call_init"):
            facts["constructor"] = True
        if function.startswith("PyInit_") and facts["init"] is None:
            facts["init"] = function[len("PyInit_") :]
        library = _full_path(line.rsplit(" from ", 1)[1].strip(), mapped) if " from " in line else None
        if library and facts["library"] is None and not facts["dlopen"] and not _is_system(library, exe):
            facts["library"] = library
    return facts


def _full_path(name: str, mapped: Sequence[str]) -> str:
    """py-spy names a library by its last components: the mapped file they end."""
    if name.startswith("/"):
        return name
    return next((path for path in mapped if path.endswith("/" + name)), name)


def library_facts(path: str, torch, driver: str | None, owners: dists.Owners) -> dict:
    """A shared object's CUDA and torch needs, its owner's metadata, and the verdicts on them."""
    info = read_dynamic(path)
    needed = list(info.needed) if info is not None else []
    needs = cuda_needs(needed)
    torch_links = [name for name in needed if library_stem(name).startswith(_TORCH_STEMS)]
    verdicts = cuda.native_verdicts(path, info, torch, driver) if info is not None else []
    owner = owners.owner(path) if (needs or torch_links) else None
    if owner is not None:
        said = dists.verdict(owner, torch)
        if said:
            verdicts.insert(0, said)
    return {
        "path": path,
        "needs": needs,
        "torch_links": torch_links,
        "distribution": f"{owner.name} {owner.version}" if owner is not None else None,
        "verdicts": verdicts,
    }


# -- the report -------------------------------------------------------------------------------------
def inspect(pid: int, native: bool = True) -> dict:
    """Every fact inspect reads about PID, and the problems it names, as the JSON object --json prints."""
    cmdline = _cmdline(pid)
    exe = _exe(pid) or ""
    cwd = _cwd(pid)
    environ = _environ(pid)
    stat = outside.process_stat(pid)
    unseen: list[str] = []
    if environ is None:
        unseen.append("its environment (/proc/PID/environ is not readable)")
    mapped = mapped_objects(pid)
    version, search, interpreter, why = interpreter_facts(
        pid, exe, cmdline[0] if cmdline else exe, cwd, environ
    )
    if why:
        unseen.append(why)
    version = version or _version_from_maps(exe, mapped)
    search = search + ([cwd] if cwd else []) + _script_folder(cmdline, cwd) + _site_folders(mapped)

    before = outside.sample_threads(pid)
    time.sleep(WINDOW)
    samples = outside.sample_threads(pid, detail=True)
    ran = last_ran(pid, list(samples))
    stacks = read_stacks(pid, native, version)
    unseen += stacks.unseen
    if samples and all(sample.syscall is None for sample in samples.values()):
        blocked = outside.ptrace_blocker(pid)
        if blocked:
            unseen.append(f"the system calls threads are blocked in: {blocked}")

    started = None
    boot = _boot_time()
    if stat is not None and boot is not None:
        started = boot + stat.start / os.sysconf("SC_CLK_TCK")
    report: dict = {
        "pid": pid,
        "cmdline": cmdline,
        "exe": exe,
        "interpreter": interpreter,
        "cwd": cwd,
        "python": version,
        "started": started,
        "state": stat.state_name if stat else None,
        "idle": min(ran.values()) if ran else None,
        "tool": stacks.tool or None,
    }
    torch = find_torch_for(mapped, search, environ or {})
    driver = cuda.driver_version()
    report["torch"] = {"path": torch.path, "version": torch.version, "build": torch.build} if torch else None
    report["driver"] = driver

    threads = []
    problems: list[str] = []
    owners = dists.Owners()
    loads: list[dict] = []
    code = outside.CodeRanges(pid)
    for tid, sample in samples.items():
        share = outside.cpu_share(before.get(tid), sample, WINDOW)
        what = outside.verdict(sample, share)
        frames = stacks.python.get(tid, [])
        imports = import_state(frames)
        entry: dict = {
            "tid": tid,
            "name": stacks.names.get(tid) or ("MainThread" if tid == pid else sample.comm),
            "state": sample.state_name,
            "wchan": sample.wchan or None,
            "verdict": what,
            "cpu": round(share, 3) if share is not None else None,
            "last_ran": round(ran[tid], 3) if tid in ran else None,
            "waits_on": outside.waits_on(pid, sample) if what != outside.BUSY else None,
            "chain": imports["chain"],
            "doing": imports["doing"],
            "lock": imports["lock"],
            "python": [frame.describe() for frame in frames[:12]],
            "native": _short_native(stacks.native.get(tid, [])),
        }
        load = _load_of(pid, sample, entry, stacks.native.get(tid, []), code, exe, search, mapped)
        if load is not None:
            entry["load"] = load
            loads.append(load)
        threads.append(entry)
    _holders(threads)
    report["threads"] = threads

    libraries: dict[str, dict] = {}
    for load in loads:
        for path in (load.get("file"), load.get("initialising")):
            if path and path not in libraries:
                libraries[path] = library_facts(path, torch, driver, owners)
    report["libraries"] = list(libraries.values())
    for facts in libraries.values():
        problems += [f"! {text}" for text in facts["verdicts"]]
    problems[:0] = _hang_problems(pid, threads, stat)
    report["problems"] = problems
    report["unseen"] = unseen
    report["rerun"] = rerun_commands(cmdline, cwd, interpreter, search)
    return report


def _site_folders(mapped: Sequence[str]) -> list[str]:
    """The site-packages folders of the shared objects mapped: a search path when none was asked for."""
    found: dict[str, None] = {}
    for path in mapped:
        for marker in ("/site-packages/", "/dist-packages/"):
            if marker in path:
                found.setdefault(path.split(marker, 1)[0] + marker.rstrip("/"), None)
    return list(found)


def _script_folder(cmdline: Sequence[str], cwd: str | None) -> list[str]:
    words = list(cmdline[1:])
    while words and words[0].startswith("-") and words[0] not in ("-m", "-c", "-"):
        words.pop(0)
    if words and not words[0].startswith("-"):
        return [os.path.dirname(os.path.join(cwd or "/", words[0]))]
    return []


def _short_native(lines: Sequence[str], limit: int = 16) -> list[str]:
    if lines and lines[0].startswith("#"):
        shown = outside._gdb_lines("Thread 1 (x):\n" + "\n".join(lines), limit)[1:]
    else:
        shown = list(lines[:limit])
    return [line.strip() for line in shown]


def _load_of(pid, sample, entry, native_lines, code, exe, search, mapped) -> dict | None:
    """The native load the thread is in, if any: the file, the module, what is being initialised."""
    facts = native_facts(native_lines, exe, mapped) if native_lines else None
    chain = entry["chain"]
    in_extension = entry["doing"] is not None and entry["doing"].startswith("loading the extension")
    on_stack: list[str] = []
    if facts is None:
        on_stack = outside.libraries_on_stack(pid, sample, code)
    if facts is None and not in_extension:
        ours = [path for path in on_stack if not _is_system(path, exe)]
        dynamic = any(os.path.basename(path).startswith("ld-linux") for path in on_stack[:4])
        # Without ld.so on the stack, an extension's code on it may be any call into it, not its
        # PyInit: only a load inside dlopen is named without a debugger.
        if not ours or not dynamic:
            return None
        facts = {"dlopen": True, "file": None, "constructor": True, "init": None, "library": ours[0]}
        source = "the libraries on its stack (no debugger)"
    elif facts is None:
        facts = {"dlopen": None, "file": None, "constructor": False, "init": None, "library": None}
        source = "its Python frames"
    else:
        source = "its native stack"
        if not (facts["dlopen"] or facts["init"] or in_extension):
            return None
    module = chain[-1] if in_extension and chain else None
    path = facts["file"]
    if path is None and module is not None:
        path = next((p for p in mapped if module_of(p, search) == module), None)
    if path is None and facts["library"] and module_of(facts["library"], search):
        path = facts["library"]
    if module is None and path is not None:
        module = module_of(path, search)
    initialising = facts["library"] or path
    if facts["constructor"]:
        how = "its constructor runs, inside dlopen"
    elif facts["init"] or (in_extension and not facts["dlopen"] and facts["library"]):
        how = f"its PyInit{'_' + facts['init'] if facts['init'] else ''} runs, after dlopen"
    elif facts["dlopen"]:
        how = "inside dlopen"
    else:
        how = "dlopen or its PyInit"
    return {
        "module": module,
        "file": path,
        "initialising": initialising,
        "how": how,
        "source": source,
    }


def _holders(threads: list[dict]) -> None:
    """For a thread waiting for a module's import lock, the thread that imports that module."""
    for waiter in threads:
        lock = waiter.get("lock")
        if not lock:
            continue
        for other in threads:
            if other is not waiter and lock in other["chain"] and other.get("lock") != lock:
                waiter["lock_holder"] = f"{other['name']} (tid {other['tid']})"
                break


def _hang_problems(pid: int, threads: list[dict], stat) -> list[str]:
    problems = []
    if stat is not None and stat.state in "Tt":
        problems.append(
            f"process {pid} is stopped ({stat.state_name}): nothing runs; kill -CONT {pid} resumes it"
        )
    for thread in threads:
        label = f"{thread['name']} (tid {thread['tid']})"
        idle = f", no CPU for {thread['last_ran']:.1f} s" if thread.get("last_ran") is not None else ""
        if thread["chain"] and thread["verdict"] == outside.WAITING:
            text = f"{label} hangs in import {' > '.join(thread['chain'])} ({thread['verdict']}{idle})"
            if thread.get("lock_holder"):
                text += f": waiting for the import lock of {thread['lock']}, held by {thread['lock_holder']}"
            elif thread.get("load"):
                load = thread["load"]
                text += f": {load['how']}, loading {load['file'] or load['initialising']}"
                if load["initialising"] and load["initialising"] != load["file"]:
                    text += f", initialising {load['initialising']}"
            elif thread.get("doing"):
                text += f": {thread['doing']}"
            problems.append(text)
        elif thread.get("load") and thread["verdict"] == outside.WAITING:
            load = thread["load"]
            problems.append(
                f"{label} hangs loading {load['file'] or load['initialising']} ({load['how']}{idle})"
            )
        waits = thread.get("waits_on") or ""
        if waits.startswith(("in read on fd 0:", "in readv on fd 0:")):
            problems.append(f"{label} waits for input on stdin: {waits.partition(': ')[2]}")
    return problems


def rerun_commands(cmdline: Sequence[str], cwd: str | None, interpreter: str, search: Sequence[str]) -> dict:
    """The command lines that rerun the program under importwatch, and whether it must be installed first."""
    if not cmdline:
        return {}
    quoted = " ".join(shlex.quote(word) for word in cmdline)
    prefix = f"cd {shlex.quote(cwd)} && " if cwd else ""
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
        rest = " ".join(shlex.quote(word) for word in [*options, "-m", "importwatch", *words])
        commands["module"] = f"{prefix}{shlex.quote(cmdline[0])} {rest}"
    installed = any(
        os.path.isfile(os.path.join(entry, "importwatch", "__init__.py")) for entry in search if entry
    )
    if not installed:
        commands["install"] = f"{shlex.quote(interpreter)} -m pip install importwatch"
    return commands


def _ago(seconds: float) -> str:
    if seconds < 120:
        return f"{seconds:.1f} s"
    if seconds < 7200:
        return f"{seconds / 60:.1f} min"
    return f"{seconds / 3600:.1f} h"


def render(report: dict) -> str:
    """The report for people: the process, its threads, the load in flight, the verdicts, what was not seen."""
    lines = [f"importwatch inspect {report['pid']}", ""]
    command = " ".join(shlex.quote(word) for word in report["cmdline"]) or "?"
    lines.append(f"process     {report['pid']}: {_ascii(command)}")
    lines.append(f"python      {report['python'] or '?'} ({report['interpreter'] or report['exe']})")
    if report["started"] is not None:
        stamp = time.strftime("%Y-%m-%d %H:%M:%S %Z", time.localtime(report["started"]))
        lines.append(f"started     {stamp} ({_ago(max(0.0, time.time() - report['started']))} ago)")
    if report["idle"] is not None:
        lines.append(f"last CPU    {_ago(report['idle'])} ago (its most recent thread)")
    torch = report["torch"]
    lines.append(
        f"torch       {torch['version'] or '?'} ({torch['build']}) at {torch['path']}"
        if torch
        else "torch       not found"
    )
    lines.append(f"driver      {report['driver'] or 'none'}")
    lines.append(f"stacks      read with {report['tool']}" if report["tool"] else "stacks      not read")
    lines.append("")
    lines.append(f"threads ({len(report['threads'])})")
    for thread in report["threads"]:
        state = thread["state"] + (f" in {thread['wchan']}" if thread["wchan"] else "")
        if thread["cpu"] is not None:
            state += f", {thread['cpu'] * 100:.0f}% CPU"
        if thread["last_ran"] is not None:
            state += f", last ran {_ago(thread['last_ran'])} ago"
        body = f"  {thread['name']} (tid {thread['tid']}): {thread['verdict']} ({state})"
        if thread["waits_on"]:
            body += f"; {thread['waits_on']}"
        lines.append(_ascii(body))
        if thread["chain"]:
            lines.append(_ascii(f"    import in flight: {' > '.join(thread['chain'])}"))
        if thread["doing"] and not thread.get("load"):
            doing = thread["doing"]
            if thread.get("lock_holder"):
                doing += f", held by {thread['lock_holder']}"
            lines.append(_ascii(f"    {doing}"))
        load = thread.get("load")
        if load:
            named = f"module {load['module']}, " if load["module"] else ""
            lines.append(
                _ascii(f"    loading {named}{load['file'] or '?'} ({load['how']}; from {load['source']})")
            )
            if load["initialising"] and load["initialising"] != load["file"]:
                lines.append(_ascii(f"    initialising {load['initialising']}"))
        if thread["python"] and (thread["chain"] or thread["verdict"] != outside.BUSY):
            lines.append(_ascii(f"    python, outermost first: {_python_path(thread['python'])}"))
        if thread["native"] and (thread["chain"] or load):
            lines.append(_ascii(f"    native, innermost first: {' < '.join(thread['native'][:5])}"))
    if report["libraries"]:
        lines.append("")
        lines.append("shared objects in flight")
        for lib in report["libraries"]:
            needs = ", ".join(lib["needs"] + lib["torch_links"]) or "no CUDA or torch library"
            owner = f" (from {lib['distribution']})" if lib["distribution"] else ""
            lines.append(_ascii(f"  {lib['path']}{owner}: needs {needs}"))
            lines += [_ascii(f"    ! {text}") for text in lib["verdicts"]]
    if report["unseen"]:
        lines.append("")
        lines.append("not seen")
        lines += [_ascii(f"  {text}") for text in report["unseen"]]
    rerun = report["rerun"]
    if rerun:
        lines.append("")
        lines.append("to see more, rerun it under importwatch:")
        if "install" in rerun:
            lines.append(_ascii(f"  {rerun['install']}"))
        if "module" in rerun:
            lines.append(_ascii(f"  {rerun['module']}"))
        lines.append(_ascii(f"  {rerun['env']}"))
    lines.append("")
    problems = report["problems"]
    if not problems:
        lines.append("verdict: nothing suspect")
    else:
        lines.append(f"verdict: {len(problems)} problem{'s' if len(problems) != 1 else ''}")
        lines += [_ascii(f"  {problem}") for problem in problems]
    return "\n".join(lines) + "\n"


def _python_path(frames: Sequence[str]) -> str:
    """Frames (innermost first) as 'a (f.py:3) > [4 importlib frames] > b', outermost first."""
    parts: list[str] = []
    run = 0
    for frame in reversed(frames):
        if frame.split(" (", 1)[-1].startswith(BOOTSTRAP):
            run += 1
            continue
        if run:
            parts.append(f"[{run} importlib frames]")
            run = 0
        parts.append(frame)
    if run:
        parts.append(f"[{run} importlib frames]")
    return " > ".join(parts)


def _ascii(text: str) -> str:
    return text.encode("ascii", "backslashreplace").decode("ascii")
