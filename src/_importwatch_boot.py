"""What the .pth line calls: activation once IMPORTWATCH is on, and the runner's exec under `python -m
importwatch`; each now, or as soon as importwatch can be imported.

The .pth is installed as 00-importwatch.pth so that site runs it before the other
.pth files of its folder (site sorts them by name), whose imports would otherwise
happen untraced: distutils-precedence.pth, setuptools' __editable__.*.pth finders.
This module is installed beside it, so it can always be imported. importwatch
itself may not be yet: an editable install puts its source folder on sys.path
through a .pth of its own that sorts later (_editable_impl_importwatch.pth). Then
both wait for the first .pth after which importwatch can be imported.

The runner's interpreter (`python -m importwatch ARGS`) only reads its command line
and execs the program's python, which the .pth traces: done from here, before the
rest of site, runpy and -m's search run in an interpreter about to be replaced
(importwatch/cli.py's exec_at_start; from 3.10, whose sys.orig_argv names the
module at site's time).
"""

# No `from __future__ import annotations`: it would import __future__, which plain python has not.
import _thread  # (in sys.modules from the interpreter's start: no import of ours)
import os
import sys

# What waits for a later .pth to put importwatch within reach, in order: the runner's exec, activation.
_pending: list = []
_pthlines = None  # importwatch.tracing.pthlines, once importwatch is found


def activate() -> None:
    """IMPORTWATCH is on: tracing starts now (or once importwatch can be imported)."""
    _when_importable(_activate)


def runner() -> None:
    """This may be `python -m importwatch ARGS` (the .pth line saw importwatch in sys.orig_argv where the
    module's name goes): the program's python exec'd now, where cli.exec_at_start can; else python
    runs -m importwatch as usual."""
    if _runner_args() is not None:
        _when_importable(_exec_runner)


def _when_importable(action) -> None:
    """ACTION now, or once a later .pth has put importwatch within reach (site may run this .pth twice)."""
    if not _in_main_interpreter():
        return
    if _pending:
        if action not in _pending:
            _pending.append(action)
        return
    if _importable():
        action()
        return
    site = sys.modules.get("site")
    addpackage = getattr(site, "addpackage", None)
    if addpackage is None:
        return
    _pending.append(action)

    # site looks addpackage up by name for each .pth it reads: try again after each one.
    def addpackage_then_start(*args, **kwargs):
        result = addpackage(*args, **kwargs)
        if site.addpackage is addpackage_then_start and _importable():
            site.addpackage = addpackage
            actions = list(_pending)
            _pending.clear()
            for waiting in actions:
                waiting()
        return result

    site.addpackage = addpackage_then_start
    # site imports sitecustomize once every .pth has run: if importwatch is still missing then, say so.
    sys.meta_path.insert(0, _LastChance(site, addpackage, addpackage_then_start))


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
            missed = _activate in _pending  # (a runner's exec missed says nothing: -m importwatch will)
            _pending.clear()
            if missed:
                _say(ModuleNotFoundError("importwatch cannot be imported (a broken install?)"))
        return None


def _importable() -> bool:
    """Whether importwatch can be imported now (a broken one can: what fails is said by whoever uses it)."""
    try:
        import importwatch  # noqa: F401
    except ModuleNotFoundError as error:
        return error.name != "importwatch"
    except Exception:
        return True
    return True


def _activate() -> None:
    try:
        _load_start_up()
        from importwatch.tracing import session
    except Exception as error:
        _say(error)
        return
    global _pthlines
    try:  # imported before tracing starts: its import is not one of the program's
        from importwatch.tracing import pthlines as _pthlines
    except ImportError:
        pass  # an importwatch older than this file: its .pth lines go untraced
    session.activate_from_env()
    _trace_pth_lines(sys.modules.get("site"))


def _runner_args() -> "list[str] | None":
    """ARGS when this process is `python [its flags] -m importwatch ARGS`, else None. At site's time
    sys.argv is ['-m', *ARGS], and sys.orig_argv (3.10 on) the whole command line, the module's word
    (`importwatch` after `-m`, or `-mimportwatch`) right before ARGS."""
    argv, whole = sys.argv, getattr(sys, "orig_argv", None)
    if not whole or argv[:1] != ["-m"] or len(whole) <= len(argv):
        return None
    at = len(whole) - len(argv)
    if whole[at + 1 :] != argv[1:]:
        return None
    if (whole[at] == "importwatch" and whole[at - 1] == "-m") or whole[at] == "-mimportwatch":
        return list(argv[1:])
    return None


def _exec_runner() -> None:
    """The runner's exec, from here where importwatch can do it (cli.exec_at_start); never raises."""
    args = _runner_args()
    if args is None:
        return
    try:
        from importwatch.cli import exec_at_start
    except Exception:
        return  # an importwatch older than this file, or a broken one: -m importwatch runs as usual
    try:
        exec_at_start(args)
    except Exception:
        pass  # nothing was said or done: -m importwatch runs as usual, and says what is wrong


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
