"""The other doors into the import system: modules still initialising in another thread, module locks
inherited through a fork, LazyLoader, bodies run by a loader outside an import, and how reports name
threads."""

from __future__ import annotations

import importlib.util
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

from helpers import clean_env, importwatch, traced

pytestmark = [pytest.mark.timeout(90), pytest.mark.slow]


def _files(root: Path, files: dict[str, str]) -> Path:
    for relative, source in files.items():
        path = root / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(source)
    return root


def _report_block(stderr: str, number: int = 0) -> list[str]:
    """The lines of the NUMBER-th stall report, from its STALL line to its dump's header."""
    lines = stderr.splitlines()
    starts = [i for i, line in enumerate(lines) if "] STALL " in line]
    start = starts[number]
    end = next(i for i in range(start, len(lines)) if lines[i].startswith("Stacks of the program's threads"))
    return lines[start:end]


def _summary(log: Path) -> str:
    result = importwatch("report", str(log))
    assert result.returncode == 0, result.stderr
    return result.stdout


# -- a module another thread is still initialising -------------------------------------------
WARMUP = """\
import threading
def warm():
    import a
t = threading.Thread(target=warm, name="warmup")
t.start()
t.join()
"""


def test_thread_waiting_for_a_module_its_starter_initialises_is_a_named_deadlock(tmp_path: Path) -> None:
    """Module a starts thread warmup, which imports a, then joins it: neither can go on."""
    root = _files(tmp_path / "pkgs", {"a.py": WARMUP})
    log = tmp_path / "trace.log"
    result = importwatch(
        "--timeout", "1", "--exit-on-stall", "--no-watcher", "--log", str(log), "-c", "import a",
        env=clean_env(PYTHONPATH=str(root)),
    )  # fmt: skip
    assert result.returncode == 1, result.stderr
    stderr = result.stderr
    assert " warmup] > a\n" in stderr  # the wait has its own start line, on its own thread
    report = "\n".join(_report_block(stderr))
    stall = _report_block(stderr)[0]
    assert "MainThread: a (loading" in stall and "waiting for its module lock: warmup" in stall
    assert "warmup: a (waiting for the module lock held by MainThread, " in report
    assert (
        "context: deadlock: MainThread holds the module lock of a and waits in Thread.join for warmup"
        in report
    )
    # Both threads of the stacks that follow, by name, the stalled one first.
    named = re.findall(r"^Thread (\S+):", stderr, re.M)
    assert named[:2] == ["MainThread", "warmup"], stderr
    summary = _summary(log)
    assert "with in flight: MainThread: a; warmup: a" in summary
    assert (
        "    on warmup, the innermost since" in summary
        and "    on MainThread, the innermost since" in summary
    )
    assert "context: deadlock: MainThread holds the module lock of a" in summary


def test_main_thread_waiting_for_a_background_import_is_in_the_stall_line(tmp_path: Path) -> None:
    root = _files(tmp_path / "pkgs", {"slowmod.py": "import time\ntime.sleep(2.4)\n"})
    code = (
        "import threading, time\n"
        "t = threading.Thread(target=__import__, args=('slowmod',), name='bg-loader')\n"
        "t.start(); time.sleep(0.3)\n"
        "import slowmod\n"
        "t.join()\n"
    )
    result = importwatch("--timeout", "1", "--no-watcher", "-c", code, env=clean_env(PYTHONPATH=str(root)))
    assert result.returncode == 0, result.stderr
    stderr = result.stderr
    assert " bg-loader] > slowmod\n" in stderr and "] > slowmod\n" in stderr.replace(
        " bg-loader] > slowmod", ""
    )
    stall = _report_block(stderr)[0]
    assert "bg-loader: slowmod (loading" in stall and "waiting for its module lock: MainThread" in stall
    report = "\n".join(_report_block(stderr))
    assert "MainThread: slowmod (waiting for the module lock held by bg-loader, " in report
    assert "deadlock" not in report  # the holder is loading, not waiting for the waiter
    assert "RESUMED after" in stderr and "< slowmod" in stderr


def test_circular_import_in_one_thread_is_no_wait() -> None:
    """A package whose submodule imports the package while it initialises: no extra event."""
    result = importwatch("--no-watcher", "-c", "import json")
    assert result.returncode == 0, result.stderr
    assert result.stderr.count("> json\n") == 1 and "STALL" not in result.stderr


