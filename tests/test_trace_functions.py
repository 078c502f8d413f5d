"""A program's trace and profile functions (a debugger, `trace`, a coverage tool, a profiler) see what they
see under plain python, side by side (plain, runner, IMPORTWATCH=1): with the C accelerator none of
importwatch's functions, in the program's threads or in ours, and every one of the program's own."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

import importwatch
from helpers import clean_env
from test_accelerator import BUILT, C
from test_side_by_side import RUNNER

pytestmark = [
    pytest.mark.timeout(180),
    pytest.mark.slow,  # every test here starts processes
    pytest.mark.skipif(
        not BUILT, reason="the C accelerator hides our functions; the pure twin cannot (limits.md)"
    ),
]

# What pdb prints where it stops: "> FILE(LINE)FUNCTION()", the value a return gives left out (an address).
_STOP = re.compile(r"> (.*?\(\d+\)[^(]*)\(\)")
# Our files, by where they are: the word importwatch alone would match a venv's path that holds it too.
_OUR_FILES = (os.path.join(os.path.dirname(importwatch.__file__), ""), "_importwatch_boot.py")


def _ours(text: str) -> bool:
    """Whether TEXT (a stop, a seen call) names a file of ours, or the frame that names a native load."""
    return " dlopen " in text or any(mark in text for mark in _OUR_FILES)


def _ways(args: list[str]) -> dict[str, tuple[list[str], dict[str, str]]]:
    quiet = {"IMPORTWATCH_STDERR": "none", **C}
    return {
        "plain": ([sys.executable, *args], clean_env(**C)),
        "runner": ([*RUNNER, "--stderr", "none", *args], clean_env(**C)),
        "IMPORTWATCH=1": ([sys.executable, *args], clean_env(IMPORTWATCH="1", **quiet)),
    }


def test_a_debuggers_steps_through_a_native_import_stop_where_they_stop_under_plain_python(
    tmp_path: Path,
) -> None:
    """pdb's `step`, 1,500 times from `import _csv`: through importlib's frames, the finders, the
    extension's load. importwatch's hook, its doors and its native load's wrapper (which read the file's
    ELF facts and write the lines) run in that thread in between; the debugger never stops in them."""
    (tmp_path / "prog.py").write_text("import _csv\nprint('done')\n")
    commands = "s\n" * 1500 + "c\n"
    stops = {}
    for name, (command, env) in _ways(["-m", "pdb", "prog.py"]).items():
        run = subprocess.run(
            command, cwd=tmp_path, env=env, input=commands, capture_output=True, text=True, timeout=120
        )
        assert run.returncode == 0, (name, run.stderr[-2000:])
        stops[name] = _STOP.findall(run.stdout)
        assert len(stops[name]) > 1000, (name, run.stdout[-2000:])
        assert not [stop for stop in stops[name] if _ours(stop)], name
    assert any("create_module" in stop for stop in stops["plain"])  # it got as far as the load
    assert stops["runner"] == stops["plain"]
    assert stops["IMPORTWATCH=1"] == stops["plain"]


# Every kind of call a program's tool can be told of, around every place where importwatch runs
# Python in the program's threads: a thread's first import, native loads (the first one reads our
# facts modules), a ctypes load in a thread of the program's, a loader's body run by importlib.util
# (a door), runpy, site.addsitedir (a .pth line run as a step), a fork (our fork hooks, and the child's
# first import starting it), the exit, and a
# spell in which our heartbeat beats (3.12 on: settrace_all_threads and sys.monitoring reach it).
TOOLS_PROGRAM = """
import os, sys, threading, time
seen = []
def note(kind, code):
    seen.append(f"{kind} {code.co_filename} {code.co_name}")
def tracer(frame, event, arg):
    if event == "call":
        note("trace", frame.f_code)
    return tracer
def profiler(frame, event, arg):
    if event == "call":
        note("profile", frame.f_code)
monitoring = getattr(sys, "monitoring", None)
if monitoring is not None:
    monitoring.use_tool_id(monitoring.PROFILER_ID, "test")
    monitoring.register_callback(
        monitoring.PROFILER_ID, monitoring.events.PY_START, lambda code, offset: note("monitor", code)
    )
    monitoring.set_events(monitoring.PROFILER_ID, monitoring.events.PY_START)
sys.settrace(tracer); threading.settrace(tracer); sys.setprofile(profiler); threading.setprofile(profiler)
import json, decimal
import importlib.util
spec = importlib.util.spec_from_file_location("plug", os.path.abspath("plug.py"))
plug = importlib.util.module_from_spec(spec)
spec.loader.exec_module(plug)
import runpy
runpy.run_path("script.py")
import site
site.addsitedir(os.path.abspath("extra"))  # its .pth's import line: a step of ours
def work():
    import csv, ctypes
    ctypes.CDLL("libm.so.6")
worker = threading.Thread(target=work); worker.start(); worker.join()
if hasattr(threading, "settrace_all_threads"):
    threading.settrace_all_threads(tracer)
