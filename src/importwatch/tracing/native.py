"""Native loads: the dlopen of extension modules and of ctypes libraries, as start and end events.

The start line is written before dlopen is called: dlopen holds the GIL, so
while it hangs nothing in Python can speak, and the last start line without an
end is what names the culprit. The call itself runs through a frame named after
the file, so faulthandler's dump of the hung thread names it too. That frame is
the only one of ours below the load: a door (hook.door) stands in importlib's
create_module and in ctypes' _dlopen and chooses it, so a module body that an
extension's init imports is one frame deeper than under plain python.
"""

import _frozen_importlib_external as _external
import os
import sys

from importwatch.events import NATIVE, NATIVE_END, VERDICT
from importwatch.tracing.accelerator import ACCELERATOR
from importwatch.tracing.hook import as_importlib_frame, door, traced

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any, Callable

    from importwatch.facts.cuda import TorchFacts
    from importwatch.facts.loaded import LoadedObjects
    from importwatch.facts.mapped import MappedObjects
    from importwatch.tracing.hook import TracedStep, Tracer
    from importwatch.tracing.standby import Standby

    # A load in flight, from its start line to its end line: its step, the step's depth, the fields of
    # its lines, and whether what is mapped may grow (see _announce).
    Load = tuple[TracedStep, int, dict[str, Any], bool]

    # What a file links, as (needed, rpath, runpath, soname): facts/elf.py's DynamicInfo as a tuple.
    Dynamic = tuple[tuple[str, ...], str | None, str | None, str | None]

# The facts modules every process's first native load runs (math, _json, _struct are such loads): that load
# reads their compiled files and runs them with no finder (tracing/standby.py), 0.3 ms quicker than an
# import of ours there. Neither imports anything start-up holds back from the program. elf.py, which
# reads the ELF files where the C accelerator is not built, is imported the usual way, lent what is held.
FIRST_FACTS = ("importwatch.facts.libnames", "importwatch.facts.mapped")


def _dlopen_through(original: "Callable") -> "Callable":
    """What a native load's door calls in ORIGINAL's place, renamed for each load after its file (see
    NativeLoads._door): ORIGINAL, called as the program's (its constructors and a module's init, seen by
    the program's trace functions: hook.traced). A hung dlopen holds the GIL, and then faulthandler's dump
    is all that can speak: this frame names the file there. Filed under importlib's name, as our other
    frames on the import path; the door takes its entry out of the traceback of an error it passes on."""

    def dlopen(*args: "Any") -> "Any":
        return original(*args) if traced is None else traced(original, *args)

    return dlopen


def _extension_load(*args: "Any") -> "tuple[str, str] | None":
    """The file and module of importlib's call ExtensionFileLoader.create_module(loader, spec); None for
    another call (a spec that is no spec), which meets the function as without us."""
    if len(args) != 2:
        return None
    try:
        return args[1].origin, args[1].name
    except Exception:
        return None


def _library_load(*args: "Any") -> "tuple[str, str] | None":
    """The library of a call ctypes._dlopen(name, mode); None for the main program's own symbols (no name)."""
    if not args or args[0] is None:
        return None
    try:
        return str(args[0]), "ctypes"
    except Exception:
        return None


