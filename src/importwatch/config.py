"""Settings from options and IMPORTWATCH_* variables, validated, with errors that name their source."""

from __future__ import annotations

import os

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Mapping
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
        log: str | None = None,
        exit_on_stall: bool = False,
        watcher: bool | None = None,
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

    def replace(self, **changes: Any) -> Settings:
        """A copy with CHANGES, by field name."""
        fields = {name: getattr(self, name) for name in self.__slots__}
        return Settings(**{**fields, **changes})

    def __repr__(self) -> str:
        return (
            f"Settings(timeout={self.timeout!r}, log={self.log!r}, exit_on_stall={self.exit_on_stall!r}, "
            f"watcher={self.watcher!r}, dump_on_sigusr1={self.dump_on_sigusr1!r}, stderr={self.stderr!r})"
        )


def parse_timeout(text: str, source: str, needs: str | None = None) -> float:
    """Seconds as a float: 0 (the watchdog off), or from MIN_TIMEOUT to MAX_TIMEOUT.

    NEEDS names a command that cannot do without the watchdog: 0 is refused there.
    """
    try:
        value = float(text)
    except ValueError:
        raise ConfigError(f"{source}: expected a number of seconds, got {text!r}") from None
    if value != 0 and not MIN_TIMEOUT <= value <= MAX_TIMEOUT:
        raise ConfigError(
            f"{source}: expected 0 (off) or {MIN_TIMEOUT:g} to {MAX_TIMEOUT:.0f} seconds (7 days), got {text!r}"
        )
    if value == 0 and needs is not None:
        raise ConfigError(f"{source}: {needs} needs a number of seconds > 0, got {text!r}")
    return value


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


def merge(
    options: dict[str, object] | None = None,
    environ: Mapping[str, str] | None = None,
    watcher: bool | None = None,
    needs: str | None = None,
) -> tuple[Settings, list[str]]:
    """The one merge of settings, for every entry point: each option wins over its variable, which wins over the default.

    OPTIONS maps Settings' field names to values already checked (a command line's, parsed
    with the parse_* functions here, or install()'s arguments); a missing or None value is
    not given. A bad variable never stops the program: its default is used, and the
    warnings returned say so, one each, for the caller to report once. WATCHER is the
    watcher's default when neither asks (on for the runner; None, off, under IMPORTWATCH=1).
    NEEDS names a command that cannot do without the watchdog (see parse_timeout).
    """
    given = {name: value for name, value in (options or {}).items() if value is not None}
    environ = os.environ if environ is None else environ
    warnings: list[str] = []

    def read(field: str, name: str, parse: Callable[[str, str], Any], default: Any, fallback: str) -> Any:
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


def to_env(settings: Settings) -> dict[str, str]:
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


def to_options(settings: Settings) -> list[str]:
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


def expand_log_path(path: str, pid: int, rank: int | None = None) -> str:
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
