"""What is the program's stays the program's, side by side (plain, runner, IMPORTWATCH=1): the file it
opens at fd 2, its patched clocks, its working folder, a quiet stderr, what a crash prints, and no step
left in flight when a line of ours cannot be written."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from helpers import clean_env
from test_accelerator import BUILT
from test_side_by_side import RUNNER, _ours_removed, three_ways

pytestmark = [pytest.mark.timeout(120), pytest.mark.slow]  # every test here starts processes


# -- fd 2 reused by the program ------------------------------------------------------------------
DATA_AT_FD2 = """
import os
os.close(2)
fd = os.open("data.txt", os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
assert fd == 2, fd
os.write(fd, b"record 1\\n")
import json, csv, email.parser
os.write(fd, b"record 2\\n")
print("ok")
"""


def test_a_file_the_program_opens_at_fd_2_gets_only_its_own_records(tmp_path: Path) -> None:
    (tmp_path / "prog.py").write_text(DATA_AT_FD2)
    for name, command, env in (
        ("plain", [sys.executable, "prog.py"], clean_env()),
        ("runner", [*RUNNER, "prog.py"], clean_env()),
        ("IMPORTWATCH=1", [sys.executable, "prog.py"], clean_env(IMPORTWATCH="1")),
    ):
        run = subprocess.run(command, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=90)
        assert (run.returncode, run.stdout) == (0, "ok\n"), (name, run.stderr)
        assert (tmp_path / "data.txt").read_text() == "record 1\nrecord 2\n", name
        if name != "plain":  # our lines go on to the stderr the process started with
            assert "] > json\n" in run.stderr, name


def test_a_program_that_dup2s_a_file_onto_fd_2_finds_only_its_own_writes_there(tmp_path: Path) -> None:
    code = (
        "import os, sys\n"
        "fd = os.open('own.err', os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)\n"
        "os.dup2(fd, 2)\n"
        "import json, csv\n"
        "sys.stderr.write('mine\\n'); sys.stderr.flush()\n"
        "print('ok')\n"
    )
    for name, command, env in (
        ("plain", [sys.executable, "-c", code], clean_env()),
        ("runner", [*RUNNER, "-c", code], clean_env()),
        ("IMPORTWATCH=1", [sys.executable, "-c", code], clean_env(IMPORTWATCH="1")),
    ):
        run = subprocess.run(command, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=90)
        assert (run.returncode, run.stdout) == (0, "ok\n"), (name, run.stderr)
        assert (tmp_path / "own.err").read_text() == "mine\n", name


# -- the numbers the program may open ----------------------------------------------------------
SCANS_AND_FILLS = """
import os, resource
seen = []
for fd in range(os.sysconf("SC_OPEN_MAX")):  # as subprocess's fd_status.py looks
    try:
        os.fstat(fd)
        seen.append(fd)
    except OSError:
        pass
opened = []
try:
    while True:
        opened.append(os.open(os.devnull, os.O_RDONLY))
except OSError as error:
    print(seen, len(opened), error.errno, resource.getrlimit(resource.RLIMIT_NOFILE))
"""


@pytest.mark.parametrize("pure", ["0", "1"], ids=["C", "pure"])
@pytest.mark.parametrize("soft", [1024, 29])
def test_under_a_soft_limit_below_the_hard_one_the_program_sees_and_opens_what_it_would_plain(
    tmp_path: Path, soft: int, pure: str
) -> None:
    """Ours sit above the soft limit, where the usual 1024 under a higher hard limit leaves room: a scan
    of range(SC_OPEN_MAX) finds none of them, as many files open before EMFILE, and the limit is the
    program's. (This machine's own soft limit is its hard one: the test lowers it for the program.)"""
    import resource

    hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
    if hard != resource.RLIM_INFINITY and hard < 1024 + 64:
        pytest.skip(f"a hard limit of {hard} leaves no room above 1024")
    (tmp_path / "prog.py").write_text(SCANS_AND_FILLS)
    # Before 3.13 the pure twin's map of the watcher's feed keeps a copy of its descriptor (docs/limits.md).
    watcher = () if pure == "0" or sys.version_info >= (3, 13) else ("--no-watcher",)
    outputs = {}
    for name, command, env in (
        ("plain", [sys.executable, "prog.py"], clean_env()),
        ("runner", [*RUNNER, *watcher, "prog.py"], clean_env(IMPORTWATCH_PURE=pure)),
        ("IMPORTWATCH=1", [sys.executable, "prog.py"], clean_env(IMPORTWATCH="1", IMPORTWATCH_PURE=pure)),
        ("IMPORTWATCH=1, a log", [sys.executable, "prog.py"],
         clean_env(IMPORTWATCH="1", IMPORTWATCH_LOG="trace.log", IMPORTWATCH_PURE=pure)),
    ):  # fmt: skip
        run = subprocess.run(
            command, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=90,
            preexec_fn=lambda: resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard)),
        )  # fmt: skip
        assert run.returncode == 0, (name, run.stderr)
        outputs[name] = run.stdout
        if name != "plain":
            assert "] > resource\n" in run.stderr, (name, run.stderr)
    assert outputs["plain"].startswith("[0, 1, 2] ")
    assert set(outputs.values()) == {outputs["plain"]}, outputs
    assert "] > resource\n" in (tmp_path / "trace.log").read_text()


def test_a_program_that_closes_fd_2_at_start_gets_no_line_in_the_file_that_takes_its_number(
    tmp_path: Path,
) -> None:
    code = (
        "import os\n"
        "fd = os.open('data.txt', os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)\n"
        "assert fd == 2, fd\n"
        "import json\n"
        "os.write(fd, b'rec\\n')\n"
    )
    for name, command, env in (
        ("plain", [sys.executable, "-c", code], clean_env()),
        ("runner", [*RUNNER, "-c", code], clean_env()),
        ("IMPORTWATCH=1", [sys.executable, "-c", code], clean_env(IMPORTWATCH="1")),
    ):
        # Started with fd 2 closed: `2>&-`.
        run = subprocess.run(
            ["sh", "-c", '"$0" "$@" 2>&-', *command], cwd=tmp_path, env=env, capture_output=True, timeout=90
        )
        assert run.returncode == 0, name
        assert (tmp_path / "data.txt").read_text() == "rec\n", name


# -- the watcher's pipe taken over by the program --------------------------------------------------
PIPE_TAKEN_OVER = """
import os
from importwatch.tracing import session

