"""Command lines: one kind of usage error, said one way (a line on stderr, exit 2), and where the target starts."""

import sys

from importwatch.tracing.runner import Target

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any, Callable

EXIT_USAGE = 2


class UsageError(Exception):
    """A bad command line; its message is one line that names what is wrong."""


def fail(message: object) -> int:
    """Say MESSAGE as importwatch's one-line error on stderr; the exit status for it."""
    sys.stderr.write(f"importwatch: error: {message}\n")
    sys.stderr.flush()
    return EXIT_USAGE


def did_you_mean(word: str, choices: "list[str]") -> str:
    """'; did you mean --timeout?' when WORD looks like a typo of one of CHOICES; else ''."""
    import difflib  # on this error path only: the runner's start-up imports nothing python does not

    # Compared without their dashes, which every option shares: --bogus is not close to --log.
    bare = {choice.lstrip("-"): choice for choice in choices if choice.startswith("--")}
    close = difflib.get_close_matches(word.lstrip("-"), list(bare), n=1, cutoff=0.75)
    return f"; did you mean {bare[close[0]]}?" if close else ""


def value_of(args: "list[str]", index: int) -> "tuple[str, int]":
    """The value of the option ARGS[INDEX]: what follows its `=`, else the next word; and where it was."""
    name, equals, value = args[index].partition("=")
    if equals:
        return value, index
    if index + 1 >= len(args):
        raise UsageError(f"{name} needs a value")
    return args[index + 1], index + 1


def options_then_target(
    args: "list[str]",
    command: str,
    texts: "dict[str, str]",
    values: "dict[str, tuple[str, Callable[[str, str], Any]]]",
    flags: "dict[str, tuple[str, Any]]",
    stdin: bool = False,
) -> "tuple[dict[str, Any], Target] | None":
    """A runner's command line: its options up to the program, then the program (see target_at).

    VALUES maps an option that takes a value (`--x V` or `--x=V`) to the key it sets and
    the parser of its text, called with the text and the option's name; FLAGS maps an
    option without a value to the key it sets and the value it sets. An option in TEXTS
    (-h, --help, --version) prints its text, and the answer is None. A parser's error (a ConfigError or a UsageError) is a UsageError.
    """
    from importwatch.config import ConfigError

    options: dict[str, Any] = {}
    index = 0
    while index < len(args):
        arg = args[index]
        name = arg.partition("=")[0] if arg.startswith("--") else arg
        if arg in texts:
            sys.stdout.write(texts[arg])
            return None
        if name in values:
            text, index = value_of(args, index)
            key, parse = values[name]
            try:
                options[key] = parse(text, name)
            except ConfigError as error:
                raise UsageError(str(error)) from None
        elif arg in flags:
            key, value = flags[arg]
            options[key] = value
        elif arg.startswith("--") and arg != "--":
            raise UsageError(f"unknown option {name!r}{did_you_mean(name, [*texts, *values, *flags])}")
        else:
            break
        index += 1
    return options, target_at(args, index, command, stdin)


def target_at(args: "list[str]", index: int, command: str, stdin: bool = False) -> "Target":
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


def argument_parser(**kwargs: object) -> "Any":  # an argparse.ArgumentParser with add_switch
    """argparse, but a bad command line is a UsageError (one line, exit 2), never usage text."""
    import argparse

    class Parser(argparse.ArgumentParser):
        def error(self, message: str) -> None:  # type: ignore[override]
            unknown = "unrecognized arguments: "
            if message.startswith(unknown) and message[len(unknown) :].startswith("--"):
                word = message[len(unknown) :].split()[0].partition("=")[0]
                message += did_you_mean(word, list(self._option_string_actions))
            raise UsageError(message)

        def add_switch(self, name: str, default: "bool | None", help: str) -> None:
            """NAME and its --no- twin; DEFAULT when neither is given (None: decided later)."""
            self.add_argument(name, action=argparse.BooleanOptionalAction, default=default, help=help)

    return Parser(**kwargs)
