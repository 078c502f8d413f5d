"""What the .pth line calls once IMPORTWATCH is on: activation now, or as soon as importwatch can be imported.

The .pth is installed as 00-importwatch.pth so that site runs it before the other
.pth files of its folder (site sorts them by name), whose imports would otherwise
happen untraced: distutils-precedence.pth, setuptools' __editable__.*.pth finders.
This module is installed beside it, so it can always be imported. importwatch
itself may not be yet: an editable install puts its source folder on sys.path
through a .pth of its own that sorts later (_editable_impl_importwatch.pth). Then
activation waits for the first .pth after which importwatch can be imported.
"""

# No `from __future__ import annotations`: it would import __future__, which plain python has not.
import _thread  # (in sys.modules from the interpreter's start: no import of ours)
import os
import sys

_waiting = False  # a later .pth is awaited already (site may run this .pth twice)
_pthlines = None  # importwatch.tracing.pthlines, once importwatch is found


def activate() -> None:
    global _waiting
    if _waiting or not _in_main_interpreter():
        return
    if _activated():
        _trace_pth_lines(sys.modules.get("site"))
        return
    site = sys.modules.get("site")
    addpackage = getattr(site, "addpackage", None)
    if addpackage is None:
        return
    _waiting = True

    # site looks addpackage up by name for each .pth it reads: try again after each one.
    def addpackage_then_activate(*args, **kwargs):
        result = addpackage(*args, **kwargs)
        if site.addpackage is addpackage_then_activate and _activated():
            site.addpackage = addpackage
            _trace_pth_lines(site)
        return result

    site.addpackage = addpackage_then_activate
    # site imports sitecustomize once every .pth has run: if importwatch is still missing then, say so.
    sys.meta_path.insert(0, _LastChance(site, addpackage, addpackage_then_activate))


def _in_main_interpreter() -> bool:
    """False in a subinterpreter, whose site runs this .pth too: importwatch's threads, hooks and
    descriptors are the process's, started once, by the main interpreter (a heartbeat left in a
    subinterpreter aborts the process as it ends: "Py_EndInterpreter: thread still has a frame")."""
    is_main = getattr(_thread, "_is_main_interpreter", None)
    if is_main is not None:  # 3.12 on
        return bool(is_main())
    # Before: only the main interpreter's main thread may set signals' wake-up descriptor, and site runs
    # this .pth in the thread that starts its interpreter. None is set yet at site's time; one that is
    # gets put back.
    import _signal  # (in sys.modules from the interpreter's start: no import of ours)

    try:
        old = _signal.set_wakeup_fd(-1)
    except ValueError:
        return False
    if old != -1:
        _signal.set_wakeup_fd(old)
    return True


class _LastChance:
    """A finder that looks only at site's import of sitecustomize, once, and then takes itself out."""

    def __init__(self, site, addpackage, wrapper) -> None:
        self.site, self.addpackage, self.wrapper = site, addpackage, wrapper

    def find_spec(self, name: str, path=None, target=None) -> None:
        if name != "sitecustomize":
            return None
        if self in sys.meta_path:
            sys.meta_path.remove(self)
        if self.site.addpackage is self.wrapper:
            self.site.addpackage = self.addpackage
            if not _activated():
                _say(ModuleNotFoundError("importwatch cannot be imported (a broken install?)"))
        return None


def _activated() -> bool:
    """Activate if importwatch can be imported now; False when it cannot be found (yet)."""
    try:
        _load_start_up()
        from importwatch.tracing import session
    except ModuleNotFoundError as error:
        if error.name == "importwatch":
            return False
        _say(error)
        return True
    except Exception as error:
        _say(error)
        return True
    global _pthlines
    try:  # imported before tracing starts: its import is not one of the program's
        from importwatch.tracing import pthlines as _pthlines
    except ImportError:
        pass  # an importwatch older than this file: its .pth lines go untraced
    session.activate_from_env()
    return True


def _load_start_up() -> None:
    """Run start-up's modules of ours from their compiled files, without the import system: a tenth
    of their import's time (importwatch/tracing/standby.py)."""
    try:
        from importwatch.tracing import standby
    except ModuleNotFoundError as error:
        if error.name == "importwatch.tracing.standby":
            return  # an importwatch older than this file: its modules are imported the usual way
        raise
    standby.load(standby.START_UP)


def _trace_pth_lines(site) -> None:
    """Each .pth import line that site runs from now on becomes a step of the trace (its file and line)."""
    if _pthlines is None or getattr(site, "addpackage", None) is None:
        return
    try:
        _pthlines.watch(site, site.addpackage)
    except Exception as error:
        _say(error, "its .pth lines are not traced")


def _say(error: BaseException, what: str = "tracing is off") -> None:
    message = f"[importwatch {os.getpid()}] ! {what}: {type(error).__name__}: {error}\n"
    try:
        os.write(2, message.encode("ascii", "backslashreplace"))
    except OSError:
        pass
