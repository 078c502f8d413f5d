"""`importwatch bisect`: from a hanging program to the smallest `python -c "import ..."` that still hangs."""

from __future__ import annotations

import json
import os
import shutil
import sys
import tempfile
import threading
import time

from importwatch import config
from importwatch.masking import mask_argv
from importwatch.tools.bisection.trials import (
    ERROR,
    OK,
    STOPPED,
    Outcome,
    TerminationAsInterrupt,
    Trials,
    stop_status,
)
from importwatch.tools.commands import import_code, join, quote
from importwatch.tracing.runner import is_zip
from importwatch.usage import EXIT_USAGE, UsageError, fail, options_then_target

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Callable

EXIT_NO_HANG = 0
EXIT_FOUND = 1


DEFAULT_JOBS = 1
DEFAULT_MAX_TRIES = 64
DEFAULT_MAX_TIME = 600.0
# A culprit is named once its reproducer did it this many times, and the import it ends with,
# tried alone as often, never did: a hang that comes every other run would otherwise steer the
# search to whatever it happened to be trying then.
REPEATS = 3

USAGE = """\
usage: importwatch bisect [OPTIONS] SCRIPT [ARGS...]
       importwatch bisect [OPTIONS] -m MODULE [ARGS...]
       importwatch bisect [OPTIONS] -c CODE [ARGS...]

Run the program under the tracer; if it hangs (or crashes) in an import, find
the smallest `python -c "import a; import b"` that still does, by trying the
import in flight alone, then reducing the imports that came before it.

options:
  --timeout S     stall threshold, and each try's limit, in seconds
                  (IMPORTWATCH_TIMEOUT, default 30)
  --jobs N        run up to N tries at once (default 1)
  --max-tries N   stop after N tries, the program's own run included (default 64)
  --max-time S    stop after S seconds in all (default 600)
  --json          print the result as one JSON object
  -h, --help      show this help and exit

Exit status: 0 no hang, 1 a hang or crash was found, 2 bad usage.
Everything after SCRIPT, -m MODULE or -c CODE belongs to the program.
"""


class Options:
    """The parsed command line."""

    def __init__(self) -> None:
        self.timeout = config.DEFAULT_TIMEOUT  # merged with IMPORTWATCH_TIMEOUT (see parse)
        self.settings = config.Settings()  # the tries' settings, merged with IMPORTWATCH_* (see parse)
        self.jobs = DEFAULT_JOBS
        self.max_tries = DEFAULT_MAX_TRIES
        self.max_time = DEFAULT_MAX_TIME
        self.json = False
        self.kind = ""  # "script", "module" or "code"
        self.target: list[str] = []  # as python would be given it: [-m MOD | -c CODE | SCRIPT, *ARGS]


def parse(args: list[str], environ: dict[str, str] | None = None) -> Options | None:
    """Options up to the target, the target untouched; None when help was printed.

    The stall threshold is merged with IMPORTWATCH_TIMEOUT as every entry point does;
    a bad variable is said on stderr, once, and the default used.
    """
    parsed = options_then_target(args, "importwatch bisect", {"-h": USAGE, "--help": USAGE}, _VALUES, _FLAGS)
    if parsed is None:
        return None
    given, target = parsed
    options = Options()
    for key in ("jobs", "max_tries", "max_time", "json"):
        if key in given:
            setattr(options, key, given[key])
    settings, warnings = config.merge(
        {"timeout": given.get("timeout")}, environ, watcher=True, needs="bisect"
    )
    for warning in warnings:
        sys.stderr.write(f"importwatch bisect: {warning}\n")
    options.timeout = settings.timeout
    options.settings = settings
    options.kind = target.kind
    if target.kind != "script":
        options.target = target.describe()
        return options
    if not os.path.exists(target.value):
        raise UsageError(f"can't open file {os.path.abspath(target.value)!r}: no such file")
    # `--` keeps a script named like an option from being read as one; the runner needs it too.
    options.target = ["--", *target.describe()] if target.value.startswith("-") else target.describe()
    return options


