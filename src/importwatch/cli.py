"""The command line: parse options, dispatch to the runner or a subcommand, own the exit codes."""

from __future__ import annotations

import os
import sys

from importwatch import __version__, config
from importwatch.usage import UsageError, fail, target_at, value_of

TYPE_CHECKING = False
if TYPE_CHECKING:
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
  --exit-on-stall   exit with status 1 after the first stall report
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


def main(argv: list[str] | None = None) -> int:
    """The console script: the program runs from runner.execute (python -m runs it from __main__.py)."""
    launch = prepare(argv)
    if isinstance(launch, int):
        return launch
    from importwatch.tracing import runner

    runner.execute(launch)
    return EXIT_OK


def prepare(argv: list[str] | None = None) -> int | Launch:
    """Everything before the program runs: an exit status when there is nothing to run, else what to run."""
    args = sys.argv[1:] if argv is None else argv
    if args and args[0] in SUBCOMMANDS:
        return _subcommand(args[0], args[1:])
    try:
        options, target = parse(args)
    except UsageError as error:
        return fail(str(error))
    if options is None:
        return EXIT_OK
    return _start(options, target)


def parse(args: list[str]) -> tuple[dict | None, Target | None]:
    """Options up to the target; the target and everything after it untouched."""
    options: dict = {}
    index = 0
    while index < len(args):
        arg = args[index]
        name = arg.partition("=")[0] if arg.startswith("--") else arg
        if arg in ("-h", "--help"):
            sys.stdout.write(USAGE)
            return None, None
        if arg == "--version":
            sys.stdout.write(f"importwatch {__version__}\n")
            return None, None
        if name in ("--timeout", "--log", "--stderr"):
            value, index = value_of(args, index)
            if name == "--timeout":
                options["timeout"] = _checked(config.parse_timeout, value, "--timeout")
            elif name == "--stderr":
                options["stderr"] = _checked(config.parse_stderr, value, "--stderr")
            else:
                if not value:
                    raise UsageError("--log needs a path")
                options["log"] = value
        elif arg == "--exit-on-stall":
            options["exit_on_stall"] = True
        elif arg in ("--watcher", "--no-watcher"):
            options["watcher"] = arg == "--watcher"
        elif arg == "--dump-on-sigusr1":
            options["dump_on_sigusr1"] = True
        else:
            return options, target_at(args, index, "importwatch", stdin=True)
        index += 1
    return options, target_at(args, index, "importwatch", stdin=True)


def _checked(parser, value: str, source: str):
    try:
        return parser(value, source)
    except config.ConfigError as error:
        raise UsageError(str(error)) from None


def _start(options: dict, target: Target) -> int | Launch:
    from importwatch.tracing import runner, session

    try:
        code, path = runner.prepare(target)
    except runner.CannotRun as error:
        return fail(str(error))
    except SyntaxError as error:
        # python reports a broken script without a traceback, and exits 1; so do we.
        error.__traceback__ = None
        sys.excepthook(type(error), error, None)
        return EXIT_PROBLEM
    env_settings, warnings = config.from_env()
    settings = config.Settings(
        timeout=options.get("timeout", env_settings.timeout),
        log=options.get("log", env_settings.log),
        exit_on_stall=options.get("exit_on_stall", env_settings.exit_on_stall),
        watcher=options.get("watcher", env_settings.watcher is not False),
        dump_on_sigusr1=options.get("dump_on_sigusr1", env_settings.dump_on_sigusr1),
        stderr=options.get("stderr", env_settings.stderr),
    )
    # The target's children (workers, torchrun's ranks) trace themselves through the .pth.
    os.environ.update(config.to_env(settings))
    session.activate(settings, warnings, argv=target.describe())
    return runner.launch(target, code, path)


def _subcommand(name: str, args: list[str]) -> int:
    """doctor, bisect, report and inspect live in their own modules, imported only when asked for."""
    import importlib

    module = importlib.import_module(f"importwatch.{_MODULES[name]}")
    return module.main(args)
