"""The import hook: every import that misses sys.modules becomes a start event and an end event.

``importlib._bootstrap._find_and_load`` is looked up by name on every import
that misses ``sys.modules``, whichever finder serves it (also those inserted
ahead of others, ``importlib.import_module``, imports made from C, and ``from
pkg import sub``). The start event is written there, before the module lock is
taken and before any finder runs, so a blocked file system or a lock held by
another thread is already named.

Where an import in flight stands (waiting for another thread's module lock,
finding, loading which file) is read from importlib's own records when a report
needs it, which keeps everything but the two events off the hot path.
"""

import _frozen_importlib as _bootstrap
import _thread
import sys

from importwatch.events import IMPORT_END, STEP, STEP_END, VERDICT, escape
from importwatch.tracing.accelerator import ACCELERATOR
from importwatch.tracing.forklocks import owner_text
from importwatch.tracing.sink import CLOCKS

TYPE_CHECKING = False
if TYPE_CHECKING:  # typing costs milliseconds at start-up; annotations alone need it
    from typing import Any, Callable

    from importwatch.tracing.sink import Sink

# Phases of an import in flight, as a stall report names them.
WAITING = "waiting for the module lock"
WAITING_GLOBAL = "waiting for the import lock"
FINDING = "finding"
LOADING = "loading"


def _codes(phase: str, *functions: "Any") -> "dict[Any, str]":
    return {function.__code__: phase for function in functions if hasattr(function, "__code__")}


# Where a thread that has no module in sys.modules yet stands, by the innermost of these frames:
# the global lock is held by any thread running a finder; module_from_spec runs create_module.
_PHASE_OF_FRAME = {
    **_codes(WAITING_GLOBAL, getattr(_bootstrap, "_get_module_lock", None)),
    **_codes(WAITING_GLOBAL, getattr(getattr(_bootstrap, "_ImportLockContext", None), "__enter__", None)),
    **_codes(LOADING, getattr(_bootstrap, "module_from_spec", None)),
    **_codes(FINDING, getattr(_bootstrap, "_find_spec", None)),
}

IMPORTLIB_FILENAME = _bootstrap._find_and_load.__code__.co_filename
# types.FunctionType, without importing types at start-up (plain python has not).
FunctionType = type(lambda: None)
NEVER = float("inf")
# A cover that holds for no step (see Tracer.cover).
NO_COVER = (NEVER, NEVER)


class TracedStep:
    """One import, native load or phase in flight on one thread."""

    __slots__ = ("context", "kind", "name", "progress", "start", "timeout")

    def __init__(self, name: str, start: float, kind: str = "import") -> None:
        self.name = name
        self.kind = kind
        self.start = start
        self.progress = start  # last sign of life: the start, or the end of a nested step
        # A phase's or step's own stall threshold, counted from its start (None: the watchdog's,
        # counted from the last progress), and what a stall report should add about it.
        self.timeout: float | None = None
        self.context: Callable[[], list[str]] | None = None

    def describe(self, now: float, ident: int, thread_name: "Callable[[int], str]") -> str:
        """NAME (PHASE, AGE) for a report; IDENT is the thread it runs in, named by THREAD_NAME."""
        if self.kind != "import":
            return f"{self.name} ({now - self.start:.1f} s)"
        return f"{self.name} ({self.where(ident, thread_name)}, {now - self.start:.1f} s)"

    def where(self, ident: int, thread_name: "Callable[[int], str]") -> str:
        """The import's phase, read when a report needs it rather than tracked on the hot path.

        A module is in sys.modules from the moment its loader starts running it.
        Before that, its thread waits for the module's lock (importlib records
        which, for its own deadlock check), or its innermost importlib frame tells:
        waiting for importlib's global lock, finding, or creating the module.
        """
        module = sys.modules.get(self.name)
        if module is None:
            owner = lock_owner(ident, self.name)
            if owner is not None:
                return f"{WAITING} held by {owner_text(self.name, owner, thread_name)}" if owner else WAITING
            return _phase_of_stack(ident)
        spec = getattr(module, "__spec__", None)
        origin = getattr(spec, "origin", None)
        if getattr(spec, "has_location", False) and isinstance(origin, str):
            return f"{LOADING} {origin}"
        return LOADING


