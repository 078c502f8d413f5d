"""`importwatch report LOG --format html`: one self-contained page, the headline first, then each thread's steps.

The log is read by the summary's streamed reader (fastread.py); each step is kept
as it ends, so memory holds the trees and nothing else. The page is three package
files (page.html, page.css, page.js) and one JSON blob of compact integer rows that
page.js draws on a canvas: no network, no library, a few DOM nodes whatever the log's
size. Everything taken from the log reaches the page escaped: HTML text through
html.escape, the blob as JSON with `<`, `>`, `&` written as \\u escapes, and the
page's policy (CSP) runs no script and loads no style but its own.
"""

from __future__ import annotations

import base64
import hashlib
import heapq
import html
import json
import os
from importlib import resources

from importwatch.events import BUSY, IMPORT, NATIVE, OUTSIDE, OUTSIDE_HEAD, PHASE, STALL, render
from importwatch.events.read import Event
from importwatch.tools.report.fastread import read_summary
from importwatch.tools.report.logread import Skipped
from importwatch.tools.report.timeline import NOTES, Ending, Node, Process, Thread, Timeline, place
from importwatch.tools.report.trees import count

# A step's kind as the page's rows give it (page.js's KINDS has the same order).
_KIND_CODES = {IMPORT: 0, NATIVE: 1, PHASE: 2}  # anything else: a blocking step (3)
# Flags of a row (page.js reads the same bits).
_UNFINISHED = 1
_FAILED = 2
_STALLED = 4  # in flight on a thread a STALL line named, or never ended
# Integers per step row: begin (us after the previous row's begin in its thread) and length (us) as
# drawn (placed so that steps nest: timeline.place), depth, kind, name (index in the strings), flags,
# error (index, -1 for none), and the measured duration and self time (us), which the details show.
ROW = 9
TOP = 10
# Processes whose section the page opens at first when none of them is in trouble.
_OPEN = 3
# How each way a process was ended reads in its headline.
_ENDED = {"died": "Died during import", "exit": "Ended by --exit-on-stall", "signal": "Killed by a signal"}


class _PageTimeline(Timeline):
    """A Timeline that keeps each step as it ends, plus what the page adds: stalls and the outside look."""

    def __init__(self, min_ms: float) -> None:
        super().__init__(keep=False, on_end=self._keep)
        self.min_ms = min_ms
        self.stalled: dict[int, set[int]] = {}  # id of process: the seqs of its steps in flight at a stall
        self.stall_times: dict[int, list[tuple[float, str]]] = {}  # id of process: (seconds, thread)
        self.outside: dict[int, list[tuple[float, str, str]]] = {}  # id of process: its headline looks
        self.counts: dict[int, list[int]] = {}  # id of process: imports, native loads, failed imports
        # id of process: its imports and native loads kept, as (ms, -seq, node, thread name) for the tables
        self.timed: dict[int, tuple[list, list]] = {}

    def _keep(self, process: Process, thread: Thread, node: Node) -> None:
        """NODE has ended (children first): it is counted, and joins its parent's children unless --min-ms
        leaves it out."""
        counts = self.counts.get(id(process))
        if counts is None:
            counts = self.counts[id(process)] = [0, 0, 0]
        if node.kind == IMPORT:
            counts[0] += 1
            counts[2] += bool(node.error)
        elif node.kind == NATIVE:
            counts[1] += 1
        if node.ms < self.min_ms and not node.unfinished and not node.children:
            return
        if node.kind in (IMPORT, NATIVE):
            timed = self.timed.get(id(process))
            if timed is None:
                timed = self.timed[id(process)] = ([], [])
            timed[node.kind == NATIVE].append((node.ms, -node.seq, node, thread.name))
        (node.parent.children if node.parent is not None else thread.roots).append(node)

    def add(self, event: Event) -> None:
        super().add(event)
        kind = event.kind
        if kind not in (STALL, OUTSIDE, BUSY):
            return
        process = self.current.get(event.pid)
        if process is None:
            return
        when = self.clock.seconds(event)
        if kind == STALL:
            thread = process.threads.get(event.fields.get("stalled") or "")
            times = self.stall_times.setdefault(id(process), [])
            if thread is not None and len(times) < NOTES:
                times.append((when, thread.name))
                self.stalled.setdefault(id(process), set()).update(node.seq for node in thread.stack)
        elif kind == BUSY or "look" in event.fields:
            # The watcher's headline of a look (the whole process), or a busy thread: the "why".
            looks = self.outside.setdefault(id(process), [])
            if len(looks) < NOTES:
                text = render(kind, event.fields).strip()
                said = text[len(OUTSIDE_HEAD) :] if kind == OUTSIDE else text
                looks.append((when, self.clock.stamp(event, when), said))


