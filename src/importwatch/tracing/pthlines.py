"""The .pth import lines site runs once tracing is on, each as a step: which file and line ran an import.

site runs a .pth file's `import` lines with `exec(line)` inside `site.addpackage`,
before the program starts; a line that blocks hangs Python there. Each such line
becomes a step `> step .pth /path/x.pth:3`, so the imports it makes nest under it
and a stall report's chain names the file and the line. Only `site.addpackage` is
wrapped (site looks it up by name for each .pth), and only while a .pth is read is
`exec` looked up through us: imports outside site pay nothing.
"""

import os
import sys

from importwatch.config import OUR_PTH  # its own line (site may run it twice) is ours, never a step
from importwatch.tracing import phases
from importwatch.tracing.accelerator import ACCELERATOR
from importwatch.tracing.hook import door, hidden, traced

TYPE_CHECKING = False
if TYPE_CHECKING:
    from types import FrameType, ModuleType
    from typing import Any, Callable

    from importwatch.tracing.hook import Tracer

STEP_NAME = ".pth"
_MARK = "_importwatch_pth"  # on our wrapper: site.addpackage is wrapped already
# site's loop counts lines from 1 since 3.13, from 0 before.
_FIRST_LINE = 0 if sys.version_info >= (3, 13) else 1


def watch(site: "ModuleType", addpackage: "Callable[..., Any]") -> None:
    """From now on, each .pth file that site's ADDPACKAGE reads runs its import lines as steps."""
    if getattr(site.addpackage, _MARK, False):
        return  # a .pth can run twice

    def addpackage_traced(sitedir: str, name: str, known_paths: "Any") -> "Any":
        stepped = phases._tracer is not None and name != OUR_PTH
        namespace = site.__dict__
        # exec is a builtin that site's addpackage looks up in its module first: ours, for this file.
        before = namespace.get("exec", _MISSING)
        if stepped:
            namespace["exec"] = _traced_exec(os.path.join(sitedir, name))
        try:
            if traced is None:
                return addpackage(sitedir, name, known_paths)
            return traced(addpackage, sitedir, name, known_paths)  # site's own, and the lines it runs
        finally:
            if stepped and before is _MISSING:
                namespace.pop("exec", None)
            elif stepped:
                namespace["exec"] = before

    setattr(addpackage_traced, _MARK, True)
    # A program's own site.addsitedir (virtualenv's activate_this.py) runs it too: unseen by the program's
    # trace functions, site's own addpackage seen (hook.hidden).
    site.addpackage = hidden(addpackage_traced, binds=False)


_MISSING = object()


def _context(where: str, source: "Any") -> str:
    """What a stall report says about a .pth line in flight."""
    code = str(source).strip()
    code = code if len(code) <= 120 else code[:117] + "..."
    return (
        f"site runs line {where} before the program starts: {code}; "
        "python -m importwatch cannot start past it (IMPORTWATCH=1 sees it): fix or remove that line"
    )


def _traced_exec(path: str) -> "Callable[..., None]":
    """What site's `exec(line)` finds for .pth file PATH: the builtin, with each line it runs a step.

    With the C accelerator a door (hook.door) over the builtin: nothing of ours is on the stack while
    the line runs, so exec runs it in site's frame as under plain python, and a line that fails
    prints site's traceback as plain python does. The pure-Python twin is one frame of ours, which
    gives exec site's globals and locals itself."""
    if getattr(ACCELERATOR, "door", None) is not None:

        def enter(source: "Any", *args: "Any", **kwargs: "Any") -> "tuple | None":
            tracer, caller = phases._tracer, sys._getframe(1)
            if args or kwargs or tracer is None or not _site_s_call(caller):
                return None  # not site's call: the builtin, as it is
            return tracer, _begin(tracer, path, caller, source)

        def leave(token: tuple, error: "BaseException | None") -> None:
            tracer, step = token
            tracer.end_step(step, error)

        return door(exec, enter, leave)

    def exec_line(source: "Any", *args: "Any", **kwargs: "Any") -> None:
        if args or kwargs:
            exec(source, *args, **kwargs)  # not site's call: as the builtin would
            return
        caller = sys._getframe(1)
        if not _site_s_call(caller):  # the line's own exec(...), at its top level: into its namespace
            optimized = caller.f_code.co_flags & _CO_OPTIMIZED  # a function's locals are a snapshot
            exec(source, caller.f_globals, dict(caller.f_locals) if optimized else caller.f_locals)
            return
        # exec(line) in a function runs in the caller's globals and a copy of its locals: so here.
        scope = (caller.f_globals, dict(caller.f_locals))
        tracer = phases._tracer
        if tracer is None:
            exec(source, *scope)
            return
        step = _begin(tracer, path, caller, source)
        try:
            exec(source, *scope)
        except BaseException as error:
            tracer.end_step(step, error)
            raise
        tracer.end_step(step, None)

    return exec_line


# A function's code (inspect.CO_OPTIMIZED), whose frame's locals exec sees as a snapshot.
_CO_OPTIMIZED = 0x1


def _site_s_call(caller: "FrameType") -> bool:
    """Whether CALLER, which called the exec site finds, is site's addpackage running a .pth line; else
    the line's own code calls it (coverage's .pth runs its code through exec), in site's globals."""
    return caller.f_code.co_name == "addpackage"


def _begin(tracer: "Tracer", path: str, caller: "FrameType", source: "Any") -> tuple:
    """The step of the line site runs from PATH (its number read from CALLER, site's addpackage)."""
    number = caller.f_locals.get("n")
    where = f"{path}:{number + _FIRST_LINE}" if isinstance(number, int) else path
    fields = {"name": STEP_NAME, "detail": where}
    return tracer.begin_step(f"step {STEP_NAME} {where}", fields, lambda: [_context(where, source)])