feed = session.active().sink.feed
own = os.open("own.lock", os.O_RDWR | os.O_CREAT, 0o600)
os.dup2(own, feed.fd)  # a file of the program's at the number of the watcher's pipe; no step after
inode, pid = os.fstat(own).st_ino, os.getpid()


class Last:
    def __del__(self):  # at finalisation: after every exit handler, importwatch's included
        fd = os.open("/proc/locks", os.O_RDONLY)
        held = [line for line in os.read(fd, 1 << 20).decode().splitlines()
                if f":{inode} " in line and line.split()[4] == str(pid)]
        os.write(1, f"locks: {len(held)}\\n".encode())


last = Last()
"""


def test_a_file_the_program_puts_at_the_watcher_s_pipe_is_never_locked_at_the_exit(tmp_path: Path) -> None:
    # The exit silences the watcher by a lock on its pipe: taken there, it would be on the program's file.
    (tmp_path / "prog.py").write_text(PIPE_TAKEN_OVER)
    for name, command, env in (
        ("runner", [*RUNNER, "--watcher", "prog.py"], clean_env()),
        ("IMPORTWATCH=1", [sys.executable, "prog.py"], clean_env(IMPORTWATCH="1", IMPORTWATCH_WATCHER="1")),
    ):
        run = subprocess.run(command, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=90)
        assert (run.returncode, run.stdout) == (0, "locks: 0\n"), (name, run.stdout, run.stderr)


# -- the end of the interpreter -------------------------------------------------------------
LAST_FINALISER = """
import gc, os, sys
ours = getattr(sys.modules.get("importwatch.tracing.session"), "_at_exit", None)


class Last:
    def __del__(self):  # as the interpreter clears __main__: after every exit handler, ours last
        os.write(1, f"end {'-' if ours is None else gc.is_tracked(ours)}\\n".encode())


