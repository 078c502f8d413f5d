"""Runs SCRIPT, -m MODULE or -c CODE exactly as python would: argv, sys.path[0], __main__, exit status."""

from __future__ import annotations

import _frozen_importlib as _bootstrap
import _frozen_importlib_external as _external
import builtins
import os
import sys
import types

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

_HERE = os.path.dirname(os.path.abspath(__file__))


class Target:
    """What to run: kind is "script", "module" or "code"; value the path, name or source."""

    __slots__ = ("args", "kind", "value")

    def __init__(self, kind: str, value: str, args: list[str]) -> None:
        self.kind = kind
        self.value = value
        self.args = args

    def describe(self) -> list[str]:
        """The command line python would have been given."""
        flag = {"module": ["-m"], "code": ["-c"]}.get(self.kind, [])
        return [*flag, self.value, *self.args]


class CannotRun(Exception):
    """The target cannot be started (python says `can't open file` and exits 2)."""


def prepare(target: Target) -> tuple[types.CodeType | None, str | None]:
    """Check and compile a script or -c code before tracing starts; returns its code and absolute path.

    Directories and zip files with a __main__.py run as python runs them, through
    runpy, and have no code here.
    """
    if target.kind == "module":
        import runpy
    if target.kind == "code":
        if sys.version_info >= (3, 13):  # python -c keeps its source for tracebacks from 3.13 on
            import linecache

            lines = [line + "\n" for line in target.value.splitlines()]
            linecache.cache["<string>"] = (len(target.value), None, lines, "<string>")
        return compile(target.value, "<string>", "exec", dont_inherit=True), None
    if target.kind != "script":
        return None, None
    # Like python's own __file__: made absolute by joining the cwd, not normalised.
    path = target.value if os.path.isabs(target.value) else os.path.join(os.getcwd(), target.value)
    if os.path.isdir(path) or is_zip(path):
        import runpy  # noqa: F401

        return None, path
    try:
        with open(path, "rb") as file:
            source = file.read()
    except OSError as error:
        raise CannotRun(f"can't open file {path!r}: [Errno {error.errno}] {error.strerror}") from None
    if source[2:4] == b"\r\n" and len(source) > 16 and path.endswith((".pyc", ".pyo")):
        import marshal

        return marshal.loads(source[16:]), path
    return compile(source, path, "exec", dont_inherit=True), path


def is_zip(path: str) -> bool:
    """A zip file, which python runs through its __main__.py as it does a directory."""
    try:
        with open(path, "rb") as file:
            return file.read(4) == b"PK\x03\x04"
    except OSError:
        return False


def _path0(target: Target, path: str | None) -> str | None:
    """What python puts in front of sys.path for this target (None with -P or -I)."""
    if getattr(sys.flags, "safe_path", False) or sys.flags.isolated:
        return None
    if target.kind == "module":
        return os.getcwd()
    if target.kind == "code":
        return ""
    assert path is not None
    if os.path.isdir(path) or is_zip(path):
        return path
    return os.path.dirname(os.path.realpath(path))


def run(target: Target, code: types.CodeType | None, path: str | None) -> None:
    """Run the target in a fresh __main__; exceptions leave with our frames trimmed."""
    sys.argv[:] = [target.value if target.kind == "script" else _FLAG[target.kind], *target.args]
    path0 = _path0(target, path)
    if path0 is not None:
        if sys.path:
            sys.path[0] = path0
        else:
            sys.path.append(path0)
    main = types.ModuleType("__main__")
    sys.modules["__main__"] = main
    try:
        if target.kind == "module":
            sys.modules["runpy"]._run_module_as_main(target.value, alter_argv=True)
        elif code is None and path is not None:  # a directory or zip with __main__.py
            sys.modules["runpy"]._run_module_as_main("__main__", alter_argv=False)
        else:
            _exec_main(main, target, code, path)
    except SystemExit:
        raise
    except BaseException as error:
        _report_uncaught(error)


_FLAG = {"module": "-m", "code": "-c"}


def _exec_main(main: types.ModuleType, target: Target, code: Any, path: str | None) -> None:
    namespace = main.__dict__
    namespace["__builtins__"] = builtins
    namespace["__spec__"] = None
    namespace["__package__"] = None
    if target.kind == "code":
        namespace["__loader__"] = _bootstrap.BuiltinImporter
    else:
        namespace["__file__"] = path
        namespace["__cached__"] = None
        namespace["__loader__"] = _external.SourceFileLoader("__main__", path)
    exec(code, namespace)


def _report_uncaught(error: BaseException) -> None:
    """Print the traceback as python would, without our frames, and exit as python would.

    The traceback goes through sys.excepthook (the program may have set its own).
    Then the same exception leaves the interpreter with a hook that prints nothing,
    so python itself sets the exit status: 1, or death by SIGINT for KeyboardInterrupt.
    """
    traceback = error.__traceback__
    while traceback is not None and _is_ours(traceback.tb_frame.f_code.co_filename):
        traceback = traceback.tb_next
    error.__traceback__ = traceback
    sys.last_type, sys.last_value, sys.last_traceback = type(error), error, traceback
    if sys.version_info >= (3, 12):
        sys.last_exc = error
    try:
        sys.excepthook(type(error), error, traceback)
    finally:
        sys.excepthook = _quiet_excepthook
    raise error


def _quiet_excepthook(*_: object) -> None:
    """The traceback was printed already."""


def _is_ours(filename: str) -> bool:
    return os.path.dirname(filename) == _HERE
