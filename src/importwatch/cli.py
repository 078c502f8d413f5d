"""The command line: parse options, dispatch to the runner or a subcommand, own the exit codes."""

import os
import sys

from importwatch import __version__, config
from importwatch.usage import UsageError, fail, options_then_target

TYPE_CHECKING = False
if TYPE_CHECKING:
    from importwatch.config import Settings
    from importwatch.tracing.runner import Launch, Target

EXIT_OK = 0
EXIT_PROBLEM = 1


SUBCOMMANDS = ("doctor", "bisect", "report", "inspect")
# A subcommand whose module is not named after it (a module named inspect would shadow the stdlib's).
_MODULES = {
    name: f"tools.{folder}.command"
    for name, folder in (
        ("doctor", "doctor"),
        ("bisect", "bisection"),
        ("report", "report"),
        ("inspect", "inspection"),
    )
}

USAGE = """\
usage: importwatch [OPTIONS] SCRIPT [ARGS...]
       importwatch [OPTIONS] -m MODULE [ARGS...]
       importwatch [OPTIONS] -c CODE [ARGS...]
       importwatch [OPTIONS] - [ARGS...]      (the program read from stdin)
       importwatch doctor|bisect|report|inspect ...   (see importwatch COMMAND --help)

Run a Python program as python would, logging the start and end of every import
and native library load, flushed, and dumping every thread's stack when an
import makes no progress for a while.

options (each has an environment twin, used with IMPORTWATCH=1):
  --timeout S       stall threshold in seconds, 0.1 to 604800 (7 days); 0 turns
                    the watchdog off (IMPORTWATCH_TIMEOUT, default 30)
  --log PATH        also append every line to PATH; {pid} expands to the process
                    id and {rank} to the distributed rank (norank outside a
                    distributed job); a directory gets importwatch-PID.log, a
                    .jsonl path gets JSON Lines (IMPORTWATCH_LOG)
  --stderr all|stalls|none
                    what goes to stderr: every line; only the start line, stall
                    reports, ! verdicts, deaths and warnings; or nothing (the
                    log still gets every line) (IMPORTWATCH_STDERR, default all)
  --exit-on-stall   exit with status 1 after the first stall report of a
                    thread that waits or is stopped; one seen busy (using
                    CPU: compiling, say) is spared and runs on
                    (IMPORTWATCH_EXIT_ON_STALL=1)
  --watcher, --no-watcher
                    run (or not) a watcher process that reports from outside
                    what each thread does on a stall, and how the program died
                    if it dies mid-import (IMPORTWATCH_WATCHER=1/0; default: on
                    here, off with IMPORTWATCH=1)
  --dump-on-sigusr1 dump every thread's stack on SIGUSR1 instead of letting
                    it end the program (IMPORTWATCH_DUMP_ON_SIGUSR1=1; off by default)
  -h, --help        show this help and exit
  --version         show the version and exit

IMPORTWATCH=1 traces every Python process that has it in its environment
(off: unset, empty, 0, false, no, off, any case). Everything after SCRIPT,
-m MODULE, -c CODE or - belongs to the program.
"""


def main(argv: "list[str] | None" = None) -> int:
    """The console script: `python -m importwatch` with the interpreter the script was installed for."""
    launch = prepare(argv)
    if isinstance(launch, int):
        return launch
    from importwatch.tracing import runner

    runner.execute(launch)
    return EXIT_OK


def prepare(argv: "list[str] | None" = None, path0_taken: bool = False) -> "int | Launch":
    """Everything before the program runs: an exit status when there is nothing to run, else what to run.

    PATH0_TAKEN: `python -m importwatch` took the working folder off the front of sys.path
    (runner.take_path0), so that it shadows none of our imports.
    """
    args = sys.argv[1:] if argv is None else argv
    if args and args[0] in SUBCOMMANDS:
        if path0_taken:
            sys.path.append(os.getcwd())  # what a subcommand looks up there, behind everything of ours
        return _subcommand(args[0], args[1:])
    texts = {"-h": USAGE, "--help": USAGE, "--version": _version_text() if "--version" in args else ""}
    try:
        checked = _checked(args, texts)
    except UsageError as error:
        return fail(str(error))
    if checked is None:
        return EXIT_OK  # the help or the version, printed
    settings, warnings = _become_python(*checked)
    return _in_process(settings, warnings, checked[1], path0_taken)