time.sleep(0.4)
import email.parser
def write(name):
    with open(name, "w") as out:
        out.write("\\n".join(seen) + "\\n")
pid = os.fork()
if pid == 0:
    import wave
    write("seen-child.txt")
    os._exit(0)
os.waitpid(pid, 0)
write("seen.txt")
"""


_PROGRAMS_FILES = ("main.py", "plug.py", "script.py", "pthmod.py")


def test_trace_and_profile_functions_see_none_of_ours_and_all_of_the_programs(tmp_path: Path) -> None:
    (tmp_path / "plug.py").write_text("def hello():\n    return 'plug'\nVALUE = hello()\n")
    (tmp_path / "script.py").write_text("def inner():\n    return 2\nRESULT = inner()\n")
    (tmp_path / "main.py").write_text(TOOLS_PROGRAM)
    (tmp_path / "extra").mkdir()
    (tmp_path / "extra" / "more.pth").write_text("import pthmod\n")
    (tmp_path / "extra" / "pthmod.py").write_text("def made():\n    return 1\nMADE = made()\n")
    programs = {}
    for name, (command, env) in _ways(["main.py"]).items():
        run = subprocess.run(command, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
        assert run.returncode == 0, (name, run.stderr[-2000:])
        seen = [
            line
            for file in ("seen.txt", "seen-child.txt")
            for line in (tmp_path / file).read_text().splitlines()
        ]
        assert len(seen) > 1000, name
        ours = [line for line in seen if _ours(line)]
        assert ours == [], (name, len(ours), sorted(set(ours))[:20])
        programs[name] = [line for line in seen if Path(line.split()[1]).name in _PROGRAMS_FILES]
    assert {"trace", "profile"} <= {line.split()[0] for line in programs["plain"]}
    assert any(line.endswith(" inner") for line in programs["plain"])  # runpy's script, seen
    assert any(line.endswith(" work") for line in programs["plain"])  # the program's thread, seen
    assert any(line.endswith(" made") for line in programs["plain"])  # a .pth line's import, seen
    assert programs["runner"] == programs["plain"]
    assert programs["IMPORTWATCH=1"] == programs["plain"]


# A project as coverage.py measures it: a package with branches taken in the main thread and in a thread
# of the program's, between native loads (ours run around each) and a ctypes load.
_COVERED = {
    "pkg/__init__.py": "from pkg.branchy import choose\n",
    "pkg/branchy.py": (
        "def choose(value):\n"
        "    if value > 0:\n        return 'up'\n"
        "    elif value < 0:\n        return 'down'\n"
        "    return 'flat'\n"
    ),
    "prog.py": (
        "import json, _csv, decimal, threading\n"
        "import pkg\n"
        "pkg.choose(1)\n"
        "def work():\n"
        "    import csv, ctypes\n"
        "    ctypes.CDLL('libm.so.6')\n"
        "    pkg.choose(-1)\n"
        "worker = threading.Thread(target=work)\nworker.start()\nworker.join()\n"
    ),
}
_CORES = ["ctrace", "pytrace"] + (["sysmon"] if sys.version_info >= (3, 12) else [])


@pytest.mark.parametrize("core", _CORES)
def test_coverage_measures_the_program_as_under_plain_python_and_none_of_ours(
    tmp_path: Path, core: str
) -> None:
    pytest.importorskip("coverage")
    for name, text in _COVERED.items():
        (tmp_path / name).parent.mkdir(exist_ok=True)
        (tmp_path / name).write_text(text)
    reports = {}
    for name, (command, env) in _ways(["-m", "coverage", "run", "--branch", "prog.py"]).items():
        env = {**env, "COVERAGE_CORE": core, "COVERAGE_FILE": str(tmp_path / f".coverage-{len(reports)}")}
        run = subprocess.run(command, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
        assert run.returncode == 0, (name, run.stderr[-2000:])
        report = tmp_path / f"coverage-{len(reports)}.json"
        subprocess.run(
            [sys.executable, "-m", "coverage", "json", "-o", str(report)],
            cwd=tmp_path, env=clean_env(COVERAGE_FILE=env["COVERAGE_FILE"]), check=True, capture_output=True,
        )  # fmt: skip
        files = json.loads(report.read_text())["files"]
        reports[name] = {
            file: {key: measured[key] for key in _MEASURED} for file, measured in sorted(files.items())
        }
    assert sorted(reports["plain"]) == ["pkg/__init__.py", "pkg/branchy.py", "prog.py"], reports["plain"]
    assert reports["plain"]["pkg/branchy.py"]["missing_lines"] == [6]  # both branches taken, in two threads
    assert reports["runner"] == reports["plain"]
    assert reports["IMPORTWATCH=1"] == reports["plain"]


_MEASURED = ("executed_lines", "missing_lines", "excluded_lines", "executed_branches", "missing_branches")
