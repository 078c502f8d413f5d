"""The C accelerator of the per-import hook (tracing/_speedups.c) against its pure-Python twin and plain python.

The same lines, byte for byte but for times; with the accelerator, a module body
sees the stack plain python gives it (tracebacks, inspect.stack(), recursion room);
the watchdog still reads the chain in flight; --version and doctor say which path
is active; and a build without a compiler still installs, pure Python.
"""

from __future__ import annotations

import importlib.util
import json
import random
import re
import shutil
import subprocess
import sys
import time
import zipfile
from collections import Counter
from pathlib import Path

import pytest

from cbuild import compile_extension
from helpers import ROOT, clean_env, deep_import_chain, importwatch, watchers_of
from importwatch.events.read import seconds_of_day
from test_side_by_side import MAIN_PROBE, _number, _ours_removed, three_ways

pytestmark = [pytest.mark.timeout(180), pytest.mark.slow]  # every test here starts processes

BUILT = importlib.util.find_spec("importwatch.tracing._speedups") is not None
needs_accelerator = pytest.mark.skipif(not BUILT, reason="the C accelerator is not built for this Python")
C = {"IMPORTWATCH_PURE": "0"}
PURE = {"IMPORTWATCH_PURE": "1"}
QUIET = ("--no-watcher", "--stderr", "none")
QUIET_ENV = {"IMPORTWATCH_STDERR": "none"}


def _runner(cwd: Path, **env: str) -> subprocess.CompletedProcess:
    """`python -m importwatch` (quiet) main.py in CWD."""
    return importwatch(*QUIET, "main.py", cwd=cwd, env=clean_env(**QUIET_ENV, **env))


def _tree(root: Path) -> None:
    """Nested imports, a module whose body fails, one that is missing, a non-ASCII name, and a thread."""
    files = {
        "pkg/__init__.py": "from pkg import sub\n",
        "pkg/sub.py": "import pkg.leaf\nimport json\n",
        "pkg/leaf.py": "X = 1\n",
        "café.py": "VALUE = 'crème'\n",
        "broken.py": "import pkg.leaf\nraise ValueError('bad crème')\n",
        "threaded.py": "import pkg.leaf\nimport csv\n",
        "main.py": (
            "import threading\nimport pkg\nimport café\n"
            "try:\n    import broken\nexcept ValueError:\n    pass\n"
            "try:\n    import missing_module\nexcept ImportError:\n    pass\n"
            "thread = threading.Thread(target=__import__, args=('threaded',), name='worker 1')\n"
            "thread.start()\nthread.join()\nprint('done')\n"
        ),
    }
    for name, text in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")


_STAMP = re.compile(rb"^\[importwatch \d+ \d\d:\d\d:\d\d\.\d\d\d", re.MULTILINE)
_MS = re.compile(rb"\d+\.\d\d\d ms\b")


def _masked(log: bytes) -> bytes:
    """A text log with pids, clock times and durations masked, byte for byte otherwise."""
    return _MS.sub(b"X ms", _STAMP.sub(b"[importwatch PID TIME", log))


def _json_masked(log: bytes) -> list[dict]:
    events = [json.loads(line) for line in log.splitlines()]
    for event in events:
        for key in ("time", "pid", "ms"):
            event.pop(key, None)
        if "text" in event:
            event["text"] = _MS.sub(b"X ms", event["text"].encode()).decode()
    return events


@needs_accelerator
@pytest.mark.parametrize("log_name", ["trace.log", "trace.jsonl"])
def test_the_accelerator_writes_the_pure_python_hook_s_lines_byte_for_byte(
    tmp_path: Path, log_name: str
) -> None:
    _tree(tmp_path)
    log = tmp_path / log_name  # one path for both: the start line names it
    logs, stderrs = {}, {}
    for name, env in (("C", C), ("pure", PURE)):  # the watcher on: its feed gets every line too
        run = importwatch("--log", str(log), "main.py", cwd=tmp_path, env=clean_env(**env), text=False)
        assert (run.returncode, run.stdout) == (0, b"done\n"), run.stderr
        logs[name], stderrs[name] = log.read_bytes(), run.stderr
        log.unlink()
    assert _masked(stderrs["C"]) == _masked(stderrs["pure"])
    if log_name.endswith(".jsonl"):
        events = _json_masked(logs["C"])
        assert {
            "thread": "MainThread",
            "kind": "import_end",
            "name": "café",
            "parent": None,
            "text": "< caf\\xe9 X ms",
        } in events
        assert events == _json_masked(logs["pure"])
    else:
        assert b"    < pkg.leaf " in logs["C"] and b"] > caf\\xe9\n" in logs["C"]
        assert b"] < broken X ms failed ValueError: bad cr\\xe8me\n" in _masked(logs["C"])
        assert b"missing_module" in logs["C"] and b"worker_1] > threaded\n" in logs["C"]
        assert _masked(logs["C"]) == _masked(logs["pure"])


