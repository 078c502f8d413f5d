"""`importwatch report LOG`: reads a log later as a summary, a tree, -X importtime text or a Chrome trace."""

from __future__ import annotations

import argparse
import heapq
import os
import sys
from typing import NamedTuple

from importwatch.events import DIED, EXIT, IMPORT, NATIVE, SIGNAL
from importwatch.events.read import BadLine
from importwatch.safefile import UnsafeFile, open_for_writing
from importwatch.tools.report.fastread import read_summary
from importwatch.tools.report.logread import LogError, Skipped, read_events
from importwatch.tools.report.page import page
from importwatch.tools.report.timeline import Ending, Node, Process, Thread, Timeline
from importwatch.tools.report.trees import count, marks, note, render
from importwatch.usage import UsageError, argument_parser, fail

EXIT_OK = 0

FORMATS = ("summary", "tree", "importtime", "chrome", "html")
TOP = 10

DESCRIPTION = """\
Read an importwatch log (text or .jsonl), also one cut off by a kill or a hang,
also one that several processes appended to. Lines that cannot be read are
skipped and counted; names are printed with control characters escaped.

formats:
  summary     per process: how it died when the log says so (first), start-up
              time, slowest imports by self and cumulative time, native loads,
              what was still in flight (the hang, or what the death cut short),
              stall reports, warnings and verdicts (default; streamed: its
              memory does not grow with the log)
  tree        the import tree of each thread with cumulative and self times
  importtime  python -X importtime's text, for tuna and importtime-waterfall;
              imports that never ended are named "NAME [unfinished]"
  chrome      a Chrome trace (JSON) for Perfetto, chrome://tracing, speedscope
  html        one self-contained page for a browser (no network): what is stuck,
              where and why first, then each thread's imports and native loads
              drawn on a time line; hover or click a step for its details
"""


def _parser() -> argparse.ArgumentParser:
    parser = argument_parser(
        prog="importwatch report",
        description=DESCRIPTION,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "log", metavar="LOG", help="the log file (text, or JSON Lines when it ends in .jsonl)"
    )
    parser.add_argument("-f", "--format", default="summary", help="|".join(FORMATS) + " (default: summary)")
    parser.add_argument("-o", "--output", metavar="FILE", help="write to FILE instead of stdout")
    parser.add_argument(
        "--min-ms",
        type=float,
        default=0.0,
        metavar="X",
        help="tree, importtime, chrome, html: leave out imports under X ms, except those leading to a kept one "
        "and those that never ended",
    )
    parser.add_argument(
        "--pid",
        type=int,
        metavar="PID",
        help="only this process (importtime takes one process: the first unless this is given)",
    )
    return parser


def main(args: list[str]) -> int:
    """The `report` subcommand; returns the exit status."""
    try:
        options = _parser().parse_args(args)
    except UsageError as error:
        return fail(str(error))
    except SystemExit as leaving:  # --help
        return leaving.code if isinstance(leaving.code, int) else EXIT_OK
    if options.format not in FORMATS:
        return fail(f"unknown --format {options.format!r}; choose one of {', '.join(FORMATS)}")
    if options.min_ms < 0:
        return fail("--min-ms must be 0 or more")
    try:  # the log's identity, taken before anything is written: -o must never name the log itself
        log_stat = os.stat(options.log)
    except OSError:
        log_stat = None  # _read says what is wrong with it
    skipped = Skipped()
    try:
        if options.format == "html":
            processes, text = page(options.log, options.min_ms, options.pid, skipped)
        else:
            processes, text = _read(options.log, options.format, options.min_ms, options.pid, skipped)
    except LogError as error:
        return fail(str(error))
    if not processes:
        return fail(f"{options.log} has no line from pid {options.pid}")
    if skipped.count and options.format != "summary":  # the summary says it itself
        note(str(skipped))
    if options.output is None:
        return _to_stdout(text)
    return _to_file(text, options.output, (log_stat,) if log_stat is not None else ())


