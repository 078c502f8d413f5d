"""The report's tree-shaped formats of a log read whole: an indented tree, CPython's -X importtime text,
and a Chrome trace event file (render picks one by name)."""

from __future__ import annotations

import json
import os
import sys

from importwatch.events import IMPORT, NATIVE
from importwatch.tools.report.timeline import Node, Process, Thread, import_children, place

UNFINISHED = " [unfinished]"
IMPORTTIME_HEADER = "import time: self [us] | cumulative | imported package"


def render(processes: list[Process], form: str, min_ms: float = 0.0, source: str = "") -> str:
    """The report on PROCESSES (read with whole trees) in format FORM: tree, importtime or chrome."""
    if form == "tree":
        return tree(processes, min_ms)
    if form == "importtime":
        if len(processes) > 1:
            others = ", ".join(str(process.pid) for process in processes[1:])
            note(
                f"the log holds {len(processes)} processes; importtime shows pid {processes[0].pid}, "
                f"choose another with --pid ({others})"
            )
        return importtime(processes[0], min_ms)
    return chrome(processes, min_ms, source)


def count(number: int, noun: str) -> str:
    """`1 import`, `3 imports`: a number and its noun, for the summary and the page."""
    return f"{number} {noun}{'' if number == 1 else 's'}"


def marks(node: Node) -> str:
    if node.unfinished:
        return UNFINISHED
    if node.error:
        return f" [failed {node.error}]"
    return ""


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
    out.append(f"{node.ms:10.3f} {node.self_ms:10.3f}  {'  ' * depth}{node.label}{marks(node)}")
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
        for when, clock, text in process.stalls + process.verdicts + process.warnings:
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
    start = process.start
    python = f"python {start['python']}" if start else "python"
    argv = repr(start["argv"]) if start else ""
    return f"{python} {process.name} {argv}".strip()


def note(message: str) -> None:
    """A line on stderr beside a report: what the report leaves out, and why."""
    sys.stderr.write(f"importwatch: note: {message}\n")