def _timeout(text: str, source: str) -> float:
    return config.parse_timeout(text, source, needs="bisect")


def _count(text: str, source: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise UsageError(f"{source}: expected a whole number >= 1, got {text!r}")
    return value


# The options, by the attribute of Options (or, for --timeout, the Settings field) each sets.
_VALUES = {
    "--timeout": ("timeout", _timeout),
    "--jobs": ("jobs", _count),
    "--max-tries": ("max_tries", _count),
    "--max-time": ("max_time", _timeout),
}
_FLAGS = {"--json": ("json", True)}


def main(args: list[str]) -> int:
    """`importwatch bisect ARGS`: returns the exit status."""
    try:
        options = parse(args)
    except UsageError as error:
        return fail(error)
    if options is None:
        return EXIT_NO_HANG
    with TerminationAsInterrupt():
        workdir = tempfile.mkdtemp(prefix="importwatch-bisect-")
        try:
            return Bisection(options, workdir).run()
        except KeyboardInterrupt as stop:  # SIGINT, SIGTERM or SIGHUP
            # Each try kills its child's process group on the way out.
            how, status = stop_status(stop)
            sys.stderr.write(f"importwatch bisect: {how}\n")
            return status
        finally:
            shutil.rmtree(workdir, ignore_errors=True)


class Result:
    """What the search found; printed as text or as one JSON object."""

    def __init__(self, first: Outcome) -> None:
        self.first = first
        self.kind = first.kind
        self.culprit = first.chain[-1] if first.chain else None
        self.imports: list[str] = []  # the reproducer's imports, in order; empty: none found
        self.alone = False  # the culprit's chain hangs with nothing imported before it
        self.stopped: str | None = None  # the bound that ended the search early
        self.note = ""
        self.tries = 0
        self.seconds = 0.0
        self.confirmed = False  # every repeat of the decisive tries agreed
        self.flaky: tuple[int, int] | None = None  # (times it happened, tries) when they did not


class Bisection:
    """The search: one run of the program, then `python -c` tries that shrink what it imports."""

    def __init__(self, options: Options, workdir: str) -> None:
        self.options = options
        self.started = time.monotonic()
        self.trials = Trials(options.settings, workdir, deadline=self.started + options.max_time)
        self.env = self._tries_env()
        self.stopped: str | None = None
        self._lock = threading.Lock()

    def _tries_env(self) -> dict[str, str]:
        """The environment of the `-c` tries: the program's, with its sys.path[0] up front.

        python puts a script's directory first on sys.path; `-c` puts the working
        directory there, as `-m` does, so only a script needs PYTHONPATH.
        """
        env = dict(self.trials.env)
        if self.options.kind == "script":
            path = self._script_path()
            is_dir_or_zip = os.path.isdir(path) or is_zip(path)
            first = path if is_dir_or_zip else os.path.dirname(os.path.realpath(path))
            old = env.get("PYTHONPATH")
            env["PYTHONPATH"] = first + (os.pathsep + old if old else "")
        return env

    def _script_path(self) -> str:
        target = self.options.target
        return os.path.abspath(target[1] if target[0] == "--" else target[0])

    # -- the search ----------------------------------------------------------------------
    def run(self) -> int:
        label = "python " + join(mask_argv(self.options.target))
        first = self._try(self.options.target, label, first=True)
        if first is None or first.kind == STOPPED:
            self._say_nothing("stopped by --max-time before the program's imports were done; no hang seen")
            return EXIT_NO_HANG
        if first.kind == ERROR:
            detail = first.stderr_tail or first.detail
            sys.stderr.write(f"importwatch: error: cannot run the program: {detail}\n")
            return EXIT_USAGE
        if first.kind == OK:
            self._say_nothing(f"no hang: the program ran its imports without a stall ({first.detail})")
            return EXIT_NO_HANG
        result = Result(first)
        self._minimise(result)
        self._confirm(result)
        result.stopped = self.stopped
        result.tries = self.trials.count
        result.seconds = time.monotonic() - self.started
        self._report(result)
        return EXIT_FOUND

    def _minimise(self, result: Result) -> None:
        first = result.first
        chain = first.chain
        if not chain:
            result.note = f"nothing was being imported when it ended ({first.detail}): not an import problem"
            return
        # The chain in flight, innermost first: the smallest that hangs by itself wins.
        alone = _unique(reversed(chain))
        index = self._batch([[name] for name in alone], result)
        if index is not None:
            result.imports = [alone[index]]
            result.alone = True
            return
        if self.stopped:
            return
        # Nothing hangs alone: what came before matters. Candidates are the imports that
        # ended before the hang, minus the culprit's own packages (importing those runs the
        # chain itself). Top-level names first: they are what a user would paste.
        packages = {_top(name) for name in chain}
        earlier = [name for name in first.completed if _top(name) not in packages]
        if not earlier:
            result.note = "nothing was imported before it: it depends on what the program itself does"
            return
        outermost = next(name for name in chain if _top(name) == _top(chain[-1]))
        tails = _unique([outermost, chain[-1]])
        tops = _unique(_top(name) for name in earlier)
        bases = [tops] if tops == earlier else [tops, earlier]
        for base, tail in [(base, tail) for tail in tails for base in bases]:
            base = self._verify(base, tail, result)
            if base is not None:
                result.imports = [*self._ddmin(base, tail, result), tail]
                return
            if self.stopped:
                return
        result.note = (
            "it did not happen again in `python -c` tries of the imports before it: "
            "it depends on what the program itself does"
        )

    def _confirm(self, result: Result) -> None:
        """Repeat the decisive tries: the reproducer must do it every time, its last import alone never.

        Otherwise the hang (or crash) is flaky: it is said so, with how often it came, and a
        last import that did it alone is named alone (what came before was chance).
        """
        if not result.imports or self.stopped:
            return
        again, runs = self._repeat(result.imports, REPEATS - 1, result)
        tail = result.imports[-1]
        alone_hits, alone_runs = 0, 1  # the search tried TAIL alone once, in vain, unless alone
        if not result.alone and not self.stopped:
            alone_hits, more = self._repeat([tail], REPEATS - 1, result)
            alone_runs += more
        if alone_hits:
            result.imports, result.alone = [tail], True
            result.flaky = (alone_hits, alone_runs)
        elif again < runs:
            result.flaky = (1 + again, 1 + runs)
        elif not self.stopped:
            result.confirmed = True

    def _repeat(self, imports: list[str], times: int, result: Result) -> tuple[int, int]:
        """Try IMPORTS again TIMES times: (how often it reproduced, tries run)."""
        assert result.culprit is not None
        hits = runs = 0
        for _ in range(times):
            outcome = self._try(["-c", import_code(imports)], f"{_label(imports)} (again)")
            if outcome is None:
                break
            runs += 1
            hits += outcome.reproduces(result.kind, result.culprit)
        return hits, runs

    def _verify(self, base: list[str], tail: str, result: Result) -> list[str] | None:
        """BASE, less what cannot be imported on its own, if importing it before TAIL reproduces.

        A program can import what a fresh `python -c` cannot (it may extend sys.path
        first) or what hangs by itself: a try that fails in an earlier import drops it.
        """
        assert result.culprit is not None
        while base:
            outcome = self._try(["-c", import_code([*base, tail])], _label([*base, tail]))
            if outcome is None:
                return None
            if outcome.reproduces(result.kind, result.culprit):
                return base
            if outcome.kind == OK or not outcome.chain or outcome.chain[0] not in base:
                return None
            self._progress(f"dropping {outcome.chain[0]}: it {_VERB[outcome.kind]} in a fresh interpreter")
            base = [name for name in base if name != outcome.chain[0]]
        return None

    def _ddmin(self, items: list[str], tail: str, result: Result) -> list[str]:
        """Delta debugging: a 1-minimal part of ITEMS that, imported before TAIL, still hangs."""
        current = items
        parts = 2
        while len(current) >= 2 and not self.stopped:
            chunks = _split(current, parts)
            index = self._batch([[*chunk, tail] for chunk in chunks], result)
            if index is not None:
                current, parts = chunks[index], 2
                continue
            if parts > 2 and not self.stopped:
                complements = [
                    [x for j, c in enumerate(chunks) if j != i for x in c] for i in range(len(chunks))
                ]
                index = self._batch([[*rest, tail] for rest in complements], result)
                if index is not None:
                    current, parts = complements[index], max(parts - 1, 2)
                    continue
            if parts >= len(current):
                break
            parts = min(parts * 2, len(current))
        return current

    def _batch(self, lists: list[list[str]], result: Result) -> int | None:
        """Try each list of imports; the index of the first (in order) that reproduces the hang.

        With --jobs N up to N tries run at once; a try is stopped as soon as an
        earlier one in the list has reproduced, since it can no longer be chosen.
        """
        assert result.culprit is not None
        kind, culprit = result.kind, result.culprit
        found: list[int] = []
        lock = threading.Lock()

        def attempt(index: int) -> None:
            def beaten() -> bool:
                return bool(found) and min(found) < index

            if beaten():
                return
            outcome = self._try(["-c", import_code(lists[index])], _label(lists[index]), cancelled=beaten)
            if outcome is not None and outcome.reproduces(kind, culprit):
                with lock:
                    found.append(index)

        if self.options.jobs == 1 or len(lists) == 1:
            for index in range(len(lists)):
                attempt(index)
                if found or self.stopped:
                    break
        else:
            _parallel(attempt, len(lists), self.options.jobs, self.trials.stop)
        return min(found) if found else None

    def _try(
        self, target: list[str], label: str, first: bool = False, cancelled: Callable[[], bool] | None = None
    ) -> Outcome | None:
        """One try, unless a bound is spent; its progress line once it ends."""
        with self._lock:
            if self.stopped:
                return None
            if self.trials.count >= self.options.max_tries:
                self.stopped = f"--max-tries {self.options.max_tries} reached"
                return None
            if time.monotonic() >= self.started + self.options.max_time:
                self.stopped = f"--max-time {self.options.max_time:g} s spent"
                return None
            number = self.trials.number()
        outcome = self.trials.run(
            target, number, env=None if first else self.env, first=first, cancelled=cancelled
        )
        deadline = self.trials.deadline
        if outcome.kind == STOPPED and deadline is not None and time.monotonic() >= deadline:
            with self._lock:
                self.stopped = self.stopped or f"--max-time {self.options.max_time:g} s spent"
        where = f"  in {' > '.join(outcome.chain)}" if outcome.chain and outcome.kind != OK else ""
        self._progress(f"try {number:>2}  {outcome.kind:<7} {outcome.seconds:6.2f} s  {label}{where}")
        return outcome

    # -- output ---------------------------------------------------------------------------
    def _progress(self, line: str) -> None:
        with self._lock:
            sys.stderr.write(f"importwatch bisect: {line}\n")
            sys.stderr.flush()

    def _say_nothing(self, message: str) -> None:
        seconds = time.monotonic() - self.started
        if self.options.json:
            record = {
                "result": OK,
                "message": message,
                "tries": self.trials.count,
                "seconds": round(seconds, 3),
            }
            sys.stdout.write(json.dumps(record) + "\n")
        else:
            sys.stdout.write(f"importwatch bisect: {message}; {_tries(self.trials.count)}, {seconds:.1f} s\n")
        sys.stdout.flush()

    def reproducer(self, imports: list[str]) -> tuple[list[str], str]:
        """The command that reproduces it, as argv and as a line for a shell."""
        command = [sys.executable, "-c", import_code(imports)]
        prefix = f"cd {quote(self.trials.cwd)} && "
        if self.options.kind == "script":
            prefix += f"PYTHONPATH={quote(self.env['PYTHONPATH'])} "
        return command, prefix + join(command)

    def _report(self, result: Result) -> None:
        first = result.first
        command, line = self.reproducer(result.imports) if result.imports else (None, None)
        if self.options.json:
            record = {
                "result": result.kind,
                "culprit": result.culprit,
                "detail": first.detail,
                "chain": first.chain,
                "failed": first.failed,
                "native": first.native,
                "verdicts": first.verdicts,
                "imports": result.imports,
                "code": import_code(result.imports) if result.imports else None,
                "command": command,
                "cwd": self.trials.cwd,
                "pythonpath": self.env.get("PYTHONPATH") if self.options.kind == "script" else None,
                "reproducer": line,
                "alone": result.alone,
                "minimal": bool(result.imports) and result.stopped is None,
                "stopped": result.stopped,
                "confirmed": result.confirmed,
                "flaky": {"reproduced": result.flaky[0], "tries": result.flaky[1]} if result.flaky else None,
                "note": result.note or None,
                "tries": result.tries,
                "seconds": round(result.seconds, 3),
            }
            sys.stdout.write(json.dumps(record) + "\n")
            sys.stdout.flush()
            return
        where = " > ".join(first.chain) or "(no import in flight)"
        lines = [
            f"importwatch bisect: {result.kind} in {result.culprit or 'the program'}, "
            f"{_tries(result.tries)}, {result.seconds:.1f} s",
            f"  how:        {first.detail}",
            f"  {'failed:   ' if first.failed else 'in flight:'}  {where}"
            + (f" > dlopen {first.native}" if first.native else ""),
        ]
        lines += [f"  verdict:    {text.strip()}" for text in first.verdicts]
        if result.imports:
            if result.flaky:  # neither "alone" nor "needs" held every time
                times, tries = result.flaky
                lines[0] += f" (flaky: {times} of {tries} tries)"
                lines.append(
                    f"  flaky:      `{import_code(result.imports)}` {_PAST[result.kind]} in {times} of {tries} "
                    "tries, not every time (a race, a timeout or something outside the program)"
                    + ("; what was imported before it is not needed" if result.alone else "")
                )
            elif result.alone:
                lines.append(f"  alone:      `{import_code(result.imports)}` {_VERB[result.kind]} by itself")
            else:
                needs = ", ".join(result.imports[:-1])
                lines.append(
                    f"  needs:      {needs} imported first; `{import_code(result.imports[-1:])}` alone is fine"
                )
            lines.append(f"  reproduce:  {line}")
        if result.stopped:
            lines.append(f"  stopped:    {result.stopped}; the reproducer, if any, may not be minimal")
        if result.note:
            lines.append(f"  note:       {result.note}")
        sys.stdout.write("\n".join(lines) + "\n")
        sys.stdout.flush()


_VERB = {"hang": "hangs", "crash": "crashes"}
_PAST = {"hang": "hung", "crash": "crashed"}


def _parallel(function: Callable[[int], None], count: int, jobs: int, stop: threading.Event) -> None:
    """Call FUNCTION(0..COUNT-1) on up to JOBS threads, lowest indices first."""
    from concurrent.futures import ThreadPoolExecutor

    executor = ThreadPoolExecutor(max_workers=min(jobs, count))
    try:
        for future in [executor.submit(function, index) for index in range(count)]:
            future.result()
    except BaseException:
        stop.set()  # every running try kills its child and returns
        raise
    finally:
        executor.shutdown(wait=True)


def _tries(count: int) -> str:
    return f"{count} {'try' if count == 1 else 'tries'}"


def _label(imports: list[str]) -> str:
    """A try's imports on one short line: long lists are abridged in the middle."""
    if len(imports) <= 6:
        return import_code(imports)
    before = imports[:-1]
    shown = ", ".join([*before[:3], "...", *before[-2:]])
    return f"{len(before)} imports ({shown}); import {imports[-1]}"


def _split(items: list[str], parts: int) -> list[list[str]]:
    size, extra = divmod(len(items), parts)
    chunks, start = [], 0
    for index in range(parts):
        end = start + size + (1 if index < extra else 0)
        chunks.append(items[start:end])
        start = end
    return [chunk for chunk in chunks if chunk]


def _top(name: str) -> str:
    return name.partition(".")[0]


def _unique(names) -> list[str]:
    return list(dict.fromkeys(names))
