"""Runs SCRIPT, -m MODULE, -c CODE or - (stdin) exactly as python would: by becoming that python.

The runner's process execs `python [its own flags] TARGET ARGS` with tracing
switched on through the environment (config.ENV_RUNNER, read at activation by
the .pth, as under IMPORTWATCH=1): argv, sys.path[0], __main__, frames, stdin,
warnings, exceptions and exit status are then python's own. Where the .pth
cannot run (-I, -E, -S, importwatch's .pth not installed in this interpreter),
the program runs in this process instead, through runpy's ways (launch/execute),
with the limits the README lists.
"""

import _frozen_importlib as _bootstrap
import _frozen_importlib_external as _external
import _imp
import builtins
import os
import stat as _stat
import sys

from importwatch.config import OUR_PTH
from importwatch.tracing import handback

TYPE_CHECKING = False
if TYPE_CHECKING:  # (types is not imported at run time: the runner's interpreter starts without it)
    import types
    from typing import Any

    from importwatch.config import Settings

# The importwatch package: frames from any of its files are ours.
_PACKAGE = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep


class Target:
    """What to run: kind is "script", "module", "code" or "stdin"; value the path, name, source or "-"."""

    __slots__ = ("args", "kind", "value")

    def __init__(self, kind: str, value: str, args: "list[str]") -> None:
        self.kind = kind
        self.value = value
        self.args = args

    def describe(self) -> "list[str]":
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
        self, code: "types.CodeType | None", namespace: dict, module: str = "", alter_argv: bool = False
    ):
        self.code = code
        self.namespace = namespace
        self.module = module
        self.alter_argv = alter_argv
        self.run_module: Any = sys.modules["runpy"]._run_module_as_main if code is None else None


class CannotRun(Exception):
    """The target cannot be started (python says `can't open file` and exits 2)."""


def check(target: "Target") -> None:
    """What python would refuse to start, refused before the exec (CannotRun); reads nothing."""
    if target.kind == "stdin" and sys.stdin is not None and sys.stdin.isatty():
        raise CannotRun("an interactive session from a terminal (-) is not supported; pipe the program in")
    if target.kind == "script":
        path = os.path.join(os.getcwd(), target.value)
        try:
            os.stat(path)
        except OSError as error:
            raise CannotRun(f"can't open file {path!r}: [Errno {error.errno}] {error.strerror}") from None


def prepare(target: "Target") -> "tuple[types.CodeType | None, str | None]":
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
    if skips_first_line():  # python -x: the first line goes, its newline stays (line numbers hold)
        newline = source.find(b"\n")
        source = source[newline:] if newline >= 0 else b""
    return compile(source, path, "exec", dont_inherit=True), path


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


def _path0(target: "Target", path: "str | None") -> "str | None":
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
    target: "Target", code: "types.CodeType | None", path: "str | None", path0_taken: bool = False
) -> "Launch":
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
    main = type(sys)("__main__")  # a module, as types.ModuleType makes it
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


def execute(launch: "Launch") -> None:
    """Run what launch() prepared, in this process (the fallback: see the module's docstring)."""
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
    """Print the traceback through sys.excepthook without our frames; python then exits as it would.

    The same exception leaves the interpreter with a hook that prints nothing, so python
    itself sets the exit status: 1, or death by SIGINT for KeyboardInterrupt.
    """
    traceback = error.__traceback__
    while traceback is not None and traceback.tb_frame.f_code.co_filename.startswith(_PACKAGE):
        traceback = traceback.tb_next
    error.__traceback__ = traceback
    sys.last_type, sys.last_value, sys.last_traceback = type(error), error, traceback
    if sys.version_info >= (3, 12):
        sys.last_exc = error
    try:
        (getattr(sys, "excepthook", None) or sys.__excepthook__)(type(error), error, traceback)
    except SystemExit:
        raise
    except BaseException:
        sys.__excepthook__(type(error), error, traceback)
    finally:
        sys.excepthook = _quiet_excepthook
    raise error


def _quiet_excepthook(*_: object) -> None:
    """The traceback was printed already."""


# -- the exec ----------------------------------------------------------------------------------
def why_in_process() -> "str | None":
    """Why the exec would run the program untraced (the fallback runs it here), or None."""
    flags = sys.flags
    if flags.ignore_environment:  # -E, -I: the .pth reads IMPORTWATCH from the environment
        return "-E or -I"
    if flags.no_site:  # -S: no .pth runs at all
        return "-S"
    if not sys.executable:
        return "no sys.executable"
    import site  # loaded at start-up already (-S is handled above)

    # In a venv, site.getsitepackages() names the venv only once site.venv() has read its .pth files a
    # first time; the .pth line's exec (cli.exec_at_start) comes in that pass, where sys.prefix is the
    # venv already. Elsewhere the prefixes add nothing: site's list starts from them.
    get = getattr(site, "getsitepackages", None)
    folders = [] if get is None else [*get(), *get([sys.prefix, sys.exec_prefix])]
    if site.ENABLE_USER_SITE:
        folders.append(site.getusersitepackages())
    if not any(os.path.isfile(os.path.join(folder, OUR_PTH)) for folder in folders):
        return f"no {OUR_PTH} in this interpreter's site-packages"
    return None


