"""The event model: every kind of event, its fields, its text and JSON renderings, and the one parser of both.

Writers (tracing/*, the watcher) build an event as a kind and its fields; the
Sink renders it with render() as the body of a text line (after the
`[importwatch PID ...]` prefix) and, in a JSON Lines log, as one object holding
the same fields. Readers (report, bisect, doctor, the watcher) get an Event back
from either line with read_line() and use its fields, never the text.

Each kind's fields are carried by both renderings, so event -> text -> event and
event -> JSON -> event give the same fields (durations and shares to the text's
digits). A few kinds also carry details that a text log gives by the lines
around it, or has no room for (EXTRAS: an import's parent, a stall's list of
chains); a text line leaves them out.

Logs may come from anywhere (a shared folder, a bug report): every string an
Event carries is printable ASCII (the rest escaped, as the writer escapes it),
every number is finite and within bounds, and a line that claims to be ours but
cannot be read is rejected with its reason (BadLine), never an exception of
another kind.

This module is imported by the Sink at start-up inside the traced process, so it
imports nothing and holds only what writing needs; the parser (with re and json)
is its other half, importwatch/events/read.py (Event, read_line, parse_line,
BadLine, clean), which only readers import.
"""

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Callable

# A line longer than this is not one of ours (the longest, a library listing, is tens of KiB).
MAX_LINE = 1 << 20
# Bounds on what a line of ours can say: pids and ranks, durations (a year), clock times
# (the epoch to the year 9999, which time.localtime can still render).
_MAX_ID = 1 << 31
MAX_MS = 366 * 86400 * 1000.0
MAX_TIME = 253402300799.0

# The kinds of events, as the "kind" field of a JSON line names them.
IMPORT = "import"  # name
IMPORT_END = "import_end"  # name, ms, error
NATIVE = "native"  # path, owner, needs (the CUDA libraries it links)
NATIVE_END = "native_end"  # path, ms, error, mapped (the shared objects the load brought)
PHASE = "phase"  # name, timeout (its own, None for the process's)
PHASE_END = "phase_end"  # name, ms, error
CHECKPOINT = "checkpoint"  # name
STEP = "step"  # name, detail
STEP_END = "step_end"  # name, ms, error
VERDICT = "verdict"  # verdict: what is wrong with a native load, a blocking step or the driver
WARNING = "warning"  # message: importwatch's own trouble (a log it cannot open, an internal error)
START = "start"  # python, executable, argv, cwd, platform, dumps
ENV = "env"  # env (the relevant variables, NAME: VALUE)
TORCH = "torch"  # version, cuda, hip, path; before import: before, runtimes, driver, gpus, models, visible
STALL = "stall"  # seconds, stalled (the thread), chain (in flight), report, busy, at; chains
STALL_THREAD = "stall_thread"  # chain: another thread in flight at a stall
STALL_CONTEXT = "stall_context"  # context
STALL_THREADS = "stall_threads"  # threads: faulthandler's addresses and their names
BUSY = "busy"  # stalled (the thread), cpu (the share of a CPU it used), gpu (an NVIDIA driver is loaded)
RESUMED = "resumed"  # name, seconds, interrupted (no name: Python runs again), dumped (where stacks went)
# The watcher's look from outside, one of: a headline (verdict, look, stalled, chain; a repeat's
# report and after), a thread (thread_name, tid, comm, state, verdict, waits; one of ours: ours),
# the library initialising (initialising, how), what a load mapped (load, names, mapped), or a
# detail in words (message: native stacks, notes).
OUTSIDE = "outside"
DIED = "died"  # process, how, seconds, chain, status: the program died with something in flight
EXIT = "exit"  # status (None: the watcher ends the program), message: ended on purpose
FORK = "fork"  # parent (pid)
SIGNAL = "signal"  # signal, child (pid), via: a parent signals its child
OTHER = "other"  # message: a line of ours of no kind known here (a newer version's)