def page(
    path: str, min_ms: float, pid: int | None, skipped: Skipped, title: str = ""
) -> tuple[list[Process], str]:
    """The processes of the log at PATH (only PID's when given) and the HTML page on them."""
    timeline = _PageTimeline(min_ms)
    read_summary(path, timeline, skipped, pid)
    processes = timeline.finish()
    if pid is not None:
        processes = [process for process in processes if process.pid == pid]
    if not processes:
        return processes, ""
    return processes, _render(processes, timeline, title or os.path.basename(path), skipped)


# -- the data blob ---------------------------------------------------------------------------
class _Strings:
    """Each distinct name, path and error once; rows refer to them by index."""

    def __init__(self) -> None:
        self.index: dict[str, int] = {}
        self.items: list[str] = []

    def __call__(self, text: str) -> int:
        found = self.index.get(text)
        if found is None:
            found = self.index[text] = len(self.items)
            self.items.append(text)
        return found


def _rows(thread: Thread, offset: int, stalled: set[int], strings: _Strings) -> tuple[list[int], int]:
    """The thread's steps, parents first, as flat integer rows; and its deepest level.

    STALLED holds the seqs of the process's steps that were in flight at a stall.
    """
    rows: list[int] = []
    add = rows.extend
    name_of = strings.index.get
    previous = offset
    deepest = 0
    pending = [(root, 0) for root in reversed(thread.roots)]
    while pending:
        node, depth = pending.pop()
        flags = _UNFINISHED | _STALLED if node.unfinished else 0
        error = node.error
        if error:
            flags |= _FAILED
        if node.seq in stalled:
            flags |= _STALLED
        begin = node.begin
        length = node.end - begin
        name = name_of(node.name)
        add(
            (
                begin - previous,
                length,
                depth,
                _KIND_CODES.get(node.kind, 3),
                strings(node.name) if name is None else name,
                flags,
                strings(error) if error else -1,
                round(node.ms * 1000.0),
                round(node.self_ms * 1000.0),
            )
        )
        previous = begin
        children = node.children
        if children:
            depth += 1
            if depth > deepest:
                deepest = depth
            pending.extend([(child, depth) for child in reversed(children)])
    return rows, deepest


def _data(processes: list[Process], timeline: _PageTimeline, origin: float) -> dict:
    strings = _Strings()
    shown = []
    for number, process in enumerate(processes):
        key = id(process)
        stalled = timeline.stalled.get(key, set())
        offset = round((process.first - origin) * 1e6)
        threads = []
        span = round(process.seconds * 1e6)
        for thread in sorted(process.threads.values(), key=lambda thread: thread.name != "MainThread"):
            rows, deepest = _rows(thread, offset, stalled, strings)
            if not rows:
                continue
            threads.append({"name": thread.name, "depth": deepest + 1, "rows": rows})
            if thread.roots:
                span = max(span, thread.roots[-1].end - offset)
        marks = [
            [round((when - process.first) * 1e6), "stall", name]
            for when, name in timeline.stall_times.get(key, [])
        ]
        marks += [
            [round((when - process.first) * 1e6), "checkpoint", name] for when, _, name in process.checkpoints
        ]
        shown.append(
            {
                "id": number,
                "name": process.name,
                "clock": process.first_clock,
                "span": span,
                "threads": threads,
                "marks": marks,
            }
        )
    return {"strings": strings.items, "processes": shown}


def _blob(data: dict) -> str:
    """DATA as JSON that no byte of the log can end early: no `<`, `>` or `&`, ASCII only."""
    text = json.dumps(data, separators=(",", ":"), ensure_ascii=True)
    return text.replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026")


# -- the HTML around it ----------------------------------------------------------------------
def _e(text: object) -> str:
    """TEXT for HTML: escaped, quotes too, and ASCII (the rest as character references)."""
    return html.escape(str(text), quote=True).encode("ascii", "xmlcharrefreplace").decode("ascii")


def _ms(ms: float) -> str:
    return f"{ms / 1000.0:.2f} s" if ms >= 1000.0 else f"{ms:.1f} ms"


