"""A program runs the same traced as plain: plain python, `python -m importwatch` and IMPORTWATCH=1 side by side."""

from __future__ import annotations

import importlib.util
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from helpers import clean_env

pytestmark = [pytest.mark.timeout(120), pytest.mark.slow]

RUNNER = [sys.executable, "-m", "importwatch"]


def _ours_removed(stderr: str) -> str:
    return "".join(line for line in stderr.splitlines(True) if not line.startswith("[importwatch "))


def three_ways(
    args: list[str], cwd: Path, stdin: str | None = None, runner_options: tuple[str, ...] = (), **env: str
) -> dict[str, subprocess.CompletedProcess]:
    """ARGS (what follows `python`) run plain, under the runner and with IMPORTWATCH=1."""
    commands = {
        "plain": ([sys.executable, *args], clean_env(**env)),
        "runner": ([*RUNNER, *runner_options, *args], clean_env(**env)),
        "IMPORTWATCH=1": ([sys.executable, *args], clean_env(IMPORTWATCH="1", **env)),
    }
    return {
        name: subprocess.run(
            command, cwd=cwd, env=environ, input=stdin, capture_output=True, text=True, timeout=90
        )
        for name, (command, environ) in commands.items()
    }


# -- a module whose name is not ASCII ----------------------------------------------------------
def test_a_module_with_a_non_ascii_name_imports_as_plain(tmp_path: Path) -> None:
    (tmp_path / "café.py").write_text("VALUE = 'crème'\n", encoding="utf-8")
    (tmp_path / "main.py").write_text("import café\nprint(café.VALUE.upper())\n", encoding="utf-8")
    runs = three_ways(["main.py"], tmp_path, PYTHONIOENCODING="utf-8")
    for name, run in runs.items():
        assert (run.returncode, run.stdout) == (0, "CRÈME\n"), (name, run.stderr)
        assert _ours_removed(run.stderr) == "", name
    for name in ("runner", "IMPORTWATCH=1"):
        assert "] > caf\\xe9\n" in runs[name].stderr and "] < caf\\xe9 " in runs[name].stderr


# -- the stall threshold's range -----------------------------------------------------------------
@pytest.mark.parametrize("value", ["1e10", "1e-300", "604801", "0.05"])
def test_a_timeout_out_of_range_is_one_line_and_status_2(tmp_path: Path, value: str) -> None:
    result = subprocess.run(
        [*RUNNER, "--timeout", value, "-c", "print('ran')"],
        cwd=tmp_path, capture_output=True, text=True, env=clean_env(), timeout=60,
    )  # fmt: skip
    assert result.returncode == 2 and result.stdout == ""
    assert result.stderr == (
        f"importwatch: error: --timeout: expected 0 (off) or 0.1 to 604800 seconds (7 days), got '{value}'\n"
    )


@pytest.mark.parametrize("value", ["1e12", "1e-300"])
def test_a_timeout_variable_out_of_range_warns_once_and_uses_the_default(tmp_path: Path, value: str) -> None:
    (tmp_path / "some_module.py").write_text("X = 1\n")
    code = "import some_module; print('ran', some_module.X)"
    runs = three_ways(["-c", code], tmp_path, IMPORTWATCH_TIMEOUT=value)
    warning = (
        f"IMPORTWATCH_TIMEOUT: expected 0 (off) or 0.1 to 604800 seconds (7 days), got '{value}'; using 30"
    )
    assert runs["plain"].stdout == "ran 1\n"
    for name in ("runner", "IMPORTWATCH=1"):
        run = runs[name]
        assert (run.returncode, run.stdout) == (0, "ran 1\n"), (name, run.stderr)
        assert run.stderr.count(warning) == 1, run.stderr
        assert "Traceback" not in run.stderr


@pytest.mark.parametrize("value", ["0.1", "604800", "0"])
def test_the_ends_of_the_timeout_range_are_accepted(tmp_path: Path, value: str) -> None:
    (tmp_path / "some_module.py").write_text("X = 1\n")
    result = subprocess.run(
        [*RUNNER, "--timeout", value, "-c", "import some_module; print('ran')"],
        cwd=tmp_path, capture_output=True, text=True, env=clean_env(), timeout=60,
    )  # fmt: skip
    assert (result.returncode, result.stdout) == (0, "ran\n"), result.stderr
    assert "< some_module" in result.stderr


