"""`importwatch report LOG`: reads a log later as a summary, a tree, -X importtime text or a Chrome trace."""

from __future__ import annotations

import argparse
import json
import os
import sys

from importwatch.events import IMPORT, NATIVE
from importwatch.timeline import LogError, Node, Process, Thread, import_children, load, place
from importwatch.usage import UsageError, argument_parser, fail

EXIT_OK = 0

FORMATS = ("summary", "tree", "importtime", "chrome")
TOP = 10
UNFINISHED = " [unfinished]"
IMPORTTIME_HEADER = "import time: self [us] | cumulative | imported package"

DESCRIPTION = """\
Read an importwatch log (text or .jsonl), also one cut off by a kill or a hang,
also one that several processes appended to.

formats:
  summary     per process: start-up time, slowest imports by self and cumulative
              time, native loads, what was still in flight when the log ends
              (the hang), stall reports and warnings (default)
  tree        the import tree of each thread with cumulative and self times
  importtime  python -X importtime's text, for tuna and importtime-waterfall;
              imports that never ended are named "NAME [unfinished]"
  chrome      a Chrome trace (JSON) for Perfetto, chrome://tracing, speedscope
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
        help="tree, importtime, chrome: leave out imports under X ms, except those leading to a kept one "
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
    try:
        processes = load(options.log)
    except LogError as error:
        return fail(str(error))
    if options.pid is not None:
        processes = [process for process in processes if process.pid == options.pid]
        if not processes:
            return fail(f"{options.log} has no line from pid {options.pid}")
    text = render(processes, options.format, options.min_ms, options.log)
    if options.output is None:
        sys.stdout.write(text)
        sys.stdout.flush()
        return EXIT_OK
    try:
        with open(options.output, "w", encoding="utf-8") as file:
            file.write(text)
    except OSError as error:
        return fail(f"cannot write {options.output}: {error.strerror or error}")
    return EXIT_OK


def render(processes: list[Process], form: str, min_ms: float = 0.0, source: str = "") -> str:
    """The report on PROCESSES in format FORM, as text."""
    if form == "tree":
        return tree(processes, min_ms)
    if form == "importtime":
        if len(processes) > 1:
            others = ", ".join(str(process.pid) for process in processes[1:])
            _note(
                f"the log holds {len(processes)} processes; importtime shows pid {processes[0].pid}, "
                f"choose another with --pid ({others})"
            )
        return importtime(processes[0], min_ms)
    if form == "chrome":
        return chrome(processes, min_ms, source)
    return summary(processes)


# -- summary ---------------------------------------------------------------------------------
def summary(processes: list[Process]) -> str:
    """Per process: time, counts, what never ended, stalls, warnings, the slowest imports and loads."""
    out: list[str] = []
    for process in processes:
        if out:
            out.append("")
        out.extend(_process_summary(process))
    return "\n".join(out) + "\n"


def _process_summary(process: Process) -> list[str]:
    nodes = list(process.nodes())
    imports = [node for node in nodes if node.kind == IMPORT]
    natives = [node for node in nodes if node.kind == NATIVE]
    phases = [node for node in nodes if node.kind not in (IMPORT, NATIVE)]
    failed = [node for node in imports if node.error]
    threads = len(process.threads)
    out = [f"{process.name}: {process.start_text or '(no start line: a fork, or a log cut at its head)'}"]
    out.append(
        f"  {process.first_clock} to {process.last_clock}: {_duration(process.seconds * 1000.0)} "
        f"from first to last line; {_count(len(imports), 'import')}"
        f"{f' ({len(failed)} failed)' if failed else ''}, {_count(len(natives), 'native load')}, "
        f"{_count(max(threads, 1), 'thread')}"
    )
    if process.torch:
        out.append(f"  {process.torch}")
    in_flight = process.in_flight()
    for thread, chain in in_flight:
        out.append(f"  still in flight when the log ends: {' > '.join(node.label for node in chain)}")
        out.append(
            f"    on {thread.name}, the innermost since {chain[-1].clock}; this process's last line is at "
            f"{process.last_clock} ({_duration(chain[-1].ms)} later): it hung there or was stopped there"
        )
    if not in_flight:
        out.append(
            "  nothing in flight when the log ends: every import, native load and phase that started, ended"
        )
    if process.orphans:
        out.append(f"  {_count(process.orphans, 'end')} without a start in this process (forked mid-import)")
    if process.stalls:
        out.append("  stall reports:")
        out.extend(f"    {clock} {text}" for _, clock, text in process.stalls)
    if process.warnings:
        out.append("  warnings and verdicts:")
        out.extend(f"    {clock} {text}" for _, clock, text in process.warnings)
    if failed:
        # Most are optional dependencies tried and caught; the names say enough, each once.
        names = list(dict.fromkeys(node.name for node in failed))
        more = f", ... ({len(names)} names)" if len(names) > TOP else ""
        out.append(
            f"  failed imports (raised; most are optional, tried and caught): {', '.join(names[:TOP])}{more}"
        )
    where = threads > 1
    if imports:
        out.append(f"  slowest imports by self time (top {min(TOP, len(imports))}):")
        out.extend(_table(sorted(imports, key=lambda node: -node.self_ms)[:TOP], where, process))
        out.append(f"  slowest imports by cumulative time (top {min(TOP, len(imports))}):")
        out.extend(_table(sorted(imports, key=lambda node: -node.ms)[:TOP], where, process))
    if natives:
        out.append(f"  native loads by time (top {min(TOP, len(natives))}):")
        out.append(f"    {'ms':>10}  library (for)")
        for node in sorted(natives, key=lambda node: -node.ms)[:TOP]:
            owner = next((up.name for up in node.chain()[-2::-1] if up.kind == IMPORT), "no import")
            out.append(f"    {node.ms:10.3f}  {node.name} ({owner}){_marks(node)}")
    if phases:
        out.append(f"  phases and steps by time (top {min(TOP, len(phases))}):")
        out.append(f"    {'ms':>10}  phase")
        out.extend(
            f"    {node.ms:10.3f}  {node.label}{_marks(node)}"
            for node in sorted(phases, key=lambda node: -node.ms)[:TOP]
        )
    return out


def _table(nodes: list[Node], where: bool, process: Process) -> list[str]:
    lines = [f"    {'self ms':>10} {'cum ms':>10}  import"]
    threads = (
        {id(node): thread.name for thread in process.threads.values() for node in thread.walk()}
        if where
        else {}
    )
    for node in nodes:
        thread = f" [{threads[id(node)]}]" if where else ""
        lines.append(f"    {node.self_ms:10.3f} {node.ms:10.3f}  {node.name}{_marks(node)}{thread}")
    return lines


def _marks(node: Node) -> str:
    if node.unfinished:
        return UNFINISHED
    if node.error:
        return f" [failed {node.error}]"
    return ""


def _duration(ms: float) -> str:
    return f"{ms / 1000.0:.1f} s" if ms >= 1000.0 else f"{ms:.1f} ms"


def _count(number: int, noun: str) -> str:
    return f"{number} {noun}{'' if number == 1 else 's'}"


# -- tree ------------------------------------------------------------------------------------
def tree(processes: list[Process], min_ms: float = 0.0) -> str:
    """Each thread's imports as an indented tree, cumulative and self ms first."""
    out: list[str] = []
    for process in processes:
        for thread in process.threads.values():
            if out:
                out.append("")
            out.append(f"{process.name} {thread.name}: {process.start_text}".rstrip(": "))
            out.append(f"{'cum ms':>10} {'self ms':>10}  import")
            for root in thread.roots:
                _tree_lines(root, 0, min_ms, out)
    if not out:
        out.append("(no import in this log)")
    return "\n".join(out) + "\n"