KINDS = frozenset(
    (IMPORT, IMPORT_END, NATIVE, NATIVE_END, PHASE, PHASE_END, CHECKPOINT, STEP, STEP_END, VERDICT, WARNING)
) | frozenset((START, ENV, TORCH, STALL, STALL_THREAD, STALL_CONTEXT, STALL_THREADS, BUSY, RESUMED, OUTSIDE))
KINDS |= frozenset((DIED, EXIT, FORK, SIGNAL, OTHER))
# Kinds whose text line is indented by the event's depth in its thread.
NESTED = frozenset((IMPORT, IMPORT_END, NATIVE, NATIVE_END, PHASE, PHASE_END, CHECKPOINT, STEP, STEP_END))
# What only a JSON line carries, per kind (see the module's docstring); every other field of a kind
# is on its text line and read back from it. No field may be named as a JSON line's own keys (time,
# pid, thread, rank, kind, text): the Sink writes those. Why each stays:
# - import, import_end `parent`: the enclosing import, which a text log gives by indentation (the
#   start line before it, one level out); `waits_for` (the thread holding the module's lock) and
#   `origin` (the file a loader ran outside an import statement) of the import lines the doors
#   write: an import's two lines keep the one shape the hook writes inline on the hot path.
# - native_end `owner`, `needs`: said by the load's start line, `> dlopen PATH (OWNER) needs ...`.
# - verdict `path`: the native load it is about, the `dlopen` line next to it in the same thread
#   (the start line before it, or the failed end line before an explanation).
# - stall `chains`: the stalled thread's chain (this line's) and the `also in flight` lines after
#   it.
# - outside `mapped`: the full paths of what a stalled load mapped (often tens of long paths); the
#   line names their files, and the load's end line lists the paths.
EXTRAS = {
    IMPORT: ("parent", "waits_for", "origin"),
    IMPORT_END: ("parent",),
    NATIVE_END: ("owner", "needs"),
    VERDICT: ("path",),
    STALL: ("chains",),
    OUTSIDE: ("mapped",),
}
# Every line of the watcher's look starts so.
OUTSIDE_HEAD = "outside: "
# The watcher's headline starts with its verdict (facts/process.py's words), in these words.
OUTSIDE_HEADS = {
    "waiting": "waiting",
    "busy": "busy, not stuck",
    "stopped": "stopped",
    "deadlock": "deadlock",
}
# A repeat says `still WORDS after N s`: the verdict's head, or these words where it reads better.
OUTSIDE_STILL = {"deadlock": "deadlocked"}
# The env line when none of the variables it shows is set.
NO_ENV = "(no CUDA, library path or distributed variable is set)"
# The tail of the torch line written from torch's files, before it imports.
BEFORE_IMPORT = " (from its files, before import)"
# The torch line's words for what it does not find.
NO_RUNTIME = "none found (torch/lib, nvidia wheels, LD_LIBRARY_PATH, /usr/local/cuda*)"
NO_DRIVER = "none (no /proc/driver/nvidia/version)"
NO_VISIBLE = "CUDA_VISIBLE_DEVICES is empty: no GPU visible"

# Kinds whose line is one field after a fixed head, and that field. The rest are rendered from
# their fields by _RENDER.
_PROSE = {
    STALL_THREAD: ("  also in flight: ", "chain"),
    STALL_CONTEXT: ("  context: ", "context"),
    STALL_THREADS: ("  threads: ", "threads"),
    VERDICT: ("! ", "verdict"),
    WARNING: ("! importwatch: ", "message"),
    OTHER: ("", "message"),
}
_BUSY_HEAD = "  busy, not stuck: "
_DIED_HEAD = "outside: died during import: "
# The watcher's form of EXIT (status None): it ends the program from outside.
_EXIT_OUTSIDE = "outside: --exit-on-stall: "
# Heads of the lines that are not nested, longest match first where one head begins another.
_HEADS = (
    ("! importwatch: ", WARNING),
    ("! ", VERDICT),
    ("start ", START),
    ("env ", ENV),
    ("torch ", TORCH),
    ("STALL ", STALL),
    ("  also in flight: ", STALL_THREAD),
    ("RESUMED", RESUMED),
    (_DIED_HEAD, DIED),
    (_EXIT_OUTSIDE, EXIT),
    (OUTSIDE_HEAD, OUTSIDE),
    ("  context: ", STALL_CONTEXT),
    (_BUSY_HEAD, BUSY),
    ("  threads: ", STALL_THREADS),
    ("fork child of ", FORK),
    ("exiting with status ", EXIT),
    ("signal ", SIGNAL),
)