# -- __main__ as python makes it ----------------------------------------------------------------
MAIN_PROBE = """\
import sys
print("annotations", __annotations__)
print("builtins", type(__builtins__).__name__, __builtins__ is __import__("builtins"))
print("main builtins", type(sys.modules["__main__"].__builtins__).__name__)
print("globals", sorted(globals()))

import inspect

print("frames", len(inspect.stack()))


def depth(n=0):
    try:
        return depth(n + 1)
    except RecursionError:
        return n

print("depth", depth())
"""


def _number(output: str, key: str) -> int:
    return int(next(line for line in output.splitlines() if line.startswith(key + " ")).split()[1])


def _probe(tmp_path: Path, *args: str) -> str:
    return subprocess.run(
        [sys.executable, *args], cwd=tmp_path, capture_output=True, text=True, env=clean_env(), check=True
    ).stdout


@pytest.mark.parametrize("kind", ["script", "module", "code", "stdin"])
def test_main_is_python_s_own_with_no_more_frames_than_runpy_adds(tmp_path: Path, kind: str) -> None:
    (tmp_path / "probe.py").write_text(MAIN_PROBE)
    (tmp_path / "depth.py").write_text(MAIN_PROBE.split("\n\n", 1)[1])  # only the frames and the depth
    (tmp_path / "run_path.py").write_text("import runpy\nrunpy.run_path('depth.py', run_name='__main__')\n")
    args = {"script": ["probe.py"], "module": ["-m", "probe"], "code": ["-c", MAIN_PROBE], "stdin": ["-"]}[
        kind
    ]
    stdin = MAIN_PROBE if kind == "stdin" else None
    runs = three_ways(args, tmp_path, stdin=stdin)
    # What runpy puts below a program's first frame is the most the runner may add: `python -m
    # runpy MODULE` for a module; for a script, runpy.run_path, whose depth is the fair measure.
    plain_module, via_runpy = _probe(tmp_path, "-m", "probe"), _probe(tmp_path, "-m", "runpy", "probe")
    runpy_frames = _number(via_runpy, "frames") - _number(plain_module, "frames")
    if kind == "module":
        runpy_depth = _number(plain_module, "depth") - _number(via_runpy, "depth")
    else:
        runpy_depth = _number(_probe(tmp_path, "depth.py"), "depth") - _number(
            _probe(tmp_path, "run_path.py"), "depth"
        )
    assert runpy_frames > 0 and runpy_depth > 0
    plain = runs["plain"].stdout
    for name in ("runner", "IMPORTWATCH=1"):
        traced = runs[name].stdout
        assert runs[name].returncode == 0, runs[name].stderr
        for key in ("annotations", "builtins", "main builtins", "globals"):
            line = next(line for line in plain.splitlines() if line.startswith(key + " "))
            assert line in traced.splitlines(), (name, key, traced)
        added = _number(traced, "frames") - _number(plain, "frames")
        assert 0 <= added <= (runpy_frames if name == "runner" else 0), (name, traced)
        lost = _number(plain, "depth") - _number(traced, "depth")
        assert lost <= (runpy_depth if name == "runner" else 0), (name, lost, runpy_depth)


# -- the program from stdin ----------------------------------------------------------------------
STDIN_PROBE = """\
import sys
print("argv", sys.argv)
print("path0", repr(sys.path[0]))
print("file", repr(globals().get("__file__")), repr(globals().get("__cached__")))
print("loader", __loader__, "spec", __spec__, "package", __package__)
print("rest of stdin", repr(sys.stdin.read()))
raise SystemExit(3)
"""


