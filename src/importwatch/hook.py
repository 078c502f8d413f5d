"""The import hook: every import that misses sys.modules becomes a start event and an end event.

Two hook points, each for something the other cannot see:

- ``importlib._bootstrap._find_and_load`` is looked up by name on every import
  that misses ``sys.modules``, whichever finder serves it (also those inserted
  ahead of ours later, ``importlib.import_module``, imports made from C, and
  ``from pkg import sub``). The start event is written there, before the module
  lock is taken and before any finder runs, so a blocked file system or a lock
  held by another thread is already named.
- A ``sys.meta_path`` finder at the front marks the moment the finders start,
  which tells a wait for another thread's module lock from a slow find. It finds
  nothing itself, so every module keeps the spec and the loader it would have had.

Which file an import is running is read from sys.modules when a report needs
it, which keeps a third hook off the hot path.
"""

from __future__ import annotations

import _frozen_importlib as _bootstrap
import _thread
import sys
import time
import types

TYPE_CHECKING = False
if TYPE_CHECKING:  # typing costs milliseconds at start-up; annotations alone need it
    from typing import Any, Callable

    from importwatch.log import Sink

# Phases of an import in flight, as a stall report names them.
WAITING = "waiting for the module lock"
FINDING = "finding"
LOADING = "loading"

IMPORTLIB_FILENAME = _bootstrap._find_and_load.__code__.co_filename


class Frame:
    """One import, native load or phase in flight on one thread."""

    __slots__ = ("context", "kind", "name", "phase", "progress", "start", "timeout")

    def __init__(self, name: str, start: float, kind: str = "import") -> None:
        self.name = name
        self.kind = kind
        self.start = start
        self.progress = start  # last sign of life: the start, or the end of a nested step
        self.phase = WAITING if kind == "import" else kind
        # A phase's or step's own stall threshold, counted from its start (None: the watchdog's,
        # counted from the last progress), and what a stall report should add about it.
        self.timeout: float | None = None
        self.context: Callable[[], list[str]] | None = None

    def describe(self, now: float) -> str:
        if self.kind != "import":
            return f"{self.name} ({now - self.start:.1f} s)"
        return f"{self.name} ({self.where()}, {now - self.start:.1f} s)"

    def where(self) -> str:
        """The import's phase, read when a report needs it rather than tracked on the hot path.

        A module is in sys.modules from the moment its loader starts running it;
        before that, our finder has marked whether the finders have started.
        """
        module = sys.modules.get(self.name)
        if module is None:
            return self.phase
        spec = getattr(module, "__spec__", None)
        origin = getattr(spec, "origin", None)
        if getattr(spec, "has_location", False) and isinstance(origin, str):
            return f"{LOADING} {origin}"
        return LOADING


def as_importlib_frame(function: Callable, name: str | None = None) -> Callable:
    """The same function, its frames filed under importlib's own file name.

    CPython strips importlib's frames from the traceback of a failed import
    (import.c, remove_importlib_frames), matching on the code's file name. Our
    wrapper sits between them; under importlib's name it is stripped with them,
    so tracebacks read exactly as they do without importwatch.
    """
    code = function.__code__.replace(co_filename=IMPORTLIB_FILENAME)
    if name is not None:
        code = code.replace(co_name=name)
    clone = types.FunctionType(
        code, function.__globals__, function.__name__, function.__defaults__, function.__closure__
    )
    clone.__qualname__ = function.__qualname__
    return clone


class ImportWatchFinder:
    """The meta_path entry: marks that the finders have started, and finds nothing itself."""

    def __init__(self, tracer: Tracer) -> None:
        self._tracer = tracer

    def find_spec(self, fullname: str, path: Any = None, target: Any = None) -> None:
        stack = self._tracer.stacks.get(_thread.get_ident())
        if stack and stack[-1].name == fullname:
            stack[-1].phase = FINDING
        return None

    def invalidate_caches(self) -> None:
        pass


