"""Runs SCRIPT, -m MODULE, -c CODE or - (stdin) exactly as python would: argv, sys.path[0], __main__, exit status.

The program's own code runs from the caller's frame (``python -m importwatch``
runs it from importwatch/__main__.py's module level), so that below its first
frame there are no more frames of ours than ``python -m runpy`` puts there:
``inspect.stack()`` and the recursion depth left to the program stay as python's.
"""

from __future__ import annotations

import _frozen_importlib as _bootstrap
import _frozen_importlib_external as _external
import builtins
import os
import stat as _stat
import sys
import types

from importwatch.tracing import handback

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

# The importwatch package: frames from any of its files are ours.
_PACKAGE = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep


class Target:
    """What to run: kind is "script", "module", "code" or "stdin"; value the path, name, source or "-"."""

    __slots__ = ("args", "kind", "value")

    def __init__(self, kind: str, value: str, args: list[str]) -> None:
        self.kind = kind
        self.value = value
        self.args = args

    def describe(self) -> list[str]:
        """The command line python would have been given."""
        if self.kind == "stdin":
            return ["-", *self.args]
        flag = {"module": ["-m"], "code": ["-c"]}.get(self.kind, [])
        return [*flag, self.value, *self.args]


class Launch:
    """What the caller runs, once __main__, sys.argv and sys.path are set: CODE in NAMESPACE, or,
    when CODE is None, RUN_MODULE(MODULE, ALTER_ARGV) (runpy's own, for -m, directories and zips)."""

    __slots__ = ("alter_argv", "code", "module", "namespace", "run_module")

    def __init__(
        self, code: types.CodeType | None, namespace: dict, module: str = "", alter_argv: bool = False
    ):
        self.code = code
        self.namespace = namespace
        self.module = module
        self.alter_argv = alter_argv
        self.run_module: Any = sys.modules["runpy"]._run_module_as_main if code is None else None


class CannotRun(Exception):
    """The target cannot be started (python says `can't open file` and exits 2)."""


def prepare(target: Target) -> tuple[types.CodeType | None, str | None]:
    """Check and compile a script or -c code before tracing starts; returns its code and absolute path.

    Directories and zip files with a __main__.py run as python runs them, through
    runpy, and have no code here.
    """
    if target.kind == "module":
        handback.import_as_python_would("runpy")  # python -m loads it too
    if target.kind == "stdin":
        # python - parses the whole of stdin before it runs any of it: so does this.
        stdin = sys.stdin
        if stdin is None:  # fd 0 closed: python runs an empty program
            return compile(b"", "<stdin>", "exec", dont_inherit=True), None
        if stdin.isatty():
            raise CannotRun(
                "an interactive session from a terminal (-) is not supported; pipe the program in"
            )
        return compile(stdin.buffer.read(), "<stdin>", "exec", dont_inherit=True), None
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
        handback.import_as_python_would("runpy")  # python runs a directory or a zip through it too
        return None, path
    try:
        with open(path, "rb") as file:
            source = file.read()
    except OSError as error:
        raise CannotRun(f"can't open file {path!r}: [Errno {error.errno}] {error.strerror}") from None
    if source[2:4] == b"\r\n" and len(source) > 16 and path.endswith((".pyc", ".pyo")):
        import marshal

        return marshal.loads(source[16:]), path
    return compiled_as_python_would(path, source), path


def is_zip(path: str) -> bool:
    """A zip file, which python runs through its __main__.py as it does a directory.

    Only a regular file can be one: reading a pipe (/dev/stdin, `<(...)`) to look would
    take from the program what python runs.
    """
    try:
        if not _stat.S_ISREG(os.stat(path).st_mode):
            return False
        with open(path, "rb") as file:
            return file.read(4) == b"PK\x03\x04"
    except OSError:
        return False


def take_path0() -> bool:
    """Take off sys.path the working folder `python -m importwatch` put first; whether it was.

    Our own imports (the subcommands', the runner's, at start-up) must not find a json.py
    or fcntl.py the user keeps there: the program gets its own sys.path[0] in launch().
    """
    if getattr(sys.flags, "safe_path", False) or sys.flags.isolated or not sys.path:
        return False
    try:
        if sys.path[0] != os.getcwd():
            return False
    except OSError:
        return False
    del sys.path[0]
    return True


def compiled_as_python_would(path: str, source: bytes) -> types.CodeType:
    """SOURCE compiled; where it cannot be, python itself says why, as it would for the file.

    python reads a script through its file tokenizer, whose messages for a NUL byte, bad
    UTF-8 or an unknown coding differ from compile()'s, by version. So on a syntax error
    this process becomes `python [its flags] PATH` (before tracing starts: nothing of ours
    is lost), which prints python's own message and exits with python's status.
    """
    try:
        return compile(source, path, "exec", dont_inherit=True)
    except (SyntaxError, ValueError):
        executable = sys.executable
        if not executable:
            raise
        import subprocess

        flags = subprocess._args_from_interpreter_flags()  # type: ignore[attr-defined]
        for stream in (sys.stdout, sys.stderr):
            if stream is not None:
                stream.flush()
        # Without IMPORTWATCH*: python's message alone, as plain python gives it.
        env = {key: value for key, value in os.environ.items() if not key.startswith("IMPORTWATCH")}
        os.execve(executable, [executable, *flags, path], env)
        raise  # not reached