def _to_stdout(text: str) -> int:
    try:
        sys.stdout.write(text)
        sys.stdout.flush()
    except BrokenPipeError:  # `report LOG | head`: the reader has what it wanted
        _drop_stdout()
    except OSError as error:  # `> /dev/full`, a full disk, a closed terminal
        _drop_stdout()
        return fail(f"cannot write the report to stdout: {error.strerror or error}")
    return EXIT_OK


def _drop_stdout() -> None:
    """Point stdout at /dev/null, so that the interpreter's own flush at exit has nothing left to fail on."""
    os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())


def _to_file(text: str, path: str, keep: tuple[os.stat_result, ...]) -> int:
    """TEXT written to PATH with the care a log gets (safefile.py), never over the log being read."""
    try:
        fd = open_for_writing(path, keep)
    except UnsafeFile as error:
        return fail(f"cannot write {error}")
    try:
        with open(fd, "w", encoding="utf-8") as file:
            file.write(text)
    except OSError as error:
        return fail(f"cannot write {path}: {error.strerror or error}")
    return EXIT_OK


def _read(
    path: str, form: str, min_ms: float, pid: int | None, skipped: Skipped
) -> tuple[list[Process], str]:
    """The processes of the log at PATH (only PID's when given) and the report on them in FORM.

    The summary streams: it keeps what is in flight and its running tallies, never the trees.
    """
    digests: dict[int, _Digest] = {}
    streamed = form == "summary"
    if streamed:  # the common lines read without an Event each (fastread.py): same result, faster
        timeline = Timeline(keep=False, on_end=_digest_into(digests))
        read_summary(path, timeline, skipped, pid)
    else:
        timeline = Timeline()
        events = read_events(path, skipped)
        if pid is not None:  # a parent's signal to the process counts too
            events = (event for event in events if event.pid == pid or event.kind == SIGNAL)
        for event in events:
            try:
                timeline.add(event)
            except BadLine as error:
                skipped.add(skipped.number, str(error))
    processes = timeline.finish()
    if pid is not None:
        processes = [process for process in processes if process.pid == pid]
    if not processes:
        return processes, ""
    if streamed:
        return processes, summary(processes, digests, skipped)
    return processes, render(processes, form, min_ms, path)


# -- summary ---------------------------------------------------------------------------------
# Failed imports are named, each once; past this many distinct names they are only counted.
_NAMES = 10_000


class _Top:
    """The TOP nodes of largest value, ties in the order they started (thread, then start).

    It keeps rows of text and numbers, never the nodes: a node holds its parents.
    """

    __slots__ = ("floor", "heap")

    def __init__(self) -> None:
        self.heap: list[tuple] = []
        self.floor = -1.0  # the smallest value kept, once TOP are kept

    def add(self, value: float, thread: Thread, node: Node, extra: str = "") -> None:
        if value < self.floor:
            return
        key = (value, -thread.index, -node.seq)
        if len(self.heap) == TOP and key <= self.heap[0][:3]:
            return
        row = _Row(node.self_ms, node.ms, node.label, marks(node), thread.name, extra)
        if len(self.heap) < TOP:
            heapq.heappush(self.heap, (*key, row))
        else:
            heapq.heapreplace(self.heap, (*key, row))
        if len(self.heap) == TOP:
            self.floor = self.heap[0][0]

    def rows(self) -> list[_Row]:
        """Largest first."""
        return [entry[3] for entry in sorted(self.heap, key=lambda entry: entry[:3], reverse=True)]


class _Row(NamedTuple):
    """A node as a summary's table shows it."""

    self_ms: float
    ms: float
    label: str  # the module's name, "dlopen PATH", "phase NAME"
    marks: str  # [unfinished], [failed ...]
    thread: str
    extra: str  # for a native load, the import it was for


class _Digest:
    """What the summary says of one process, tallied as its imports, loads and phases end."""

    def __init__(self) -> None:
        self.imports = 0
        self.natives = 0
        self.phases = 0
        self.failed = 0
        self.failed_names: dict[str, int] = {}  # name: order of its first start, up to _NAMES
        self.by_self = _Top()
        self.by_cumulative = _Top()
        self.native_top = _Top()
        self.phase_top = _Top()