def test_a_program_read_from_stdin_runs_as_python_minus_runs_it(tmp_path: Path) -> None:
    runs = three_ways(["-", "a b", "--timeout", "x"], tmp_path, stdin=STDIN_PROBE)
    plain = runs["plain"]
    assert plain.returncode == 3 and "argv ['-', 'a b', '--timeout', 'x']" in plain.stdout
    for name in ("runner", "IMPORTWATCH=1"):
        assert (runs[name].returncode, runs[name].stdout) == (plain.returncode, plain.stdout), name
        assert _ours_removed(runs[name].stderr) == plain.stderr == ""
        assert "[importwatch " in runs[name].stderr


def test_a_program_from_stdin_that_raises_shows_python_s_traceback(tmp_path: Path) -> None:
    runs = three_ways(["-"], tmp_path, stdin="x = 1\n\ndef f():\n    1 / 0\n\nf()\n")
    plain = runs["plain"]
    assert plain.returncode == 1 and 'File "<stdin>", line 4, in f' in plain.stderr
    for name in ("runner", "IMPORTWATCH=1"):
        assert runs[name].returncode == 1
        assert _ours_removed(runs[name].stderr) == plain.stderr, name


# -- a JSON Lines log imports nothing the program could import ------------------------------------
def test_a_jsonl_log_leaves_the_program_s_import_json_an_event(tmp_path: Path) -> None:
    code = "import json, re; print(json.dumps({'a': 1}))"
    log = tmp_path / "trace.jsonl"
    runs = three_ways(["-c", code], tmp_path, IMPORTWATCH_LOG=str(log))
    for name in ("runner", "IMPORTWATCH=1"):
        assert (runs[name].returncode, runs[name].stdout) == (0, runs["plain"].stdout), runs[name].stderr
    records = [json.loads(line) for line in log.read_text(encoding="ascii").splitlines()]
    assert len(records) > 10
    imported = {}
    for process in {record["pid"] for record in records}:
        imported[process] = {r.get("name") for r in records if r["pid"] == process and r["kind"] == "import"}
        assert {"json", "json.decoder"} <= imported[process], imported[process]
    # The runner's own imports come before tracing (a documented limit): with IMPORTWATCH=1, re too.
    assert any("re" in names for names in imported.values()), imported