def _phase_of_stack(ident: int) -> str:
    """Thread IDENT's phase as its innermost importlib frame tells (finding when none does)."""
    frame = sys._current_frames().get(ident)
    while frame is not None:
        phase = _PHASE_OF_FRAME.get(frame.f_code)
        if phase is not None:
            return phase
        frame = frame.f_back
    return FINDING


def lock_owner(ident: int, name: str) -> "int | None":
    """When thread IDENT waits for module NAME's import lock: the thread that holds it (0 if unknown).

    importlib notes, per waiting thread, the lock it waits for (up to 3.11) or a
    list of them (3.12 on) in ``_blocking_on``; each lock knows its name and owner.
    """
    blocking = getattr(_bootstrap, "_blocking_on", None)
    try:
        entry = blocking.get(ident) if blocking is not None else None
        locks = list(entry) if isinstance(entry, list) else [entry]
    except Exception:  # a private structure of another version: no phase rather than no report
        return None
    for lock in locks:
        if getattr(lock, "name", None) == name:
            return getattr(lock, "owner", None) or 0
    return None


def as_importlib_frame(
    function: "Callable", name: "str | None" = None, stands_for: "Any" = None, importing: bool = True
) -> "Callable":
    """The same function, its frames filed under importlib's own file name (where IMPORTING).

    CPython strips importlib's frames from the traceback of a failed import
    (import.c, remove_importlib_frames), matching on the code's file name. Our
    wrapper sits between them; under importlib's name it is stripped with them,
    so tracebacks read exactly as they do without importwatch.

    STANDS_FOR: the function the clone takes the place of (importlib.util's, a loader's
    exec_module). The clone gets its globals, names, module and docstring, as a program
    reading the attribute finds them under plain python (CPython's own tests read
    spec_from_file_location.__globals__), and __wrapped__, so that inspect.signature gives
    the original's. FUNCTION must then read no global of its module: only its closure and
    builtins (tests/test_doors.py holds every such wrapper to it).
    """
    code = function.__code__
    filename = IMPORTLIB_FILENAME if importing else code.co_filename
    code = code.replace(co_filename=filename, co_name=code.co_name if name is None else name)
    namespace = getattr(stands_for, "__globals__", None)
    if not isinstance(namespace, dict):  # not a function: its names, if any, but our globals
        namespace = function.__globals__
    clone = FunctionType(code, namespace, function.__name__, function.__defaults__, function.__closure__)
    clone.__kwdefaults__ = function.__kwdefaults__  # FunctionType takes no keyword-only defaults
    clone.__qualname__ = function.__qualname__
    if stands_for is not None:
        look_like(clone, stands_for)
    return clone


_BoundMethod = type(as_importlib_frame.__get__(0))  # types.MethodType, without importing types at start-up


def look_like(wrapper: "Any", original: "Any") -> None:
    """WRAPPER given ORIGINAL's names, module and docstring, and __wrapped__ (inspect.signature's way
    to the original's signature)."""
    for attribute in ("__module__", "__name__", "__qualname__", "__doc__"):
        value = getattr(original, attribute, None)
        if isinstance(value, str) or (value is None and attribute in ("__module__", "__doc__")):
            setattr(wrapper, attribute, value)
    wrapper.__wrapped__ = original