last = Last()
print("ran", flush=True)
sys.exit(3)
"""


@pytest.mark.parametrize("pure", ["0", "1"], ids=["C", "pure"])
def test_a_finaliser_at_the_very_end_runs_as_under_plain_python(tmp_path: Path, pure: str) -> None:
    # Our last exit handler takes our functions out of the collector's passes (the C accelerator's
    # keep_to_the_end): the program's finalisers, exit status and output are as under plain python.
    (tmp_path / "prog.py").write_text(LAST_FINALISER)
    plain = subprocess.run([sys.executable, "prog.py"], cwd=tmp_path, env=clean_env(), capture_output=True,
                           text=True, timeout=60)  # fmt: skip
    assert (plain.returncode, plain.stdout, plain.stderr) == (3, "ran\nend -\n", "")
    kept = "False" if pure == "0" and BUILT else "True"  # untracked by the accelerator only
    for name, command, env in (
        ("runner", [*RUNNER, "prog.py"], clean_env(IMPORTWATCH_PURE=pure)),
        ("IMPORTWATCH=1", [sys.executable, "prog.py"], clean_env(IMPORTWATCH="1", IMPORTWATCH_PURE=pure)),
    ):
        run = subprocess.run(command, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=60)
        assert (run.returncode, run.stdout) == (3, f"ran\nend {kept}\n"), (name, run.stdout, run.stderr)
        assert _ours_removed(run.stderr) == "", (name, run.stderr)


LATE_MARKS = """
import importwatch, os


class Last:
    def __del__(self):  # at the very end, when nothing can be imported any more
        importwatch.checkpoint("late")
        with importwatch.phase("late phase"):
            pass
        importwatch.uninstall()
        os.write(1, b"late done\\n")


first, second = Last(), Last()
first.other, second.other = second, first  # a cycle: freed by the collector as the interpreter ends
last = Last()
print("ran", flush=True)
"""


def test_checkpoints_phases_and_uninstall_in_a_finaliser_at_the_very_end(tmp_path: Path) -> None:
    # importwatch's own API, called as the interpreter ends: nothing of it may import then, traced or not.
    (tmp_path / "prog.py").write_text(LATE_MARKS)
    runs = three_ways(["prog.py"], tmp_path)
    for name, run in runs.items():
        assert (run.returncode, run.stdout) == (0, "ran\n" + "late done\n" * 3), (
            name,
            run.stdout,
            run.stderr,
        )
        assert "Exception ignored" not in run.stderr and "Error" not in run.stderr, (name, run.stderr)
    traced = runs["IMPORTWATCH=1"].stderr
    assert "] checkpoint late" in traced and "] < phase late phase" in traced, traced


# -- a failure of ours leaves no step in flight ------------------------------------------------
RECURSE_THEN_IMPORT = """
import time
def down(n):
    try:
        return down(n + 1)
    except RecursionError:
        for i in range(3):
            try:
                __import__(f"no_such_module_{n}_{i}")
            except ImportError:
                pass
        raise
try:
    down(0)
except RecursionError:
    pass
time.sleep(1.5)
print("done")
"""


def test_imports_that_fail_at_the_recursion_limit_leave_no_false_stall(tmp_path: Path) -> None:
    (tmp_path / "prog.py").write_text(RECURSE_THEN_IMPORT)
    runs = three_ways(
        ["prog.py"], tmp_path, runner_options=("--timeout", "0.5", "--exit-on-stall"),
        IMPORTWATCH_TIMEOUT="0.5", IMPORTWATCH_EXIT_ON_STALL="1", IMPORTWATCH_STDERR="stalls",
    )  # fmt: skip
    for name, run in runs.items():
        assert (run.returncode, run.stdout) == (0, "done\n"), (name, run.stderr[-2000:])
        assert "STALL" not in run.stderr, name


# -- our clocks are our own ---------------------------------------------------------------------
PATCHED_CLOCKS = """
import time
real = time.monotonic
time.monotonic = lambda: real() + 1e6
time.perf_counter = lambda: real() + 1e6
time.time = lambda: 0.0
time.strftime = lambda fmt, t=None: "XX:XX:XX."
import slowish
print("ok")
"""

FROZEN = """
from freezegun import freeze_time
with freeze_time("2024-01-01 12:00:00"):
    import slowish
print("ok")
"""


@pytest.mark.parametrize("program", ["monkeypatch", "freezegun"])
def test_a_program_that_patches_the_time_module_gets_no_false_stall_and_true_stamps(
    tmp_path: Path, program: str
) -> None:
    if program == "freezegun":
        pytest.importorskip("freezegun")
    (tmp_path / "slowish.py").write_text("import time\ntime.sleep(0.8)\n")
    (tmp_path / "prog.py").write_text(FROZEN if program == "freezegun" else PATCHED_CLOCKS)
    runs = three_ways(["prog.py"], tmp_path, runner_options=("--timeout", "2"), IMPORTWATCH_TIMEOUT="2")
    for name, run in runs.items():
        assert (run.returncode, run.stdout) == (0, "ok\n"), (name, run.stderr)
    for name in ("runner", "IMPORTWATCH=1"):
        stderr = runs[name].stderr
        assert "STALL" not in stderr, (name, stderr)
        start = next(line for line in stderr.splitlines() if line.endswith("] > slowish"))
        end = next(line for line in stderr.splitlines() if "] < slowish " in line)
        assert " 12:00:00.000]" not in start and "XX:XX" not in start, start
        assert start.split()[2] != end.split()[2], (start, end)  # a real clock moved 0.8 s between them
        assert 700 < float(end.split()[-2]) < 5000, end


# -- a relative log path, a chdir and a fork ---------------------------------------------------
FORK_AFTER_CHDIR = """
import os
os.chdir("work")
pid = os.fork()
if pid == 0:
    import json
    os._exit(0)
