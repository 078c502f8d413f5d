"""The event model: every kind, written by the real Sink as a text and a JSON line, reads back as the same event."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from importwatch import events
from importwatch.events import EXTRAS, KINDS, MAX_LINE
from importwatch.events.read import read_line
from importwatch.tracing.sink import Sink

# One event of every kind, with every field its writer passes (durations as a text line keeps them:
# milliseconds to three decimals, a stall's seconds to one), and the depth of the nested ones.
EXAMPLES: list[tuple[str, dict, int]] = [
    (events.IMPORT, {"name": "pkg.mod", "parent": "pkg"}, 1),
    (events.IMPORT, {"name": "pkg", "parent": None, "waits_for": "Thread-1", "origin": "reload"}, 0),
    (events.IMPORT_END, {"name": "pkg.mod", "parent": "pkg", "ms": 12.345}, 1),
    (events.IMPORT_END, {"name": "pkg", "parent": None, "ms": 0.5, "error": "ImportError: no; not: this"}, 0),
    (
        events.NATIVE,
        {"path": "/site/fast kern/_k.so", "owner": "fastkern._k", "needs": ["libcudart.so.11.0"]},
        2,
    ),
    (events.NATIVE, {"path": "libm.so.6", "owner": "ctypes"}, 0),
    (
        events.NATIVE_END,
        {"path": "/site/_k.so", "owner": "fastkern._k", "ms": 3.25, "mapped": ["/a/libx.so", "/b/liby.so.1"]},
        2,
    ),
    (
        events.NATIVE_END,
        {"path": "/site/_k.so", "ms": 1.0, "error": "OSError: libz.so: cannot open; sorry"},
        1,
    ),
    (events.PHASE, {"name": "load model", "timeout": 600.0}, 0),
    (events.PHASE, {"name": "warm (up)", "timeout": 0.25}, 1),
    (events.PHASE, {"name": "no timeout of its own", "timeout": None}, 0),
    (events.PHASE_END, {"name": "load model", "ms": 1234.5}, 0),
    (events.PHASE_END, {"name": "load 2 ms", "ms": 2.0, "error": "ValueError: x"}, 1),
    (events.CHECKPOINT, {"name": "weights read"}, 1),
    (events.STEP, {"name": "torch.cuda.init", "detail": "CUDA_VISIBLE_DEVICES=0"}, 1),
    (events.STEP_END, {"name": "torch.cuda.init", "ms": 7.125}, 1),
    (events.STEP_END, {"name": "torch.cuda.init", "ms": 7.0, "error": "RuntimeError: no GPU"}, 0),
    (
        events.VERDICT,
        {"verdict": "fastkern/_k.so needs libcudart.so.11.0 (CUDA 11) but torch is for 12.1"},
        0,
    ),
    (events.VERDICT, {"verdict": "_k.so: needs CUDA 11", "path": "/site/_k.so"}, 0),
    (events.WARNING, {"message": "cannot open log file x.log: it is a FIFO; logging to stderr only"}, 0),
    (
        events.START,
        {
            "python": "3.11.7",
            "executable": "/venv/bin/python",
            "argv": ["run.py", "--log", "a b", "it's ] cwd=x"],
            "cwd": "/job dir",
            "platform": "Linux-6.1-x86_64",
            "dumps": "job.log",
        },
        0,
    ),
    (
        events.START,
        {"python": "3.9.1", "executable": "/p", "argv": [], "cwd": "/", "platform": "Linux-5-aarch64"},
        0,
    ),
    (events.ENV, {"env": {"CUDA_VISIBLE_DEVICES": "0"}}, 0),
    (events.ENV, {"env": {"LD_LIBRARY_PATH": "/opt/my libs:/x", "NCCL_DEBUG": "", "TORCH_x": "a=b"}}, 0),
    (events.ENV, {"env": {}}, 0),
    (events.TORCH, {"version": "2.3.1", "cuda": "12.1", "hip": None, "path": "/t"}, 0),
    (events.TORCH, {"version": "2.13.0+cpu", "cuda": None, "hip": None, "path": "/my venvs/a (b)/torch"}, 0),
    (events.TORCH, {"version": "6.2.0+rocm6.0", "cuda": None, "hip": "6.0", "path": "/t"}, 0),
    (
        events.TORCH,
        {
            "version": "2.3.1+cu121",
            "cuda": "12.1",
            "hip": None,
            "path": "/site dir/torch",
            "before": True,
            "runtimes": ["libcudart.so.12 (torch/lib)", "libcudart.so.11.0 (LD_LIBRARY_PATH)"],
            "driver": "550.54.14",
            "gpus": 2,
            "models": ["NVIDIA A100", "NVIDIA H200"],
            "visible": "0",
        },
        0,
    ),
    (
        events.TORCH,
        {
            "version": None,
            "cuda": None,
            "hip": None,
            "path": "/t",
            "before": True,
            "runtimes": None,
            "driver": None,
            "gpus": 0,
            "models": [],
            "visible": "",
        },
        0,
    ),
    (
        events.TORCH,
        {
            "version": "2.3.1+cu121",
            "cuda": "12.1",
            "hip": None,
            "path": "/t",
            "before": True,
            "runtimes": [],
            "driver": "535.1",
            "gpus": 1,
            "models": [],
            "visible": None,
        },
        0,
    ),
    (
        events.STALL,
        {
            "seconds": 30.1,
            "stalled": "MainThread",
            "chain": "fastkern > dlopen /s/_k.so (30.0 s); waiting for its module lock: Thread-2",
            "chains": ["MainThread: fastkern > dlopen /s/_k.so (30.0 s)"],
            "report": 1,
            "busy": False,
            "at": None,
        },
        0,
    ),
    (
        events.STALL,
        {
            "seconds": 64.0,
            "stalled": "MainThread",
            "chain": "sleepy (loading /s p/sleepy.py, 64.0 s)",
            "chains": ["MainThread: sleepy (loading /s p/sleepy.py, 64.0 s)"],
            "report": 4,
            "busy": False,
            "at": "/s p/sleepy.py:2 in <module>",
        },
        0,
    ),
    (
        events.STALL,
        {
            "seconds": 1.0,
            "stalled": "Thread-1",
            "chain": "spin (loading /s/spin.py, 1.0 s)",
            "chains": ["Thread-1: spin (loading /s/spin.py, 1.0 s)"],
            "report": 1,
            "busy": True,
            "at": "/s/spin.py:3 in <module>",
        },
        0,
    ),
    (events.STALL_THREAD, {"chain": "Thread-2: a > b (3.0 s)"}, 0),
    (events.STALL_CONTEXT, {"context": "! a verdict said before"}, 0),
    (events.STALL_THREADS, {"threads": "0x7f01=MainThread"}, 0),
    (events.BUSY, {"stalled": "MainThread", "cpu": 0.98, "gpu": False}, 0),
    (events.BUSY, {"stalled": "MainThread", "cpu": 0.61, "gpu": True}, 0),
    (events.RESUMED, {"name": "fastkern", "seconds": 31.0, "interrupted": False, "dumped": None}, 0),
    (
        events.RESUMED,
        {
            "name": "phase load",
            "seconds": 2.5,
            "interrupted": False,
            "dumped": "in /j/run (1).log, not on this terminal",
        },
        0,
    ),
    (events.RESUMED, {"dumped": "above"}, 0),
    (events.RESUMED, {"name": "sleepy", "seconds": 3.5, "interrupted": True, "dumped": None}, 0),
    (
        events.OUTSIDE,
        {
            "verdict": "waiting",
            "look": "MainThread sleeping in futex_wait_queue, 0% CPU over the last 2.0 s; not using CPU: "
            "blocked, not slow",
            "stalled": "MainThread",
            "chain": "fastkern (2.1 s) > dlopen /s p/_k.so (2.0 s)",
        },
        0,
    ),
    (
        events.OUTSIDE,
        {
            "verdict": "busy",
            "look": "MainThread running, 99% CPU over the last 1.0 s; a long import ...",
            "stalled": "MainThread",
            "chain": "spin (1.5 s)",
        },
        0,
    ),
    (
        events.OUTSIDE,
        {
            "verdict": "waiting",
            "look": "MainThread sleeping in hrtimer_nanosleep, 0% CPU (in clock_nanosleep: sleeping on a "
            "timer); not using CPU: blocked, not slow",
            "stalled": "MainThread",
            "chain": "sleepy (64.5 s)",
            "report": 4,
            "after": 64.5,
        },
        0,
    ),
    (
        events.OUTSIDE,
        {
            "thread_name": "T",
            "tid": 7,
            "comm": "python3",
            "state": "sleeping in futex_wait_queue, 0% CPU",
            "verdict": "waiting",
            "waits": "waits on a lock",
        },
        0,
    ),
    (
        events.OUTSIDE,
        {
            "thread_name": "worker",
            "tid": 8,
            "comm": "my worker: 2",
            "state": "running, 100% CPU",
            "verdict": "busy",
            "waits": None,
        },
        0,
    ),
    (
        events.OUTSIDE,
        {
            "verdict": "deadlock",
            "look": "MainThread (tid 1) holds the GIL in PyInit_x and waits for a mutex held by w (tid 2)",
            "stalled": "MainThread",
            "chain": "x (9.0 s)",
            "report": 3,
            "after": 9.0,
        },
        0,
    ),
    (
        events.OUTSIDE,
        {"thread_name": "importwatch-heartbeat", "tid": 9, "ours": "importwatch's heartbeat (ours)"},
        0,
    ),
    (
        events.OUTSIDE,
        {"initialising": "/s p/libx.so", "how": "innermost new library on its stack"},
        0,
    ),
    (
        events.OUTSIDE,
        {"load": "/s/_k.so", "names": ["libx.so", "liby.so.1"], "mapped": ["/s p/libx.so", "/l/liby.so.1"]},
        0,
    ),
    (
        events.OUTSIDE,
        {"message": "pid 9 gdb is debugging it: left as it is, not killed (--exit-on-stall)"},
        0,
    ),
    (events.OUTSIDE, {"message": "  #1 block_in_constructor (tid 3): from /x.so"}, 0),
    (
        events.DIED,
        {
            "process": 7,
            "how": "was killed by SIGKILL (the OOM killer, a scheduler or kill -9)",
            "seconds": 3.0,
            "status": 9,
            "chain": "MainThread: a (2.0 s)",
        },
        0,
    ),
    (
        events.DIED,
        {
            "process": 7,
            "how": "was killed by SIGSEGV, core dumped",
            "seconds": 0.5,
            "status": 11 | 0x80,
            "chain": "T: a > b (0.1 s)",
        },
        0,
    ),
    (
        events.DIED,
        {
            "process": 7,
            "how": "exited with status 1, ended by --exit-on-stall after the stall report",
            "seconds": 31.0,
            "status": 1 << 8,
            "chain": "MainThread: a (31.0 s)",
        },
        0,
    ),
    (
        events.DIED,
        {
            "process": 7,
            "how": "ended without a clean exit (its exit status was gone before the watcher could read it)",
            "seconds": 1.0,
            "status": None,
            "chain": "MainThread: a (1.0 s)",
        },
        0,
    ),
    (events.EXIT, {"status": 1, "message": "--exit-on-stall"}, 0),
    (events.EXIT, {"status": None, "message": "the program is waiting, not busy: killing it"}, 0),
    (events.FORK, {"parent": 4711}, 0),
    (events.SIGNAL, {"signal": "SIGTERM", "child": 4712, "via": "multiprocessing"}, 0),
    (events.OTHER, {"message": "a line of a later version"}, 0),
]


def test_every_kind_has_an_example_and_no_field_takes_a_json_lines_own_key() -> None:
    assert {kind for kind, _, _ in EXAMPLES} == KINDS
    for _, fields, _ in EXAMPLES:
        assert not set(fields) & {"time", "pid", "thread", "rank", "kind", "text"}


def _written(tmp_path: Path, name: str) -> list[str]:
    """EXAMPLES as the Sink writes them to a log called NAME (no stderr: it goes to /dev/null)."""
    sink = Sink(os.open(os.devnull, os.O_WRONLY))  # the Sink takes it over as its copy of stderr
    sink.set_stderr("none")
    assert sink.open_log(str(tmp_path / name))
    for kind, fields, depth in EXAMPLES:
        sink.event(kind, fields, depth)
    sink.close_log()
    sink.close_stderr()
    return (tmp_path / name).read_text().splitlines()


@pytest.mark.parametrize("name", ["run.log", "run.jsonl"])
def test_event_to_line_to_event_is_identity_for_every_kind(tmp_path: Path, name: str) -> None:
    lines = _written(tmp_path, name)
    assert len(lines) == len(EXAMPLES)
    for line, (kind, fields, depth) in zip(lines, EXAMPLES):
        event = read_line(line)
        assert event is not None, line
        assert (event.kind, event.depth) == (kind, depth), line
        # A text line carries every field but the extras (see events.EXTRAS); a JSON line all.
        extras = EXTRAS.get(kind, ()) if name.endswith(".log") else ()
        expected = {key: value for key, value in fields.items() if key not in extras}
        assert event.data() == expected, line


def test_the_text_and_json_lines_of_an_event_read_back_alike(tmp_path: Path) -> None:
    for text, json in zip(_written(tmp_path, "run.log"), _written(tmp_path, "run.jsonl")):
        from_text, from_json = read_line(text), read_line(json)
        assert from_text.kind == from_json.kind and from_text.depth == from_json.depth
        assert from_text.text == from_json.text  # the same body, rendered once by the model
        extras = EXTRAS.get(from_json.kind, ())
        assert from_text.data() == {k: v for k, v in from_json.data().items() if k not in extras}


@pytest.mark.parametrize("name", ["run.log", "run.jsonl"])
def test_a_line_written_onto_the_end_of_a_torn_one_reads_as_itself(tmp_path: Path, name: str) -> None:
    # faulthandler writes a dump in pieces: a process killed amid one leaves a line unended, and
    # the next line of ours goes on its end. What is not ours is looked into; what is ours, never.
    torns = ['  File "/x/torch/_ops.py", line 1', "Thread 0x00007f", "", "progress: {'a': 50%}"]
    for line in _written(tmp_path, name):
        alone = read_line(line)
        for torn in torns:
            glued = read_line(torn + line)
            assert (glued.kind, glued.depth, glued.data()) == (alone.kind, alone.depth, alone.data()), (
                torn + line
            )
    for torn in torns:
        assert read_line(torn) is None
    # Words that quote a head are the program's, never a bad line of ours (report would count it).
    for quoted in (
        "grep found [importwatch 7 in job.err",
        'echo {"time": "noon"}',
        "x[importwatch " + "y" * MAX_LINE,
    ):
        assert read_line(quoted) is None
    # A name that holds a head is the name, in a line of ours.
    own = "[importwatch 7 10:00:00.000] > pkg[importwatch 8 10:00:00.000] > other"
    assert read_line(own).name == "pkg[importwatch 8 10:00:00.000] > other"


def test_a_verdict_and_a_warning_are_told_apart_in_both_forms(tmp_path: Path) -> None:
    kinds = {read_line(line).kind for name in ("a.log", "a.jsonl") for line in _written(tmp_path, name)}
    assert {events.VERDICT, events.WARNING} <= kinds


def test_a_line_not_as_we_write_its_kind_reads_as_other() -> None:
    for line in (
        '{"time": 1, "pid": 1, "kind": "verdict", "text": "no head"}',
        '{"time": 1, "pid": 1, "kind": "stall", "seconds": "x", "stalled": "T", "chain": "c", "text": "STALL"}',
        '{"time": 1, "pid": 1, "kind": "signal", "signal": "SIGTERM", "text": "signal"}',
        "[importwatch 1 10:00:00.000] signal SIGTERM to nobody",
        "[importwatch 1 10:00:00.000] start python 3 /p argv=[1, 2] cwd=/",
        "[importwatch 1 10:00:00.000] exiting with status one",
    ):
        event = read_line(line)
        assert event.kind == events.OTHER and event.fields == {"message": event.text}, line


def test_a_thread_name_in_another_script_reads_back_escaped_from_both_lines(tmp_path: Path) -> None:
    name = "W\u00f6rker_\u7ebf\u7a0b"  # the Sink's thread names have no spaces
    fields = {
        "thread_name": name,
        "tid": 8,
        "comm": "pt_main",
        "state": "running, 97% CPU",
        "verdict": "busy",
    }
    fields["waits"] = None
    read = []
    for log in ("a.log", "a.jsonl"):
        sink = Sink(os.open(os.devnull, os.O_WRONLY))  # the Sink takes it over as its copy of stderr
        sink.set_stderr("none")
        assert sink.open_log(str(tmp_path / log))
        sink.event(events.OUTSIDE, fields)
        sink.close_log()
        sink.close_stderr()
        line = (tmp_path / log).read_text()
        assert line.isascii()
        read.append(read_line(line).data())
    escaped = "W\\xf6rker_\\u7ebf\\u7a0b"
    assert read[0] == read[1] == {**fields, "thread_name": escaped}


# Imports that end well and badly, a name that needs escaping, an extension module and a ctypes load.
_TRACED_PROGRAM = """\
import ctypes, ctypes.util, sys
sys.path.insert(0, sys.argv[1])
import _bz2, json.decoder, m\u00f6d
try:
    import no_such_module
