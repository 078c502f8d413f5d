"""importwatch report: real logs of real runs, read back as summary, tree, importtime and Chrome trace."""

from __future__ import annotations

import json
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from cbuild import FIXTURES, compile_extension
from helpers import clean_env

pytestmark = pytest.mark.slow  # every test here starts processes

LOGS = FIXTURES / "logs"
REPORT = [sys.executable, "-m", "importwatch", "report"]
STDLIB_CODE = "import json, email.parser"
IMPORTTIME_LINE = re.compile(r"^import time: ([ \d]{9}) \| ([ \d]{10}) \| ((?:  )*)(\S+)( \[unfinished\])?$")


def trace(log: Path, *target: str, cwd: Path | None = None) -> subprocess.CompletedProcess:
    command = [sys.executable, "-m", "importwatch", "--log", str(log), *target]
    return subprocess.run(command, capture_output=True, text=True, cwd=cwd, env=clean_env(), timeout=60)


def report(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([*REPORT, *map(str, args)], capture_output=True, text=True, timeout=60)


def report_ok(*args: str) -> str:
    done = report(*args)
    assert done.returncode == 0, done.stderr
    assert "Traceback" not in done.stderr
    return done.stdout


def parse_importtime(text: str) -> list[tuple[str, str | None, int, int, bool]]:
    """(name, parent, self us, cumulative us, unfinished) per line, from -X importtime text."""
    lines = text.splitlines()
    assert lines[0] == "import time: self [us] | cumulative | imported package"
    rows = []
    for line in lines[1:]:
        match = IMPORTTIME_LINE.match(line)
        assert match, f"not in -X importtime format: {line!r}"
        rows.append(
            (match.group(4), len(match.group(3)) // 2, int(match.group(1)), int(match.group(2)), match)
        )
    # Children come before their parent: read backwards, the parent is the last one seen a level up.
    found = []
    last_at_level: dict[int, str] = {}
    for name, level, self_us, cumulative, match in reversed(rows):
        parent = last_at_level.get(level - 1) if level else None
        last_at_level[level] = name
        found.append((name, parent, self_us, cumulative, bool(match.group(5))))
    return found[::-1]


def cpython_importtime(code: str, cwd: Path) -> list[tuple[str, str | None, int, int, bool]]:
    done = subprocess.run(
        [sys.executable, "-X", "importtime", "-c", code],
        capture_output=True,
        text=True,
        cwd=cwd,
        env=clean_env(),
    )
    assert done.returncode == 0, done.stderr
    lines = [line for line in done.stderr.splitlines() if line.startswith("import time:")]
    return parse_importtime("\n".join(lines))


def assert_same_shape(ours: list, cpython: list, least: int) -> None:
    """Modules both list have the same parent; nearly all of ours are in CPython's list."""
    our_parents = {name: parent for name, parent, *_ in ours}
    # `site` is imported before any .pth can switch tracing on: what a .pth imports under it (setuptools'
    # _distutils_hack) is traced with no parent, the interpreter's start-up being none of ours.
    cpython_parents = {name: (None if parent == "site" else parent) for name, parent, *_ in cpython}
    common = set(our_parents) & set(cpython_parents)
    assert len(common) >= least
    assert len(common) >= 0.95 * len(our_parents), sorted(set(our_parents) - common)
    wrong = {
        name: (our_parents[name], cpython_parents[name])
        for name in common
        if our_parents[name] != cpython_parents[name]
    }
    assert not wrong


def assert_nested(trace_json: dict) -> list[dict]:
    """Complete events of each thread nest like a call tree; returns them."""
    slices = [event for event in trace_json["traceEvents"] if event["ph"] == "X"]
    for event in slices:
        assert isinstance(event["ts"], int) and isinstance(event["dur"], int) and event["dur"] >= 0
        assert isinstance(event["pid"], int) and isinstance(event["tid"], int)
    tracks: dict[tuple[int, int], list[dict]] = {}
    for event in slices:
        tracks.setdefault((event["pid"], event["tid"]), []).append(event)
    for events in tracks.values():
        stack: list[int] = []
        for event in sorted(events, key=lambda event: (event["ts"], -event["dur"])):
            while stack and stack[-1] <= event["ts"] and not (stack[-1] == event["ts"] and event["dur"] == 0):
                stack.pop()
            end = event["ts"] + event["dur"]
            assert not stack or end <= stack[-1], f"{event['name']} overlaps its parent's end"
            stack.append(end)
    return slices


def hung_program(folder: Path, native: bool) -> Path:
    """main.py imports hangpkg > hangpkg.slow, which hangs: in a sleep, or in dlopen (a .so's constructor)."""
    package = folder / "hangpkg"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text("from hangpkg import slow\n")
    if native:
        compile_extension(FIXTURES / "hang" / "blocking_ext.c", folder, "hangpkg._kernels")
        (package / "slow.py").write_text("import json\nfrom hangpkg import _kernels\n")
    else:
        (package / "slow.py").write_text("import json\nimport time\ntime.sleep(1000)\n")
    (folder / "main.py").write_text("import hangpkg\n")
    return folder / "main.py"


def run_until_stalled(script: Path, log: Path, wait_for: str, watcher: bool = False) -> int:
    """Run SCRIPT traced until WAIT_FOR is in the log, then kill it as a job scheduler would.

    With WATCHER, the watcher process runs beside it, and this returns once it has
    written the death in the log. Returns the pid.
    """
    command = [sys.executable, "-m", "importwatch", "--timeout", "0.5", "--log", str(log)]
    command += ["--watcher" if watcher else "--no-watcher", str(script)]
    process = subprocess.Popen(
        command, cwd=script.parent, env=clean_env(), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    try:
        wait_in_log(log, wait_for)
    finally:
        process.send_signal(signal.SIGKILL)
        process.wait()
    if watcher:
        wait_in_log(log, "died during import")
    return process.pid


def wait_in_log(log: Path, text: str, seconds: float = 20) -> None:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if log.exists() and text in log.read_text(errors="replace"):
            return
        time.sleep(0.05)
    pytest.fail(f"{text!r} never appeared in the log")


# -- a real run of the stdlib ------------------------------------------------------------------
@pytest.mark.timeout(60)
def test_importtime_has_cpythons_modules_and_tree_shape(tmp_path):
    log = tmp_path / "run.log"
    assert trace(log, "-c", STDLIB_CODE, cwd=tmp_path).returncode == 0
    text = report_ok(log, "--format", "importtime")
    ours = parse_importtime(text)
    assert_same_shape(ours, cpython_importtime(STDLIB_CODE, tmp_path), least=30)
    assert {"json", "email.parser"} <= {name for name, parent, *_ in ours if parent is None}
    assert "dlopen" not in text  # native loads are not imports
    for name, _, self_us, cumulative, unfinished in ours:
        assert 0 <= self_us <= cumulative and not unfinished, name


@pytest.mark.timeout(60)
def test_jsonl_and_text_logs_give_the_same_tree(tmp_path):
    code = "import email.parser, csv"
    trees = []
    for log in (tmp_path / "run.log", tmp_path / "run.jsonl"):
        assert trace(log, "-c", code, cwd=tmp_path).returncode == 0
        trees.append(
            [(name, parent) for name, parent, *_ in parse_importtime(report_ok(log, "-f", "importtime"))]
        )
    # The JSON sink imports json (and re, enum...) before tracing starts: those are missing from it.
    text, jsonl = trees
    assert [row for row in text if row[0] in {name for name, _ in jsonl}] == jsonl
    assert len(jsonl) > 20


@pytest.mark.timeout(60)
def test_tree_min_ms_keeps_slow_imports_and_their_ancestors(tmp_path):
    log = tmp_path / "run.log"
    assert trace(log, "-c", STDLIB_CODE, cwd=tmp_path).returncode == 0
    full = report_ok(log, "-f", "tree").splitlines()
    rows = [line for line in full if re.match(r"^ *\d+\.\d{3} +\d+\.\d{3}  ", line)]
    assert any(line.split()[2] == "json" for line in rows) and any("dlopen" in line for line in rows)
    times = sorted(float(line.split()[0]) for line in rows)
    threshold = times[len(times) * 3 // 4]  # keeps about a quarter
    kept = [line for line in report_ok(log, "-f", "tree", "--min-ms", threshold).splitlines() if line in rows]
    assert 0 < len(kept) < len(rows)
    for index, line in enumerate(kept):
        depth = len(line[23:]) - len(line[23:].lstrip())
        child = kept[index + 1] if index + 1 < len(kept) else ""
        deeper = child and len(child[23:]) - len(child[23:].lstrip()) > depth
        assert float(line.split()[0]) >= threshold or deeper, line


@pytest.mark.timeout(60)
def test_tuna_reads_our_importtime(tmp_path):
    reader = pytest.importorskip("tuna._import_profile")
    log = tmp_path / "hung.log"
    run_until_stalled(hung_program(tmp_path / "prog", native=False), log, "STALL")
    profile = tmp_path / "profile.txt"
    report_ok(log, "-f", "importtime", "-o", profile)
    assert " [unfinished]" in profile.read_text()
    tree = reader.read_import_profile(str(profile))
    names = set()
    pending = [tree]
    while pending:
        node = pending.pop()
        names.add(node["text"][0])
        pending.extend(node.get("children", []))
    assert {"hangpkg [unfinished]", "hangpkg.slow [unfinished]", "json"} <= names


# -- logs cut off by a hang ----------------------------------------------------------------------
@pytest.mark.timeout(60)
def test_summary_names_the_import_in_flight_when_killed(tmp_path):
    log = tmp_path / "hung.log"
    run_until_stalled(hung_program(tmp_path / "prog", native=False), log, "STALL")
    out = report_ok(log)
    assert "still in flight when the log ends: hangpkg > hangpkg.slow\n" in out
    assert "it hung there or was stopped there" in out
    assert "STALL" in out and "hangpkg.slow" in out.split("stall reports:")[1]
    importtime = parse_importtime(report_ok(log, "-f", "importtime"))
    unfinished = {name: parent for name, parent, *_, flag in importtime if flag}
    assert unfinished == {"hangpkg": None, "hangpkg.slow": "hangpkg"}


@pytest.mark.timeout(60)
def test_summary_names_the_hung_dlopen_and_chrome_shows_it_unfinished(tmp_path):
    log = tmp_path / "hung.log"
    run_until_stalled(hung_program(tmp_path / "prog", native=True), log, "Timeout (")
    library = next((tmp_path / "prog" / "hangpkg").glob("_kernels.*"))
    out = report_ok(log)
    assert (
        f"in flight when the log ends: hangpkg > hangpkg.slow > hangpkg._kernels > dlopen {library}\n" in out
    )
    trace_json = json.loads(report_ok(log, "-f", "chrome"))
    slices = assert_nested(trace_json)
    unfinished = {event["name"] for event in slices if event["args"].get("unfinished")}
    assert unfinished == {
        "hangpkg [unfinished]",
        "hangpkg.slow [unfinished]",
        "hangpkg._kernels [unfinished]",
        f"dlopen {library.name} [unfinished]",
    }
    # Native loads stay out of importtime; their module is there, unfinished.
    importtime = report_ok(log, "-f", "importtime")
    assert "dlopen" not in importtime and "hangpkg._kernels [unfinished]" in importtime


@pytest.mark.timeout(60)
def test_summary_names_each_threads_chain_in_flight(tmp_path):
    (tmp_path / "sleepy_a.py").write_text("import time\ntime.sleep(1000)\n")
    (tmp_path / "sleepy_b.py").write_text("import time\ntime.sleep(1000)\n")
    (tmp_path / "main.py").write_text(
        "import threading\n"
        "threading.Thread(target=lambda: __import__('sleepy_a'), name='worker', daemon=True).start()\n"
        "import sleepy_b\n"
    )
    log = tmp_path / "threads.log"
    run_until_stalled(tmp_path / "main.py", log, "also in flight")
    out = report_ok(log)
    assert "still in flight when the log ends: sleepy_a\n    on worker," in out
    assert "still in flight when the log ends: sleepy_b\n    on MainThread," in out
    assert_nested(json.loads(report_ok(log, "-f", "chrome")))


@pytest.mark.timeout(60)
def test_phases_and_checkpoints_are_read(tmp_path):
    import importwatch

    if not hasattr(importwatch, "phase"):
        pytest.skip("importwatch.phase is not public yet")
    (tmp_path / "main.py").write_text(
        "import time, importwatch\n"
        "with importwatch.phase('load model'):\n"
        "    import csv\n"
        "    importwatch.checkpoint('half')\n"
        "    with importwatch.phase('warm up'):\n"
        "        time.sleep(1000)\n"
    )
    log = tmp_path / "phases.log"
    run_until_stalled(tmp_path / "main.py", log, "STALL")
    assert "still in flight when the log ends: phase load model > phase warm up\n" in report_ok(log)
    rows = parse_importtime(report_ok(log, "-f", "importtime"))
    assert ("csv", None) in [(name, parent) for name, parent, *_ in rows]  # phases are not imports
    events = json.loads(report_ok(log, "-f", "chrome"))["traceEvents"]
    assert any(event["name"] == "checkpoint half" for event in events)
    assert any(
        event["name"] == "phase warm up [unfinished]" and event["args"]["unfinished"] for event in events
    )


# -- several processes and threads in one log ---------------------------------------------------
@pytest.mark.timeout(60)
@pytest.mark.parametrize("suffix", [".log", ".jsonl"])
def test_mixed_log_of_two_processes_and_a_thread(tmp_path, suffix):
    log = tmp_path / f"mixed{suffix}"
    # The first process waits until the second has written, so their lines really interleave.
    first = (
        "import threading, time\n"
        "t = threading.Thread(target=lambda: __import__('csv'), name='loader'); t.start(); t.join()\n"
        "deadline = time.monotonic() + 20\n"
        f"while b'email.parser' not in open({str(log)!r}, 'rb').read() and time.monotonic() < deadline:\n"
        "    time.sleep(0.01)\n"
        "import fractions\n"
    )
    (tmp_path / "first.py").write_text(first)
    (tmp_path / "second.py").write_text("import email.parser\n")
    command = [sys.executable, "-m", "importwatch", "--log", str(log)]
    env = clean_env()
    quiet = {"stdout": subprocess.DEVNULL, "stderr": subprocess.DEVNULL, "cwd": tmp_path, "env": env}
    one = subprocess.Popen([*command, "first.py"], **quiet)
    while not log.exists() or b"> csv" not in log.read_bytes():
        assert one.poll() is None
        time.sleep(0.01)
    two = subprocess.Popen([*command, "second.py"], **quiet)
    assert one.wait(timeout=30) == 0 and two.wait(timeout=30) == 0
    pids = [
        json.loads(line)["pid"] if suffix == ".jsonl" else int(line.split()[1])
        for line in log.read_text().splitlines()
        if line.startswith(("[importwatch", "{"))
    ]
    assert sum(1 for a, b in zip(pids, pids[1:]) if a != b) >= 2, (
        "the two processes' lines did not interleave"
    )

    out = report_ok(log)
    assert out.count("\npid ") + out.startswith("pid ") == 2
    assert f"pid {one.pid}: " in out and f"pid {two.pid}: " in out
    assert out.count("nothing in flight when the log ends") == 2
    first_part = (
        out.split(f"pid {two.pid}: ")[0]
        if out.index(f"pid {one.pid}") == 0
        else out.split(f"pid {one.pid}: ")[1]
    )
    assert "2 threads" in first_part and "[loader]" in first_part

    tree = report_ok(log, "-f", "tree")
    assert (
        f"pid {one.pid} loader" in tree
        and f"pid {one.pid} MainThread" in tree
        and f"pid {two.pid} MainThread" in tree
    )

    trace_json = json.loads(report_ok(log, "-f", "chrome"))
    slices = assert_nested(trace_json)
    meta = [event for event in trace_json["traceEvents"] if event["ph"] == "M"]
    assert {event["pid"] for event in meta if event["name"] == "process_name"} == {one.pid, two.pid}
    threads = {(event["pid"], event["args"]["name"]) for event in meta if event["name"] == "thread_name"}
    assert threads == {(one.pid, "MainThread"), (one.pid, "loader"), (two.pid, "MainThread")}
    loader = next(
        event["tid"] for event in meta if event["name"] == "thread_name" and event["args"]["name"] == "loader"
    )
    assert any(event["name"] == "csv" and event["tid"] == loader for event in slices)
    assert any(event["name"] == "email.parser" and event["pid"] == two.pid for event in slices)

    only_second = parse_importtime(report_ok(log, "-f", "importtime", "--pid", two.pid))
    assert ("email.parser", None) in [(name, parent) for name, parent, *_ in only_second]
    assert "csv" not in [name for name, *_ in only_second]


@pytest.mark.timeout(60)
def test_a_child_forked_mid_import_ends_its_parents_import(tmp_path):
    (tmp_path / "forker.py").write_text(
        "import os\npid = os.fork()\nimport csv\nif pid:\n    os.waitpid(pid, 0)\n"
    )
    (tmp_path / "main.py").write_text("import forker\n")
    log = tmp_path / "fork.log"
    assert trace(log, "main.py", cwd=tmp_path).returncode == 0
    pids = {int(line.split()[1]) for line in log.read_text().splitlines() if line.startswith("[importwatch ")}
    assert len(pids) == 2
    out = report_ok(log)
    assert (
        "(no start line: a fork" in out and "1 end without a start in this process (forked mid-import)" in out
    )
    for pid in pids:
        tree = parse_importtime(report_ok(log, "-f", "importtime", "--pid", pid))
        parents = {name: parent for name, parent, *_ in tree}
        assert parents["forker"] is None and parents["csv"] == "forker", (pid, parents)
    assert_nested(json.loads(report_ok(log, "-f", "chrome")))


# -- clocks -----------------------------------------------------------------------------------
@pytest.mark.timeout(60)
def test_a_log_across_midnight_reads_like_the_same_log_by_day(tmp_path):
    log = tmp_path / "run.log"
    assert trace(log, "-c", STDLIB_CODE, cwd=tmp_path).returncode == 0
    lines = log.read_text().splitlines(keepends=True)
    clocks = [re.match(r"\[importwatch \d+ (\d\d):(\d\d):(\d\d\.\d{3})", line) for line in lines]
    seconds = [int(m[1]) * 3600 + int(m[2]) * 60 + float(m[3]) if m else None for m in clocks]
    middle = sorted(value for value in seconds if value is not None)[len(lines) // 2]
    shift = 86400.0 - middle  # the middle line lands on 00:00:00.000

    def moved(line: str, value: float | None) -> str:
        if value is None:
            return line
        value = round((value + shift) % 86400.0, 3)
        stamp = f"{int(value // 3600):02d}:{int(value % 3600 // 60):02d}:{value % 60:06.3f}"
        return re.sub(r"\d\d:\d\d:\d\d\.\d{3}", stamp, line, count=1)

    night = tmp_path / "night.log"
    night.write_text("".join(moved(line, value) for line, value in zip(lines, seconds)))
    assert "23:59:" in night.read_text() and "00:00:0" in night.read_text()
    for form in ("importtime", "tree"):
        assert report_ok(night, "-f", form) == report_ok(log, "-f", form)
    day_summary, night_summary = report_ok(log), report_ok(night)
    assert (
        day_summary.split(" from first to last")[0].split(": ")[-1]
        == night_summary.split(" from first to last")[0].split(": ")[-1]
    )
    day, night_trace = (
        json.loads(report_ok(log, "-f", "chrome")),
        json.loads(report_ok(night, "-f", "chrome")),
    )
    assert [(e["name"], e["ts"], e["dur"]) for e in assert_nested(day)] == [
        (e["name"], e["ts"], e["dur"]) for e in assert_nested(night_trace)
    ]


# -- the sample logs in fixtures/logs (written by real runs) --------------------------------------
def test_fixture_logs_read_in_every_format():
    # Named .txt so that they are kept in git (which ignores *.log): the reader goes by content.
    logs = sorted(LOGS.glob("*.txt"))
    assert len(logs) == 3
    for log in logs:
        for form in ("summary", "tree", "importtime"):
            assert report_ok(log, "-f", form).strip(), (log, form)
        assert_nested(json.loads(report_ok(log, "-f", "chrome")))
    summary = report_ok(LOGS / "hung-dlopen.txt")
    assert "still in flight when the log ends: hangpkg > hangpkg.slow > hangpkg._kernels > dlopen " in summary


# -- bad input ----------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("content", "args", "says"),
    [
        (None, [], "cannot read"),
        (b"", [], "is empty"),
        (b"\x7fELF\x02\x01\x01\x00\x00\x00" * 20, [], "binary"),
        (b"hello\nthis is a build log\n[other-tool 12 10:00:00.000] > x\n", [], "not an importwatch log"),
        (b'{"kind": "import"}\n{"pid": 3}\n', [], "not an importwatch log"),
        (
            b'{"kind": "import", "pid": "x", "time": 1}\n{"kind": "import", "pid": 1, "time": "noon"}\n',
            [],
            "not an",
        ),
        (b"[importwatch 1 10:00:00.000] > x\n", ["--format", "xml"], "unknown --format 'xml'"),
        (b"[importwatch 1 10:00:00.000] > x\n", ["--min-ms", "lots"], "--min-ms"),
        (b"[importwatch 1 10:00:00.000] > x\n", ["--pid", "2"], "no line from pid 2"),
        (b"[importwatch 1 10:00:00.000] > x\n", ["--bogus"], "--bogus"),
    ],
)
def test_bad_input_is_one_line_and_exit_2(tmp_path, content, args, says):
    log = tmp_path / "some.log"
    if content is not None:
        log.write_bytes(content)
    done = report(log, *args)
    assert done.returncode == 2
    assert done.stdout == ""
    assert done.stderr.count("\n") == 1 and done.stderr.startswith("importwatch: error: "), done.stderr
    assert says in done.stderr


def test_a_directory_is_bad_input(tmp_path):
    done = report(tmp_path)
    assert done.returncode == 2 and done.stderr.startswith("importwatch: error: cannot read")
    assert done.stderr.count("\n") == 1


# -- torch ---------------------------------------------------------------------------------------
@pytest.mark.torch
@pytest.mark.timeout(120)
def test_torch_importtime_round_trip(tmp_path):
    if sys.version_info[:2] != (3, 11):
        pytest.skip("the torch build here is for Python 3.11")
    pytest.importorskip("torch")
    log = tmp_path / "torch.log"
    assert trace(log, "-c", "import torch", cwd=tmp_path).returncode == 0
    ours = parse_importtime(report_ok(log, "-f", "importtime"))
    assert_same_shape(ours, cpython_importtime("import torch", tmp_path), least=500)
    assert [name for name, parent, *_ in ours if parent is None][-1] == "torch"
    assert "torch 2." in report_ok(log)