def door(
    original: "Callable",
    enter: "Callable",
    leave: "Callable",
    stacks: "dict | None" = None,
    importing: bool = True,
    binds: "bool | None" = None,
    chooses: bool = False,
) -> "Callable":
    """ORIGINAL, in its place, with ENTER called before it (with its arguments) and LEAVE after it:
    LEAVE(token, error) gets what ENTER returned and the exception that ended ORIGINAL (None if it
    returned); where ENTER returns None, ORIGINAL is just called. The event of a door (doors.py) or a
    blocking step (blocking.py) is begun in ENTER and ended in LEAVE. Where CHOOSES, ENTER returns
    None or (token, function), and FUNCTION, ours, is called in ORIGINAL's place, unseen by the
    program's trace functions as ENTER is (a native load's frame named after the file, native.py).

    With the C accelerator a Door (_speedups_door.h): nothing of ours is on the stack while ORIGINAL
    runs, so a module body or an error raised in it reads as under plain python; with STACKS (the
    tracer's, for a loader's exec_module) the call an import makes for its own module passes straight
    through. Else a function, one frame: under importlib's name where ORIGINAL runs within an import
    (IMPORTING), so that a failed import's traceback drops it; under ours elsewhere (a CUDA
    initialisation), where nothing would. Either looks to the program as ORIGINAL does (its globals,
    names, docstring, and __wrapped__ for its signature); a Door also reads ORIGINAL's other attributes,
    and pickles and copies as a function does (docs/doors.md). A class attribute that holds it binds it
    where BINDS, by default where ORIGINAL binds (a function does, a builtin does not).
    """
    if binds is None:
        binds = hasattr(type(original), "__get__")
    make = getattr(ACCELERATOR, "door", None)
    if make is None:

        def through(*args: "Any", **kwargs: "Any") -> "Any":
            if not binds:
                args = args[1:]  # what the bound method below passes first
            token = enter(*args, **kwargs)
            if token is None:
                return original(*args, **kwargs)
            called = token[1] if chooses else original
            try:
                result = called(*args, **kwargs)
            except BaseException as error:
                ours = error.__traceback__  # this frame's entry first, then the chosen function's
                chosen = ours.tb_next if chooses and ours is not None else None
                if chosen is not None and chosen.tb_frame.f_code is getattr(called, "__code__", None):
                    # The error reads as if ORIGINAL had raised it, as the C door leaves it (from 3.11:
                    # before, a bare raise re-raises the traceback as it was caught).
                    error.__traceback__ = chosen.tb_next
                leave(token, error)
                raise
            leave(token, None)
            return result

        name = getattr(original, "__name__", None)
        twin = as_importlib_frame(through, name, stands_for=original, importing=importing)
        # A bound method is bound by no instance again: the twin's way not to be bound, as a builtin is not.
        return twin if binds else _BoundMethod(twin, original)
    made = make(original, enter, leave, stacks, binds, chooses)
    look_like(made, original)  # the rest a Door reads from ORIGINAL: __globals__, __code__, __defaults__...
    return made


def hidden(function: "Callable", binds: bool = True) -> "Callable":
    """FUNCTION, ours, where the program or the interpreter calls it (a loader's create_module, a fork or exit
    hook): with the C accelerator a Door that runs all of it unseen by the program's trace and profile
    functions, as CPython runs a trace function's own calls, so that a debugger's step, `trace --count` or
    a coverage tool never enters ours (_speedups_untraced.h); what it calls of the program's through
    ACCELERATOR.traced is seen again. Without the accelerator FUNCTION itself, seen (docs/limits.md).
    Bound by an instance where BINDS, as a function is."""
    make = getattr(ACCELERATOR, "door", None)
    return function if make is None else make(function, None, None, None, binds)


# What a function hidden() stands for calls of the program's (a native load's dlopen, site's own addpackage),
# as traced(function, *args): seen by the program's trace functions again. None without the accelerator,
# where nothing of ours is hidden: the caller calls the function as it is, with no frame between.
traced: "Callable[..., Any] | None" = getattr(ACCELERATOR, "traced", None)