def test_jsonl_lines_escape_what_is_not_ascii(tmp_path: Path) -> None:
    (tmp_path / "café.py").write_text(
        "raise ImportError('bad \"quote\" \\\\ é \\n line')\n", encoding="utf-8"
    )
    log = tmp_path / "trace.jsonl"
    result = subprocess.run(
        [*RUNNER, "--log", str(log), "-c", "try:\n    import café\nexcept ImportError:\n    pass"],
        cwd=tmp_path, capture_output=True, text=True, env=clean_env(), timeout=60,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    text = log.read_bytes().decode("ascii")
    ends = [json.loads(line) for line in text.splitlines() if '"import_end"' in line]
    failed = next(record for record in ends if record["name"] == "café")
    assert failed["error"] == 'ImportError: bad "quote" \\ é \n line'


# -- --stderr all|stalls|none --------------------------------------------------------------------
def _slow_tree(root: Path, count: int = 3) -> None:
    for index in range(count):
        (root / f"quick{index}.py").write_text("X = 1\n")
    (root / "slow.py").write_text("import time\ntime.sleep(1.5)\n")


STALL_CODE = "import quick0, quick1, quick2, slow; print('done')"


@pytest.mark.parametrize("how", ["option", "variable"])
def test_stderr_stalls_keeps_the_stall_report_only_and_the_log_gets_everything(
    tmp_path: Path, how: str
) -> None:
    _slow_tree(tmp_path)
    log = tmp_path / "trace.log"
    options = ("--stderr", "stalls") if how == "option" else ()
    env = {"IMPORTWATCH_TIMEOUT": "0.5", "IMPORTWATCH_LOG": str(log)}
    if how == "variable":
        env["IMPORTWATCH_STDERR"] = "stalls"
    runs = three_ways(["-c", STALL_CODE], tmp_path, runner_options=options, **env)
    assert runs["plain"].stdout == "done\n"
    for name in (
        ("runner", "IMPORTWATCH=1") if how == "variable" else ("runner",)
    ):  # the option is the runner's
        run = runs[name]
        assert (run.returncode, run.stdout) == (0, "done\n"), run.stderr
        ours = [line for line in run.stderr.splitlines() if line.startswith("[importwatch ")]
        assert "STALL " in ours[0], ours  # nothing of ours before there is something to report
        assert any("STALL " in line and "slow (loading" in line for line in ours), run.stderr
        assert "Stacks of the program's threads" in run.stderr
        assert not any(
            "] > " in line or "] < " in line or "] env " in line or "] start " in line for line in ours
        ), ours
    for process in {
        line.split()[1] for line in log.read_text().splitlines() if line.startswith("[importwatch ")
    }:
        logged = "".join(
            line for line in log.read_text().splitlines(True) if f"[importwatch {process} " in line
        )
        assert "] > quick1\n" in logged and "] < slow " in logged and "STALL " in logged


def test_stderr_none_writes_nothing_of_ours_to_stderr(tmp_path: Path) -> None:
    _slow_tree(tmp_path)
    log = tmp_path / "trace.log"
    runs = three_ways(
        ["-c", STALL_CODE], tmp_path, IMPORTWATCH_STDERR="none", IMPORTWATCH_TIMEOUT="0.5",
        IMPORTWATCH_LOG=str(log),
    )  # fmt: skip
    for name in ("runner", "IMPORTWATCH=1"):
        assert (runs[name].returncode, runs[name].stdout, runs[name].stderr) == (0, "done\n", ""), name
    assert "STALL " in log.read_text() and "] > quick2\n" in log.read_text()


def test_stderr_all_is_the_default(tmp_path: Path) -> None:
    _slow_tree(tmp_path)
    runs = three_ways(["-c", "import quick0"], tmp_path)
    for name in ("runner", "IMPORTWATCH=1"):
        assert "] > quick0\n" in runs[name].stderr


def test_a_bad_stderr_value_is_one_line_or_one_warning(tmp_path: Path) -> None:
    result = subprocess.run(
        [*RUNNER, "--stderr", "some", "-c", "pass"],
        capture_output=True,
        text=True,
        env=clean_env(),
        timeout=60,
    )
    assert result.returncode == 2
    assert result.stderr == "importwatch: error: --stderr: expected one of all, stalls, none, got 'some'\n"
    runs = three_ways(["-c", "print('ran')"], tmp_path, IMPORTWATCH_STDERR="loud")
    for name in ("runner", "IMPORTWATCH=1"):
        assert (runs[name].returncode, runs[name].stdout) == (0, "ran\n")
        warning = "IMPORTWATCH_STDERR: expected one of all, stalls, none, got 'loud'; using all"
        assert runs[name].stderr.count(warning) == 1


# -- a parent that reads nothing from a traced child's stderr pipe -------------------------------
PARENT = """\
import subprocess, sys
child = subprocess.Popen([sys.executable, "-c", "import bigtree"], stderr=subprocess.PIPE)
print("child status", child.wait(timeout=float(sys.argv[1])))
"""


def test_stderr_stalls_lets_a_parent_that_never_reads_the_pipe_wait_for_its_child(tmp_path: Path) -> None:
    lines = []
    for index in range(800):
        (tmp_path / f"mod_with_a_longish_name_{index:04d}.py").write_text("X = 1\n")
        lines.append(f"import mod_with_a_longish_name_{index:04d}")
    (tmp_path / "bigtree.py").write_text("\n".join(lines) + "\n")
    (tmp_path / "parent.py").write_text(PARENT)
    log = tmp_path / "t.log"
    env = {"PYTHONPATH": str(tmp_path), "IMPORTWATCH_STDERR": "stalls", "IMPORTWATCH_LOG": str(log)}
    runs = three_ways(["parent.py", "60"], tmp_path, **env)
    for name, run in runs.items():
        assert (run.returncode, run.stdout) == (0, "child status 0\n"), (name, run.stderr)
    # What one child would have written to the pipe with every line: more than a pipe holds.
    text = log.read_text()
    child = next(line.split()[1] for line in text.splitlines() if "] > bigtree" in line)
    assert (
        sum(len(line) for line in text.splitlines(True) if line.startswith(f"[importwatch {child} ")) > 65536
    )


# -- the program's partial line -------------------------------------------------------------------
@pytest.mark.parametrize("unbuffered", ["1", ""], ids=["PYTHONUNBUFFERED=1", "line-buffered"])
def test_an_event_line_never_follows_the_program_s_unfinished_line(tmp_path: Path, unbuffered: str) -> None:
    """A line the program left unended on stderr gets its end before ours; one still held in a line-buffered
    sys.stderr has reached nothing, so our lines come first, whole, and no empty line is added."""
    code = (
        "import sys\n"
        "sys.stderr.write('Loading model... ')\n"
        "import colorsys\n"
        "print('done', file=sys.stderr)\n"
        "print('next', end=' ', file=sys.stderr, flush=True)\n"
        "import json\n"
        "sys.stderr.write('ok\\n')\n"
    )
    runs = three_ways(["-c", code], tmp_path, PYTHONUNBUFFERED=unbuffered)
    assert runs["plain"].stderr == "Loading model... done\nnext ok\n"
    for name in ("runner", "IMPORTWATCH=1"):
        stderr = runs[name].stderr
        if unbuffered:
            assert "Loading model... \n[importwatch " in stderr, stderr
            assert _ours_removed(stderr) == "Loading model... \ndone\nnext \nok\n"
        else:  # 'Loading model... ' waits in the stream for its line's end, past the colorsys lines
            assert re.search(r"< colorsys [0-9.]+ ms\nLoading model\.\.\. done\n", stderr), stderr
            assert _ours_removed(stderr) == "Loading model... done\nnext \nok\n"
        assert "next \n[importwatch " in stderr, stderr  # flushed unended: ours starts on a line of its own
        assert "\n\n" not in stderr, stderr
        for line in stderr.splitlines():
            assert "[importwatch " not in line or line.startswith("[importwatch "), line


@pytest.mark.skipif(
    importlib.util.find_spec("importwatch.tracing._speedups") is None, reason="no C accelerator"
)
def test_a_failing_write_to_stderr_has_plain_python_s_traceback(tmp_path: Path) -> None:
    """sys.stderr's write and flush are stand-ins that note unended lines (Sink.follow_partial_lines): with
    the C accelerator no frame of ours is below them, and they read as the stream's own methods."""
    code = (
        "import inspect, sys, traceback\n"
        "write = sys.stderr.write\n"
        "print(write.__self__ is sys.stderr, write.__qualname__, inspect.signature(write), sys.stderr.flush.__name__)\n"
        "try:\n"
        "    sys.stderr.write(b'bytes')\n"
        "except TypeError:\n"
        "    print(traceback.format_exc())\n"
    )
    runs = three_ways(["-c", code], tmp_path, IMPORTWATCH_PURE="0")
    plain = runs["plain"].stdout
    assert plain.startswith("True TextIOWrapper.write (text, /) flush\n") and "TypeError" in plain, plain
    for name, run in runs.items():
        assert (run.returncode, run.stdout) == (0, plain), (name, run.stdout, run.stderr)


# -- descriptors the program closes and reuses ------------------------------------------------------
DAEMON = """\
import os, sys
os.closerange(3, int(sys.argv[1]))
files = [open(f"out{index}.txt", "w") for index in range(3)]
import colorsys, json, quick0
for file in files:
    file.write("mine\\n")
    file.flush()
{extra}
print("done")
"""

REUSE = """\
log = [int(fd) for fd in os.listdir("/proc/self/fd") if os.path.realpath(f"/proc/self/fd/{fd}").endswith("trace.log")]
for fd in log:
    os.dup2(files[0].fileno(), fd)
import time
time.sleep(2)
import quick1, quick2
"""


@pytest.mark.parametrize("up_to", ["1000", "65536"])
def test_descriptors_closed_by_the_program_never_get_our_lines(tmp_path: Path, up_to: str) -> None:
    _slow_tree(tmp_path)
    (tmp_path / "daemon.py").write_text(DAEMON.replace("{extra}", ""))
    log = tmp_path / "trace.log"
    runs = three_ways(["daemon.py", up_to], tmp_path, IMPORTWATCH_LOG=str(log), IMPORTWATCH_WATCHER="1")
    for name, run in runs.items():
        assert (run.returncode, run.stdout) == (0, "done\n"), (name, run.stderr)
        for index in range(3):
            assert (tmp_path / f"out{index}.txt").read_text() == "mine\n", (name, index)
    for name in ("runner", "IMPORTWATCH=1"):
        stderr = runs[name].stderr
        assert "] > quick0\n" in stderr
        said = stderr.count("the program closed or replaced the log file's descriptor")
        assert said == (0 if up_to == "1000" else 1), stderr
    assert "] > quick0\n" in log.read_text() or up_to != "1000"


def test_a_log_descriptor_the_program_takes_over_stops_getting_our_lines(tmp_path: Path) -> None:
    _slow_tree(tmp_path)
    (tmp_path / "daemon.py").write_text(DAEMON.replace("{extra}", REUSE))
    log = tmp_path / "trace.log"
    runs = three_ways(["daemon.py", "3"], tmp_path, IMPORTWATCH_LOG=str(log), IMPORTWATCH_TIMEOUT="1")
    for name, run in runs.items():
        assert (run.returncode, run.stdout) == (0, "done\n"), (name, run.stderr)
        assert (tmp_path / "out0.txt").read_text() == "mine\n", name
    for name in ("runner", "IMPORTWATCH=1"):
        assert runs[name].stderr.count("the program closed or replaced the log file's descriptor") == 1, runs[
            name
        ].stderr
        assert "] > quick2\n" in runs[name].stderr


def test_a_log_descriptor_taken_over_between_two_imports_gets_none_of_the_next_lines(tmp_path: Path) -> None:
    """No heartbeat (--timeout 0) and no pause: the next import, begun with nothing in flight, checks."""
    _slow_tree(tmp_path)
    at_once = REUSE.replace("import time\ntime.sleep(2)\n", "")
    (tmp_path / "daemon.py").write_text(DAEMON.replace("{extra}", at_once))
    log = tmp_path / "trace.log"
    runs = three_ways(["daemon.py", "3"], tmp_path, IMPORTWATCH_LOG=str(log), IMPORTWATCH_TIMEOUT="0")
    for name, run in runs.items():
        assert (run.returncode, run.stdout) == (0, "done\n"), (name, run.stderr)
        assert (tmp_path / "out0.txt").read_text() == "mine\n", name
    for name in ("runner", "IMPORTWATCH=1"):
        assert "] > quick2\n" in runs[name].stderr, runs[name].stderr
        assert runs[name].stderr.count("the program closed or replaced the log file's descriptor") == 1


# A program that takes over stderr's copy of ours (a copy of fd 2 placed high: it dup2s its own file onto
# it), does WHAT, then writes a line of its own there and prints what that file holds.
TAKE_OVER = """\
import os
stderr = os.fstat(2)
def same_as_stderr(fd):
    try:
        seen = os.fstat(fd)
    except OSError:
        return False
    return (seen.st_dev, seen.st_ino) == (stderr.st_dev, stderr.st_ino)
mine = os.open("mine.txt", os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
for fd in [fd for fd in range(512, 1024) if same_as_stderr(fd)]:
    os.dup2(mine, fd)
{what}
os.write(mine, b"mine\\n")
os.close(mine)
with open("mine.txt") as written:
    print(repr(written.read()))
"""
QUIET_TAKEOVER = TAKE_OVER.replace(
    "{what}",
    "import ctypes, json\ntry:\n    ctypes.CDLL('libdoes_not_exist_here.so.3')\nexcept OSError:\n    pass",
)


@pytest.mark.parametrize("pure", ["0", "1"], ids=["C", "pure"])
def test_a_quiet_stderr_copy_the_program_takes_over_gets_none_of_the_lines_said_later(
    tmp_path: Path, pure: str
) -> None:
    """Under --stderr stalls with no timer armed (--timeout 0) no import looks at stderr's copy: no step
    line goes there, and the line about to be written looks first. Here a `!` line of the program's own
    thread, with no heartbeat to look meanwhile: it goes to stderr, through a copy made anew, never into
    the program's file."""
    (tmp_path / "takeover.py").write_text(QUIET_TAKEOVER)
    runs = three_ways(  # no watcher: its start, still under way, would find the copy taken and say so
        ["takeover.py"],
        tmp_path,
        runner_options=("--no-watcher",),
        IMPORTWATCH_STDERR="stalls",
        IMPORTWATCH_TIMEOUT="0",
        IMPORTWATCH_PURE=pure,
    )
    for name, run in runs.items():
        assert (run.returncode, run.stdout) == (0, "'mine\\n'\n"), (name, run.stdout, run.stderr)
    for name in ("runner", "IMPORTWATCH=1"):
        said = [line for line in runs[name].stderr.splitlines() if "] ! " in line]
        assert len(said) == 1 and "libdoes_not_exist_here.so.3" in said[0], runs[name].stderr


# fd 2 pointed elsewhere too (a daemon's redirect): no copy of the stderr we started with can be made again.
HOLDER = TAKE_OVER.replace(
    "{what}",
    "os.dup2(os.open('errors.txt', os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600), 2)\nimport holds_the_gil",
)


@pytest.mark.timeout(120)
@pytest.mark.parametrize("stderr_mode", ["all", "stalls"])
def test_faulthandler_s_timer_never_dumps_into_a_stderr_copy_the_program_took_over(
    tmp_path: Path, stderr_mode: str
) -> None:
    """The program takes over stderr's copy and points fd 2 elsewhere (a daemon's redirect), so no copy of
    the stderr we started with can be made again; then an import holds the GIL past the threshold, and only
    faulthandler's timer can act. Its dump goes nowhere kept rather than into the program's file."""
    (tmp_path / "holds_the_gil.py").write_text("import ctypes\nctypes.PyDLL(None).sleep(3)\n")
    (tmp_path / "daemon.py").write_text(HOLDER)
    runs = three_ways(
        ["daemon.py"],
        tmp_path,
        runner_options=("--no-watcher",),
        IMPORTWATCH_STDERR=stderr_mode,
        IMPORTWATCH_TIMEOUT="1",
    )
    for name, run in runs.items():
        assert (run.returncode, run.stdout) == (0, "'mine\\n'\n"), (name, run.stdout, run.stderr)


# -- nothing of ours in the program's log --------------------------------------------------------
NATIVE = "import readline, ctypes\nctypes.CDLL(None).getpid()\n"


@pytest.mark.parametrize("way", ["runner", "IMPORTWATCH=1", "pytest -p importwatch"])
def test_no_module_of_ours_appears_in_the_log_of_a_program_that_loads_extensions(
    tmp_path: Path, way: str
) -> None:
    """Our facts modules load at the first dlopen, by import_own; pytest's assertion rewriter runs
    their bodies for `-p importwatch` too, and that must not make them the program's imports."""
    log = tmp_path / "run.log"
    (tmp_path / "test_native.py").write_text(NATIVE + "def test_loads():\n    pass\n")
    env = {"IMPORTWATCH_LOG": str(log), "IMPORTWATCH_STDERR": "none"}
    if way == "runner":
        command = [*RUNNER, "--no-watcher", "--stderr", "none", "--log", str(log), "-c", NATIVE]
        env = {}
    elif way == "IMPORTWATCH=1":
        command, env["IMPORTWATCH"] = [sys.executable, "-c", NATIVE], "1"
    else:
        command = [sys.executable, "-m", "pytest", "-q", "-p", "importwatch", "-p", "no:cacheprovider", "test_native.py"]  # fmt: skip
    done = subprocess.run(
        command, cwd=tmp_path, capture_output=True, text=True, env=clean_env(**env), timeout=90
    )
    assert done.returncode == 0, done.stdout + done.stderr
    text = log.read_text()
    assert "> readline" in text and "dlopen" in text
    assert [line for line in text.splitlines() if "> importwatch." in line or "< importwatch." in line] == []