_ROUTE_CHANGES = {
    "quiet0.py": "import quiet1\n",
    "quiet1.py": "X = 1\n",
    # The route changes inside an import: its start line went nowhere, its end line is logged.
    "switch.py": "import os\nimport importwatch\nimportwatch.install(log=os.environ['ROUTE_LOG'])\n",
    "logged0.py": "import logged1\n",
    "logged1.py": "X = 1\n",
    "loud0.py": "X = 1\n",
    "main.py": (
        "import os\nimport importwatch\nimport quiet0\nimport switch\nimport logged0\n"
        "os.environ['IMPORTWATCH_STDERR'] = 'all'\nimportwatch.install(log=os.environ['ROUTE_LOG'])\n"
        "import loud0\nprint('done')\n"
    ),
}


@pytest.mark.parametrize("env", [C, PURE], ids=["C", "pure"])
def test_a_route_changed_while_the_program_runs_takes_effect_at_the_next_line(
    tmp_path: Path, env: dict[str, str]
) -> None:
    # The C hook keeps where lines go between changes of the sink (_speedups_route.h): quiet lines
    # first, kept as going nowhere; then a log opened, inside an import; then every line to stderr.
    for name, text in _ROUTE_CHANGES.items():
        (tmp_path / name).write_text(text)
    log = tmp_path / "trace.log"
    run = subprocess.run(
        [sys.executable, "main.py"],
        cwd=tmp_path,
        env=clean_env(IMPORTWATCH="1", IMPORTWATCH_STDERR="stalls", ROUTE_LOG=str(log), **env),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert (run.returncode, run.stdout) == (0, "done\n"), run.stderr
    logged = log.read_text()
    assert "quiet" not in logged and "quiet" not in run.stderr
    assert "> switch" not in logged and re.search(r"\] < switch \d+\.\d{3} ms\n", logged), logged
    assert re.search(r"\]   > logged1\n", logged) and re.search(r"\] < logged0 \d", logged), logged
    assert "logged" not in run.stderr
    for text in (logged, run.stderr):
        assert "] > loud0\n" in text and re.search(r"\] < loud0 \d", text), text


@pytest.mark.parametrize("env", [C, PURE], ids=["C", "pure"])
def test_a_step_someone_still_holds_is_never_used_again_for_another_import(
    tmp_path: Path, env: dict[str, str]
) -> None:
    # The C hook uses an ended step again when nothing else holds it (keep_spare); this one is held.
    # grab's body imports nothing new, so no nested step has been put aside when grab's own ends.
    (tmp_path / "grab.py").write_text(
        "import _thread, gc, sys\nTracer = sys.modules['importwatch.tracing.hook'].Tracer\n"
        "tracer = next(o for o in gc.get_objects() if isinstance(o, Tracer))\n"
        "STEP = tracer.stacks[_thread.get_ident()][-1]\n"
    )
    for name in ("other0", "other1"):
        (tmp_path / f"{name}.py").write_text("X = 1\n")
    (tmp_path / "main.py").write_text(
        "import _thread, gc, sys\nimport grab\nimport other0\nimport other1\nprint(grab.STEP.name, grab.STEP.kind)\n"
    )
    run = subprocess.run(
        [sys.executable, "main.py"],
        cwd=tmp_path,
        env=clean_env(IMPORTWATCH="1", IMPORTWATCH_STDERR="none", **env),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert (run.returncode, run.stdout, run.stderr) == (0, "grab import\n", "")


@needs_accelerator
def test_the_accelerator_writes_durations_and_stamps_as_python_does(tmp_path: Path) -> None:
    from importwatch.tracing import _speedups

    # Durations: f"{ms:.3f}" rounds the exact binary value, a tie to the even digit; the C hook its own way.
    rng = random.Random(25)
    values = [0.0, 0.0005, 0.0015, 0.0625, 0.1875, 2.5, 999.9995, 1e-9, 123456.7890005, 1e11, 2e12]
    values += [k / 1024 for k in range(4096)] + [k * 0.0005 for k in range(4096)]
    values += [rng.uniform(0, 50) for _ in range(20000)] + [rng.expovariate(0.01) for _ in range(20000)]
    wrong = [ms for ms in values if _speedups.duration_text(ms) != f" {ms:.3f} ms"]
    assert wrong == [], wrong[:5]
    # Stamps: made in C within a second (new_stamp), by Sink._set_stamp at each new one; the log's must
    # read as the wall clock did, in order, to the millisecond.
    for index in range(300):
        (tmp_path / f"m{index}.py").write_text("x = 1\n")
    (tmp_path / "main.py").write_text("".join(f"import m{index}\n" for index in range(300)))
    log = tmp_path / "trace.log"
    before = time.time()
    run = importwatch("--no-watcher", "--log", str(log), "main.py", cwd=tmp_path, env=clean_env(**C))
    after = time.time()
    assert run.returncode == 0, run.stderr
    stamps = [
        seconds_of_day(match.group(1))
        for match in re.finditer(r"^\[importwatch \d+ (\d\d:\d\d:\d\d\.\d\d\d)\] [<>]", log.read_text(), re.M)
    ]
    assert len(stamps) >= 600, len(stamps)  # the 300 imports' lines, and the .pth lines' steps
    if time.localtime(before).tm_mday != time.localtime(after).tm_mday:
        pytest.skip("the run crossed a midnight")
    start = seconds_of_day(time.strftime("%H:%M:%S", time.localtime(before))) + before % 1
    assert stamps == sorted(stamps)
    assert start - 0.002 <= stamps[0] and stamps[-1] <= start + (after - before) + 0.002, (
        start,
        stamps[::100],
    )


@needs_accelerator
def test_top_level_imports_in_a_row_cost_neither_hook_a_python_call(tmp_path: Path) -> None:
    """A program's run of top-level imports: each is a thread's first step, within the cover the first
    one's deadline gives; after a quiet spell the heartbeat has left, and the next one must wake it."""
    for index in range(51):
        (tmp_path / f"m{index}.py").write_text("x = 1\n")
    # The watchdog's step_begins counted where the hook finds it (a profile function cannot see it: our
    # functions are hidden from the program's, test_trace_functions.py).
    (tmp_path / "main.py").write_text(
        "import time\nfrom importwatch.tracing import session\ncalls = []\n"
        "tracer = session.active().tracer\n"
        "def counted(step_begins):\n"
        "    def count(*args):\n        calls.append(1)\n        return step_begins(*args)\n"
        "    return count\n"
        "tracer.on_deadline = counted(tracer.on_deadline)\n"
        + "".join(f"import m{index}\n" for index in range(50))
        + "run = len(calls)\ntime.sleep(1.5)\n"
        "import m50\nprint(run, len(calls) - run)\n"
    )
    for path in (C, PURE):
        env = clean_env(IMPORTWATCH="1", IMPORTWATCH_STDERR="none", **path)
        run = subprocess.run(
            [sys.executable, "main.py"], cwd=tmp_path, env=env, capture_output=True, text=True
        )
        assert run.returncode == 0, run.stderr
        in_a_row, after_a_spell = map(int, run.stdout.split())
        assert in_a_row <= 2 and after_a_spell == 1, (path, run.stdout)


_FSTAT = re.compile(r"^(\d+) +(?:newfstatat|fstat)\((\d+), ")
# A path the program stats once its watcher runs: strace's lines after it are the ones counted.
COUNTED_FROM = "/importwatch-test-counted-from-here"
# Program text: say its pid, then wait for the test's word (given once the program's watcher runs).
AWAIT_GO = """import os, time
with open("pid.tmp", "w") as file:
    file.write(str(os.getpid()))
os.rename("pid.tmp", "pid")
while not os.path.exists("go"):
    time.sleep(0.01)
"""


# Per case: the runner's options, and how many descriptors of ours each top-level import looks at.
LOOKED_AT = {
    "every line": (("--stderr", "all"), 1),  # stderr's copy: the lines go there
    "quiet": (("--stderr", "stalls"), 1),  # stderr's copy: faulthandler's timer is armed with it
    "quiet, no watchdog": (("--stderr", "stalls", "--timeout", "0"), 0),
    "none": (("--stderr", "none"), 0),  # the timer dumps into /dev/null
}


@needs_accelerator
@pytest.mark.skipif(shutil.which("strace") is None, reason="counts system calls with strace")
@pytest.mark.parametrize("case", list(LOOKED_AT))
def test_a_top_level_import_looks_only_at_the_descriptors_lines_go_to(tmp_path: Path, case: str) -> None:
    """Each top-level import checks that stderr's copy of ours is still ours where something of ours would
    write there (its lines, or faulthandler's timer for a stall that holds the GIL), never the watcher's
    pipe: nothing is written to that, and the lock at the exit looks at it itself. Where nothing would,
    no import looks: what writes to stderr's copy, or arms the timer with it, looks first
    (tests/test_side_by_side.py holds that). While the watcher is starting every such import looks at
    all of ours (sink.check_descriptors), so the imports counted come once it runs: on a loaded
    machine its start can outlast fifty imports."""
    options, per_import_wanted = LOOKED_AT[case]
    for index in range(50):
        (tmp_path / f"m{index}.py").write_text("x = 1\n")
    (tmp_path / "warm.py").write_text("")
    (tmp_path / "main.py").write_text(
        AWAIT_GO
        + "import warm\n"  # the first step to find the watcher's start ended
        + f"os.path.exists({COUNTED_FROM!r})\n"
        + "".join(f"import m{index}\n" for index in range(50))
    )
    trace = tmp_path / "trace.txt"
    command = ["strace", "-f", "-qq", "-e", "trace=fstat,newfstatat", "-o", str(trace)]
    command += [sys.executable, "-m", "importwatch", "--watcher", *options, "main.py"]
    running = subprocess.Popen(
        command, cwd=tmp_path, env=clean_env(**C), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    try:
        pid_file = tmp_path / "pid"
        deadline = time.monotonic() + 30
        while not (pid_file.exists() and watchers_of(int(pid_file.read_text()))):
            assert time.monotonic() < deadline and running.poll() is None, "no watcher came"
            time.sleep(0.01)
        (tmp_path / "go").touch()
        _, err = running.communicate(timeout=60)
    finally:
        if running.poll() is None:
            running.kill()
            running.wait()
    assert running.returncode == 0, err
    program = pid_file.read_text()  # the main thread's lines: the heartbeat's looks are its own
    lines = [line for line in trace.read_text().splitlines() if line.split(maxsplit=1)[0] == program]
    counted = next(at for at, line in enumerate(lines) if COUNTED_FROM in line)
    ours = _ours_looked_at(lines)
    assert len(ours) >= 2, ours  # stderr's copy and the watcher's pipe, each looked at now and then
    per_import = [fd for fd, count in _ours_looked_at(lines[counted:]).items() if count >= 50]
    assert len(per_import) == per_import_wanted, ours  # stderr's copy at most; never the pipe


def _ours_looked_at(lines: list[str]) -> Counter:
    """How often each descriptor of ours was looked at in strace's LINES: ours sit just below 1024 (the
    program's module files come and go at 3)."""
    return Counter(int(found[2]) for found in map(_FSTAT.match, lines) if found and int(found[2]) > 512)


# The C hook's own writer hands these to Sink.emit, or meets them itself: the same bytes either way.
EDGES = {
    "unended stderr line": "import sys\nsys.stderr.write('Loading... ')\nsys.stderr.flush()\nimport pkg\n",
    "our descriptors closed": "import os\nos.closerange(3, 1024)\nimport pkg\nimport json\n",
    "stderr closed": "import os\nos.close(2)\nimport pkg\n",
}


@needs_accelerator
@pytest.mark.parametrize("edge", list(EDGES))
@pytest.mark.parametrize("stderr_mode", ["all", "stalls"])
def test_the_accelerator_s_writer_meets_closed_descriptors_and_unended_lines_as_emit_does(
    tmp_path: Path, edge: str, stderr_mode: str
) -> None:
    _tree(tmp_path)
    (tmp_path / "edge.py").write_text(EDGES[edge] + "print('done')\n")
    log = tmp_path / "trace.log"
    seen = {}
    for name, env in (("C", C), ("pure", PURE)):
        options = ("--no-watcher", "--stderr", stderr_mode, "--log", str(log))
        run = importwatch(*options, "edge.py", cwd=tmp_path, env=clean_env(**env), text=False)
        assert (run.returncode, run.stdout) == (0, b"done\n"), run.stderr
        seen[name] = (_masked(run.stderr), _masked(log.read_bytes()))
        log.unlink()
    assert seen["C"] == seen["pure"]
    stderr, logged = seen["C"]
    if edge == "our descriptors closed":  # the log's descriptor is gone: said once, stderr goes on
        assert stderr.count(b"closed or replaced the log file's descriptor") == 1, stderr
        assert b"> json" in stderr or stderr_mode == "stalls"
    else:
        assert b"> pkg\n" in logged and b"< pkg X ms" in logged
    if edge == "unended stderr line" and stderr_mode == "all":
        assert b"Loading... \n[importwatch PID TIME] > pkg\n" in stderr


# -- the stack a module body sees -------------------------------------------------------------
NESTED = {
    "outer.py": "import middle\n",
    "middle.py": "import inner\n",
    "inner.py": "import inspect\nprint('depth', len(inspect.stack()))\nraise KeyError('from inner')\n",
    "plugin.py": "x = 1\n",
    "again.py": (
        "import builtins, inspect\nif getattr(builtins, 'loaded_once', False):\n"
        "    print('depth', len(inspect.stack()))\n    raise KeyError('from inner')\nbuiltins.loaded_once = True\n"
    ),
}
# How a program gets to a module body: the last four through a door of doors.py (a loader class's
# exec_module once importlib.util has made a spec with it, runpy, importlib.reload).
BODIES = {
    "import": "import outer\n",
    "import_module": "import importlib\nimportlib.import_module('outer')\n",
    "after spec_from_file_location": (
        "import importlib.util\nspec = importlib.util.spec_from_file_location('plugin', 'plugin.py')\n"
        "importlib.util.module_from_spec(spec)\nimport outer\n"
    ),
    "run_path": "import runpy\nrunpy.run_path('outer.py')\n",
    "run_module": "import runpy\nrunpy.run_module('outer')\n",
    "reload": "import importlib, again\nimportlib.reload(again)\n",
}


@needs_accelerator
@pytest.mark.parametrize("main", list(BODIES.values()), ids=list(BODIES))
def test_with_the_accelerator_a_module_body_s_stack_and_traceback_are_plain_python_s(
    tmp_path: Path, main: str
) -> None:
    for name, text in NESTED.items():
        (tmp_path / name).write_text(text)
    (tmp_path / "main.py").write_text(main)
    runs = three_ways(["main.py"], tmp_path, runner_options=QUIET, **QUIET_ENV, **C)
    plain = runs["plain"]
    assert plain.returncode == 1 and "KeyError: 'from inner'" in plain.stderr, plain.stderr
    for name in ("runner", "IMPORTWATCH=1"):
        run = runs[name]
        assert (run.returncode, run.stdout) == (1, plain.stdout), name
        assert _ours_removed(run.stderr) == plain.stderr, name
    if main in (BODIES["import"], BODIES["import_module"]):
        # The pure-Python hook adds one frame per import in flight (three here), named as importlib's own.
        pure = _runner(tmp_path, **PURE)
        plain_depth = int(plain.stdout.split()[1])
        assert pure.stdout == f"depth {plain_depth + 3}\n", pure.stderr


# A C extension whose init imports a Python module, as numpy's and torch's do: that body runs below the native
# load (its dlopen and init), where importwatch names the file in a frame of its own.
IMPORTING_EXTENSION = r"""
#include <Python.h>
static struct PyModuleDef definition = {PyModuleDef_HEAD_INIT, MODULE_NAME, NULL, -1, NULL};
PyMODINIT_FUNC PyInit_importer(void) {
    PyObject *imported = PyImport_ImportModule(getenv("IMPORTER_IMPORTS"));
    if (imported == NULL) {
        return NULL;
    }
    Py_DECREF(imported);
    return PyModule_Create(&definition);
}
"""


@needs_accelerator
@pytest.mark.parametrize("imports", ["outer", "depth_probe"])
def test_a_body_an_extension_s_init_imports_has_one_frame_more_than_plain_python_gives_it(
    tmp_path: Path, imports: str
) -> None:
    """Below a module body that an extension module's init imports, the native load has one frame of
    ours: the one that names the file in faulthandler's dump of a hung load (three before the load's
    wrapper became a door). The traceback of an error raised there is plain python's."""
    for name, text in NESTED.items():
        (tmp_path / name).write_text(text)
    (tmp_path / "depth_probe.py").write_text(MAIN_PROBE.split("\n\n", 1)[1])  # frames, then the deepest call
    (tmp_path / "importer.c").write_text(IMPORTING_EXTENSION)
    compile_extension(tmp_path / "importer.c", tmp_path, "importer")
    (tmp_path / "main.py").write_text("import importer\n")
    runs = three_ways(["main.py"], tmp_path, runner_options=QUIET, IMPORTER_IMPORTS=imports, **QUIET_ENV, **C)
    plain = runs["plain"]
    assert plain.returncode == (1 if imports == "outer" else 0), plain.stderr
    key = "depth" if imports == "outer" else "frames"  # inner.py prints its frames as "depth"
    for name in ("runner", "IMPORTWATCH=1"):
        run = runs[name]
        assert run.returncode == plain.returncode and _ours_removed(run.stderr) == plain.stderr, name
        assert _number(run.stdout, key) == _number(plain.stdout, key) + 1, (name, run.stdout, plain.stdout)
        if imports == "depth_probe":  # the frame, and the call into the load that the frame makes
            assert 1 <= _number(plain.stdout, "depth") - _number(run.stdout, "depth") <= 2, (name, run.stdout)
    # The pure-Python twin: its hook's frame per import in flight (four), and the load's door and named frame.
    pure = _runner(tmp_path, IMPORTER_IMPORTS=imports, **PURE)
    added = 6 if imports == "outer" else 4
    assert _number(pure.stdout, key) == _number(plain.stdout, key) + added, pure.stdout


@needs_accelerator
def test_with_the_accelerator_nested_imports_reach_as_deep_as_under_plain_python(tmp_path: Path) -> None:
    deep_import_chain(tmp_path)
    runs = three_ways(["main.py"], tmp_path, runner_options=QUIET, **QUIET_ENV, **C)
    plain = runs["plain"]
    assert plain.returncode == 0 and int(plain.stdout) > 10, plain.stderr
    for name in ("runner", "IMPORTWATCH=1"):
        assert (runs[name].returncode, runs[name].stdout) == (0, plain.stdout), (name, runs[name].stderr)
    pure = _runner(tmp_path, **PURE)
    assert pure.returncode == 0 and int(pure.stdout) < int(plain.stdout), pure.stderr


@needs_accelerator
def test_a_door_calls_enter_and_leave_around_the_function_and_passes_its_outcome_through() -> None:
    from importwatch.tracing import _speedups

    seen: list = []

    def original(*args, **kwargs):
        seen.append(("original", args, kwargs))
        if kwargs.get("fail"):
            raise KeyError("from the function")
        return "result"

    def enter(*args, **kwargs):
        seen.append(("enter", args, kwargs))
        return None if kwargs.get("plain") else "token"

    def leave(token, error):
        seen.append(("leave", token, type(error).__name__))
        if isinstance(error, KeyError) and error.args == ("leave fails",):
            raise RuntimeError("from leave")

    door = _speedups.door(original, enter, leave, None)
    assert door(1, x=2) == "result"
    assert seen == [("enter", (1,), {"x": 2}), ("original", (1,), {"x": 2}), ("leave", "token", "NoneType")]
    seen.clear()
    assert door(plain=True) == "result" and [step[0] for step in seen] == ["enter", "original"]
    seen.clear()
    with pytest.raises(KeyError, match="from the function") as failed:
        door(fail=True)
    assert seen[-1] == ("leave", "token", "KeyError") and failed.value.__traceback__ is not None

    def failing(*args):
        raise KeyError("leave fails")

    with pytest.raises(RuntimeError, match="from leave") as ours:
        _speedups.door(failing, enter, leave, None)()
    assert isinstance(ours.value.__context__, KeyError)  # as from a finally clause

    class Loader:
        exec_module = door

    seen.clear()
    loader = Loader()
    assert loader.exec_module("module") == "result" and seen[1] == ("original", (loader, "module"), {})
    assert Loader.exec_module is door  # read from the class, not bound

    # A door that chooses (a native load's): ENTER names the function called in ORIGINAL's place.
    def chosen(*args, **kwargs):
        seen.append(("chosen", args, kwargs))
        return "chosen"

    choices = iter([("token", chosen), None, "no pair"])
    choosing = _speedups.door(original, lambda *args, **kwargs: next(choices), leave, None, True, True)
    seen.clear()
    assert choosing(3, y=4) == "chosen"
    assert seen == [("chosen", (3,), {"y": 4}), ("leave", ("token", chosen), "NoneType")]
    seen.clear()
    assert choosing(5) == "result" and seen == [("original", (5,), {})]  # None: no event, the original
    with pytest.raises(TypeError, match="returns None or"):
        choosing(6)


# -- the watchdog reads the chain the C hook keeps -----------------------------------------------
@needs_accelerator
def test_a_stall_under_the_accelerator_is_reported_with_its_chain(tmp_path: Path) -> None:
    for name, text in {"outer.py": "import middle\n", "middle.py": "import sleepy\n"}.items():
        (tmp_path / name).write_text(text)
    (tmp_path / "sleepy.py").write_text("import time\ntime.sleep(2.5)\n")
    result = importwatch("--timeout", "1", "-c", "import outer", env=clean_env(PYTHONPATH=str(tmp_path), **C))
    assert result.returncode == 0, result.stderr
    stall = next(line for line in result.stderr.splitlines() if "STALL" in line)
    assert "MainThread: outer (loading" in stall
    assert "> middle (loading" in stall and "> sleepy (loading" in stall
    # Resumed after the sleep's 2.5 s, or later when the watcher's look held the process for a while.
    assert "RESUMED after " in result.stderr and "sleepy ended" in result.stderr


# -- which path is active -----------------------------------------------------------------------
@pytest.mark.parametrize(
    ("env", "words"),
    [
        (C, "C accelerator" if BUILT else "the C accelerator is not built"),
        (PURE, "pure Python (IMPORTWATCH_PURE is set)"),
    ],
    ids=["default", "pure"],
)
def test_version_and_doctor_name_the_hot_path(env: dict[str, str], words: str) -> None:
    version = importwatch("--version", env=clean_env(**env))
    assert version.returncode == 0 and version.stdout.startswith("importwatch ")
    assert "(hot path: " in version.stdout and words in version.stdout, version.stdout
    doctor = importwatch("doctor", "--json", env=clean_env(**env))
    assert words in json.loads(doctor.stdout)["hot_path"]


# -- the build ----------------------------------------------------------------------------------
def _wheel(out: Path, **env: str) -> subprocess.CompletedProcess:
    pytest.importorskip("hatchling")
    return subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-v", "-w", str(out), str(ROOT)],
        capture_output=True, text=True, env=clean_env(**env), timeout=300,
    )  # fmt: skip


@needs_accelerator
def test_the_wheel_carries_the_accelerator_and_is_tagged_for_this_python(tmp_path: Path) -> None:
    assert _wheel(tmp_path).returncode == 0
    wheel = next(tmp_path.glob("importwatch-*.whl"))
    tag = f"cp{sys.version_info[0]}{sys.version_info[1]}"
    assert f"-{tag}-{tag}-" in wheel.name and "linux" in wheel.name, wheel.name
    names = zipfile.ZipFile(wheel).namelist()
    assert any(re.fullmatch(r"importwatch/tracing/_speedups\..*\.so", name) for name in names), names


def test_without_a_compiler_the_wheel_is_pure_python_and_says_so_in_one_line(tmp_path: Path) -> None:
    built = _wheel(tmp_path, CC="/bin/false")
    assert built.returncode == 0, built.stderr
    said = [line for line in (built.stdout + built.stderr).splitlines() if "C accelerator not built" in line]
    assert len(said) == 1, built.stdout + built.stderr
    wheel = next(tmp_path.glob("importwatch-*.whl"))
    assert wheel.name.endswith("-py3-none-any.whl"), wheel.name
    assert not [name for name in zipfile.ZipFile(wheel).namelist() if name.endswith(".so")]