def _tree_lines(node: Node, depth: int, min_ms: float, out: list[str]) -> None:
    if not _kept(node, min_ms):
        return
    out.append(f"{node.ms:10.3f} {node.self_ms:10.3f}  {'  ' * depth}{node.label}{_marks(node)}")
    for child in node.children:
        _tree_lines(child, depth + 1, min_ms, out)


def _kept(node: Node, min_ms: float) -> bool:
    """Slow enough, never ended, or on the way to one that is kept."""
    if min_ms <= 0 or node.ms >= min_ms or node.unfinished:
        return True
    return any(_kept(child, min_ms) for child in node.children)


# -- importtime ------------------------------------------------------------------------------
def importtime(process: Process, min_ms: float = 0.0) -> str:
    """CPython's -X importtime text for one process: children before parents, as imports end.

    Native loads are left out (their time is their module's self time, as in
    CPython). Each thread's imports come as one block, so the indentation read
    by tuna and importtime-waterfall always describes one tree.
    """
    out = [IMPORTTIME_HEADER]
    for thread in _threads_main_first(process):
        for root in thread.roots:
            for node in [root] if root.kind == IMPORT else import_children(root):
                _importtime_lines(node, 0, min_ms, out)
    return "\n".join(out) + "\n"


def _importtime_lines(node: Node, level: int, min_ms: float, out: list[str]) -> int:
    """Append NODE's lines; return its cumulative microseconds, rounded as printed."""
    cumulative = round(node.ms * 1000.0)
    nested = 0
    for child in import_children(node):
        nested += _importtime_lines(child, level + 1, min_ms, out)
    if _kept(node, min_ms):
        name = node.name + (UNFINISHED if node.unfinished else "")
        out.append(f"import time: {max(cumulative - nested, 0):9d} | {cumulative:10d} | {'  ' * level}{name}")
    return cumulative


