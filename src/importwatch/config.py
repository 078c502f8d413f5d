"""Settings from options and IMPORTWATCH_* variables, validated, with errors that name their source."""

import os

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Mapping, Sequence
    from typing import Any, Callable

DEFAULT_TIMEOUT = 30.0
# The stall threshold's range (0 turns the watchdog off). Below the least, the heartbeat would wake
# so often that it costs the program CPU; past a week, faulthandler's timer and lock waits
# overflow long before (at about 9.2e9 s) after a few doublings of the report interval.
MIN_TIMEOUT = 0.1
MAX_TIMEOUT = 7 * 86400.0

# Each option has an environment twin; the option wins.
ENV_ON = "IMPORTWATCH"
ENV_TIMEOUT = "IMPORTWATCH_TIMEOUT"
ENV_LOG = "IMPORTWATCH_LOG"
ENV_EXIT_ON_STALL = "IMPORTWATCH_EXIT_ON_STALL"
ENV_WATCHER = "IMPORTWATCH_WATCHER"
ENV_DUMP_ON_SIGUSR1 = "IMPORTWATCH_DUMP_ON_SIGUSR1"
ENV_STDERR = "IMPORTWATCH_STDERR"
# Private: the runner's process execs python with this set (see to_runner); the traced process
# takes it out of its environment as it activates, so neither the program nor its children see it.
ENV_RUNNER = "IMPORTWATCH_RUNNER"
# The .pth that pyproject.toml installs, whose line activates tracing when IMPORTWATCH is set: the
# runner execs python only where it is installed (tracing/runner.py), and its own line is no step
# of the program's (tracing/pthlines.py). Here, not in pthlines.py: the runner's own interpreter
# reads it without loading the tracing that only the exec'd python runs.
OUR_PTH = "00-importwatch.pth"

# What goes to stderr: every line, only what says something is wrong, or nothing of ours.
STDERR_ALL = "all"
STDERR_STALLS = "stalls"
STDERR_NONE = "none"
STDERR_MODES = (STDERR_ALL, STDERR_STALLS, STDERR_NONE)

_FALSE = ("", "0", "no", "false", "off")
_TRUE = ("1", "yes", "true", "on")


class ConfigError(ValueError):
    """A bad setting; the message is one line that names the option or variable."""


class Settings:
    """What one traced process does; immutable once built."""

    __slots__ = ("dump_on_sigusr1", "exit_on_stall", "log", "stderr", "timeout", "watcher")

    def __init__(
        self,
        timeout: float = DEFAULT_TIMEOUT,
        log: "str | None" = None,
        exit_on_stall: bool = False,
        watcher: "bool | None" = None,
        dump_on_sigusr1: bool = False,
        stderr: str = STDERR_ALL,
    ) -> None:
        object.__setattr__(self, "timeout", timeout)
        object.__setattr__(self, "log", log)
        object.__setattr__(self, "exit_on_stall", exit_on_stall)
        # The watcher process: None means not asked, which is off (the runner turns it on).
        object.__setattr__(self, "watcher", watcher)
        # SIGUSR1's default action ends a process, and batch schedulers rely on it: opt-in only.
        object.__setattr__(self, "dump_on_sigusr1", dump_on_sigusr1)
        object.__setattr__(self, "stderr", stderr)

    def __setattr__(self, name: str, value: object) -> None:
        raise AttributeError("Settings are immutable")

    def replace(self, **changes: "Any") -> "Settings":
        """A copy with CHANGES, by field name."""
        fields = {name: getattr(self, name) for name in self.__slots__}
        return Settings(**{**fields, **changes})

    def __repr__(self) -> str:
        return (
            f"Settings(timeout={self.timeout!r}, log={self.log!r}, exit_on_stall={self.exit_on_stall!r}, "
            f"watcher={self.watcher!r}, dump_on_sigusr1={self.dump_on_sigusr1!r}, stderr={self.stderr!r})"
        )


def parse_timeout(text: str, source: str, needs: "str | None" = None) -> float:
    """Seconds as a float: 0 (the watchdog off), or from MIN_TIMEOUT to MAX_TIMEOUT.

    NEEDS names a command that cannot do without the watchdog: 0 is refused there.
    """
    try:
        value = float(text)
    except ValueError:
        raise ConfigError(f"{source}: expected a number of seconds, got {text!r}") from None
    return check_timeout(value, source, needs, text)


def check_timeout(value: float, source: str, needs: "str | None" = None, text: object = None) -> float:
    """VALUE if it is a stall threshold (see parse_timeout), else a ConfigError naming SOURCE."""
    shown = repr(value if text is None else text)
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ConfigError(f"{source}: expected a number of seconds, got {shown}")
    if value != 0 and not MIN_TIMEOUT <= value <= MAX_TIMEOUT:
        raise ConfigError(
            f"{source}: expected 0 (off) or {MIN_TIMEOUT:g} to {MAX_TIMEOUT:.0f} seconds (7 days), got {shown}"
        )
    if value == 0 and needs is not None:
        raise ConfigError(f"{source}: {needs} needs a number of seconds > 0, got {shown}")
    return float(value)


