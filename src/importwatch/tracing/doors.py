"""The other doors into the import system: waits for a module still initialising, and module bodies run
by a loader outside an import statement (LazyLoader, spec_from_file_location, runpy, reload).

``_find_and_load`` (hook.py) sees every import that misses ``sys.modules``.
These ways to run or wait for a module's body pass it by; each is wrapped where
an import that does not use it pays nothing:

- ``_lock_unlock_module``: the C import code looks it up by name when the module
  is in ``sys.modules`` but its ``__spec__._initializing`` is set, so only for a
  module whose body is still running. It becomes an event only when another
  thread holds the module's lock (a wait); the same thread re-entering its own
  module (a circular import) passes through after one dictionary look-up.
- a loader class's ``exec_module``, once ``importlib.util`` has helped make a
  module for that class (spec_from_file_location, module_from_spec, LazyLoader:
  the ways plugin systems, pytest's importlib mode and lazy loading make theirs).
  From then on an import statement runs the wrapper too, inside
  ``_find_and_load``, whose event is already on top of the thread's chain: it
  passes through after one comparison (about 2,200 instructions an import).
- ``importlib.reload``, ``runpy.run_path`` and ``runpy.run_module`` (``python -m``
  itself uses neither).
"""

import _frozen_importlib as _bootstrap
import _frozen_importlib_external as _external
import _thread
import os
import sys

from importwatch.events import IMPORT, IMPORT_END
from importwatch.tracing.forklocks import forgotten_in_parent, note_locks_at_fork, owner_text
from importwatch.tracing.hook import WAITING, FunctionType, TracedStep, as_importlib_frame, door, hidden
from importwatch.tracing.sink import CLOCKS

_OURS = ("importwatch.", "_importwatch_boot")  # the package itself is imported before tracing starts
# What is put in the place of a function of importlib's or of a loader class (a door, hook.door) carries
# that function's globals, as a program reading the attribute finds them under plain python. The enters
# run under this module's own globals.

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any, Callable

    from importwatch.tracing.hook import Tracer


_fork_hooks = False


class DoorStep(TracedStep):
    """An event of this module in flight: a wait for a module lock, or a body run by a loader."""

    __slots__ = ("origin", "owner")

    def __init__(
        self, name: str, start: float, owner: "int | None" = None, origin: "str | None" = None
    ) -> None:
        super().__init__(name, start)
        self.owner = owner  # the thread holding the lock waited for; None for a body being run
        self.origin = origin

    def where(self, ident: int, thread_name: "Callable[[int], str]") -> str:
        if self.owner is not None:
            return f"{WAITING} held by {owner_text(self.name, self.owner, thread_name)}"
        if self.origin is not None:
            return f"loading {self.origin}"
        return super().where(ident, thread_name)


def _lock_owner(name: str) -> "int | None":
    """The thread other than this one that holds module NAME's lock now, if any."""
    ref = _bootstrap._module_locks.get(name)
    lock = ref() if ref is not None else None
    owner = getattr(lock, "owner", None)
    if owner is None or owner == _thread.get_ident():
        return None
    return owner