# -- a module lock inherited through a fork ----------------------------------------------------
FORKER = """\
import os, threading, time
t = threading.Thread(target=__import__, args=("slowinit",), name="prefetch")
t.start(); time.sleep(0.3)
pid = os.fork()
if pid == 0:
    import slowinit
    os._exit(0)
_, status = os.waitpid(pid, 0)
print("child", pid, "status", os.waitstatus_to_exitcode(status), flush=True)
"""


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork")
def test_fork_child_waiting_for_a_lock_held_by_a_lost_thread_is_told_it_never_resolves(
    tmp_path: Path,
) -> None:
    root = _files(tmp_path / "pkgs", {"slowinit.py": "import time\ntime.sleep(0.9)\n", "forker.py": FORKER})
    result = importwatch(
        "--timeout", "1.5", "--exit-on-stall", "--no-watcher", str(root / "forker.py"),
        env=clean_env(PYTHONPATH=str(root)),
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    child, status = re.search(r"child (\d+) status (-?\d+)", result.stdout).groups()
    assert status == "1", result.stdout + result.stderr  # ended by --exit-on-stall
    parent = re.search(r"\[importwatch (\d+) ", result.stderr).group(1)
    mine = "\n".join(line for line in result.stderr.splitlines() if line.startswith(f"[importwatch {child} "))
    assert f"fork child of {parent}" in mine and "] > slowinit" in mine
    assert (
        f"MainThread: slowinit (waiting for the module lock held by prefetch in the parent {parent}, "
        "lost in the fork" in mine
    )
    assert "was lost in the fork" in mine and "this will never resolve" in mine
    assert "exiting with status 1 (--exit-on-stall)" in mine


# -- LazyLoader and __getattr__ -----------------------------------------------------------------
LAZY = """\
import importlib.util, sys
import importwatch
def lazy_import(name):
    spec = importlib.util.find_spec(name)
    loader = importlib.util.LazyLoader(spec.loader)
    spec.loader = loader
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    loader.exec_module(module)
    return module
lazymod = lazy_import("lazymod")
importwatch.checkpoint("created")
print(lazymod.VALUE)
import pkg
print(pkg.sub.WHO)
"""


def test_lazy_module_body_is_an_event_when_it_runs(tmp_path: Path) -> None:
    root = _files(
        tmp_path / "pkgs",
        {
            "lazymod.py": "import colorsys\nimport time\ntime.sleep(1.6)\nVALUE = 7\n",
            "pkg/__init__.py": (
                "import importlib\n"
                "def __getattr__(name):\n"
                "    return importlib.import_module('.' + name, __name__)\n"
            ),
            "pkg/sub.py": "WHO = 'sub'\n",
            "main.py": LAZY,
        },
    )
    log = tmp_path / "trace.log"
    result = importwatch(
        "--timeout", "1", "--no-watcher", "--log", str(log), str(root / "main.py"),
        env=clean_env(PYTHONPATH=str(root)),
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert result.stdout == "7\nsub\n"
    lines = [line.split("] ", 1)[1] for line in result.stderr.splitlines() if line.startswith("[importwatch")]
    body = lines.index("> lazymod")
    assert lines.index("checkpoint created") < body  # nothing ran when the module was made
    assert lines[body + 1] == "  > colorsys" and lines.count("> lazymod") == 1
    assert any(line.startswith("< lazymod ") for line in lines[body:])
    stall = _report_block(result.stderr)[0]
    assert "MainThread: lazymod (loading" in stall
    assert "> pkg.sub" in lines  # a lazy submodule by __getattr__ is a plain import
    summary = _summary(log)
    assert "lazymod" in summary and "STALL" in summary


# -- bodies run by a loader, whoever asked ------------------------------------------------------
DIRECT = """\
import importlib, importlib.util, runpy, sys
spec = importlib.util.spec_from_file_location("direct_mod", sys.argv[1] + "/direct.py")
module = importlib.util.module_from_spec(spec)
spec.loader.exec_module(module)
runpy.run_path(sys.argv[1] + "/script.py")
runpy.run_module("viarunpy")
import plain
importlib.reload(plain)
"""


def test_module_run_by_a_loader_outside_an_import_is_one_event(tmp_path: Path) -> None:
    root = _files(
        tmp_path / "pkgs",
        {
            "direct.py": "import colorsys\n",
            "script.py": "import fractions\n",
            "viarunpy.py": "import statistics\n",
            "plain.py": "import wave\n",
            "main.py": DIRECT,
        },
    )
    result = importwatch(
        "--no-watcher", str(root / "main.py"), str(root), env=clean_env(PYTHONPATH=str(root))
    )
    assert result.returncode == 0, result.stderr
    lines = [line.split("] ", 1)[1] for line in result.stderr.splitlines() if line.startswith("[importwatch")]
    direct = lines.index("> direct_mod")
    assert lines[direct + 1] == "  > colorsys"
    assert lines.count("> direct_mod") == 1
    run_path = lines.index("> <run_path>")
    assert "  > fractions" in lines[run_path:]
    assert lines.count("> viarunpy") == 1 and "  > statistics" in lines[lines.index("> viarunpy") :]
    # The import statement is one event (not one more for its exec_module), the reload another.
    assert lines.count("> plain") == 2 and lines.count("  > wave") == 1


SPEC_ONLY = """\
import importlib.machinery, importlib.util, sys, types
class Loader(importlib.machinery.SourceFileLoader):  # a loader class of the program's own
    def exec_module(self, module):
        print("own loader runs", module.__name__)
        super().exec_module(module)
for name, loader in (("bare", None), ("custom", Loader("custom", "custom.py"))):
    # The recipe without module_from_spec: only spec_from_file_location has seen the loader.
    spec = importlib.util.spec_from_file_location(name, name + ".py", loader=loader)
    module = types.ModuleType(name)
    module.__spec__ = spec
    spec.loader.exec_module(module)
    print(name, module.VALUE)
"""


@pytest.mark.parametrize("pure", ["0", "1"], ids=["C", "pure"])
def test_a_body_run_through_a_spec_alone_is_an_event_and_runs_as_plain(tmp_path: Path, pure: str) -> None:
    # spec_from_file_location watches the loader class before the call (the given loader's, else the
    # file loaders it chooses among): a module made by hand and run by spec.loader is still an event.
    _files(tmp_path, {"bare.py": "import colorsys\nVALUE = 1\n", "custom.py": "import wave\nVALUE = 2\n"})
    (tmp_path / "main.py").write_text(SPEC_ONLY)
    plain = subprocess.run([sys.executable, "main.py"], cwd=tmp_path, env=clean_env(), capture_output=True,
                           text=True, timeout=60)  # fmt: skip
    assert plain.returncode == 0 and plain.stdout == "bare 1\nown loader runs custom\ncustom 2\n", plain
    for command, env in (
        ([sys.executable, "main.py"], clean_env(IMPORTWATCH="1", IMPORTWATCH_PURE=pure)),
        (traced("--no-watcher", "main.py"), clean_env(IMPORTWATCH_PURE=pure)),
    ):
        run = subprocess.run(command, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=60)
        assert (run.returncode, run.stdout) == (0, plain.stdout), run.stderr
        lines = [
            line.split("] ", 1)[1] for line in run.stderr.splitlines() if line.startswith("[importwatch")
        ]
        for name, inner in (("bare", "colorsys"), ("custom", "wave")):
            assert lines.count(f"> {name}") == 1, run.stderr
            assert lines[lines.index(f"> {name}") + 1] == f"  > {inner}", run.stderr


def test_failed_body_run_by_a_loader_keeps_its_traceback(tmp_path: Path) -> None:
    root = _files(
        tmp_path / "pkgs",
        {
            "broken.py": "raise ValueError('broken body')\n",
            "main.py": (
                "import importlib.util, sys\n"
                "spec = importlib.util.spec_from_file_location('broken', sys.argv[1] + '/broken.py')\n"
                "spec.loader.exec_module(importlib.util.module_from_spec(spec))\n"
            ),
        },
    )
    plain = subprocess.run(
        [sys.executable, str(root / "main.py"), str(root)], capture_output=True, text=True, env=clean_env()
    )
    result = importwatch("--no-watcher", str(root / "main.py"), str(root))
    assert result.returncode == plain.returncode == 1
    assert "< broken " in result.stderr and "failed ValueError: broken body" in result.stderr
    ours = [line for line in result.stderr.splitlines() if not line.startswith("[importwatch")]
    assert ours[-1] == plain.stderr.splitlines()[-1] == "ValueError: broken body"
    assert "importwatch" not in "\n".join(ours)  # no frame of ours in the traceback


PYTEST_TEST = "import time\ntime.sleep(2.4)\n\ndef test_ok():\n    pass\n"


def test_pytest_importlib_mode_collection_stall_is_reported(tmp_path: Path) -> None:
    project = _files(tmp_path / "proj", {"conftest.py": "import colorsys\n", "test_blocks.py": PYTEST_TEST})
    result = subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "importwatch", "--import-mode=importlib", "-q",
         "-p", "no:cacheprovider", "test_blocks.py"],
        cwd=project, capture_output=True, text=True, timeout=60, env=clean_env(IMPORTWATCH_TIMEOUT="1"),
    )  # fmt: skip
    assert result.returncode == 0, result.stdout + result.stderr
    assert "1 passed" in result.stdout
    lines = [line.split("] ", 1)[1] for line in result.stderr.splitlines() if line.startswith("[importwatch")]
    assert lines.count("> conftest") == 1 and lines.count("> test_blocks") == 1
    stall = _report_block(result.stderr)[0]
    assert "MainThread: test_blocks (loading" in stall and "test_blocks.py" in stall