class NativeLoads:
    """Wraps the places where Python code calls dlopen, and reports each call."""

    def __init__(self, tracer: "Tracer", standby: "Standby | None" = None) -> None:
        self.tracer = tracer
        self.standby = standby  # runs FIRST_FACTS from their compiled files (see fact)
        self.sink = tracer.sink
        self._create_module: Callable | None = None
        self._ctypes: Any = None
        self._ctypes_dlopen: Callable | None = None
        self._facts: tuple[TorchFacts | None, str | None] | None = None
        self._facts_run: dict[str, Any] = {}  # fact()'s modules, once imported
        self._owners: Any = None  # dists.Owners: which distribution installed a file, from RECORDs
        self._objects: MappedObjects | None = None
        # The loader's own list, once the program has imported ctypes: False where it cannot be read.
        self._loaded: LoadedObjects | bool | None = None
        # A watcher was started: tell it what is mapped before the next load (see _tell_mapped).
        self.tell_mapped = False

    def fact(self, name: str) -> "Any":
        """importwatch.facts.NAME (libnames, elf, cuda, loaded, mapped, dists), imported on the first load that needs it.

        Not at start-up, which they would make slower for every traced program, loads or not; and
        through import_own, so that no line of ours stands among the program's. What they import
        of ours must be imported first, the same way: cuda imports libnames.
        """
        found = self._facts_run.get(name)
        if found is not None:
            return found  # each load asks for some (libnames at every one): a dict's look, not an import's
        if name == "cuda":
            self.fact("libnames")
        module = "importwatch.facts." + name
        if module in FIRST_FACTS and module not in sys.modules and self.standby is not None:
            self.standby.read((module,))  # import_own then runs it from these bytes
        found = self._facts_run[name] = self.tracer.import_own(module)
        return found

    def install(self) -> None:
        """A door in ExtensionFileLoader.create_module's place, and ctypes wrapped if the program has it."""
        if self._create_module is None:
            self._create_module = original = _external.ExtensionFileLoader.create_module
            _external.ExtensionFileLoader.create_module = self._door(original, _extension_load)
        ctypes = sys.modules.get("ctypes")
        if ctypes is not None:
            self.wrap_ctypes(ctypes)

    def _door(self, original: "Callable", load_of: "Callable") -> "Callable":
        """ORIGINAL, which dlopens, in a door (hook.door) that makes each call LOAD_OF names a load.

        Its enter puts the load in flight and writes the start line (begin), then chooses what the door
        calls: _dlopen_through's function, named `dlopen PATH for OWNER`, the one frame of ours below
        the load. Its leave writes the end line (end). Neither is on the stack while the load runs.
        """
        loads = self
        through = _dlopen_through(original)

        def enter(*args: "Any", **kwargs: "Any") -> "tuple[Load, Callable] | None":
            found = None if kwargs else load_of(*args)
            if found is None:
                return None
            path, owner = found
            try:
                called = as_importlib_frame(through, f"dlopen {path} for {owner}")
            except Exception as error:
                loads.tracer.internal_error("naming a native load", error)
                return None
            return loads.begin(path, owner), called

        def leave(token: "tuple[Load, Callable]", error: "BaseException | None") -> None:
            loads.end(token[0], error)

        # Under importlib's name: the pure twin's door calls them, and a failed import's traceback drops them.
        return door(original, as_importlib_frame(enter), as_importlib_frame(leave), chooses=True)

    def arrivals(self) -> "dict[str, Callable[[Any], None]]":
        """ctypes, wrapped when it arrives if it has not yet (Session connects it)."""
        return {"ctypes": self.wrap_ctypes}

    def uninstall(self) -> None:
        if self._create_module is not None:
            _external.ExtensionFileLoader.create_module = self._create_module
            self._create_module = None
        if self._ctypes is not None:
            self._ctypes._dlopen = self._ctypes_dlopen
            self._ctypes = self._ctypes_dlopen = None

    def wrap_ctypes(self, ctypes: "Any") -> None:
        """ctypes.CDLL, PyDLL and cdll.LoadLibrary all call the module's _dlopen."""
        original = getattr(ctypes, "_dlopen", None)
        if original is None or self._ctypes is not None:
            return
        self._ctypes, self._ctypes_dlopen = ctypes, original
        ctypes._dlopen = self._door(original, _library_load)

    def begin(self, path: str, owner: str) -> "Load":
        """The load of PATH for OWNER in flight, its start line written.

        Before dlopen is called, everything a hang report needs is already written: the
        file, the CUDA libraries it links, and any verdict about them.
        """
        frame, depth = self.tracer.push(f"dlopen {path}", "native")
        fields: dict[str, Any] = {"path": path, "owner": owner}
        try:  # from the push on: whatever fails, the step is popped
            rescan = self._announce(frame, depth, fields)
        except BaseException as error:
            self.end((frame, depth, fields, False), error)
            raise
        return frame, depth, fields, rescan

    def end(self, load: "Load", error: "BaseException | None") -> None:
        """LOAD out of flight, its end line written: what it mapped, or the ERROR that ended it and why."""
        frame, depth, fields, rescan = load
        tracer = self.tracer
        now = tracer.pop(frame)
        fields["ms"] = (now - frame.start) * 1000.0
        path = fields["path"]
        if error is not None:
            fields["error"] = f"{type(error).__name__}: {error}"
            tracer.write(NATIVE_END, fields, depth)
            if isinstance(error, (ImportError, OSError)):
                try:
                    self._explain(str(error), path)
                except Exception as ours:  # the load's own error passes through, never ours
                    tracer.internal_error("explaining a failed load", ours)
            return
        try:
            self._pulled_in(rescan, path, fields)
        except Exception as ours:
            tracer.internal_error("the libraries a load mapped", ours)
        tracer.write(NATIVE_END, fields, depth)

    def _announce(self, frame: "TracedStep", depth: int, fields: "dict[str, Any]") -> bool:
        """The start line and any verdict, before dlopen; True when the mapped set may grow."""
        path = fields["path"]
        try:
            dynamic = self._dynamic(path) if os.sep in path else None  # a bare ctypes name is no file yet
            needed = dynamic[0] if dynamic is not None else ()
            names = self.fact("libnames")
            needs, links_torch = names.cuda_needs(needed), bool(names.torch_links(needed))
        except Exception as error:  # never let our reading of the file stop the load
            self.tracer.internal_error("reading ELF", error)
            dynamic, needs, links_torch = None, [], False
        if needs:
            fields["needs"] = needs
        if self.tell_mapped:
            self._tell_mapped()
        self.tracer.write(NATIVE, fields, depth)
        if self._loaded is None:
            self._start_loaded()
        try:
            if dynamic is not None and (needs or links_torch):
                self._say_verdicts(frame, path, dynamic)
            if dynamic is None or self._loaded:  # the loader's counters make a look cheap
                return True
            return self._mapped().needs_rescan(dynamic[0])
        except Exception as error:
            self.tracer.internal_error("CUDA verdicts", error)
            return False

    def _dynamic(self, path: str) -> "Dynamic | None":
        """What the file at PATH links, or None where it is no readable ELF file: read by the C accelerator
        where it is built (_speedups_elf.h: 10 us, and no module of ours to import), else by elf.py."""
        read = getattr(ACCELERATOR, "read_dynamic", None)
        if read is not None:
            return read(path)
        info = self.fact("elf").read_dynamic(path)
        return None if info is None else (info.needed, info.rpath, info.runpath, info.soname)

    # -- what a load says beyond its start and end -----------------------------------------
    def torch_facts(self) -> "tuple[TorchFacts | None, str | None]":
        """torch and the driver as their files describe them, read once, when first needed."""
        if self._facts is None:
            cuda = self.fact("cuda")
            self._facts = (cuda.find_torch(), cuda.driver_version())
        return self._facts

    def _say_verdicts(self, frame: "TracedStep", path: str, dynamic: "Dynamic") -> None:
        torch, driver = self.torch_facts()
        info = self.fact("elf").DynamicInfo(*dynamic)
        verdicts = self.fact("cuda").native_verdicts(path, info, torch, driver)
        # torch's own files need no pin against torch; skipping them also spares `import torch`
        # the read of torch's RECORD (14,000 lines, about 20 ms).
        if torch is not None and not path.startswith(os.path.join(torch.path, "")):
            # What the owner's metadata says (the torch it was built for) is the decisive fact: first.
            dists = self.fact("dists")
            if self._owners is None:
                self._owners = dists.Owners()
            owner = self._owners.owner(path)
            said = dists.verdict(owner, torch) if owner is not None else None
            if said:
                verdicts.insert(0, said)
        for verdict in verdicts:
            self.sink.event(VERDICT, {"verdict": verdict, "path": path})
        if verdicts:
            frame.context = lambda: [f"! {verdict}" for verdict in verdicts]

    def _explain(self, message: str, path: str) -> None:
        torch, _ = self.torch_facts()
        cause = self.fact("cuda").explain_load_error(message, path, torch)
        if cause:
            self.sink.event(VERDICT, {"verdict": cause, "path": path})

    def _tell_mapped(self) -> None:
        """What is mapped before this load, told through the feed (at most once per watcher started).

        The watcher's own first look at the maps may come after this dlopen has begun, and could not
        tell its libraries as new. Told here, not as the watcher starts: a program that loads nothing
        native never reads its maps, and the watcher's start costs the program 0.3 ms less.
        """
        self.tell_mapped = False
        if self.sink.feed is None:
            return
        try:
            paths = self.mapped_now()
        except Exception as error:
            self.tracer.internal_error("listing mapped objects", error)
            return
        for path in paths:
            self.sink.feed_line(f"#mapped {path}")

    def mapped_now(self) -> "list[str]":
        """The shared objects mapped in this process, as of the last look (taken now if none was)."""
        return list(self._mapped().paths)

    def _mapped(self) -> "MappedObjects":
        if self._objects is None:
            self._objects = self.fact("mapped").MappedObjects()
        return self._objects

    def _pulled_in(self, rescan: bool, path: str, fields: "dict[str, Any]") -> None:
        """The shared objects this load mapped besides the file itself, as the end event's `mapped`."""
        try:
            new = self._new_since_last_look(rescan, path)
        except Exception as error:
            self.tracer.internal_error("listing mapped objects", error)
            return
        if new:
            fields["mapped"] = new

    def _new_since_last_look(self, rescan: bool, path: str) -> "list[str]":
        """What the loader's list gained, once the program has ctypes; else what the maps gained."""
        loaded = self._loaded
        if loaded:
            try:
                return loaded.added(path)
            except Exception:
                # The maps again: their last look is older, so a listing may repeat some, never miss one.
                self._loaded = False
                raise
        mapped = self._mapped()
        if not rescan:
            mapped.note(path)
            return []
        new = mapped.rescan()
        if new:
            # Maps names the file itself by its real path; resolve only a path it does not list.
            itself = path if path in mapped.paths else os.path.realpath(path)
            new = [other for other in new if other != itself]
        return new

    def _start_loaded(self) -> None:
        """Read the loader's list from the load about to begin, if the program has imported ctypes."""
        ctypes = sys.modules.get("ctypes")
        if ctypes is None or getattr(getattr(ctypes, "__spec__", None), "_initializing", False):
            return  # not yet; ctypes's own import loads _ctypes before it defines what we need
        try:
            loaded = self.fact("loaded")
            # The accelerator walks the same list in C, sparing ctypes types and callbacks of ours; still
            # only once the program has ctypes, so that both twins name the same objects.
            if hasattr(ACCELERATOR, "loaded_names"):
                looks = (ACCELERATOR.loaded_counters, ACCELERATOR.loaded_names)
            else:
                looks = loaded.through_ctypes(ctypes)
            self._loaded = loaded.LoadedObjects(*looks)  # what is loaded now is its baseline
        except Exception:  # no dl_iterate_phdr, a ctypes that is not the standard one, ...
            self._loaded = False

    # Under importlib's name: a failed import's traceback drops them, as it drops importlib's own frames.
    begin, end = as_importlib_frame(begin), as_importlib_frame(end)