# -- rendering ---------------------------------------------------------------------------------
# The escapes of escape() for what is not printable ASCII, as Python's unicode_escape codec writes them.
_ESCAPES = {ord("\\"): "\\\\", ord("\t"): "\\t", ord("\n"): "\\n", ord("\r"): "\\r"}


def escape(text: str) -> str:
    """ASCII-only and one line: anything else as a backslash escape (\\xe9, \\n, \\x1b).

    Written out rather than done with the unicode_escape codec: the codec is a
    module that the first use would import, inside the import hook.
    """
    if text.isascii() and text.isprintable():
        return text
    return "".join([_escape_char(char) for char in text])


def _escape_char(char: str) -> str:
    if " " <= char <= "~" and char != "\\":
        return char
    code = ord(char)
    known = _ESCAPES.get(code)
    if known is not None:
        return known
    if code < 0x100:
        return f"\\x{code:02x}"
    if code < 0x10000:
        return f"\\u{code:04x}"
    return f"\\U{code:08x}"


# JSON string escapes (RFC 8259), the rest of the control characters as \u00XX.
_JSON_ESCAPES = {i: f"\\u{i:04x}" for i in range(0x20)}
_JSON_ESCAPES.update(
    {ord('"'): '\\"', ord("\\"): "\\\\", 8: "\\b", 9: "\\t", 10: "\\n", 12: "\\f", 13: "\\r"}
)
_JSON_ESCAPES[0x7F] = "\\u007f"


def json_string(text: str) -> str:
    """TEXT as a JSON string in ASCII: non-ASCII as \\uXXXX (a surrogate pair above the BMP)."""
    if text.isascii():
        if text.isprintable() and '"' not in text and "\\" not in text:
            return '"' + text + '"'
        return '"' + text.translate(_JSON_ESCAPES) + '"'
    parts = []
    for char in text.translate(_JSON_ESCAPES):
        code = ord(char)
        if code < 0x80:
            parts.append(char)
        elif code < 0x10000:
            parts.append(f"\\u{code:04x}")
        else:
            code -= 0x10000
            parts.append(f"\\u{0xD800 | code >> 10:04x}\\u{0xDC00 | code & 0x3FF:04x}")
    return '"' + "".join(parts) + '"'


def json_value(value: object) -> str:
    """VALUE as JSON text in ASCII, for what events carry: str, int, float, bool, None, lists, dicts.

    Written here rather than with the json module: a log must not import, before
    tracing starts, a module that the program's own import should show as an event.
    A float that is not finite becomes null (strict JSON has no NaN); anything
    else becomes its str().
    """
    if isinstance(value, str):
        return json_string(value)
    if value is None or value is True or value is False:
        return "null" if value is None else "true" if value else "false"
    if isinstance(value, int):
        return int.__repr__(value)
    if isinstance(value, float):
        return float.__repr__(value) if value - value == 0 else "null"
    if isinstance(value, dict):
        items = [json_string(str(key)) + ": " + json_value(item) for key, item in value.items()]
        return "{" + ", ".join(items) + "}"
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join([json_value(item) for item in value]) + "]"
    return json_string(str(value))


def json_line(
    now: float,
    pid: int,
    thread: "str | None",
    rank: "int | None",
    kind: str,
    body: str,
    fields: "dict | None",
) -> bytes:
    """The JSON rendering of an event: the Sink's prefix (time, pid, thread, rank), the kind, the
    fields and the text line's BODY as `text`, in one line of ASCII."""
    record = {"time": now, "pid": pid, "thread": thread or "MainThread"}
    if rank is not None:
        record["rank"] = rank
    record["kind"] = kind
    if fields:
        record.update(fields)
    record["text"] = body
    return (json_value(record) + "\n").encode("ascii")