# -- reports: order and stacks ---------------------------------------------------------------------
def test_stall_report_is_whole_before_its_resumed_line(tmp_path: Path) -> None:
    """The import ends while the report looks at the thread's CPU (0.2 s): RESUMED waits for the report.

    It ends 0.15 s into the look when the heartbeat is on time, so a heartbeat up to that late
    (a loaded machine) still finds it in flight."""
    root = _files(tmp_path / "pkgs", {"brief.py": "import time\ntime.sleep(1.15)\n"})
    result = importwatch(
        "--timeout", "1", "--no-watcher", "-c", "import brief", env=clean_env(PYTHONPATH=str(root))
    )
    assert result.returncode == 0, result.stderr
    lines = result.stderr.splitlines()
    stall = next(i for i, line in enumerate(lines) if "] STALL " in line)
    resumed = next(i for i, line in enumerate(lines) if "] RESUMED " in line)
    dumped = next(i for i, line in enumerate(lines) if line.startswith("Stacks of the program's threads"))
    last_frame = max(i for i, line in enumerate(lines) if line.startswith("  File "))
    assert stall < dumped < last_frame < resumed, result.stderr


def test_gil_held_stall_with_a_log_says_on_stderr_where_the_dump_is(built: Path, tmp_path: Path) -> None:
    log = tmp_path / "trace.log"
    env = clean_env(PYTHONPATH=str(built), HANG_SECONDS="2")
    result = importwatch("--timeout", "1", "--no-watcher", "--log", str(log), "-c", "import hangext", env=env)
    assert result.returncode == 0, result.stderr
    assert "Timeout (" in log.read_text() and "Timeout (" not in result.stderr
    assert f"stacks dumped in {log}, not on this terminal" in result.stderr
    # The names of the threads faulthandler's dump gave by address only.
    assert re.search(r"\]\s+threads: 0x[0-9a-f]{16} (importwatch-heartbeat|MainThread), ", result.stderr)