def parse_log(text: str, source: str) -> str:
    """A log path: any non-empty text (see expand_log_path)."""
    if not text:
        raise ConfigError(f"{source} needs a path")
    return text


def parse_stderr(text: str, source: str) -> str:
    """What goes to stderr: all, stalls or none."""
    lowered = text.strip().lower()
    if lowered not in STDERR_MODES:
        raise ConfigError(f"{source}: expected one of {', '.join(STDERR_MODES)}, got {text!r}")
    return lowered


def parse_flag(text: str, source: str) -> bool:
    """A yes/no variable: 1/yes/true/on or 0/no/false/off (or empty)."""
    lowered = text.strip().lower()
    if lowered in _TRUE:
        return True
    if lowered in _FALSE:
        return False
    raise ConfigError(f"{source}: expected 1 or 0, got {text!r}")


# The runner's options for each setting, by the Settings field each sets: the runner's command line
# (cli.py), the watcher's (from_options) and what to_options writes all read from these.
VALUE_OPTIONS: "dict[str, tuple[str, Callable[[str, str], Any]]]" = {
    "--timeout": ("timeout", parse_timeout),
    "--log": ("log", parse_log),
    "--stderr": ("stderr", parse_stderr),
}
FLAG_OPTIONS: "dict[str, tuple[str, bool]]" = {
    "--exit-on-stall": ("exit_on_stall", True),
    "--watcher": ("watcher", True),
    "--no-watcher": ("watcher", False),
    "--dump-on-sigusr1": ("dump_on_sigusr1", True),
}


def option_name(field: str) -> str:
    """The runner's option for a Settings field: how an error names a bad one given on a command line."""
    return "--" + field.replace("_", "-")


def _check(field: str, value: "Any", source: str, needs: "str | None") -> "Any":
    """VALUE, given for FIELD by SOURCE (an option, or an argument of install()), if it is one."""
    if field == "timeout":
        return check_timeout(value, source, needs)
    if field == "log":
        if isinstance(value, os.PathLike):
            value = os.fspath(value)
        if not isinstance(value, str) or not value:
            raise ConfigError(f"{source}: expected a path, got {value!r}")
        return value
    if field == "stderr":
        if value not in STDERR_MODES:
            raise ConfigError(f"{source}: expected one of {', '.join(STDERR_MODES)}, got {value!r}")
        return value
    if not isinstance(value, bool):  # the switches
        raise ConfigError(f"{source}: expected True or False, got {value!r}")
    return value


def merge(
    options: "dict[str, object] | None" = None,
    environ: "Mapping[str, str] | None" = None,
    watcher: "bool | None" = None,
    needs: "str | None" = None,
    source: "Callable[[str], str]" = option_name,
) -> "tuple[Settings, list[str]]":
    """The one merge of settings, for every entry point: each option wins over its variable, which wins over the default.

    OPTIONS maps Settings' field names to values (a command line's, parsed with the parse_*
    functions here, or install()'s arguments); a missing or None value is not given. Each
    is checked here: a bad one is a programming or usage error, a ConfigError (a ValueError)
    that names it as SOURCE(field) does. A bad variable never stops the program: its default
    is used, and the warnings returned say so, one each, for the caller to report once. WATCHER is the
    watcher's default when neither asks (on for the runner; None, off, under IMPORTWATCH=1).
    NEEDS names a command that cannot do without the watchdog (see parse_timeout).
    """
    given = {
        name: _check(name, value, source(name), needs)
        for name, value in (options or {}).items()
        if value is not None
    }
    environ = os.environ if environ is None else environ
    warnings: list[str] = []

    def read(
        field: str, name: str, parse: "Callable[[str, str], Any]", default: "Any", fallback: str
    ) -> "Any":
        if field in given:
            return given[field]
        raw = environ.get(name)
        if raw is None or raw == "":
            return default
        try:
            return parse(raw, name)
        except ConfigError as error:
            warnings.append(f"{error}; using {fallback}")
            return default

    settings = Settings(
        timeout=read(
            "timeout",
            ENV_TIMEOUT,
            lambda text, source: parse_timeout(text, source, needs),
            DEFAULT_TIMEOUT,
            f"{DEFAULT_TIMEOUT:g}",
        ),
        log=given.get("log", environ.get(ENV_LOG) or None),
        exit_on_stall=read("exit_on_stall", ENV_EXIT_ON_STALL, parse_flag, False, "0"),
        watcher=read("watcher", ENV_WATCHER, parse_flag, watcher, "the default"),
        dump_on_sigusr1=read("dump_on_sigusr1", ENV_DUMP_ON_SIGUSR1, parse_flag, False, "0"),
        stderr=read("stderr", ENV_STDERR, parse_stderr, STDERR_ALL, STDERR_ALL),
    )
    return settings, warnings