def exec_at_start(args: "list[str]") -> None:
    """`python -m importwatch ARGS`, from importwatch's .pth line as site starts (_importwatch_boot.py):
    exec the program's python at once, where ARGS run a program that the exec traces and nothing needs
    saying first. This interpreter is replaced by the exec anyway: its start is then spared the rest of
    site, runpy and -m's search (milliseconds), and a sitecustomize or a later .pth runs in the
    program's process alone, as often as under plain python. Anything else returns with nothing done or said (a bad
    command line, help, a subcommand, a program the exec cannot trace, an exec that failed): python
    goes on to run `-m importwatch`, which does it the usual way (prepare)."""
    if not args or args[0] in SUBCOMMANDS:
        return
    try:  # no texts: -h, --help and --version are errors here, and prepare prints them
        checked = _checked(args, {})
    except UsageError:
        return
    if checked is not None:
        _become_python(*checked)


def _checked(args: "list[str]", texts: "dict[str, str]") -> "tuple[dict, Target] | None":
    """The options and the program that ARGS give, checked as far as they can be before it runs: None
    when one of TEXTS was asked for (printed), a UsageError for anything wrong."""
    from importwatch.tracing import runner

    parsed = options_then_target(
        args, "importwatch", texts, config.VALUE_OPTIONS, config.FLAG_OPTIONS, stdin=True
    )
    if parsed is None:
        return None
    options, target = parsed
    try:
        if options.get("log"):
            config.check_log_folder(options["log"], "--log")
        if target.kind == "script" and target.value in SUBCOMMANDS and not os.path.exists(target.value):
            raise UsageError(_subcommand_first(args, target))
        runner.check(target)
    except (config.ConfigError, runner.CannotRun) as error:
        raise UsageError(str(error)) from None
    return options, target


def _become_python(options: dict, target: "Target") -> "tuple[Settings, list[str]]":
    """Exec the program's python, traced from its start by the .pth, where it can be; else (or if the exec
    failed) the settings and warnings for running it here."""
    from importwatch.tracing import runner

    # The watcher is on here unless asked off (under IMPORTWATCH=1 alone it is off).
    settings, warnings = config.merge(options, watcher=True)
    if runner.why_in_process() is None:
        outer = sys.modules.get("importwatch.tracing.session")  # IMPORTWATCH=1 traced this process
        if outer is not None and outer.active() is not None:
            outer.before_exec()
        try:
            runner.become_python(target, settings, warnings)  # returns only if the exec failed
        except OSError:
            pass  # then here, as where it cannot trace
    return settings, warnings


def _subcommand_first(args: "list[str]", target: "Target") -> str:
    """`importwatch --timeout 5 doctor`: the subcommand's name came after options, where a script's
    goes, and no such file is here. What to type instead."""
    import shlex

    before = args[: len(args) - len(target.args) - 1]
    words = ["importwatch", target.value, *before, *target.args]
    return (
        f"{target.value} is a subcommand and comes first, before its options: "
        f"{' '.join(shlex.quote(word) for word in words)} (no file {target.value} here to run as a script)"
    )


def _version_text() -> str:
    """The version, and which per-import hook this interpreter gets (the C accelerator or pure Python)."""
    from importwatch.tracing.accelerator import HOT_PATH

    return f"importwatch {__version__} (hot path: {HOT_PATH})\n"


def _in_process(
    settings: "Settings", warnings: "list[str]", target: "Target", path0_taken: bool
) -> "int | Launch":
    """The fallback: the program runs in this process, through runpy's ways (see tracing/runner.py)."""
    from importwatch.tracing import runner, session

    try:
        code, path = runner.prepare(target)
    except runner.CannotRun as error:
        return fail(str(error))
    except (SyntaxError, ValueError) as error:
        # python reports a broken script without a traceback, and exits 1; so do we.
        error.__traceback__ = None
        sys.excepthook(type(error), error, None)
        return EXIT_PROBLEM
    # The target's children (workers, torchrun's ranks) trace themselves through the .pth.
    os.environ.update(config.to_env(settings))
    started_here = session.active() is None  # else IMPORTWATCH=1 traced our imports as they came
    tracing = session.activate(settings, warnings, argv=target.describe())
    launch = runner.launch(target, code, path, path0_taken)
    if started_here:
        tracing.held.put_aside()  # what the runner itself imported after activation
    return launch


def _subcommand(name: str, args: "list[str]") -> int:
    """doctor, bisect, report and inspect live in their own modules, imported only when asked for."""
    import importlib

    module = importlib.import_module(f"importwatch.{_MODULES[name]}")
    return module.main(args)