def test_gil_held_hang_that_never_ends_has_said_on_stderr_where_the_dump_is(
    built: Path, tmp_path: Path, start
) -> None:
    """While dlopen holds the GIL nothing of ours can speak: the start line already said where."""
    log = tmp_path / "trace.log"
    proc = start(
        traced("--timeout", "1", "--no-watcher", "--log", str(log), "-c", "import hangext"),
        PYTHONPATH=str(built),
    )
    proc.wait_for("> dlopen ", timeout=30)
    deadline = time.monotonic() + 30
    while "Timeout (" not in log.read_text() and time.monotonic() < deadline:
        time.sleep(0.1)
    assert "Timeout (" in log.read_text()  # the stall was dumped, in the log only
    assert proc.process.poll() is None  # still hung
    start_line = next(line for line in proc.stderr.splitlines() if "] start python " in line)
    assert start_line.endswith(f" dumps={log}")


def test_gil_free_stall_with_a_log_shows_the_stacks_on_stderr_too(tmp_path: Path) -> None:
    root = _files(tmp_path / "pkgs", {"napping.py": "import time\ntime.sleep(1.5)\n"})
    log = tmp_path / "trace.log"
    env = clean_env(PYTHONPATH=str(root))
    result = importwatch("--timeout", "1", "--no-watcher", "--log", str(log), "-c", "import napping", env=env)
    assert result.returncode == 0, result.stderr
    for text in (result.stderr, log.read_text()):
        assert 'napping.py", line 2' in text and "Thread MainThread:" in text


