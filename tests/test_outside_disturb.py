"""Looking from outside must not change what is seen, nor outlive the program.

The watcher's debugger (gdb, reading native stacks) stops the process for a moment: no busy or
waiting verdict, in the program, the watcher or doctor, may be taken from that moment; no line of
ours may reach stderr once the program's parent has its exit status; our own threads are named as
ours; and a process someone else is debugging is not ours to kill.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from cbuild import FIXTURES, compile_shared
from helpers import clean_env, traced

pytestmark = [
    pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc"),
    pytest.mark.slow,
]
needs_gdb = pytest.mark.skipif(shutil.which("gdb") is None, reason="gdb is not installed")
WATCHER = pytest.mark.parametrize("watcher", ["--watcher", "--no-watcher"])

SPIN = "import time\nend = time.monotonic() + {seconds}\nwhile time.monotonic() < end:\n    pass\n"
SLEEP = "import time\ntime.sleep({seconds})\n"
STOP = "import os, signal\nos.kill(os.getpid(), signal.SIGSTOP)\n"


def module(folder: Path, name: str, text: str) -> Path:
    (folder / f"{name}.py").write_text(text)
    return folder


def run(*args: str, cwd: Path, timeout: float = 60) -> subprocess.CompletedProcess:
    return subprocess.run(
        traced(*args), cwd=cwd, env=clean_env(), stdin=subprocess.DEVNULL,
        capture_output=True, text=True, timeout=timeout,
    )  # fmt: skip


def outside_lines(text: str) -> list[str]:
    return [line for line in text.splitlines() if "] outside: " in line]


def read_after_reap(process: subprocess.Popen) -> tuple[bytes, bytes]:
    """(what stderr held when the process was reaped, what came after): the watcher holds the pipe
    too, so reading to EOF waits for it to leave; what arrives then was written after the reap."""
    process.wait(60)
    fd = process.stderr.fileno()
    os.set_blocking(fd, False)
    before = b""
    while True:
        try:
            data = os.read(fd, 1 << 16)
        except BlockingIOError:
            break
        if not data:
            break
        before += data
    os.set_blocking(fd, True)
    after = process.stderr.read()
    process.stderr.close()
    return before, after


# -- 1. busy or waiting, never from a moment we stopped the process -------------------------------
@pytest.mark.timeout(60)
@WATCHER
def test_busy_import_is_spared_by_exit_on_stall(tmp_path, watcher):
    # The watcher's gdb stops the process right at the threshold, while the program looks at its
    # own CPU time: a busy import must still be seen busy, and end by itself.
    module(tmp_path, "busy", SPIN.format(seconds=4))
    done = run("--timeout", "1.5", "--exit-on-stall", watcher, "-c", "import busy", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert "busy, not stuck: MainThread used" in done.stderr
    assert "exiting with status 1" not in done.stderr
    lines = outside_lines(done.stderr)
    if watcher == "--no-watcher":
        assert lines == []
        return
    assert any("outside: busy, not stuck: MainThread running" in line for line in lines), done.stderr
    assert not any("killing it" in line or "died during import" in line for line in lines)
    if shutil.which("gdb"):
        assert any("outside: native stacks (gdb" in line for line in lines), done.stderr


@pytest.mark.timeout(60)
@WATCHER
def test_sleeping_import_is_waiting_and_ended_by_exit_on_stall(tmp_path, watcher):
    module(tmp_path, "slowimp", SLEEP.format(seconds=60))
    done = run("--timeout", "1.5", "--exit-on-stall", watcher, "-c", "import slowimp", cwd=tmp_path)
    assert done.returncode == 1, done.stderr
    assert "exiting with status 1 (--exit-on-stall)" in done.stderr
    assert "busy, not stuck" not in done.stderr
    lines = outside_lines(done.stderr)
    if watcher == "--watcher":
        assert any("outside: waiting: MainThread sleeping" in line for line in lines), done.stderr
    else:
        assert lines == []


@pytest.mark.timeout(60)
def test_stopped_import_is_stopped_and_ended_by_the_watcher(tmp_path, start):
    # A stopped process cannot speak for itself (without a watcher nothing is said, nothing ends it):
    # the watcher says so and, with --exit-on-stall, ends it, as no debugger of anyone holds it.
    module(tmp_path, "spinner", SPIN.format(seconds=6))
    proc = start(traced("--timeout", "2", "--exit-on-stall", "-c", "import spinner"), cwd=tmp_path)
    proc.wait_for("> spinner", 20)
    os.kill(proc.process.pid, signal.SIGSTOP)
    assert proc.finish() == -signal.SIGKILL
    lines = outside_lines(proc.stderr)
    assert any("outside: stopped: process" in line for line in lines), proc.stderr
    assert any("--exit-on-stall: the program is stopped, not busy: killing it" in line for line in lines)


# -- 2. doctor: its last look never catches our own debugger --------------------------------------
def doctor(folder: Path, name: str, timeout: str, watcher: str) -> dict:
    done = subprocess.run(
        [sys.executable, "-m", "importwatch", "doctor", "--import", name, "--timeout", timeout,
         "--no-cuda", "--json", watcher],
        env=clean_env(PYTHONPATH=str(folder)), stdin=subprocess.DEVNULL, capture_output=True, text=True,
        timeout=90,
    )  # fmt: skip
    assert done.returncode in (0, 1), done.stderr
    (check,) = json.loads(done.stdout)["imports"]
    return check


@pytest.mark.timeout(90)
@WATCHER
def test_doctor_sees_a_sleep_as_waiting(tmp_path, watcher):
    check = doctor(module(tmp_path, "slowimp", SLEEP.format(seconds=60)), "slowimp", "2", watcher)
    assert check["status"] == "hung"
    assert check["outside"].startswith("waiting: main thread sleeping"), check


@pytest.mark.timeout(90)
@WATCHER
def test_doctor_lets_a_busy_import_finish(tmp_path, watcher):
    check = doctor(module(tmp_path, "busy", SPIN.format(seconds=2.5)), "busy", "1.5", watcher)
    assert check["status"] == "ok", check


@pytest.mark.timeout(90)
@WATCHER
def test_doctor_sees_a_stopped_import_as_stopped(tmp_path, watcher):
    check = doctor(module(tmp_path, "stops", STOP), "stops", "1.5", watcher)
    assert check["status"] == "hung"
    # Doctor's own look, or, if a loaded machine kept it from looking in time, the watcher's.
    assert check["outside"].startswith("stopped: "), check


# -- 3. no line after the program's exit --------------------------------------------------------
@pytest.mark.timeout(60)
@needs_gdb
def test_no_line_after_exit_when_the_watcher_is_mid_report(tmp_path):
    # The watcher reports at 1.5 s and reads the stacks while the import still sleeps, or while the
    # program exits (gdb may take a second to attach): either way it exits at once when let go.
    module(tmp_path, "nap", SLEEP.format(seconds=1.8))
    code = "import nap, sys; sys.stderr.write('program done\\n')"
    process = subprocess.Popen(
        traced("--timeout", "1", "-c", code), cwd=tmp_path, env=clean_env(),
        stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
    )  # fmt: skip
    before, after = read_after_reap(process)
    assert process.returncode == 0
    assert after == b"", after.decode()
    text = before.decode()
    assert "outside: native stacks (gdb" in text, text
    # The exit waited for them rather than cutting them short.
    assert f"Thread 1 (LWP {process.pid}) MainThread" in text[text.index("outside: native stacks (gdb") :]


def tracer_of(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("TracerPid:"):
            return int(line.split()[1])
    return 0


@pytest.mark.timeout(60)
@needs_gdb
def test_after_a_kill_mid_report_only_the_death_line(tmp_path):
    module(tmp_path, "slowimp", SLEEP.format(seconds=60))
    log = tmp_path / "run.log"
    process = subprocess.Popen(
        traced("--timeout", "1", "--log", str(log), "-c", "import slowimp"), cwd=tmp_path,
        env=clean_env(), stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
    )  # fmt: skip
    seen = b""
    deadline = time.monotonic() + 30
    while b"outside: waiting:" not in seen and time.monotonic() < deadline:
        seen += os.read(process.stderr.fileno(), 1 << 16)
    assert b"outside: waiting:" in seen, seen.decode()
    while not tracer_of(process.pid) and time.monotonic() < deadline:
        time.sleep(0.005)
    assert tracer_of(process.pid), "the watcher's gdb never attached"
    os.kill(process.pid, signal.SIGKILL)  # the watcher is in the middle of its report: reading stacks
    before, after = read_after_reap(process)
    # Reaped at once: the parent has the status, so nothing of ours may follow on stderr; the
    # death line, with what was in flight, is in the log (and on stderr only if it beat the reap).
    assert b"[importwatch " not in after, after.decode()
    late = (seen + before).decode()
    late = late[late.index("outside: waiting:") :]
    died = [line for line in late.splitlines() if "outside: died during import" in line]
    assert len(died) <= 1, late
    if died:
        assert late.splitlines()[-1] == died[0], late
    logged = [line for line in log.read_text().splitlines() if "outside: died during import" in line]
    assert len(logged) == 1 and "SIGKILL" in logged[0] and "slowimp" in logged[0], log.read_text()
    after_death = log.read_text().split("outside: died during import", 1)[1].splitlines()[1:]
    assert after_death == [], after_death


PARENT = """\
import os, signal, subprocess, sys, time
how = os.environ["HOW"]
job = subprocess.Popen(sys.argv[1:], stdin=subprocess.DEVNULL)
if how == "kill":
    time.sleep(1.5)
    os.kill(job.pid, signal.SIGKILL)