def _ended(fields: dict) -> str:
    """The tail of an end line: ` 1.234 ms`, then ` failed ERROR` when it failed."""
    error = fields.get("error")
    tail = f" {fields['ms']:.3f} ms"
    return tail if error is None else f"{tail} failed {error}"


def _native(fields: dict) -> str:
    needs = fields.get("needs")
    return f"> dlopen {fields['path']} ({fields['owner']})" + (f" needs {', '.join(needs)}" if needs else "")


def _native_end(fields: dict) -> str:
    mapped = fields.get("mapped")
    listing = f"; mapped {len(mapped)} new: {', '.join(mapped)}" if mapped else ""
    return f"< dlopen {fields['path']}{_ended(fields)}{listing}"


def _timeout(timeout: "float | None") -> str:
    """A phase's own timeout on its start line, ` (timeout 2.5 s)`, in as many digits as read it back."""
    if timeout is None:
        return ""
    text = float.__repr__(float(timeout))
    return f" (timeout {text[:-2] if text.endswith('.0') else text} s)"


def _start(fields: dict) -> str:
    text = (
        f"start python {fields['python']} {fields['executable']} argv={fields['argv']!r} cwd={fields['cwd']}"
    )
    for key in ("platform", "dumps"):  # platform: not in the lines of older versions
        if fields.get(key) is not None:
            text += f" {key}={fields[key]}"
    return text


def _stall(fields: dict) -> str:
    """A stall report's headline: how long, busy or stuck, where the stalled thread is, what is in flight.

    The first report of a stall says `N s without progress` (or `busy, not stuck`); each later
    one, which stands alone on the terminal, `still stuck after N s (report K)`.
    """
    seconds, report, busy = fields["seconds"], fields.get("report") or 1, fields.get("busy")
    if report > 1:
        head = f"still {'busy' if busy else 'stuck'} after {seconds:.1f} s (report {report})"
    else:
        head = f"{seconds:.1f} s {'busy, not stuck' if busy else 'without progress'}"
    at = fields.get("at")
    where = f" at {at}" if at else ""
    return f"STALL {head}{where}; in flight: {fields['stalled']}: {fields['chain']}"


def torch_build(fields: dict) -> str:
    """What torch is built for, in words: 'built for CUDA 12.1', 'ROCm build, HIP 6.0', ..."""
    if fields.get("cuda"):
        return f"built for CUDA {fields['cuda']}"
    if fields.get("hip"):
        return f"ROCm build, HIP {fields['hip']}"
    if fields.get("version") is None:
        return "version unknown: no torch/version.py"
    return "CPU build, no CUDA"


def _torch(fields: dict) -> str:
    """`torch VERSION (BUILD) at PATH`; before import, from its files, also the CUDA runtimes at hand,
    the driver and its GPUs, and CUDA_VISIBLE_DEVICES when set."""
    parts = [f"torch {fields.get('version') or '?'} ({torch_build(fields)}) at {fields['path']}"]
    if not fields.get("before"):
        return parts[0]
    runtimes = fields.get("runtimes")
    if runtimes is not None:
        parts.append("CUDA runtime: " + (", ".join(runtimes) if runtimes else NO_RUNTIME))
    driver = fields.get("driver")
    if driver is None:
        parts.append(f"driver: {NO_DRIVER}")
    else:
        gpus, models = fields.get("gpus") or 0, fields.get("models") or []
        count = f"{gpus} GPU" + ("s" if gpus != 1 else "")
        parts.append(f"driver: {driver}, {count}" + (f" ({', '.join(models)})" if models else ""))
    visible = fields.get("visible")
    if visible is not None:
        parts.append(f"CUDA_VISIBLE_DEVICES={visible}" if visible.strip() else NO_VISIBLE)
    return "; ".join(parts) + BEFORE_IMPORT


