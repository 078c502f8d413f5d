"""Command lines: one kind of usage error, said one way (a line on stderr, exit 2), and where the target starts."""

from __future__ import annotations

import sys

from importwatch.tracing.runner import Target

TYPE_CHECKING = False
if TYPE_CHECKING:
    import argparse

EXIT_USAGE = 2


class UsageError(Exception):
    """A bad command line; its message is one line that names what is wrong."""


def fail(message: object) -> int:
    """Say MESSAGE as importwatch's one-line error on stderr; the exit status for it."""
    sys.stderr.write(f"importwatch: error: {message}\n")
    sys.stderr.flush()
    return EXIT_USAGE


def value_of(args: list[str], index: int) -> tuple[str, int]:
    """The value of the option ARGS[INDEX]: what follows its `=`, else the next word; and where it was."""
    name, equals, value = args[index].partition("=")
    if equals:
        return value, index
    if index + 1 >= len(args):
        raise UsageError(f"{name} needs a value")
    return args[index + 1], index + 1


def target_at(args: list[str], index: int, command: str, stdin: bool = False) -> Target:
    """The program to run, from ARGS[INDEX] on, once the caller has taken its own options.

    `-m MODULE` and `-c CODE` start it, `--` ends the options, and the first word
    that is not an option is a script; everything after belongs to the program.
    `-` reads the program from stdin, as python does, where STDIN allows it.
    """
    if index < len(args):
        arg = args[index]
        if arg in ("-m", "-c"):
            if index + 1 >= len(args):
                raise UsageError(f"argument expected for the {arg} option")
            kind = "module" if arg == "-m" else "code"
            return Target(kind, args[index + 1], args[index + 2 :])
        if arg == "--":
            index += 1
        elif arg.startswith("-") and arg != "-":
            raise UsageError(f"unknown option {arg!r}")
    if index >= len(args):
        raise UsageError(f"no program given: {command} [OPTIONS] SCRIPT|-m MODULE|-c CODE")
    if args[index] == "-":
        if not stdin:
            raise UsageError("reading the program from stdin is not supported here; give a file")
        return Target("stdin", "-", args[index + 1 :])
    return Target("script", args[index], args[index + 1 :])


def argument_parser(**kwargs: object) -> argparse.ArgumentParser:
    """argparse, but a bad command line is a UsageError (one line, exit 2), never usage text."""
    import argparse

    class Parser(argparse.ArgumentParser):
        def error(self, message: str) -> None:  # type: ignore[override]
            raise UsageError(message)

    return Parser(**kwargs)