# -- the watcher names stdin ------------------------------------------------------------------
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
def test_blocked_read_of_stdin_is_named_stdin(tmp_path: Path) -> None:
    _files(tmp_path, {"readin.py": "import sys\nsys.stdin.read()\n"})
    stderr = tmp_path / "stderr.txt"
    with open(stderr, "wb") as err:
        proc = subprocess.Popen(
            traced("--timeout", "1", "-c", "import readin"), cwd=tmp_path, stdin=subprocess.PIPE,
            stdout=subprocess.DEVNULL, stderr=err, env=clean_env(),
        )  # fmt: skip
        try:
            deadline = time.monotonic() + 20
            while "outside: MainThread (tid" not in stderr.read_text() and time.monotonic() < deadline:
                time.sleep(0.05)
        finally:
            proc.stdin.close()
            proc.wait(30)
    main = next(line for line in stderr.read_text().splitlines() if "outside: MainThread (tid" in line)
    assert "in read on stdin (fd 0): a pipe" in main, main


# -- what the wrapped functions look like to the program ------------------------------------------
WRAPPED_LOOK = """\
import importlib, importlib.util, importlib.machinery, inspect, runpy, sys
import _frozen_importlib as bootstrap, _frozen_importlib_external as external

spec = importlib.util.spec_from_file_location("plugin", "plugin.py")  # wraps its loader's class
module = importlib.util.module_from_spec(spec)
sys.modules["plugin"] = module
spec.loader.exec_module(module)
importlib.reload(module)
runpy.run_path("plugin.py")
runpy.run_module("plugin")
importlib.util.LazyLoader(spec.loader)
import _csv  # a native load through ExtensionFileLoader.create_module
for function, home in (
    (bootstrap._lock_unlock_module, bootstrap),
    (importlib.machinery.ExtensionFileLoader.create_module, external),
    (importlib.util.spec_from_file_location, external),
    (importlib.util.module_from_spec, bootstrap),
    (importlib.util.LazyLoader.exec_module, importlib.util),
    (type(spec.loader).exec_module, external),
    (importlib.reload, importlib),
    (runpy.run_path, runpy),
    (runpy.run_module, runpy),
):
    print(function.__module__, function.__name__, function.__qualname__, function.__globals__ is vars(home),
          inspect.signature(function), bool(function.__doc__))
# CPython's own test of spec_from_file_location reads its globals (test_importlib/test_spec.py).
print(importlib.util.spec_from_file_location.__globals__["SourceFileLoader"] is importlib.machinery.SourceFileLoader)
"""


def _side_by_side(tmp_path: Path, program: str, pure: str | None) -> dict[str, str]:
    """PROGRAM's output plain, under the runner and under IMPORTWATCH=1 (IMPORTWATCH_PURE=PURE where
    given), and with the pure-Python twin where PURE is None; addresses in reprs made alike."""
    _files(tmp_path, {"plugin.py": "x = 1\n", "main.py": program})
    chosen = {} if pure is None else {"IMPORTWATCH_PURE": pure}
    quiet = {"IMPORTWATCH": "1", "IMPORTWATCH_STDERR": "stalls"}
    modes = [
        ("plain", [sys.executable, "main.py"], clean_env()),
        ("runner", traced("--stderr", "stalls", "main.py"), clean_env(**chosen)),
        ("IMPORTWATCH=1", [sys.executable, "main.py"], clean_env(**quiet, **chosen)),
    ]
    if pure is None:
        modes.append(("pure", [sys.executable, "main.py"], clean_env(**quiet, IMPORTWATCH_PURE="1")))
    seen = {}
    for name, command, env in modes:
        run = subprocess.run(command, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=60)
        assert run.returncode == 0, (name, run.stderr)
        seen[name] = re.sub(r" at 0x[0-9a-f]+", " at 0x", run.stdout)  # a default's repr: an address
    return seen


def test_each_function_a_door_wraps_looks_to_the_program_as_under_plain_python(tmp_path: Path) -> None:
    seen = _side_by_side(tmp_path, WRAPPED_LOOK, pure=None)
    assert seen["plain"].endswith("True\n") and seen["plain"].count("\n") == 10, seen["plain"]
    assert all(output == seen["plain"] for output in seen.values()), seen


