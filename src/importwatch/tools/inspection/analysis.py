"""What a thread of an inspected process is doing, from the frames read: the import chain in flight,
the import lock it waits for and which thread holds it, and the native load under way."""

from __future__ import annotations

import os

from importwatch.inflight import named_once
from importwatch.tools.inspection.libraries import is_system, module_of

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Sequence

    from importwatch.facts.stacks import StackFrame

_DLOPEN = ("dlopen", "_dl_open", "dlopen_implementation", "___dlopen", "__dlopen")


def import_state(frames: Sequence[StackFrame]) -> dict:
    """From one thread's Python frames (innermost first): the import chain, and where in it it is."""
    # _lock_unlock_module counts too: importing a module another thread is initialising waits there,
    # called by the import machinery in C without a _find_and_load frame.
    chain = [
        frame.argument
        for frame in reversed(frames)
        if frame.function.endswith(("_find_and_load", "_lock_unlock_module"))
    ]
    chain = named_once([name for name in chain if name])
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


def holders(threads: list[dict]) -> None:
    """For a thread waiting for a module's import lock, the thread that imports that module."""
    for waiter in threads:
        lock = waiter.get("lock")
        if not lock:
            continue
        for other in threads:
            if other is not waiter and lock in other["chain"] and other.get("lock") != lock:
                waiter["lock_holder"] = f"{other['name']} (tid {other['tid']})"
                break


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
        if function in _DLOPEN or function.startswith("dlopen@"):
            facts["dlopen"] = True
            # Code of a library that runs inside dlopen, called through ld.so, is a constructor.
            facts["constructor"] = facts["constructor"] or facts["library"] is not None
        if function in ("_dl_init", "call_init"):
            facts["constructor"] = True
        if function.startswith("PyInit_") and facts["init"] is None:
            facts["init"] = function[len("PyInit_") :]
        library = _full_path(line.rsplit(" from ", 1)[1].strip(), mapped) if " from " in line else None
        if library and facts["library"] is None and not facts["dlopen"] and not is_system(library, exe):
            facts["library"] = library
    return facts


def _full_path(name: str, mapped: Sequence[str]) -> str:
    """py-spy names a library by its last components: the mapped file they end."""
    if name.startswith("/"):
        return name
    return next((path for path in mapped if path.endswith("/" + name)), name)


def _load_facts(
    native_lines: Sequence[str], on_stack: Sequence[str], in_extension: bool, exe: str, mapped: Sequence[str]
) -> tuple[dict, str] | None:
    """The native facts of a thread's load and where they come from; None when it is in no load."""
    if native_lines:
        facts = native_facts(native_lines, exe, mapped)
        if not (facts["dlopen"] or facts["init"] or in_extension):
            return None
        return facts, "its native stack"
    ours = [path for path in on_stack if not is_system(path, exe)]
    dynamic = any(os.path.basename(path).startswith("ld-linux") for path in on_stack[:4])
    # Without ld.so on the stack, an extension's code on it may be any call into it, not its
    # PyInit: only a load inside dlopen is named without a debugger.
    if ours and dynamic:
        facts = {"dlopen": True, "file": None, "constructor": True, "init": None, "library": ours[0]}
        return facts, "the libraries on its stack (no debugger)"
    if in_extension:
        facts = {"dlopen": None, "file": None, "constructor": False, "init": None, "library": None}
        return facts, "its Python frames"
    return None


def load_of(
    imports: dict,
    native_lines: Sequence[str],
    on_stack: Sequence[str],
    exe: str,
    search: Sequence[str],
    mapped: Sequence[str],
) -> dict | None:
    """The native load a thread is in, if any: the file, the module, what is being initialised.

    IMPORTS is import_state()'s answer; ON_STACK the libraries on its stack, read only when
    there are no NATIVE_LINES."""
    chain = imports["chain"]
    in_extension = imports["doing"] is not None and imports["doing"].startswith("loading the extension")
    found = _load_facts(native_lines, on_stack, in_extension, exe, mapped)
    if found is None:
        return None
    facts, source = found
    module = chain[-1] if in_extension and chain else None
    path = facts["file"]
    if path is None and module is not None:
        path = next((p for p in mapped if module_of(p, search) == module), None)
    if path is None and facts["library"] and module_of(facts["library"], search):
        path = facts["library"]
    if module is None and path is not None:
        module = module_of(path, search)
    return {
        "module": module,
        "file": path,
        "initialising": facts["library"] or path,
        "how": _how(facts, in_extension),
        "source": source,
    }


def _how(facts: dict, in_extension: bool) -> str:
    if facts["constructor"]:
        return "its constructor runs, inside dlopen"
    if facts["init"] or (in_extension and not facts["dlopen"] and facts["library"]):
        return f"its PyInit{'_' + facts['init'] if facts['init'] else ''} runs, after dlopen"
    if facts["dlopen"]:
        return "inside dlopen"
    return "dlopen or its PyInit"