class Doors:
    """Installs and removes the wrappers; each turns what it sees into the tracer's start and end lines."""

    def __init__(self, tracer: "Tracer") -> None:
        self.tracer = tracer
        self._saved: list[tuple[Any, str, Any]] = []  # (owner, attribute, original), to put back
        self._loader_classes: set[type] = set()

    # -- installing --------------------------------------------------------------------
    def install(self) -> None:
        if self._saved:
            return
        global _fork_hooks
        if not _fork_hooks:  # once per process: fork hooks cannot be taken back
            _fork_hooks = True
            os.register_at_fork(
                before=hidden(note_locks_at_fork, binds=False),
                after_in_parent=hidden(forgotten_in_parent, binds=False),
            )
        lock_unlock = getattr(_bootstrap, "_lock_unlock_module", None)
        if lock_unlock is not None:
            self._replace(_bootstrap, "_lock_unlock_module", self._make_wait(lock_unlock))
        for name, wrap in self.arrivals().items():
            module = sys.modules.get(name)
            if module is not None:
                wrap(module)

    def uninstall(self) -> None:
        for owner, attribute, original in reversed(self._saved):
            setattr(owner, attribute, original)
        self._saved.clear()
        self._loader_classes.clear()

    def arrivals(self) -> "dict[str, Callable[[Any], None]]":
        """The modules with doors of their own, and what wraps each once it is there (Session connects them)."""
        return {"runpy": self._wrap_runpy, "importlib.util": self._wrap_util, "importlib": self._wrap_reload}

    def _replace(self, owner: "Any", attribute: str, replacement: "Any") -> None:
        self._saved.append((owner, attribute, owner.__dict__[attribute]))
        setattr(owner, attribute, replacement)

    # -- one event around a call ---------------------------------------------------------
    def _door(self, original: "Callable", enter: "Callable", stacks: "dict | None" = None) -> "Callable":
        """ORIGINAL as a door (hook.door): ENTER (returning _begin's token, or None) before it, _end after."""
        enter.__qualname__ = getattr(original, "__qualname__", enter.__qualname__)  # its TypeError's words
        return door(original, as_importlib_frame(enter), self._end, stacks)

    def _begin(self, frame: "DoorStep") -> "tuple[DoorStep, str | None, int] | None":
        """The event FRAME put in flight and its start line written: what _end needs.

        Never for a module of ours (None): Tracer.import_own passes the hook by, but a loader class wrapped
        here (pytest's assertion rewriter, which `-p importwatch` puts on our package) still runs its body.
        """
        if frame.name.startswith(_OURS):
            return None
        tracer = self.tracer
        stack, fresh = tracer.thread_stack()
        token = (frame, stack[-1].name if stack else None, len(stack))
        stack.append(frame)
        try:  # from the push on: whatever fails, ours or the program's, the step is popped
            if fresh and tracer.on_deadline is not None:
                tracer.on_deadline(None)
            fields = {"name": frame.name, "parent": token[1]}
            if frame.owner is not None:
                fields["waits_for"] = owner_text(frame.name, frame.owner, tracer.sink.thread_name)
            if frame.origin is not None:
                fields["origin"] = frame.origin
            tracer.write(IMPORT, fields, token[2])
        except BaseException as error:
            self._end(token, error)
            raise
        return token

    def _end(self, token: "tuple[DoorStep, str | None, int]", error: "BaseException | None") -> None:
        """The event of TOKEN (_begin's) ended, by ERROR if not None: popped, its end line written."""
        frame, parent, depth = token
        now = self.tracer.pop(frame)
        fields = {"name": frame.name, "parent": parent, "ms": (now - frame.start) * 1000.0}
        if error is not None:
            fields["error"] = f"{type(error).__name__}: {error}"
        self.tracer.write(IMPORT_END, fields, depth)

    # -- waits for a module still initialising ---------------------------------------------
    def _make_wait(self, original: "Callable") -> "Callable":
        begin, lock_owner, step, clocks = self._begin, _lock_owner, DoorStep, CLOCKS

        def _lock_unlock_module(name: str) -> "Any":
            owner = lock_owner(name)
            if owner is None:  # free, or ours (a circular import): no wait
                return None
            return begin(step(name, clocks.monotonic(), owner=owner))

        return self._door(original, _lock_unlock_module)

    # -- module bodies run by a loader --------------------------------------------------------
    def _wrap_exec_module(self, klass: type) -> None:
        """Have KLASS's exec_module announce the bodies it runs outside an import of the same module."""
        if klass in self._loader_classes or "exec_module" not in vars(klass):
            return
        self._loader_classes.add(klass)
        original = vars(klass)["exec_module"]
        if not isinstance(original, FunctionType):
            return  # a static or class method, or one in C: left alone
        stacks = self.tracer.stacks
        get_ident = _thread.get_ident
        begin, step, clocks = self._begin, DoorStep, CLOCKS

        def exec_module(loader: "Any", module: "Any") -> "Any":
            # An import statement's own call: its event is on top (the C Door reads this itself). A
            # plain attribute read is the cheapest test (70 ns a call against 300 for
            # ModuleType.__getattribute__); a lazy module answers it as it runs its body, without
            # starting it again.
            try:
                name = module.__name__
            except AttributeError:  # not a module: the loader's own error, untouched
                return None
            stack = stacks.get(get_ident())
            if (stack and stack[-1].name == name) or not isinstance(name, str):
                return None  # inside the import of this very module
            origin = getattr(getattr(module, "__spec__", None), "origin", None)
            return begin(step(name, clocks.monotonic(), origin=origin if isinstance(origin, str) else None))

        try:
            self._replace(klass, "exec_module", self._door(original, exec_module, stacks))
        except (TypeError, AttributeError):
            pass  # a class that cannot be changed

    def _wrap_util(self, util: "Any") -> None:
        """importlib.util: the loader classes of the modules it helps make are wrapped (_wrap_exec_module).

        spec_from_file_location and module_from_spec (the recipe of plugin systems and
        of pytest's importlib mode) wrap the class of the loader their spec has or will
        have, before the call, so neither needs a frame of ours; LazyLoader wraps the
        class of the loader it holds, whose exec_module runs the body when the module's
        first attribute is touched. An import that uses none of them costs nothing more.
        """
        wrap_loader = self._wrap_loader
        lazy = getattr(util, "LazyLoader", None)

        def watch(loader: "Any") -> None:
            if lazy is not None and isinstance(loader, lazy):
                loader = getattr(loader, "loader", None)
            if loader is not None:
                wrap_loader(type(loader))

        def module_from_spec(spec: "Any") -> None:
            watch(getattr(spec, "loader", None))

        def spec_from_file_location(
            name: "Any",
            location: "Any" = None,
            *,
            loader: "Any" = None,
            submodule_search_locations: "Any" = None,
        ) -> None:
            # Before the spec is made: the loader given, else each file loader it may choose by the
            # location's suffix. The door has no event of its own, so the spec comes straight from importlib.
            if loader is not None:
                watch(loader)
            else:
                for klass in (
                    _external.SourceFileLoader,
                    _external.SourcelessFileLoader,
                    _external.ExtensionFileLoader,
                ):
                    wrap_loader(klass)

        self._wrap_function(util, "module_from_spec", module_from_spec)
        self._wrap_function(util, "spec_from_file_location", spec_from_file_location)
        original_lazy = vars(lazy).get("exec_module") if lazy is not None else None
        if original_lazy is not None and not getattr(original_lazy, "_importwatch", False):

            def exec_module(loader: "Any", module: "Any") -> None:
                wrap_loader(type(getattr(loader, "loader", None)))

            traced = self._door(original_lazy, exec_module)
            traced._importwatch = True  # type: ignore[attr-defined]
            self._replace(lazy, "exec_module", traced)

    def _wrap_function(self, owner: "Any", name: str, enter: "Callable") -> None:
        """Replace OWNER.NAME, once, by a door (_door) with ENTER before it."""
        original = owner.__dict__.get(name)
        if original is None or getattr(original, "_importwatch", False):
            return
        traced = self._door(original, enter)
        traced._importwatch = True  # type: ignore[attr-defined]
        self._replace(owner, name, traced)

    def _wrap_reload(self, importlib: "Any") -> None:
        """importlib.reload runs a module's body again: an event named by the module."""
        begin, step, clocks = self._begin, DoorStep, CLOCKS

        def reload(module: "Any") -> "Any":
            name = getattr(module, "__name__", None)
            if not isinstance(name, str):
                return None  # not a module: reload's own error, untouched
            origin = getattr(getattr(module, "__spec__", None), "origin", None)
            return begin(step(name, clocks.monotonic(), origin=origin if isinstance(origin, str) else None))

        self._wrap_function(importlib, "reload", reload)

    def _wrap_loader(self, loader_class: type) -> None:
        """Wrap the exec_module LOADER_CLASS runs: the one of the first class in its MRO that defines it."""
        for klass in loader_class.__mro__:
            if "exec_module" in vars(klass):
                self._wrap_exec_module(klass)
                return

    def _wrap_runpy(self, runpy: "Any") -> None:
        """runpy.run_path and run_module (not python -m's own path): the code they run is an event."""
        begin, step, clocks = self._begin, DoorStep, CLOCKS

        def run_path(path_name: "Any", init_globals: "Any" = None, run_name: "Any" = None) -> "Any":
            name = run_name if isinstance(run_name, str) else "<run_path>"
            origin = path_name if isinstance(path_name, str) else repr(path_name)
            return begin(step(name, clocks.monotonic(), origin=origin))

        def run_module(
            mod_name: "Any", init_globals: "Any" = None, run_name: "Any" = None, alter_sys: "Any" = False
        ) -> "Any":
            return begin(step(str(mod_name), clocks.monotonic()))

        self._wrap_function(runpy, "run_path", run_path)
        self._wrap_function(runpy, "run_module", run_module)


# Our frames under importlib's file name, as hook.py files its own (tracebacks read as without us).
Doors._begin = as_importlib_frame(Doors._begin)  # type: ignore[method-assign]
Doors._end = as_importlib_frame(Doors._end)  # type: ignore[method-assign]