os.waitpid(pid, 0)
print("ok")
"""


def test_a_relative_log_path_is_resolved_once_so_a_fork_child_after_a_chdir_logs_beside_its_parent(
    tmp_path: Path,
) -> None:
    (tmp_path / "work").mkdir()
    (tmp_path / "prog.py").write_text(FORK_AFTER_CHDIR)
    for name, command, env in (
        ("runner", [*RUNNER, "--log", "iw-{pid}.log", "prog.py"], clean_env()),
        (
            "IMPORTWATCH=1",
            [sys.executable, "prog.py"],
            clean_env(IMPORTWATCH="1", IMPORTWATCH_LOG="iw-{pid}.log"),
        ),
    ):
        run = subprocess.run(command, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=90)
        assert (run.returncode, run.stdout) == (0, "ok\n"), (name, run.stderr)
        assert list((tmp_path / "work").iterdir()) == [], name
        logs = sorted(tmp_path.glob("iw-*.log"))
        assert len(logs) == 2 and any("fork child of" in log.read_text() for log in logs), (name, logs)
        for log in logs:
            log.unlink()


# -- quiet is silent ------------------------------------------------------------------------------
PARENT_OF_A_CHILD = """
import subprocess, sys
child = subprocess.Popen(
    [sys.executable, "-c", "import sys, json; sys.stdout.write(sys.stdin.read())"],
    stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
)
out, err = child.communicate(b"hello")
assert (out, err) == (b"hello", b""), (out, err)
print("ok")
"""


@pytest.mark.parametrize("log", [False, True])
def test_stderr_stalls_leaves_a_childs_stderr_byte_identical_to_plain(tmp_path: Path, log: bool) -> None:
    (tmp_path / "prog.py").write_text(PARENT_OF_A_CHILD)
    env = {"IMPORTWATCH_STDERR": "stalls"}
    if log:
        env["IMPORTWATCH_LOG"] = str(tmp_path / "trace-{pid}.log")
    runs = three_ways(["prog.py"], tmp_path, runner_options=("--stderr", "stalls"), **env)
    for name, run in runs.items():
        assert (run.returncode, run.stdout, run.stderr) == (0, "ok\n", ""), name
    if log:
        logged = "".join(path.read_text() for path in tmp_path.glob("trace-*.log"))
        assert "] start python " in logged and "] env " in logged


# -- a crash prints what plain python prints ----------------------------------------------------------
def test_a_crash_prints_on_stderr_what_plain_python_prints_and_the_log_keeps_the_dump(
    tmp_path: Path, built: Path
) -> None:
    code = "import sys; print('before', flush=True); import crashext"
    log = tmp_path / "crash.log"
    runs = three_ways(["-c", code], tmp_path, PYTHONPATH=str(built))
    plain = runs["plain"]
    assert plain.returncode == -11 and plain.stdout == "before\n"
    for name in ("runner", "IMPORTWATCH=1"):
        run = runs[name]
        assert (run.returncode, run.stdout) == (-11, "before\n"), name
        assert _ours_removed(run.stderr) == plain.stderr, (name, run.stderr)
    logged = subprocess.run(
        [sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, timeout=90,
        env=clean_env(IMPORTWATCH="1", IMPORTWATCH_LOG=str(log), PYTHONPATH=str(built)),
    )  # fmt: skip
    assert _ours_removed(logged.stderr) == plain.stderr
    assert "Fatal Python error: Segmentation fault" in log.read_text()


def test_a_crash_dumps_to_stderr_when_the_program_asked_for_faulthandler(tmp_path: Path, built: Path) -> None:
    runs = three_ways(["-c", "import crashext"], tmp_path, PYTHONPATH=str(built), PYTHONFAULTHANDLER="1")
    for name, run in runs.items():
        assert run.returncode == -11, name
        assert "Fatal Python error: Segmentation fault" in run.stderr, (name, run.stderr)