def _outside(fields: dict) -> str:
    """One line of the watcher's look from outside; which one, its fields say (see OUTSIDE)."""
    if "look" in fields:
        verdict = fields["verdict"]
        head = OUTSIDE_HEADS.get(verdict, verdict)
        report = fields.get("report") or 1
        if report > 1:
            head = f"still {OUTSIDE_STILL.get(verdict, head)} after {fields['after']:.1f} s (report {report})"
        return f"{OUTSIDE_HEAD}{head}: {fields['look']}; in flight: {fields['stalled']}: {fields['chain']}"
    if "tid" in fields:
        who = f"{OUTSIDE_HEAD}{fields['thread_name']} (tid {fields['tid']}"
        if fields.get("comm") is None:  # one of importwatch's own threads
            return f"{who}): {fields['ours']}"
        waits = fields.get("waits")
        tail = f"; {waits}" if waits else ""
        return f"{who}, {fields['comm']}): {fields['state']}: {fields['verdict']}{tail}"
    if "initialising" in fields:
        return f"{OUTSIDE_HEAD}most likely initialising: {fields['initialising']} ({fields['how']})"
    if "load" in fields:
        return f"{OUTSIDE_HEAD}mapped since dlopen {fields['load']} began: {', '.join(fields['names'])}"
    return OUTSIDE_HEAD + fields["message"]


def _env(fields: dict) -> str:
    env = fields["env"]
    return "env " + (" ".join(f"{name}={value}" for name, value in env.items()) if env else NO_ENV)


def _busy(fields: dict) -> str:
    # CUDA JIT is named only where it can happen: with an NVIDIA driver (absent from older logs: named).
    work = "CUDA JIT compiling PTX or a build" if fields.get("gpu", True) else "a build or a long computation"
    return (
        f"{_BUSY_HEAD}{fields['stalled']} used {fields['cpu']:.0%} of a CPU just now (or waited for one); "
        f"slow work such as {work} ends by itself"
    )


def _resumed(fields: dict) -> str:
    """`RESUMED after 2.0 s: NAME ended` (or interrupted); or, once Python runs again after
    faulthandler dumped a stall on its own, `RESUMED: progress again after a stall`."""
    dumped = fields.get("dumped")
    if fields.get("name") is None:
        return f"RESUMED: progress again after a stall; stacks dumped {dumped}"
    how = "interrupted (KeyboardInterrupt)" if fields.get("interrupted") else "ended"
    tail = f" (stacks dumped {dumped})" if dumped else ""
    return f"RESUMED after {fields['seconds']:.1f} s: {fields['name']} {how}{tail}"


def _died(fields: dict) -> str:
    return (
        f"{_DIED_HEAD}process {fields['process']} {fields['how']} after {fields['seconds']:.1f} s "
        f"with in flight: {fields['chain']}"
    )


def _exit(fields: dict) -> str:
    status = fields.get("status")
    if status is None:
        return _EXIT_OUTSIDE + fields["message"]
    return f"exiting with status {status} ({fields['message']})"


_RENDER: "dict[str, Callable[[dict], str]]" = {
    IMPORT: lambda f: f"> {f['name']}",
    IMPORT_END: lambda f: f"< {f['name']}{_ended(f)}",
    NATIVE: _native,
    NATIVE_END: _native_end,
    PHASE: lambda f: f"> phase {f['name']}{_timeout(f.get('timeout'))}",
    PHASE_END: lambda f: f"< phase {f['name']}{_ended(f)}",
    CHECKPOINT: lambda f: f"checkpoint {f['name']}",
    STEP: lambda f: f"> step {f['name']} {f['detail']}",
    STEP_END: lambda f: f"< step {f['name']}{_ended(f)}",
    START: _start,
    ENV: _env,
    TORCH: _torch,
    STALL: _stall,
    BUSY: _busy,
    RESUMED: _resumed,
    OUTSIDE: _outside,
    DIED: _died,
    EXIT: _exit,
    FORK: lambda f: f"fork child of {f['parent']}",
    SIGNAL: lambda f: f"signal {f['signal']} to child {f['child']} ({f['via']})",
}


def render(kind: str, fields: dict, depth: int = 0) -> str:
    """The body of KIND's text line for FIELDS (not yet escaped: the Sink escapes it).

    The import hook renders its own two lines inline, as these would (see tracing/hook.py).
    """
    made = _RENDER.get(kind)
    if made is not None:
        body = made(fields)
    else:
        head, key = _PROSE.get(kind, _PROSE[OTHER])
        body = head + fields[key]
    return "  " * depth + body if kind in NESTED else body