def _digest_into(digests: dict[int, _Digest]):
    """The Timeline's on_end: each node, once it has its time, counted into its process's digest."""

    def ended(process: Process, thread: Thread, node: Node) -> None:
        digest = digests.get(id(process))
        if digest is None:
            digest = digests[id(process)] = _Digest()
        kind = node.kind
        if kind == IMPORT:
            digest.imports += 1
            # Most nodes are below both tables' floors: tested here, without a call (a log has millions).
            own = node.ms - node.nested
            if own >= digest.by_self.floor or own < 0.0:
                digest.by_self.add(node.self_ms, thread, node)
            if node.ms >= digest.by_cumulative.floor:
                digest.by_cumulative.add(node.ms, thread, node)
            if node.error:
                digest.failed += 1
                names = digest.failed_names
                if len(names) < _NAMES or node.name in names:
                    names[node.name] = min(names.get(node.name, node.seq), node.seq)
        elif kind == NATIVE:
            digest.natives += 1
            if node.ms >= digest.native_top.floor:
                up = node.parent
                while up is not None and up.kind != IMPORT:
                    up = up.parent
                digest.native_top.add(node.ms, thread, node, up.name if up is not None else "no import")
        else:
            digest.phases += 1
            digest.phase_top.add(node.ms, thread, node)

    return ended


def summary(processes: list[Process], digests: dict[int, _Digest], skipped: Skipped | None = None) -> str:
    """Per process: how it ended, time, counts, what never ended, stalls, warnings, the slowest steps."""
    out: list[str] = []
    for process in processes:
        if out:
            out.append("")
        out.extend(_process_summary(process, digests.get(id(process)) or _Digest()))
    if skipped is not None and skipped.count:
        out.extend(["", str(skipped)])
    return "\n".join(out) + "\n"


# How each kind of ending reads in a summary: the chain in flight, and what cut it.
_CUT = {
    DIED: "in flight when the process died",
    EXIT: "in flight when --exit-on-stall ended the process",
    SIGNAL: "in flight when a signal ended the process",
}
_CUT_AT = {DIED: "the watcher saw it dead at", EXIT: "it was ended at", SIGNAL: "at"}


def _process_summary(process: Process, digest: _Digest) -> list[str]:
    ending = process.cut_by()
    in_flight = process.in_flight()
    out = _process_head(process, digest, ending, in_flight)
    out.extend(_in_flight_lines(process, ending, in_flight))
    out.extend(_notes(process, "stalls", "stall reports"))
    out.extend(_notes(process, "verdicts", "verdicts"))
    out.extend(_notes(process, "warnings", "importwatch's warnings"))
    if digest.failed_names:
        # Most are optional dependencies tried and caught; the names say enough, each once.
        names = sorted(digest.failed_names, key=digest.failed_names.__getitem__)
        count = f"{len(names)}{'+' if len(names) >= _NAMES else ''}"
        more = f", ... ({count} names)" if len(names) > TOP else ""
        out.append(
            f"  failed imports (raised; most are optional, tried and caught): {', '.join(names[:TOP])}{more}"
        )
    out.extend(_slowest(digest, len(process.threads) > 1))
    return out


def _process_head(
    process: Process, digest: _Digest, ending: Ending | None, in_flight: list[tuple[Thread, list[Node]]]
) -> list[str]:
    """Who the process was (or what ended it, first), its time and counts, and its torch."""
    threads = len(process.threads)
    start = process.start_text or "(no start line: a fork, or a log cut at its head)"
    if ending is not None and in_flight:
        # The death is the headline: what ended the process, with the import in flight.
        out = [f"{process.name}: {_ending_headline(ending, in_flight)}", f"  {start}"]
    else:
        out = [f"{process.name}: {start}"]
    failed = f" ({digest.failed} failed)" if digest.failed else ""
    out.append(
        f"  {process.first_clock} to {process.last_clock}: {_duration(process.seconds * 1000.0)} "
        f"from first to last line; {count(digest.imports, 'import')}{failed}, "
        f"{count(digest.natives, 'native load')}, {count(max(threads, 1), 'thread')}"
    )
    if process.torch:
        out.append(f"  {process.torch}")
    return out