def _path0(target: Target, path: str | None) -> str | None:
    """What python puts in front of sys.path for this target (None with -P or -I)."""
    if getattr(sys.flags, "safe_path", False) or sys.flags.isolated:
        return None
    if target.kind == "module":
        return os.getcwd()
    if target.kind in ("code", "stdin"):
        return ""
    assert path is not None
    if os.path.isdir(path) or is_zip(path):
        return path
    return os.path.dirname(os.path.realpath(path))


def launch(
    target: Target, code: types.CodeType | None, path: str | None, path0_taken: bool = False
) -> Launch:
    """Make sys.argv, sys.path[0] and a fresh __main__ what python makes them; what to run then.

    PATH0_TAKEN: the entry `python -m` put first on sys.path was taken off (see take_path0), so the
    target's goes in front rather than in its place.
    """
    sys.argv[:] = [target.value if target.kind == "script" else _FLAG[target.kind], *target.args]
    path0 = _path0(target, path)
    if path0 is not None:
        if path0_taken or not sys.path:
            sys.path.insert(0, path0)
        elif sys.path:
            sys.path[0] = path0
    main = types.ModuleType("__main__")
    namespace = main.__dict__
    # What the interpreter puts in its own __main__ (runpy keeps it for -m): the builtins module,
    # not the dict exec() would add, and an empty __annotations__ (up to 3.13).
    # In python's order (globals() shows it): __annotations__ first, up to 3.13.
    if sys.version_info < (3, 14):
        namespace["__annotations__"] = {}
    namespace["__builtins__"] = builtins
    sys.modules["__main__"] = main
    if target.kind == "module":
        return Launch(None, namespace, target.value, alter_argv=True)
    if code is None:  # a directory or zip with __main__.py
        return Launch(None, namespace, "__main__")
    namespace["__spec__"] = None
    namespace["__package__"] = None
    if target.kind == "code":
        namespace["__loader__"] = _bootstrap.BuiltinImporter
    elif target.kind == "stdin":
        namespace["__file__"] = "<stdin>"
        namespace["__cached__"] = None
        namespace["__loader__"] = _bootstrap.BuiltinImporter
    else:
        namespace["__file__"] = path
        namespace["__cached__"] = None
        namespace["__loader__"] = _external.SourceFileLoader("__main__", path)
    return Launch(code, namespace)


_FLAG = {"module": "-m", "code": "-c", "stdin": "-"}


def execute(launch: Launch) -> None:
    """Run what launch() prepared, from here (the console script's way; __main__.py runs it inline)."""
    # __main__.py repeats these lines at its module level on purpose: calling this function from
    # there would put one frame more below the program than `python -m runpy` does (see its
    # docstring). Change both alike.
    try:
        if launch.code is None:
            launch.run_module(launch.module, launch.alter_argv)
        else:
            exec(launch.code, launch.namespace)
    except SystemExit:
        raise
    except BaseException as error:
        report_uncaught(error)


def report_uncaught(error: BaseException) -> None:
    """Print the traceback as python would, without our frames, and exit as python would.

    The traceback goes through sys.excepthook (the program may have set its own).
    Then the same exception leaves the interpreter with a hook that prints nothing,
    so python itself sets the exit status: 1, or death by SIGINT for KeyboardInterrupt.
    """
    traceback = _without_ours(error.__traceback__)
    error.__traceback__ = traceback
    sys.last_type, sys.last_value, sys.last_traceback = type(error), error, traceback
    if sys.version_info >= (3, 12):
        sys.last_exc = error
    try:
        _call_excepthook(error, traceback)
    finally:
        sys.excepthook = _quiet_excepthook
    raise error


def _call_excepthook(error: BaseException, traceback: types.TracebackType | None) -> None:
    """sys.excepthook, and what python prints when it is missing, None or raises."""
    hook = getattr(sys, "excepthook", None)
    if hook is None and not hasattr(sys, "excepthook"):
        _say("sys.excepthook is missing\n")
        sys.__excepthook__(type(error), error, traceback)
        return
    try:
        hook(type(error), error, traceback)  # type: ignore[misc]
    except SystemExit:
        raise  # python exits with the hook's status too
    except BaseException as hook_error:
        hook_traceback = hook_error.__traceback__ = _without_ours(hook_error.__traceback__)
        if hook_error.__context__ is error:  # python calls the hook with no exception in hand
            hook_error.__context__ = None
        if sys.stdout is not None:
            try:
                sys.stdout.flush()
            except Exception:
                pass
        _say("Error in sys.excepthook:\n")
        sys.__excepthook__(type(hook_error), hook_error, hook_traceback)
        _say("\nOriginal exception was:\n")
        sys.__excepthook__(type(error), error, traceback)


def _say(text: str) -> None:
    stderr = sys.stderr
    if stderr is not None:
        try:
            stderr.write(text)
        except Exception:
            pass


def _without_ours(traceback: types.TracebackType | None) -> types.TracebackType | None:
    while traceback is not None and _is_ours(traceback.tb_frame.f_code.co_filename):
        traceback = traceback.tb_next
    return traceback


def _quiet_excepthook(*_: object) -> None:
    """The traceback was printed already."""


def _is_ours(filename: str) -> bool:
    return filename.startswith(_PACKAGE)
