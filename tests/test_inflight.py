"""The one reader of what is in flight (inflight.py), fed real log lines, text and JSON alike: the edge
cases that report, bisect, doctor and the watcher each handled in their own copy before."""

from __future__ import annotations

import json

import pytest

from importwatch.events import IMPORT, NATIVE
from importwatch.events.read import parse_line
from importwatch.inflight import InFlight, Started, close

SO = "/venv/fastkern/_kernels.cpython-311-x86_64-linux-gnu.so"


def text(body: str, thread: str = "", pid: int = 7) -> str:
    return f"[importwatch {pid} 12:00:00.000{' ' + thread if thread else ''}] {body}"


def as_json(line: str) -> str:
    """LINE, a text line of ours, as the JSON line of the same event."""
    event = parse_line(line)
    assert event is not None
    record = {"time": 1.0, "pid": event.pid, "thread": event.thread, "kind": event.kind}
    record["path" if event.kind.startswith("native") else "name"] = event.name
    if event.ms is not None:
        record["ms"] = event.ms
    if event.error is not None:
        record["error"] = event.error
    record["text"] = event.text
    return json.dumps(record)


def read(lines: list[str], reader: InFlight, form: str = "text") -> list[Started | None]:
    """Feed LINES to READER, each thread keyed by name; what each line started or ended."""
    found = []
    for seq, line in enumerate(lines, 1):
        event = parse_line(line if form == "text" else as_json(line))
        assert event is not None, line
        found.append(reader.follow(event, event.thread, seq=seq) if reader.follows(event.kind) else None)
    return found


def names(reader: InFlight) -> dict:
    return {key: [f"{step.kind}:{step.name}" for step in stack] for key, stack in reader.chains().items()}


FORMS = pytest.mark.parametrize("form", ["text", "json"])


@FORMS
def test_a_native_load_nested_in_an_import_ends_alone(form):
    reader = InFlight()
    lines = [
        text("> fastkern"),
        text(f"  > dlopen {SO} (fastkern._kernels)"),
        text("  ! _kernels...so needs libcudart.so.11.0 (CUDA 11); torch is built for CUDA 12.1"),
    ]
    read(lines, reader, form)
    assert names(reader) == {"MainThread": ["import:fastkern", f"native:{SO}"]}
    read([text(f"  < dlopen {SO} 12.5 ms")], reader, form)
    assert names(reader) == {"MainThread": ["import:fastkern"]}
    read([text("< fastkern 20.0 ms")], reader, form)
    assert names(reader) == {}


@FORMS
def test_an_end_with_no_start_closes_nothing(form):
    # A fork child ends what its parent began; a log cut at its start ends what it never showed.
    reader = InFlight()
    started = read([text("> a"), text("< inherited 3.0 ms")], reader, form)
    assert started[1] is None
    assert names(reader) == {"MainThread": ["import:a"]}


@FORMS
def test_a_missing_end_closes_with_the_step_around_it(form):
    reader = InFlight()
    read([text("> a"), text("  > b"), text("    > dlopen /x/c.so (c)"), text("< a 9.0 ms")], reader, form)
    assert names(reader) == {}
    # What the report needs to mark them unfinished: the lost ones, innermost first.
    stack = [Started(IMPORT, "a"), Started(IMPORT, "b"), Started(NATIVE, "/x/c.so")]
    ended, lost = close(stack, IMPORT, "a")
    assert ended is not None and ended.name == "a" and stack == []
    assert [step.name for step in lost] == ["/x/c.so", "b"]


@FORMS
def test_ends_out_of_order_leave_nothing_stale(form):
    reader = InFlight()
    read([text("> a"), text("  > b"), text("< a 2.0 ms"), text("  < b 1.0 ms")], reader, form)
    assert names(reader) == {}


def test_the_innermost_of_two_steps_of_one_name_is_closed():
    reader = InFlight()
    read([text("> a"), text("  > phase load"), text("    > a"), text("    < a 1.0 ms")], reader)
    assert names(reader) == {"MainThread": ["import:a", "phase:load"]}


@FORMS
def test_a_thread_whose_steps_ended_has_nothing_in_flight(form):
    reader = InFlight()
    lines = [
        text("> a"),
        text("> loader_mod", thread="loader"),
        text("< loader_mod 4.0 ms", thread="loader"),
        text("  > b"),
    ]
    read(lines, reader, form)
    assert names(reader) == {"MainThread": ["import:a", "import:b"]}
    assert reader.chain("loader") == [] and reader.chain("nobody") == []


def test_only_the_kinds_followed_are_kept():
    # bisect tries imports and native loads apart; a phase or a step is not one of its suspects.
    reader = InFlight(kinds=(IMPORT, NATIVE))
    started = read([text("> a"), text("  > phase warmup"), text("    > step rendezvous tcp://h:1")], reader)
    assert started[1:] == [None, None]
    read([text("    < step rendezvous 1.0 ms"), text("  < phase warmup 2.0 ms")], reader)
    assert names(reader) == {"MainThread": ["import:a"]}


def test_steps_carry_their_sequence_number_and_start():
    reader = InFlight()
    event = parse_line(text("> a"))
    step = reader.follow(event, (7, "MainThread"), start=12.5, seq=41)
    assert step is not None and (step.seq, step.start, step.kind, step.name) == (41, 12.5, IMPORT, "a")
    assert reader.chain((7, "MainThread")) == [step]


@FORMS
def test_by_depth_a_start_after_lost_ends_replaces_the_stale_steps(form):
    # The watcher's feed may drop lines: the indentation says what still holds.
    reader = InFlight(by_depth=True)
    read([text("> a"), text("  > b"), text("    > c"), text("  > d")], reader, form)
    assert names(reader) == {"MainThread": ["import:a", "import:d"]}
    # An end at depth 0 ends everything, whatever its name says (its start's line may be lost).
    read([text("< renamed 1.0 ms")], reader, form)
    assert names(reader) == {}


def test_by_name_a_start_after_lost_ends_nests():
    reader = InFlight()
    read([text("> a"), text("  > b"), text("    > c"), text("  > d")], reader)
    assert names(reader) == {"MainThread": ["import:a", "import:b", "import:c", "import:d"]}


def test_warnings_belong_to_the_innermost_step_of_their_thread():
    reader = InFlight(by_depth=True)
    read(
        [text("> fastkern"), text(f"  > dlopen {SO} (fastkern._kernels)"), text("> other", thread="t2")],
        reader,
    )
    reader.warn("MainThread", "! needs libcudart.so.11.0")
    reader.warn("t2", "! said for other")
    reader.warn("idle", "! nothing in flight there: dropped")
    main = reader.chain("MainThread")
    assert main[0].warnings == () and main[1].warnings == ("! needs libcudart.so.11.0",)
    assert reader.chain("t2")[0].warnings == ("! said for other",)