def _in_flight_lines(
    process: Process, ending: Ending | None, in_flight: list[tuple[Thread, list[Node]]]
) -> list[str]:
    """What was still in flight, per thread, and what cut it; or that nothing was."""
    out = []
    for thread, chain in in_flight:
        names = " > ".join(node.label for node in chain)
        since = f"on {thread.name}, the innermost since {chain[-1].clock}"
        if ending is None:
            out.append(f"  still in flight when the log ends: {names}")
            out.append(
                f"    {since}; this process's last line is at {process.last_clock} "
                f"({_duration(chain[-1].ms)} later): it hung there or was stopped there"
            )
        else:
            out.append(f"  {_CUT[ending.what]}: {names}")
            out.append(f"    {since}; {_CUT_AT[ending.what]} {ending.clock}{_signal_words(ending)}")
    for thread, names, clock, closer in process.lost:
        # The table marks them [unfinished] too: the summary says why, never "everything ended".
        out.append(f"  never ended (no end line; closed by the end of {closer}): {' < '.join(names)}")
        out.append(f"    on {thread}, the innermost since {clock}")
    if process.lost_left_out:
        out.append(f"    ... and {process.lost_left_out} more")
    if not in_flight and not process.lost:
        out.append(
            "  nothing in flight when the log ends: every import, native load and phase that started, ended"
        )
    elif not in_flight:
        out.append("  nothing else in flight when the log ends")
    if process.orphans:
        out.append(f"  {count(process.orphans, 'end')} without a start in this process (forked mid-import)")
    return out


def _slowest(digest: _Digest, where: bool) -> list[str]:
    """The tables of the slowest imports, native loads, phases and steps."""
    out = []
    if digest.imports:
        top = min(TOP, digest.imports)
        out.append(f"  slowest imports by self time (top {top}):")
        out.extend(_table(digest.by_self.rows(), where))
        out.append(f"  slowest imports by cumulative time (top {top}):")
        out.extend(_table(digest.by_cumulative.rows(), where))
    if digest.natives:
        out.append(f"  native loads by time (top {min(TOP, digest.natives)}):")
        out.append(f"    {'ms':>10}  library (for)")
        for row in digest.native_top.rows():
            out.append(f"    {row.ms:10.3f}  {row.label[len('dlopen ') :]} ({row.extra}){row.marks}")
    if digest.phases:
        out.append(f"  phases and steps by time (top {min(TOP, digest.phases)}):")
        out.append(f"    {'ms':>10}  phase")
        out.extend(f"    {row.ms:10.3f}  {row.label}{row.marks}" for row in digest.phase_top.rows())
    return out


def _ending_headline(ending: Ending, in_flight: list[tuple[Thread, list[Node]]]) -> str:
    """The first statement on a process that the log says died: the watcher's words, or the signal's."""
    if ending.what == DIED:
        return (
            ending.text
        )  # "died during import: process 7 was killed by SIGKILL after ... with in flight: ..."
    chains = "; ".join(
        f"{thread.name}: {' > '.join(node.label for node in chain)}" for thread, chain in in_flight
    )
    if ending.what == EXIT:
        return f"ended during import: {ending.text}, with in flight: {chains}"
    return f"ended by a signal during import: {ending.text}, with in flight: {chains}"


def _signal_words(ending: Ending) -> str:
    return f": {ending.text}" if ending.what == SIGNAL else ""


def _notes(process: Process, which: str, title: str) -> list[str]:
    notes = getattr(process, which)
    if not notes:
        return []
    lines = [f"  {title}:", *(f"    {clock} {text}" for _, clock, text in notes)]
    if process.left_out[which]:
        lines.append(f"    ... and {process.left_out[which]} more")
    return lines


def _table(rows: list[_Row], where: bool) -> list[str]:
    lines = [f"    {'self ms':>10} {'cum ms':>10}  import"]
    for row in rows:
        shown = f" [{row.thread}]" if where else ""
        lines.append(f"    {row.self_ms:10.3f} {row.ms:10.3f}  {row.label}{row.marks}{shown}")
    return lines


def _duration(ms: float) -> str:
    return f"{ms / 1000.0:.1f} s" if ms >= 1000.0 else f"{ms:.1f} ms"