def to_env(settings: "Settings") -> "dict[str, str]":
    """The IMPORTWATCH_* variables that make a child process trace itself with SETTINGS."""
    # A relative log path would land in each child's own working directory.
    log = os.path.abspath(os.path.expanduser(settings.log)) if settings.log else ""
    return {
        ENV_ON: "1",
        ENV_TIMEOUT: repr(settings.timeout),
        ENV_LOG: log,
        ENV_EXIT_ON_STALL: "1" if settings.exit_on_stall else "0",
        ENV_DUMP_ON_SIGUSR1: "1" if settings.dump_on_sigusr1 else "0",
        ENV_STDERR: settings.stderr,
    }


def to_options(settings: "Settings") -> "list[str]":
    """The runner's options that give a child process SETTINGS, whatever IMPORTWATCH_* it has."""
    options = ["--timeout", repr(settings.timeout), "--stderr", settings.stderr]
    options.append("--watcher" if settings.watcher else "--no-watcher")
    if settings.log:
        options += ["--log", settings.log]
    if settings.exit_on_stall:
        options.append("--exit-on-stall")
    if settings.dump_on_sigusr1:
        options.append("--dump-on-sigusr1")
    return options


def from_options(args: "Sequence[str]") -> "Settings":
    """The Settings that ARGS, written by to_options, give (the watcher reads its own so).

    Through the one merge, with no variable read: a bad word is a ConfigError naming it.
    """
    given: dict[str, object] = {}
    words = iter(args)
    for word in words:
        if word in FLAG_OPTIONS:
            field, value = FLAG_OPTIONS[word]
            given[field] = value
        elif word in VALUE_OPTIONS:
            field, parse = VALUE_OPTIONS[word]
            given[field] = parse(next(words, ""), word)
        else:
            raise ConfigError(f"{word}: not an option of importwatch's settings")
    return merge(given, {})[0]


def to_runner(settings: "Settings", warnings: "Sequence[str]", skip: int) -> str:
    """ENV_RUNNER's value: SETTINGS (as to_options writes them), the WARNINGS the merge gave (for the
    traced process to report), and how many words of its command line are the interpreter's (SKIP)."""
    words = [str(skip), str(len(warnings)), *warnings, *to_options(settings)]
    return "".join(f"{len(word)}:{word}" for word in words)  # any text may be in a log's path


def from_runner(text: str) -> "tuple[Settings, list[str], int]":
    """What to_runner wrote: the settings, the warnings and the skip; a ValueError if it is not that."""
    words = []
    while text:
        size, colon, text = text.partition(":")
        if not colon or not size.isdigit() or int(size) > len(text):
            raise ValueError(f"{ENV_RUNNER} is not the runner's")
        words.append(text[: int(size)])
        text = text[int(size) :]
    if len(words) < 2 or not (words[0] + words[1]).isdigit() or len(words) < 2 + int(words[1]):
        raise ValueError(f"{ENV_RUNNER} is not the runner's")
    count = int(words[1])
    return from_options(words[2 + count :]), words[2 : 2 + count], int(words[0])


def for_child(
    settings: "Settings | None" = None, environ: "Mapping[str, str] | None" = None
) -> "tuple[dict[str, str], list[str]]":
    """A child process's environment and options: how every process we start gets its settings.

    The environment is ENVIRON's (os.environ's) without any IMPORTWATCH* variable, so a child
    never inherits ours by accident: a tool's child, a watcher, an interpreter asked for its
    path are not traced. Given SETTINGS, the options are the runner's that trace the child
    with exactly those (`python -m importwatch OPTIONS ...`); the runner hands them on to the
    child's own children through to_env.
    """
    environ = os.environ if environ is None else environ
    env = {name: value for name, value in environ.items() if not name.startswith(ENV_ON)}
    return env, ([] if settings is None else to_options(settings))


def expand_log_path(path: str, pid: int, rank: "int | None" = None) -> str:
    """The file a process writes to: {pid} and {rank} expand; a directory gets one file per process.

    {rank} is "norank" in a process that is not part of a distributed job (the launcher).
    """
    expanded = path.replace("{pid}", str(pid)).replace("{rank}", "norank" if rank is None else str(rank))
    expanded = os.path.expanduser(expanded)
    if os.path.isdir(expanded):
        expanded = os.path.join(expanded, f"importwatch-{pid}.log")
    return expanded


def check_log_folder(path: str, source: str) -> str:
    """PATH, when the folder its log file goes in exists and may be written in; else a ConfigError.

    For the runner, before the program runs: a log that cannot be opened loses every
    event, which a person at the command line wants to hear at once. A cheap look (no
    file is opened here: the Sink opens it once); a folder named by {rank} is known only
    in the process that has the rank, and is left to the Sink.
    """
    expanded = expand_log_path(path, os.getpid())
    folder = os.path.dirname(expanded) or "."
    if "{rank}" in os.path.dirname(path):
        return path
    if not os.path.isdir(folder):
        raise ConfigError(
            f"{source}: no folder {folder} for the log file {path} (importwatch does not create it)"
        )
    if not os.access(folder, os.W_OK | os.X_OK):
        raise ConfigError(f"{source}: cannot write in the folder {folder} of the log file {path}")
    return path