def _threads_main_first(process: Process) -> list[Thread]:
    return sorted(process.threads.values(), key=lambda thread: thread.name != "MainThread")


# -- chrome ----------------------------------------------------------------------------------
# Thread ids above any pid Linux hands out (pid_max is at most 2**22), so they never clash.
_THREAD_IDS = 10_000_000
_RUN_PIDS = 100_000_000


def chrome(processes: list[Process], min_ms: float = 0.0, source: str = "") -> str:
    """A Chrome trace event file: one track per process and thread, imports and loads as nested slices."""
    origin = place(processes)
    events: list[dict] = []
    for process in processes:
        pid = process.pid + _RUN_PIDS * (process.run - 1)
        events.append(_meta("process_name", pid, 0, {"name": _process_label(process)}))
        tids = {}
        for index, thread in enumerate(_threads_main_first(process)):
            tid = tids[thread.name] = process.pid if thread.name == "MainThread" else _THREAD_IDS + index
            events.append(_meta("thread_name", pid, tid, {"name": thread.name}))
            events.append(_meta("thread_sort_index", pid, tid, {"sort_index": index}))
            for node in thread.walk():
                if _kept(node, min_ms):  # then its ancestors are kept too
                    events.append(_slice(node, pid, tid))
        for when, clock, text in process.stalls + process.warnings:
            events.append(
                {
                    "name": text.split(" ", 1)[0],
                    "cat": "importwatch",
                    "ph": "i",
                    "s": "p",
                    "ts": round((when - origin) * 1e6),
                    "pid": pid,
                    "tid": process.pid,
                    "args": {"text": text, "clock": clock},
                }
            )
        for when, thread_name, name in process.checkpoints:
            tid = tids.get(thread_name, process.pid)
            events.append(
                {
                    "name": f"checkpoint {name}",
                    "cat": "checkpoint",
                    "ph": "i",
                    "s": "t",
                    "ts": round((when - origin) * 1e6),
                    "pid": pid,
                    "tid": tid,
                }
            )
    trace = {
        "traceEvents": events,
        "displayTimeUnit": "ms",
        "otherData": {"generator": "importwatch report", "log": source},
    }
    return json.dumps(trace, indent=None, separators=(",", ":")) + "\n"


def _slice(node: Node, pid: int, tid: int) -> dict:
    args: dict = {"cumulative_ms": round(node.ms, 3), "self_ms": round(node.self_ms, 3)}
    if node.kind == NATIVE:
        args["path"] = node.name
    if node.unfinished:
        args["unfinished"] = True
    if node.error:
        args["error"] = node.error
    label = f"dlopen {os.path.basename(node.name)}" if node.kind == NATIVE else node.label
    name = label + (UNFINISHED if node.unfinished else "")
    return {
        "name": name,
        "cat": node.kind,
        "ph": "X",
        "ts": node.begin,
        "dur": node.end - node.begin,
        "pid": pid,
        "tid": tid,
        "args": args,
    }


def _meta(name: str, pid: int, tid: int, args: dict) -> dict:
    return {"name": name, "ph": "M", "pid": pid, "tid": tid, "args": args}


def _process_label(process: Process) -> str:
    text = process.start_text
    argv = text.partition(" argv=")[2].partition(" cwd=")[0]
    python = " ".join(text.split(" ")[:2]) if text else "python"
    return f"{python} {process.name} {argv}".strip()


def _note(message: str) -> None:
    sys.stderr.write(f"importwatch: note: {message}\n")