except ImportError:
    pass
ctypes.CDLL(ctypes.util.find_library("m"))
"""
_LINE_KINDS = (events.IMPORT, events.IMPORT_END, events.NATIVE, events.NATIVE_END)


@pytest.mark.slow
@pytest.mark.timeout(60)
def test_the_inline_lines_of_a_traced_program_are_what_render_makes_of_their_fields(tmp_path: Path) -> None:
    """The hook writes its import lines without calling render (a call per line costs): the same run's
    text lines (stderr) and JSON records (the log) must still be render's, field for field."""
    import json
    import subprocess
    import sys

    from helpers import clean_env

    (tmp_path / "m\u00f6d.py").write_text("")
    log = tmp_path / "run.jsonl"
    command = [sys.executable, "-m", "importwatch", "--log", str(log), "-c", _TRACED_PROGRAM, str(tmp_path)]
    done = subprocess.run(command, env=clean_env(), capture_output=True, text=True, timeout=50)
    assert done.returncode == 0, done.stderr
    records = [json.loads(line) for line in log.read_text().splitlines()]
    # The .pth lines site runs are steps the imports they make nest under: a depth of theirs.
    outer = {index for index, record in enumerate(records) if record["kind"] == events.STEP}
    ends = [index for index, record in enumerate(records) if record["kind"] == events.STEP_END]
    depth_at = [sum(s < i for s in outer) - sum(e < i for e in ends) for i in range(len(records))]
    depths = [depth_at[i] for i, record in enumerate(records) if record["kind"] in _LINE_KINDS]
    records = [record for record in records if record["kind"] in _LINE_KINDS]
    texts = [read_line(line) for line in done.stderr.splitlines()]
    texts = [event for event in texts if event is not None and event.kind in _LINE_KINDS]
    assert [record["kind"] for record in records] == [event.kind for event in texts]
    kinds = {record["kind"] for record in records}
    assert kinds == set(_LINE_KINDS), kinds
    assert any(not record.get("name", "").isascii() for record in records)  # a name the line escapes
    assert any(record.get("error") for record in records if record["kind"] == events.IMPORT_END)
    in_flight: list[str] = []  # the nesting, from the starts and ends alone (one thread)
    for record, text, outside in zip(records, texts, depths):
        kind = record["kind"]
        fields = {
            key: value
            for key, value in record.items()
            if key not in ("time", "pid", "thread", "kind", "text")
        }
        if kind in (events.IMPORT_END, events.NATIVE_END):
            in_flight.pop()
        expected = events.escape(events.render(kind, fields, outside + len(in_flight)))
        if kind in (events.IMPORT, events.NATIVE):
            in_flight.append(kind)
        assert record["text"] == expected
        assert text.text == expected