class _Facts:
    """What one process's section and headline say, gathered in one walk of its steps."""

    def __init__(self, process: Process, timeline: _PageTimeline) -> None:
        self.imports, self.natives, self.failed = timeline.counts.get(id(process), (0, 0, 0))
        cumulative, loads = timeline.timed.get(id(process), ([], []))
        self.slowest = heapq.nlargest(TOP, cumulative, key=lambda row: row[:2])
        self.slowest_loads = heapq.nlargest(TOP, loads, key=lambda row: row[:2])
        self.in_flight = process.in_flight()
        self.ending = process.cut_by()
        self.outside = timeline.outside.get(id(process), [])
        self.stall_count = len(timeline.stall_times.get(id(process), []))
        if self.in_flight:
            self.state = "died" if self.ending is not None else "stuck"
        elif self.stall_count:
            self.state = "stalled"
        else:
            self.state = "ok"


def _chain(chain: list[Node]) -> str:
    return " &gt; ".join(f"<b>{_e(node.label)}</b>" for node in chain)


def _headline(process: Process, facts: _Facts) -> list[str]:
    """The process's headline as HTML lines: what is stuck, where, why, the fix when the log says it."""
    out = []
    for thread, chain in facts.in_flight:
        innermost = chain[-1]
        what = _ENDED[facts.ending.what] if facts.ending is not None else "Stuck"
        out.append(
            f'<p class="head {facts.state}"><span class="tag">{what}</span> {_e(process.name)}, '
            f"thread <b>{_e(thread.name)}</b>: {_chain(chain)} "
            f'<span class="dim">(since {_e(innermost.clock)}, {_ms(innermost.ms)} until '
            f"{'its end' if facts.ending is not None else 'the log ends'})</span></p>"
        )
        if innermost.kind == NATIVE:
            out.append(
                f'<p class="why">Where: loading the shared object <code>{_e(innermost.name)}</code> '
                "(dlopen: its constructor, or a library it needs, has not returned)</p>"
            )
    if facts.ending is not None and facts.in_flight:
        out.append(f'<p class="why">How it ended: {_e(_ending_words(facts.ending))}</p>')
    if facts.outside:
        _, clock, text = facts.outside[-1]
        out.append(f'<p class="why">Why, seen from outside at {_e(clock)}: {_e(text)}</p>')
    elif facts.state == "stalled":
        out.append(
            f'<p class="head stalled"><span class="tag">Stalled</span> {_e(process.name)}: '
            f"{count(facts.stall_count, 'stall report')}, and then every step ended</p>"
        )
    for _, clock, text in process.verdicts[:TOP]:
        out.append(f'<p class="fix">Verdict at {_e(clock)}: {_e(text[2:] if text[:2] == "! " else text)}</p>')
    return out


def _ending_words(ending: Ending) -> str:
    return f"{ending.text} (at {ending.clock})"


def _section(number: int, process: Process, facts: _Facts, opened: bool, headline: bool) -> str:
    parts = [
        f'<details class="process {facts.state}" id="p{number}" data-process="{number}"{" open" if opened else ""}>',
        f'<summary><span class="badge {facts.state}">{facts.state}</span> <b>{_e(process.name)}</b> '
        f'<span class="dim">{_e(process.start_text or "(no start line: a fork, or a log cut at its head)")}</span>'
        "</summary>",
    ]
    failed = f" ({facts.failed} failed)" if facts.failed else ""
    parts.append(
        f'<p class="facts">{_e(process.first_clock)} to {_e(process.last_clock)}: '
        f"{_ms(process.seconds * 1000.0)}; {count(facts.imports, 'import')}{failed}, "
        f"{count(facts.natives, 'native load')}, {count(max(len(process.threads), 1), 'thread')}</p>"
    )
    if process.torch:
        parts.append(f'<p class="facts">{_e(process.torch)}</p>')
    if headline:  # else the top of the page has it
        parts.extend(_headline(process, facts))
    parts.append(
        f'<div class="view" data-process="{number}"><div class="bar">'
        '<span class="key k0">import</span><span class="key k1">native load (dlopen)</span>'
        '<span class="key k2">phase</span><span class="key k3">blocking step</span>'
        '<span class="key failed">failed</span><span class="key stalled">stalled or never ended</span>'
        '<span class="hint">wheel: zoom &middot; drag: pan &middot; click: details &middot; '
        "double-click: zoom to a step, or back out</span></div>"
        '<div class="holder"><canvas></canvas><div class="tip" hidden></div></div>'
        '<pre class="details">Click a bar for its details.</pre></div>'
    )
    parts.extend(_tables(process, facts))
    parts.append("</details>")
    return "\n".join(parts)


