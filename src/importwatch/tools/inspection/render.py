"""The inspect report's two renderings: the JSON object as is, and the text for people, ASCII only."""

from __future__ import annotations

import json
import time

from importwatch.events import escape
from importwatch.facts import process
from importwatch.facts.stacks import described_in_importlib, short_frame
from importwatch.tools.commands import join
from importwatch.tracing.blocking import format_age

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Sequence


# Native frames a thread's text shows, innermost first; the JSON report lists up to 16.
NATIVE_SHOWN = 5


def render_json(report: dict) -> str:
    return json.dumps(report, indent=2) + "\n"


def render(report: dict) -> str:
    """The process, its threads, the load in flight, the verdicts, what was not seen."""
    lines = [*_process(report), "", f"threads ({len(report['threads'])})"]
    for thread in report["threads"]:
        lines += _thread(thread)
    if report["libraries"]:
        lines += ["", "shared objects in flight"]
        for lib in report["libraries"]:
            needs = ", ".join(lib["needs"] + lib["torch_links"]) or "no CUDA or torch library"
            owner = f" (from {lib['distribution']})" if lib["distribution"] else ""
            lines.append(f"  {lib['path']}{owner}: needs {needs}")
            lines += [f"    ! {text}" for text in lib["verdicts"]]
    if report["unseen"]:
        lines += ["", "not seen", *(f"  {text}" for text in report["unseen"])]
    rerun = report["rerun"]
    if rerun:
        lines += ["", "to see more, rerun it under importwatch:"]
        lines += [f"  {rerun[key]}" for key in ("install", "module", "env") if key in rerun]
    lines.append("")
    problems = report["problems"]
    if not problems:
        lines.append("verdict: nothing suspect")
    else:
        lines.append(f"verdict: {len(problems)} problem{'s' if len(problems) != 1 else ''}")
        lines += [f"  {problem}" for problem in problems]
    return "".join(escape(line) + "\n" for line in lines)


def _process(report: dict) -> list[str]:
    """The heading: what the process is, its Python and torch, how the stacks were read."""
    command = join(report["cmdline"]) or "?"
    lines = [f"importwatch inspect {report['pid']}", "", f"process     {report['pid']}: {command}"]
    lines.append(f"python      {report['python'] or '?'} ({report['interpreter'] or report['exe']})")
    if report["started"] is not None:
        stamp = time.strftime("%Y-%m-%d %H:%M:%S %Z", time.localtime(report["started"]))
        lines.append(f"started     {stamp} ({format_age(max(0.0, time.time() - report['started']), 1)} ago)")
    if report["idle"] is not None:
        lines.append(f"last CPU    {format_age(report['idle'], 1)} ago (its most recent thread)")
    torch = report["torch"]
    lines.append(
        f"torch       {torch['version'] or '?'} ({torch['build']}) at {torch['path']}"
        if torch
        else "torch       not found"
    )
    lines.append(f"driver      {report['driver'] or 'none'}")
    lines.append(f"stacks      read with {report['tool']}" if report["tool"] else "stacks      not read")
    return lines


def _thread(thread: dict) -> list[str]:
    """One thread: its verdict and state, the import and load in flight, its Python and native frames."""
    # A thread whose verdict is its state ("stopped") names it once: "stopped (in do_signal_stop, ...)".
    # So does one whose state says its verdict ("waiting for the GIL": it polls it, so /proc may
    # catch it running).
    said = thread["state"].startswith(f"{thread['verdict']} ")
    shown = process.state_words(thread["state"], thread["verdict"])  # never "waiting (running, ...)"
    head = "" if shown == thread["verdict"] or said else shown
    if thread["wchan"]:
        head = f"{head} in {thread['wchan']}".lstrip()
    words = [head] if head else []
    if thread["cpu"] is not None:
        words.append(f"{thread['cpu'] * 100:.0f}% CPU")
    if thread["last_ran"] is not None:
        words.append(f"last ran {format_age(thread['last_ran'], 1)} ago")
    state = f" ({', '.join(words)})" if words else ""
    verdict = thread["state"] if said else thread["verdict"]
    body = f"  {thread['name']} (tid {thread['tid']}): {verdict}{state}"
    lines = [body + (f"; {thread['waits_on']}" if thread["waits_on"] and not said else "")]
    if thread.get("relation"):
        lines.append(f"    {thread['relation']}")
    if thread["chain"]:
        lines.append(f"    import in flight: {' > '.join(thread['chain'])}")
    if thread.get("waits_for"):
        lines.append(f"    {thread['waits_for']}")
    if thread.get("joins"):
        lines.append(f"    waits in Thread.join for {thread['joins']}")
    load = thread.get("load")
    if thread["doing"] and not load:
        held = f", held by {thread['lock_holder']}" if thread.get("lock_holder") else ""
        lines.append(f"    {thread['doing']}{held}")
    if load:
        named = f"module {load['module']}, " if load["module"] else ""
        lines.append(f"    loading {named}{load['file'] or '?'} ({load['how']}; from {load['source']})")
        if load["initialising"] and load["initialising"] != load["file"]:
            lines.append(f"    initialising {load['initialising']}")
    if thread["python"] and (thread["chain"] or thread["verdict"] != process.BUSY):
        lines.append(f"    python, outermost first: {_python_path(thread['python'])}")
    if thread["native"] and (thread["chain"] or load):
        # The innermost few say where it waits; the rest is counted, never dropped unsaid (short_native
        # ends a list it cut with "...": then there are more than it holds).
        native = thread["native"]
        cut = native[-1] == "..."
        frames = native[:-1] if cut else native
        shown = " < ".join(frames[:NATIVE_SHOWN])
        if len(frames) > NATIVE_SHOWN:
            shown += f" < ... {len(frames) - NATIVE_SHOWN}{'+' if cut else ''} more (--json shows more)"
        lines.append(f"    native, innermost first: {shown}")
    return lines


def _python_path(frames: Sequence[str]) -> str:
    """Frames (innermost first) as 'a (f.py:3) > ... 4 importlib frames > b', outermost first: every
    frame of the program's own, importlib's own runs folded to a count."""
    parts: list[str] = []
    run = 0
    for frame in reversed(frames):
        if described_in_importlib(frame):
            run += 1
            continue
        if run:
            parts.append(_importlib_run(run))
            run = 0
        parts.append(frame)
    if run:
        parts.append(_importlib_run(run))
    return " > ".join(parts)


def _importlib_run(count: int) -> str:
    return f"... {count} importlib frame{'s' if count != 1 else ''}"


def short_native(lines: Sequence[str], limit: int = 16) -> list[str]:
    """A thread's native frames for the report: gdb's shortened to function and library, at most LIMIT."""
    if lines and lines[0].startswith("#"):
        shown = [short_frame(line) for line in lines[:limit]]
        if len(lines) > limit:
            shown.append("...")
        return shown
    return [line.strip() for line in lines[:limit]]