# sys.flags fields that a repeated letter sets (-vv is verbose=2), in CPython's order (subprocess's).
_COUNTED_FLAGS = (
    ("optimize", "O"),
    ("debug", "d"),
    ("dont_write_bytecode", "B"),
    ("no_site", "S"),
    ("verbose", "v"),
    ("bytes_warning", "b"),
    ("quiet", "q"),
)


def interpreter_flags() -> "list[str]":
    """This interpreter's own flags (-B, -O, -W, -X ...), as the command line of another one.

    What subprocess._args_from_interpreter_flags() gives, built here: importing subprocess
    (signal, enum, selectors, threading, locale) took 5 to 10 ms of the runner's start. And
    every -X option goes on, not CPython's short list of them: the program's sys._xoptions is
    then what python gives it, and -X int_max_str_digits, no_debug_ranges, pycache_prefix,
    warn_default_encoding or an option of its own keep their effect.
    """
    flags = sys.flags
    args = [
        f"-{letter * getattr(flags, name)}" for name, letter in _COUNTED_FLAGS if getattr(flags, name) > 0
    ]
    if flags.isolated:
        args.append("-I")  # it implies -E, -s and -P
    else:
        args += [flag for flag, on in (("-E", flags.ignore_environment), ("-s", flags.no_user_site)) if on]
        if getattr(flags, "safe_path", False):  # 3.11 on
            args.append("-P")
    args += [f"-W{option}" for option in _given_warnoptions()]
    for name, value in getattr(sys, "_xoptions", {}).items():
        args += ["-X", name if value is True else f"{name}={value}"]
    hash_checks = getattr(_imp, "check_hash_based_pycs", "default")  # no sys.flags field either
    if hash_checks != "default":
        args += ["--check-hash-based-pycs", hash_checks]
    if skips_first_line():
        args.append("-x")
    stdout = sys.__stdout__
    if stdout is not None and type(getattr(stdout, "buffer", None)).__name__ == "FileIO":
        args.append("-u")  # no sys.flags field says -u: an unbuffered stdout does
    if flags.inspect:
        args.append("-i")
    return args


def skips_first_line() -> bool:
    """Whether python was given -x (skip the script's first line), which only sys.orig_argv tells (3.10 on)."""
    argv = getattr(sys, "orig_argv", None) or []
    index = 1
    while index < len(argv):
        arg = argv[index]
        index += 1
        if arg == "--check-hash-based-pycs":
            index += 1  # its value
        elif arg in ("-", "--") or not arg.startswith("-"):
            return False  # stdin, or the script: the interpreter's options ended before it
        elif not arg.startswith("--"):
            for position, letter in enumerate(arg[1:], 2):
                if letter in "cm":
                    return False  # -c CODE, -m MODULE: the options end there
                if letter == "x":
                    return True
                if letter in "WX":  # its value is the rest of the word, or the next one
                    index += position == len(arg)
                    break
    return False


def _given_warnoptions() -> "list[str]":
    """sys.warnoptions without the entries that -b, -bb and -X dev add to it (their flags add them again)."""
    options = list(sys.warnoptions)
    added = ["default"] if getattr(sys.flags, "dev_mode", False) else []
    if sys.flags.bytes_warning:
        added.append("error::BytesWarning" if sys.flags.bytes_warning > 1 else "default::BytesWarning")
    for option in added:
        if option in options:
            options.remove(option)
    return options


def become_python(target: "Target", settings: "Settings", warnings: "list[str]") -> None:
    """Exec `python [flags] TARGET ARGS`, traced with SETTINGS from its start; returns only if the exec fails.

    Its environment is ours plus what the runner has always given the program (IMPORTWATCH=1
    and the settings, so that its children trace themselves too) and config.ENV_RUNNER, which
    the traced process takes out of its environment as it activates.
    """
    from importwatch import config

    command = [sys.executable, *interpreter_flags()]
    payload = config.to_runner(settings, warnings, len(command))
    env = {**os.environ, **config.to_env(settings), config.ENV_RUNNER: payload}
    for stream in (sys.stdout, sys.stderr):
        if stream is not None:
            try:
                stream.flush()
            except (OSError, ValueError):
                pass
    os.execve(sys.executable, [*command, *target.describe()], env)