def _tables(process: Process, facts: _Facts) -> list[str]:
    out = []
    if facts.slowest:
        out.append(
            "<table><caption>Slowest imports (cumulative)</caption><tr><th>ms</th><th>self ms</th><th>import</th><th>thread</th></tr>"
        )
        for ms, _, node, thread in facts.slowest:
            out.append(
                f'<tr><td class="n">{ms:.3f}</td><td class="n">{node.self_ms:.3f}</td>'
                f"<td>{_e(node.name)}{_marks(node)}</td><td>{_e(thread)}</td></tr>"
            )
        out.append("</table>")
    if facts.slowest_loads:
        out.append(
            "<table><caption>Slowest native loads</caption><tr><th>ms</th><th>library</th><th>thread</th></tr>"
        )
        for ms, _, node, thread in facts.slowest_loads:
            out.append(
                f'<tr><td class="n">{ms:.3f}</td><td>{_e(node.name)}{_marks(node)}</td><td>{_e(thread)}</td></tr>'
            )
        out.append("</table>")
    notes = sorted(process.stalls + facts.outside)
    for title, items, left in (
        ("Stall reports and looks from outside", notes, process.left_out["stalls"]),
        ("Verdicts", process.verdicts, process.left_out["verdicts"]),
        ("importwatch's warnings", process.warnings, process.left_out["warnings"]),
    ):
        if not items:
            continue
        more = f"<li>... and {left} more</li>" if left else ""
        lines = "".join(
            f'<li><span class="dim">{_e(clock)}</span> {_e(text)}</li>' for _, clock, text in items
        )
        out.append(
            f'<details class="notes"><summary>{title} ({len(items) + left})</summary><ul>{lines}{more}</ul></details>'
        )
    return out


def _marks(node: Node) -> str:
    if node.unfinished:
        return ' <span class="tag stuck">unfinished</span>'
    if node.error:
        return f' <span class="tag failed">failed {_e(node.error)}</span>'
    return ""


def _top(processes: list[Process], facts: list[_Facts]) -> str:
    """The page's first lines: the processes in trouble, each with its headline; or that none is."""
    troubled = [(number, process) for number, process in enumerate(processes) if facts[number].state != "ok"]
    out = []
    for number, process in troubled[:TOP]:
        out.append(f'<div class="headline"><a href="#p{number}">{_e(process.name)}</a>')
        out.extend(_headline(process, facts[number]))
        out.append("</div>")
    if len(troubled) > TOP:
        out.append(
            f'<p class="dim">... and {len(troubled) - TOP} more processes that stalled or never ended (below).</p>'
        )
    if not troubled:
        noun = {1: "the process", 2: "both processes"}.get(len(processes), f"all {len(processes)} processes")
        out.append(
            f'<p class="head ok"><span class="tag">No stall</span> In {noun}, every import, native load '
            "and phase that started, ended, and no stall was reported.</p>"
        )
    return "\n".join(out)


def _asset(name: str) -> str:
    return resources.files(__package__).joinpath(name).read_text(encoding="utf-8")


def _digest(text: str) -> str:
    return "sha256-" + base64.b64encode(hashlib.sha256(text.encode("utf-8")).digest()).decode("ascii")


def _render(processes: list[Process], timeline: _PageTimeline, title: str, skipped: Skipped) -> str:
    origin = place(processes)
    facts = [_Facts(process, timeline) for process in processes]
    troubled = [number for number, fact in enumerate(facts) if fact.state != "ok"]
    on_top = set(troubled[:TOP])
    sections = [
        _section(
            number,
            process,
            facts[number],
            facts[number].state != "ok" or (not troubled and number < _OPEN),
            number not in on_top,
        )
        for number, process in enumerate(processes)
    ]
    script, style = _asset("page.js"), _asset("page.css")
    skipped_note = f'<p class="dim">{_e(skipped)}</p>' if skipped.count else ""
    fields = {
        "csp": f"default-src 'none'; script-src '{_digest(script)}'; style-src '{_digest(style)}'; img-src data:",
        "title": _e(title),
        "style": style,
        "top": _top(processes, facts),
        "count": _e(
            f"{(f'{len(processes)} processes' if len(processes) > 1 else '1 process')} in this log"
            + (f", {len(troubled)} in trouble" if troubled else "")
        ),
        "skipped": skipped_note,
        "sections": "\n".join(sections),
        "data": _blob(_data(processes, timeline, origin)),
        "script": script,
    }
    template = _asset("page.html")
    # One pass over the template: a field's value is never searched for another field's mark.
    pieces = template.split("@@")
    for index in range(1, len(pieces), 2):
        pieces[index] = fields[pieces[index]]
    return "".join(pieces)