elif how == "kill-mid-report":  # while the watcher's debugger reads the stacks
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        with open(f"/proc/{job.pid}/status") as status:
            if any(line.split() != ["TracerPid:", "0"] for line in status if line.startswith("TracerPid:")):
                break
        time.sleep(0.002)
    os.kill(job.pid, signal.SIGKILL)
status = job.wait()
print(f"PARENT: the job ended with {status}", file=sys.stderr, flush=True)
time.sleep(2.5)  # what the watcher would still write lands here, after the parent's line
"""
# How the job dies with an import in flight: (its module, importwatch's options).
DIES = {
    "kill": ("import time\ntime.sleep(60)\n", ["--timeout", "30"]),
    "kill-mid-report": ("import time\ntime.sleep(60)\n", ["--timeout", "1"]),
    "os._exit": (
        "import os, threading, time\nthreading.Timer(1.0, os._exit, (3,)).start()\ntime.sleep(60)\n",
        ["--timeout", "30"],
    ),
    # the demo's: a constructor holds the GIL in dlopen, faulthandler's timer ends the program
    "exit-on-stall": ("import hangext\n", ["--timeout", "1", "--exit-on-stall"]),
}
WORDS = {
    "kill": "SIGKILL",
    "kill-mid-report": "SIGKILL",
    "os._exit": "status 3 without a clean exit",
    "exit-on-stall": "ended by --exit-on-stall",
}


@pytest.mark.timeout(60)
@pytest.mark.parametrize("how", sorted(DIES))
def test_no_line_of_ours_after_the_parent_saw_the_death(tmp_path, built, how):
    # The shape of `python demo/stuck_job.py` and of a shell: the parent reaps the job at once and
    # prints; the watcher's death line must not come after that, and the log still has it.
    if how == "kill-mid-report" and shutil.which("gdb") is None:
        pytest.skip("gdb is not installed")
    text, options = DIES[how]
    module(tmp_path, "dies", text)
    (tmp_path / "parent.py").write_text(PARENT)
    log = tmp_path / "job.log"
    done = subprocess.run(
        [sys.executable, "parent.py", *traced(*options, "--log", str(log), "-c", "import dies")],
        cwd=tmp_path, env=clean_env(HOW=how, PYTHONPATH=str(built)), stdin=subprocess.DEVNULL,
        capture_output=True, text=True, timeout=50,
    )  # fmt: skip
    lines = done.stderr.splitlines()
    ended = next(i for i, line in enumerate(lines) if line.startswith("PARENT: the job ended"))
    assert not [line for line in lines[ended:] if line.startswith("[importwatch ")], done.stderr
    logged = [line for line in log.read_text().splitlines() if "outside: died during import" in line]
    assert len(logged) == 1 and "dies" in logged[0] and WORDS[how] in logged[0], log.read_text()


# -- 4. native stacks: the stalled thread first, ours named as ours ------------------------------
@pytest.fixture(scope="module")
def libctor(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("ctor")
    compile_shared(FIXTURES / "outside" / "ctor_lib.c", out / "libctor.so")
    return out / "libctor.so"


@pytest.mark.timeout(60)
@needs_gdb
def test_native_stacks_show_the_stalled_thread_first_and_ours_as_ours(libctor, tmp_path, start):
    log = tmp_path / "run.log"
    code = f"import ctypes; ctypes.CDLL({str(libctor)!r})"
    proc = start(traced("--timeout", "1", "--log", str(log), "-c", code))
    pid = proc.process.pid
    proc.wait_for("outside: still waiting after", 30)
    lines = outside_lines(proc.stderr)
    titles = [i for i, line in enumerate(lines) if "outside: native stacks (gdb" in line]
    assert len(titles) == 1, proc.stderr  # the unchanged stall's second report does not repeat them
    block = [line.split("] outside: ", 1)[1] for line in lines[titles[0] + 1 :]]
    block = block[: next((i for i, line in enumerate(block) if not line.startswith("  ")), len(block))]
    # The terminal: the stalled thread first, its frames folded, ours counted; the log has the rest.
    assert block[0] == f"  Thread 1 (LWP {pid}) MainThread", block
    assert any("never_returns" in frame for frame in block), block
    assert any("dynamic loader frames" in frame for frame in block), block
    assert block[-1] == "  (and 1 thread of importwatch's own)", block
    assert f"outside: full stacks in {log}" in proc.stderr
    logged = outside_lines(log.read_text())
    title = next(i for i, line in enumerate(logged) if "outside: native stacks (gdb" in line)
    whole = [line.split("] outside: ", 1)[1] for line in logged[title + 1 :]]
    whole = whole[: next((i for i, line in enumerate(whole) if not line.startswith("  ")), len(whole))]
    assert whole[0] == f"  Thread 1 (LWP {pid}) MainThread", whole
    assert not any("dynamic loader frames" in frame for frame in whole), whole  # every frame
    ours = [line for line in whole if "(ours)" in line]
    assert ours == [f"  Thread 2 (LWP {ours_tid(lines)}): importwatch's heartbeat (ours)"], whole
    assert whole[-1] == ours[0]


def ours_tid(lines: list[str]) -> int:
    line = next(line for line in lines if "importwatch-heartbeat (tid " in line)
    return int(line.split("importwatch-heartbeat (tid ")[1].split(")")[0])


@pytest.mark.timeout(60)
@needs_gdb
def test_our_threads_are_named_as_ours_never_as_suspects(tmp_path, start):
    # A stall that leaves the GIL free: the heartbeat keeps faulthandler's timer thread armed.
    module(tmp_path, "slowimp", SLEEP.format(seconds=60))
    log = tmp_path / "run.log"
    proc = start(traced("--timeout", "1", "--log", str(log), "-c", "import slowimp"), cwd=tmp_path)
    proc.wait_for("outside: full stacks in", 30)
    lines = outside_lines(proc.stderr)
    title = next(i for i, line in enumerate(lines) if "outside: native stacks (gdb" in line)
    listing = [line for line in lines[:title] if "(tid " in line]
    assert "MainThread (tid" in listing[0] and ": waiting; in " in listing[0], listing
    # faulthandler's timer thread lives while it is armed: re-armed for the next report (a new thread),
    # or fired when a loaded machine delayed the heartbeat, it may be gone at the look; when there, ours.
    timers = [line for line in listing if "faulthandler" in line]
    assert all("faulthandler-timer (tid" in line and "faulthandler's timer" in line for line in timers), (
        timers
    )
    assert any("importwatch-heartbeat (tid" in line and "(ours)" in line for line in listing), listing
    assert not any("thread-" in line for line in listing), listing
    # Ours in one line each: never a verdict nor what they wait on.
    assert all(line.endswith("(ours)") for line in listing[1:]), listing
    # On the terminal the stacks are the program's; ours are counted, and named in the log.
    shown = [line.split("] outside: ", 1)[1] for line in lines[title + 1 :]]
    assert [line for line in shown if line.startswith("  Thread")] == [shown[0]], shown
    assert any(re.fullmatch(r"  \(and [12] threads? of importwatch's own\)", line) for line in shown), shown
    logged = outside_lines(log.read_text())
    title = next(i for i, line in enumerate(logged) if "outside: native stacks (gdb" in line)
    stacks = [line.split("] outside: ", 1)[1] for line in logged[title + 1 :]]
    headers = [line for line in stacks if line.startswith("  Thread")]
    assert "MainThread" in headers[0]
    assert len(headers) >= 2 and all(line.endswith("(ours)") for line in headers[1:]), headers


# -- 5. someone else's debugger: not ours to kill ------------------------------------------------
@pytest.mark.timeout(60)
@needs_gdb
def test_exit_on_stall_leaves_a_process_someone_is_debugging(tmp_path, start):
    module(tmp_path, "slowimp", SLEEP.format(seconds=60))
    proc = start(traced("--timeout", "3", "--exit-on-stall", "-c", "import slowimp"), cwd=tmp_path)
    pid = proc.process.pid
    proc.wait_for("> slowimp", 20)
    person = subprocess.Popen(
        ["gdb", "-nx", "-batch", "-p", str(pid), "-ex", "shell sleep 7"],
        stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    try:
        proc.wait_for("is debugging it: left as it is, not killed", 30)
        assert proc.process.poll() is None  # still there, stopped in the person's debugger
        person.wait(30)
        # Let go, the program's own watchdog ends it, as --exit-on-stall asks.
        assert proc.finish() == 1, proc.stderr
    finally:
        if person.poll() is None:
            person.kill()
            person.wait()
    lines = outside_lines(proc.stderr)
    assert sum("not killed" in line for line in lines) == 1, proc.stderr
    assert not any("killing it" in line for line in lines)


@pytest.mark.timeout(60)
@needs_gdb
def test_exit_on_stall_leaves_a_program_running_under_someones_debugger(tmp_path, start):
    module(tmp_path, "slowimp", SLEEP.format(seconds=60))
    proc = start(traced("--timeout", "3", "--exit-on-stall", "-c", "import slowimp"), cwd=tmp_path)
    pid = proc.process.pid
    proc.wait_for("> slowimp", 20)
    person = subprocess.Popen(
        ["gdb", "-nx", "-batch", "-p", str(pid), "-ex", "continue"],
        stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    try:
        # Neither the program's watchdog nor the watcher ends it, nor reads its stacks.
        proc.wait_for("--exit-on-stall does not end it: a debugger, pid", 30)
        proc.wait_for("is debugging it: left as it is, not killed", 30)
        assert proc.process.poll() is None
    finally:
        person.kill()
        person.wait()
    os.kill(pid, signal.SIGCONT)  # a debugger killed may leave its tracee stopped
    # Free again: the next stall report ends it, as --exit-on-stall asks.
    assert proc.finish() == 1, proc.stderr
    lines = outside_lines(proc.stderr)
    assert any("no native stacks: pid" in line and "is debugging it" in line for line in lines), lines
    assert not any("killing it" in line for line in lines)


# A new heartbeat starts at the first step after the last one left (idle), and the kernel's list of
# threads cannot say which new one is ours (here: none looks new, as when another one left meanwhile).
# Then the GIL is held for good, before the heartbeat could run: the starter must learn its name.
NAMED_UNDER_DOUBT = """\
import ctypes, time
import importwatch
from importwatch.facts import procstat
hold = ctypes.PyDLL(None).sleep  # libc's sleep, called with the GIL held
time.sleep(0.8)  # the heartbeat of the start-up's steps has left: the next step starts a new one
real, seen = procstat.tasks, []
def tasks():
    seen.append(seen[0] if seen else real())
    return seen[-1]
procstat.tasks = tasks
with importwatch.phase("holding"):
    hold(60)
"""


@pytest.mark.timeout(60)
def test_a_new_heartbeat_is_named_for_the_watcher_when_the_threads_cannot_tell(tmp_path, start):
    proc = start(traced("--timeout", "1", "--stderr", "stalls", "-c", NAMED_UNDER_DOUBT), cwd=tmp_path)
    proc.wait_for("outside: waiting: ", 30)
    proc.wait_after("outside: waiting: ", "importwatch-heartbeat (tid")  # ours: the listing's last
    listing = [line for line in outside_lines(proc.stderr) if "(tid " in line]
    assert any("importwatch-heartbeat (tid" in line and "(ours)" in line for line in listing), proc.stderr
    assert not any("thread-" in line for line in listing), listing