class Tracer:
    """Keeps the imports in flight per thread and reports their start and end to the sink."""

    def __init__(self, sink: "Sink") -> None:
        self.sink = sink
        self.clock = CLOCKS.monotonic  # our own, out of reach of a patched time module (see sink.Clocks)
        self.stacks: dict[int, list[TracedStep]] = {}
        self.native_ids: dict[int, int] = {}  # thread ident: kernel thread id
        self.on_start: dict[str, Callable[[str], None]] = {}
        self.on_end: dict[str, Callable[[Any], None]] = {}
        self.on_progress: Callable[..., None] | None = None
        # From when a step's end must be told to on_progress: the watchdog keeps it (see
        # Watchdog._tell_due). A comparison on every import instead of a call, which almost none need.
        self.progress_due = NEVER
        # Called around steps that hold the GIL (a dlopen): the heartbeat cannot run then.
        self.on_gil_held: Callable[[TracedStep], None] | None = None
        self.on_gil_released: Callable[[TracedStep], None] | None = None
        # Called with the step's own threshold (None: the watchdog's) when a step begins that the
        # watchdog may not be watching yet: the first on a thread with nothing in flight, or one with
        # a threshold of its own.
        self.on_deadline: Callable[[float | None], None] | None = None
        # (LOW, HIGH): a thread's first step that begins at LOW or later and before HIGH needs no
        # on_deadline(None), which would do nothing then (the watchdog keeps it: see Watchdog._tell_due).
        # A comparison instead of a call at each import a program's own code makes.
        self.cover: tuple[float, float] = NO_COVER
        self._errors_said: set[str] = set()
        self._saved: Callable | None = None  # the original _find_and_load while installed

    # -- installing ------------------------------------------------------------
    @property
    def installed(self) -> bool:
        return self._saved is not None

    def install(self) -> None:
        if self._saved is not None:
            return
        self._saved = _bootstrap._find_and_load
        _bootstrap._find_and_load = self._make_hook(self._saved)

    def uninstall(self) -> None:
        if self._saved is None:
            return
        _bootstrap._find_and_load = self._saved
        self._saved = None

    def import_own(self, name: str) -> "Any":
        """One of importwatch's own modules, imported without a line: it is not the program's import."""
        module = sys.modules.get(name)
        if module is None:
            find_and_load = self._saved or _bootstrap._find_and_load
            module = find_and_load(name, _bootstrap._gcd_import)
        return module

    # -- the hot path ------------------------------------------------------------
    def _make_hook(self, original: "Callable") -> "Callable":
        """ORIGINAL traced: by the C accelerator, which adds no frame below a module body, where it is
        built; else by the closure below, its twin, filed under importlib's name so that a failed
        import's traceback drops it (see as_importlib_frame), which still adds one frame per import."""
        if ACCELERATOR is not None:
            try:
                return ACCELERATOR.find_and_load(
                    original, self, self.sink, self.sink.emit, CLOCKS.monotonic, TracedStep, escape
                )
            except Exception as error:  # a TracedStep or Tracer the C code does not know: the twin
                self.internal_error("the C accelerator", error)
        twin = as_importlib_frame(self._make_find_and_load(original))
        look_like(twin, original)  # importlib's names (pickle finds it where it is), not its globals: ours
        return twin

    # One piece on purpose: _find_and_load runs for every import, on a budget of a few microseconds.
    # The C accelerator (_speedups.c) does the same, in the same order, and writes the two lines as
    # Sink.emit would in the common case; a change here is one there too.
    # What it uses is bound here once, as cells of the closure (cheaper than attribute or global
    # lookups), and its stack bookkeeping stays inline: each helper call would add its cost to every
    # import, and the try/finally must see the push, the pop and both end lines together.
    def _make_find_and_load(self, original: "Callable") -> "Callable":
        stacks = self.stacks
        sink = self.sink
        emit = sink.emit
        on_start = self.on_start
        on_end = self.on_end
        get_ident = _thread.get_ident
        get_native_id = _thread.get_native_id
        native_ids = self.native_ids
        clock = CLOCKS.monotonic
        tracer = self

        def _find_and_load(name: str, import_: "Callable") -> "Any":
            if name in sys.modules:  # importlib.import_module of a loaded module, or a lock wait
                return original(name, import_)
            shown = name if name.isascii() and name.isprintable() else escape(name)  # once, for both lines
            hook = on_start.get(name)
            # Before the stack is taken: a callback may import. One that answers True leaves this
            # import out of the log (site's probe of an optional module that is not there).
            if hook is not None and tracer.safely(hook, name) is True:
                return original(name, import_)
            ident = get_ident()
            stack = stacks.get(ident)
            if stack is None:
                stack = stacks[ident] = []
                native_ids[ident] = get_native_id()  # for the watchdog's look at its CPU time
                # The program's own code ran since this thread's last step: it may have moved a descriptor
                # of ours that something writes to (the sink's guards; none may be: see check_descriptors).
                if sink.guards != ():
                    sink.check_descriptors()
                if tracer.on_deadline is not None:
                    low, high = tracer.cover
                    if not low <= clock() < high:
                        tracer.on_deadline(None)
            parent = stack[-1].name if stack else None
            indent = "  " * len(stack)
            frame = TracedStep(name, clock())
            stack.append(frame)
            failure = None
            try:  # from the push on: whatever fails, ours or the import, the step is popped
                # The two lines are rendered here as events.render would (no call per line on this path;
                # tests/test_events.py reads them back); the fields are only made when a JSON log writes them.
                try:
                    emit(
                        "import",
                        f"{indent}> {shown}",
                        {"name": name, "parent": parent} if sink.structured else None,
                    )
                except Exception as error:  # a RecursionError at the program's depth: the line is lost
                    try:
                        tracer.internal_error("writing a line", error)
                    except Exception:
                        pass  # no room left even to say it: said at a later failure
                module = original(name, import_)
            except BaseException as error:
                failure = f"{type(error).__name__}: {error}"
                raise
            finally:  # the end line, whichever way the import ended
                # Our own frame, by identity, and the thread's entry only while it is still this
                # list: whatever ran in between (a re-entrant import, a fork) may have changed both.
                if stack and stack[-1] is frame:
                    stack.pop()
                elif frame in stack:
                    stack.remove(frame)
                now = clock()
                if stack:
                    stack[-1].progress = now
                elif stacks.get(ident) is stack:
                    del stacks[ident]
                try:  # never an exception of ours in place of the import's own
                    ms = (now - frame.start) * 1000.0
                    if failure is None:
                        fields = {"name": name, "parent": parent, "ms": ms} if sink.structured else None
                        emit("import_end", f"{indent}< {shown} {ms:.3f} ms", fields)
                    else:  # an exception's text may need escaping
                        fields = {"name": name, "parent": parent, "ms": ms, "error": failure}
                        sink.event(IMPORT_END, fields, len(indent) // 2)
                    if now >= tracer.progress_due and tracer.on_progress is not None:
                        tracer.on_progress(now, failure)
                except Exception as error:
                    try:
                        tracer.internal_error("writing a line", error)
                    except Exception:
                        pass
            hook = on_end.get(name)
            if hook is not None:
                tracer.safely(hook, module)
            return module

        return _find_and_load

    # -- steps other than imports ------------------------------------------------
    def push(self, name: str, kind: str, timeout: "float | None" = None) -> "tuple[TracedStep, int]":
        """Put a native load or a phase in flight on this thread; returns it and its depth.

        TIMEOUT is the step's own stall threshold, counted from its start (None: the watchdog's).
        """
        stack, fresh = self.thread_stack()
        frame = TracedStep(name, CLOCKS.monotonic(), kind)
        frame.timeout = timeout
        stack.append(frame)
        pushed = False
        try:  # a failure here (ours, or a RecursionError) takes the step out again: never left in flight
            try:
                if (fresh or timeout is not None) and self.on_deadline is not None:
                    self.on_deadline(timeout)
                if kind == "native" and self.on_gil_held is not None:
                    self.on_gil_held(frame)
            except Exception as error:
                self.internal_error("the watchdog's start of a step", error)
            pushed = True
        finally:
            if not pushed and frame in stack:
                stack.remove(frame)
        return frame, len(stack) - 1

    def thread_stack(self) -> "tuple[list[TracedStep], bool]":
        """This thread's chain in flight, made when it has none; and whether it was made just now.

        _find_and_load does the same inline: it is the per-import hot path.
        """
        ident = _thread.get_ident()
        stack = self.stacks.get(ident)
        if stack is not None:
            return stack, False
        stack = self.stacks[ident] = []
        self.native_ids[ident] = _thread.get_native_id()  # for the watchdog's look at its CPU time
        if self.sink.guards != ():  # see _find_and_load
            self.sink.check_descriptors()
        return stack, True

    def pop(self, frame: "TracedStep") -> float:
        """End a step put in flight by push(); returns the time it ended."""
        ident = _thread.get_ident()
        stack = self.stacks.get(ident)
        now = CLOCKS.monotonic()
        if stack and stack[-1] is frame:
            stack.pop()
            if stack:
                stack[-1].progress = now
            else:
                del self.stacks[ident]
        elif stack and frame in stack:  # a phase left out of order (a generator): never leave it behind
            stack.remove(frame)
        try:  # the step is out already; a failure of ours here is said, never raised
            if frame.kind == "native" and self.on_gil_released is not None:
                self.on_gil_released(frame)
            if now >= self.progress_due and self.on_progress is not None:
                self.on_progress(now)
        except Exception as error:
            try:
                self.internal_error("the watchdog's end of a step", error)
            except Exception:
                pass
        return now

    # -- helpers -------------------------------------------------------------

    def in_flight(self) -> "dict[int, list[TracedStep]]":
        """A snapshot of the chains in flight, per thread ident."""
        return {ident: list(stack) for ident, stack in list(self.stacks.items()) if stack}

    def safely(self, function: "Callable", argument: "Any") -> "Any":
        """Run one of our own callbacks, and give its answer; a failure of ours is said once and never
        reaches the program (the answer is then None)."""
        try:
            return function(argument)
        except Exception as error:
            self.internal_error(getattr(function, "__qualname__", "a callback"), error)
            return None

    def absent_once(self, name: str) -> bool:
        """An on_start callback for site's own probes of sitecustomize and usercustomize: True (leave
        the import out of the log) when no finder has it, so that it fails with ModuleNotFoundError
        for that very name; that is every interpreter's start, not news. site imports each once."""
        self.on_start.pop(name, None)
        return _bootstrap._find_spec(name, None) is None

    def begin_step(
        self,
        label: str,
        fields: dict,
        context: "Callable[[], list[str]] | None" = None,
        problems: "tuple[str, ...] | list[str]" = (),
    ) -> "tuple[TracedStep, int, str]":
        """A step begun (LABEL on a stall's chain): its start line with FIELDS (name, detail) and PROBLEMS
        as verdicts; returns what end_step needs. Whatever fails from the push on, the step is ended."""
        frame, depth = self.push(label, "step")
        frame.context = context
        token = (frame, depth, fields["name"])
        try:
            self.write(STEP, fields, depth)
            for problem in problems:
                self.write(VERDICT, {"verdict": f"{token[2]}: {problem}"}, 0)
        except BaseException as error:
            self.end_step(token, error)
            raise
        return token

    def end_step(self, token: "tuple[TracedStep, int, str]", error: "BaseException | None") -> None:
        """The step of TOKEN (begin_step's) ended, by ERROR if not None: popped, its end line written."""
        frame, depth, name = token
        now = self.pop(frame)
        fields: dict = {"name": name, "ms": (now - frame.start) * 1000.0}
        if error is not None:
            fields["error"] = f"{type(error).__name__}: {error}"
        self.write(STEP_END, fields, depth)

    def write(self, kind: str, fields: dict, depth: int) -> None:
        """sink.event for a step's own lines, off the hot path: a line that cannot be written (a
        RecursionError at the program's depth) is lost, said once, and never raised into the program."""
        try:
            self.sink.event(kind, fields, depth)
        except Exception as error:
            try:
                self.internal_error("writing a line", error)
            except Exception:
                pass  # no room left even to say it: said at a later failure

    def internal_error(self, where: str, error: BaseException) -> None:
        """A bug of ours: said once per place, and the program goes on."""
        if where in self._errors_said:
            return
        self.sink.warn(f"internal error in {where}: {type(error).__name__}: {error}")
        self._errors_said.add(where)  # only once said: a warning that failed (no stack room) is tried again

    def after_fork_in_child(self) -> None:
        """Only the forking thread survives a fork: drop the others' chains."""
        ident = _thread.get_ident()
        for other in [key for key in self.stacks if key != ident]:
            del self.stacks[other]