WRAPPED_USE = (
    WRAPPED_LOOK.split("for function, home in", 1)[0]
    + """\
import copy, pickle, typing, weakref
for function in (bootstrap._find_and_load, bootstrap._lock_unlock_module, importlib.util.spec_from_file_location,
                 importlib.util.module_from_spec, importlib.util.LazyLoader.exec_module,
                 type(spec.loader).exec_module, importlib.reload, runpy.run_path, runpy.run_module):
    again = pickle.loads(pickle.dumps(function))  # multiprocessing's way with a target, by reference
    print(function.__qualname__, again in (function, getattr(function, "__wrapped__", None)),
          copy.copy(function) is function, copy.deepcopy({"f": function})["f"] is function,
          weakref.ref(function)() is function,
          typing.get_type_hints(function), inspect.isroutine(function))
    for attribute in ("__code__", "__defaults__", "__kwdefaults__", "__annotations__", "__closure__"):
        print(" ", attribute, repr(getattr(function, attribute, "<none>")))
"""
)


@pytest.mark.skipif(
    importlib.util.find_spec("importwatch.tracing._speedups") is None, reason="no C accelerator"
)
def test_each_function_a_door_wraps_pickles_copies_and_reads_as_under_plain_python(tmp_path: Path) -> None:
    # pickle by reference (a multiprocessing or Ray target), copy and deepcopy (a config holding a
    # callable), a weak reference (a cache keyed by function), and the function's own attributes
    # (typing, dis, tools that read __code__): the C accelerator's doors and hook. The pure-Python
    # twin's are functions of ours (docs/doors.md says what differs).
    seen = _side_by_side(tmp_path, WRAPPED_USE, pure="0")
    assert seen["plain"].count(" True True True True ") == 9 and "<none>" not in seen["plain"], seen["plain"]
    assert all(output == seen["plain"] for output in seen.values()), seen


@pytest.mark.parametrize("pure", ["0", "1"], ids=["C", "pure"])
def test_a_wrapper_under_the_globals_of_the_function_it_stands_for_reads_none_of_its_own(
    tmp_path: Path, pure: str
) -> None:
    # Each Python wrapper reads only its closure and builtins: a global of ours would be looked up in the
    # module of the function it stands for. (The C accelerator's doors are no functions: no globals; the one
    # around create_module too, since a native load's wrapper is a door rather than a hidden function.)
    code = WRAPPED_LOOK.split("for function, home in", 1)[0] + (
        "import builtins, dis, types\n"
        "for function in (bootstrap._lock_unlock_module, importlib.machinery.ExtensionFileLoader.create_module,\n"
        "                 importlib.util.spec_from_file_location, importlib.util.module_from_spec,\n"
        "                 importlib.util.LazyLoader.exec_module, type(spec.loader).exec_module,\n"
        "                 importlib.reload, runpy.run_path, runpy.run_module):\n"
        "    assert hasattr(function, '__wrapped__'), function\n"
        "    code = getattr(function, '__code__', None)\n"  # a door's is the function's it stands for
        "    if code is None or code is getattr(function.__wrapped__, '__code__', None):\n"
        "        print(function.__qualname__, 'C')\n"
        "        continue\n"
        "    loaded = {i.argval for i in dis.get_instructions(code) if i.opname == 'LOAD_GLOBAL'}\n"
        "    print(function.__qualname__, sorted(name for name in loaded if not hasattr(builtins, name)))\n"
    )
    _files(tmp_path, {"plugin.py": "x = 1\n", "main.py": code})
    run = subprocess.run(
        [sys.executable, "main.py"], cwd=tmp_path, capture_output=True, text=True, timeout=60,
        env=clean_env(IMPORTWATCH="1", IMPORTWATCH_STDERR="stalls", IMPORTWATCH_PURE=pure),
    )  # fmt: skip
    assert run.returncode == 0, run.stderr
    lines = run.stdout.splitlines()
    assert len(lines) == 9 and all(line.endswith((" []", " C")) for line in lines), run.stdout
    functions = sum(line.endswith(" []") for line in lines)
    assert functions == (9 if pure == "1" else 0), run.stdout


@pytest.mark.skipif(
    importlib.util.find_spec("test.test_importlib") is None, reason="CPython's tests are not installed"
)
def test_cpython_s_own_tests_of_importlib_util_pass_traced(tmp_path: Path) -> None:
    command = [
        sys.executable,
        "-m",
        "unittest",
        "-q",
        "test.test_importlib.test_spec",
        "test.test_importlib.test_util",
    ]
    for name, env in (
        ("plain", clean_env()),
        ("IMPORTWATCH=1", clean_env(IMPORTWATCH="1", IMPORTWATCH_STDERR="stalls")),
    ):
        run = subprocess.run(command, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
        assert run.returncode == 0, (name, run.stderr[-3000:])