class Tracer:
    """Keeps the imports in flight per thread and reports their start and end to the sink."""

    def __init__(self, sink: Sink) -> None:
        self.sink = sink
        self.stacks: dict[int, list[Frame]] = {}
        self.native_ids: dict[int, int] = {}  # thread ident: kernel thread id
        self.on_start: dict[str, Callable[[str], None]] = {}
        self.on_end: dict[str, Callable[[Any], None]] = {}
        self.on_progress: Callable[[float], None] | None = None
        # Called around steps that hold the GIL (a dlopen): the heartbeat cannot run then.
        self.on_gil_held: Callable[[Frame], None] | None = None
        self.on_gil_released: Callable[[Frame], None] | None = None
        self.finder = ImportWatchFinder(self)
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
        _bootstrap._find_and_load = as_importlib_frame(self._make_find_and_load(self._saved))
        sys.meta_path.insert(0, self.finder)

    def uninstall(self) -> None:
        if self._saved is None:
            return
        _bootstrap._find_and_load = self._saved
        self._saved = None
        if self.finder in sys.meta_path:
            sys.meta_path.remove(self.finder)

    # -- the hot path ------------------------------------------------------------
    def _make_find_and_load(self, original: Callable) -> Callable:
        stacks = self.stacks
        sink = self.sink
        on_start = self.on_start
        on_end = self.on_end
        get_ident = _thread.get_ident
        get_native_id = _thread.get_native_id
        native_ids = self.native_ids
        clock = time.monotonic
        tracer = self

        def _find_and_load(name: str, import_: Callable) -> Any:
            if name in sys.modules:  # importlib.import_module of a loaded module, or a lock wait
                return original(name, import_)
            ident = get_ident()
            stack = stacks.get(ident)
            if stack is None:
                stack = stacks[ident] = []
                native_ids[ident] = get_native_id()  # for the watchdog's look at its CPU time
            parent = stack[-1].name if stack else None
            indent = "  " * len(stack)
            hook = on_start.get(name)
            if hook is not None:
                tracer.safely(hook, name)
            frame = Frame(name, clock())
            stack.append(frame)
            sink.event("import", f"{indent}> {name}", {"name": name, "parent": parent})
            try:
                module = original(name, import_)
            except BaseException as error:
                stack.pop()
                now = clock()
                if stack:
                    stack[-1].progress = now
                else:
                    del stacks[ident]
                ms = (now - frame.start) * 1000.0
                message = f"{type(error).__name__}: {error}"
                sink.event(
                    "import_end",
                    f"{indent}< {name} {ms:.3f} ms failed {message}",
                    {"name": name, "parent": parent, "ms": ms, "error": message},
                )
                if tracer.on_progress is not None:
                    tracer.on_progress(now)
                raise
            stack.pop()
            now = clock()
            if stack:
                stack[-1].progress = now
            else:
                del stacks[ident]
            ms = (now - frame.start) * 1000.0
            sink.event(
                "import_end", f"{indent}< {name} {ms:.3f} ms", {"name": name, "parent": parent, "ms": ms}
            )
            if tracer.on_progress is not None:
                tracer.on_progress(now)
            hook = on_end.get(name)
            if hook is not None:
                tracer.safely(hook, module)
            return module

        return _find_and_load

    # -- steps other than imports ------------------------------------------------
    def push(self, name: str, kind: str) -> tuple[Frame, int]:
        """Put a native load or a phase in flight on this thread; returns it and its depth."""
        ident = _thread.get_ident()
        stack = self.stacks.get(ident)
        if stack is None:
            stack = self.stacks[ident] = []
            self.native_ids[ident] = _thread.get_native_id()
        frame = Frame(name, time.monotonic(), kind)
        stack.append(frame)
        if kind == "native" and self.on_gil_held is not None:
            self.on_gil_held(frame)
        return frame, len(stack) - 1

    def pop(self, frame: Frame) -> float:
        """End a step put in flight by push(); returns the time it ended."""
        ident = _thread.get_ident()
        stack = self.stacks.get(ident)
        now = time.monotonic()
        if stack and stack[-1] is frame:
            stack.pop()
            if stack:
                stack[-1].progress = now
            else:
                del self.stacks[ident]
        elif stack and frame in stack:  # a phase left out of order (a generator): never leave it behind
            stack.remove(frame)
        if frame.kind == "native" and self.on_gil_released is not None:
            self.on_gil_released(frame)
        if self.on_progress is not None:
            self.on_progress(now)
        return now

    # -- helpers -------------------------------------------------------------

    def top(self) -> Frame | None:
        """The innermost import in flight on the calling thread."""
        stack = self.stacks.get(_thread.get_ident())
        return stack[-1] if stack else None

    def in_flight(self) -> dict[int, list[Frame]]:
        """A snapshot of the chains in flight, per thread ident."""
        return {ident: list(stack) for ident, stack in list(self.stacks.items()) if stack}

    def safely(self, function: Callable, argument: Any) -> None:
        """Run one of our own callbacks; a failure of ours is said once and never reaches the program."""
        try:
            function(argument)
        except Exception as error:
            self.internal_error(getattr(function, "__qualname__", "a callback"), error)

    def internal_error(self, where: str, error: BaseException) -> None:
        """A bug of ours: said once per place, and the program goes on."""
        if where in self._errors_said:
            return
        self._errors_said.add(where)
        self.sink.warn(f"importwatch internal error in {where}: {type(error).__name__}: {error}")

    def after_fork_in_child(self) -> None:
        """Only the forking thread survives a fork: drop the others' chains."""
        ident = _thread.get_ident()
        for other in [key for key in self.stacks if key != ident]:
            del self.stacks[other]
