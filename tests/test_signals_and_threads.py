"""Our threads never take the program's signals, nor its faulthandler deadline, side by side with plain python."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

from helpers import clean_env
from test_side_by_side import RUNNER, three_ways

pytestmark = [pytest.mark.timeout(180), pytest.mark.slow]  # every test here starts processes


def _write(folder: Path, **files: str) -> None:
    for name, text in files.items():
        (folder / name).write_text(text)


# -- signals the program blocked -------------------------------------------------------------------
def test_a_signal_the_program_blocked_reaches_its_sigwait_thread(tmp_path: Path) -> None:
    _write(
        tmp_path,
        **{
            "prog.py": """\
import signal, sys, threading
signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM})
got = []
waiter = threading.Thread(target=lambda: got.append(signal.sigwait({signal.SIGTERM})))
waiter.start()
import sends_term
waiter.join(10)
print("shut down cleanly on", [int(s) for s in got])
""",
            "sends_term.py": "import os, signal, time\nos.kill(os.getpid(), signal.SIGTERM)\ntime.sleep(0.5)\n",
        },
    )
    for name, run in three_ways(["prog.py"], tmp_path).items():
        assert (run.returncode, run.stdout) == (0, "shut down cleanly on [15]\n"), (name, run.stderr)


def test_a_sigint_blocked_around_a_critical_section_waits_for_its_end(tmp_path: Path) -> None:
    _write(
        tmp_path,
        **{
            "prog.py": """\
import signal
signal.signal(signal.SIGINT, signal.default_int_handler)  # ignored when started in the background
signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
try:
    import critical
finally:
    print("unblocking", flush=True)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})
print("not reached")
""",
            "critical.py": """\
import os, signal, time
os.kill(os.getpid(), signal.SIGINT)
time.sleep(0.5)
print("critical section done", flush=True)
""",
        },
    )
    for name, run in three_ways(["prog.py"], tmp_path).items():
        assert run.stdout == "critical section done\nunblocking\n", (name, run.stderr)
        assert run.returncode in (-2, 130) and "KeyboardInterrupt" in run.stderr, (name, run.stderr)


_ALL_THREADS_BLOCK = """\
import os, sys, time
TAKEN = (1, 2, 10, 12, 14, 15, 17)  # HUP INT USR1 USR2 ALRM TERM CHLD

def takers():
    count = 0
    for task in os.listdir("/proc/self/task"):
        if task == str(os.getpid()):
            continue
        with open(f"/proc/self/task/{task}/status") as status:
            mask = int(next(l for l in status if l.startswith("SigBlk")).split()[1], 16)
        count += any(not mask & (1 << (s - 1)) for s in TAKEN)
    return count

time.sleep(0.6)  # in flight: the heartbeat looks, faulthandler's timer is armed
print("child" if os.environ.get("FORKED") else "parent", "threads taking signals:", takers(), flush=True)
"""


def test_every_thread_of_ours_blocks_every_signal_also_in_a_fork_child(tmp_path: Path) -> None:
    _write(
        tmp_path,
        **{
            "looks.py": _ALL_THREADS_BLOCK,
            "prog.py": """\
import os, sys
import looks
pid = os.fork()
if pid == 0:
    os.environ["FORKED"] = "1"
    sys.modules.pop("looks")
    import looks
    os._exit(0)
os.waitpid(pid, 0)
""",
        },
    )
    for name, run in three_ways(["prog.py"], tmp_path, IMPORTWATCH_TIMEOUT="2").items():
        lines = sorted(run.stdout.splitlines())
        assert lines == ["child threads taking signals: 0", "parent threads taking signals: 0"], (
            name,
            run.stderr,
        )


# -- the program's own faulthandler deadline -----------------------------------------------------
def test_the_programs_faulthandler_deadline_fires_after_ours_fired_while_the_gil_was_held(
    tmp_path: Path,
) -> None:
    """Our deadline comes first and fires while Python cannot run (as during a debugger's pause or a
    dlopen); the import ends and nothing else is in flight: the program's deadline must still fire."""
    _write(
        tmp_path,
        **{
            "prog.py": """\
import faulthandler, sys, time
faulthandler.dump_traceback_later(3, exit=True)
import hog
time.sleep(8)
print("not reached")
""",
            "hog.py": """\
import sys, time
sys.setswitchinterval(100)  # no other thread gets the GIL while this loop runs
end = time.monotonic() + 2.0
while time.monotonic() < end:
    pass
sys.setswitchinterval(0.005)
""",
        },
    )
    started = time.monotonic()
    runs = three_ways(["prog.py"], tmp_path, runner_options=("--timeout", "1"), IMPORTWATCH_TIMEOUT="1")
    assert time.monotonic() - started < 60
    for name, run in runs.items():
        assert (run.returncode, run.stdout) == (1, ""), (name, run.stderr)
        # Its dump and exit, as it asked (the header gives the time left when it was armed again).
        assert "Timeout (0:00:" in run.stderr, (name, run.stderr)


# -- a job ended for a stall ----------------------------------------------------------------------
def _processes_with(marker: str) -> list[int]:
    found = []
    for entry in os.listdir("/proc"):
        try:
            with open(f"/proc/{entry}/cmdline", "rb") as cmdline:
                if marker.encode() in cmdline.read():
                    found.append(int(entry))
        except (OSError, ValueError):
            continue
    return found


STARTS_CHILDREN = """\
import subprocess, sys
print("from the stalled import")  # block-buffered: a file
grandchild = "import subprocess, sys, time; subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(1000)', sys.argv[1]]); time.sleep(1000)"
subprocess.run([sys.executable, "-c", grandchild, sys.argv[1]])
"""


@pytest.mark.parametrize("how", ["runner", "IMPORTWATCH=1"])
def test_a_job_ended_for_a_stall_takes_what_the_stalled_import_started_and_writes_out_its_stdout(
    tmp_path: Path, how: str
) -> None:
    marker = f"iw-orphan-{uuid.uuid4().hex}"
    _write(tmp_path, **{"prog.py": "print('before')\nimport starts\n", "starts.py": STARTS_CHILDREN})
    options = ["--timeout", "1", "--exit-on-stall"]
    env = clean_env(IMPORTWATCH="1", IMPORTWATCH_TIMEOUT="1", IMPORTWATCH_EXIT_ON_STALL="1")
    command = [*RUNNER, *options] if how == "runner" else [sys.executable]
    out, err = tmp_path / "out.txt", tmp_path / "err.txt"
    try:
        with open(out, "wb") as stdout, open(err, "wb") as stderr:
            status = subprocess.run(
                [*command, "prog.py", marker], cwd=tmp_path, stdin=subprocess.DEVNULL, stdout=stdout,
                stderr=stderr, env=env if how != "runner" else clean_env(), timeout=60,
            ).returncode  # fmt: skip
        left = _processes_with(marker)
    finally:
        for pid in _processes_with(marker):
            os.kill(pid, signal.SIGKILL)
    stderr_text = err.read_text()
    assert status == 1, stderr_text
    assert left == [], stderr_text
    assert out.read_text() == "before\nfrom the stalled import\n"
    ended = re.search(r"exiting with status 1 \(--exit-on-stall; ended what it started: (.*)\)", stderr_text)
    assert ended is not None, stderr_text
    assert len(ended.group(1).split(", ")) == 2 and "python" in ended.group(1)


# -- threads of ours only while something is in flight ----------------------------------------
def test_a_program_that_imported_is_single_threaded_again_and_may_unshare_its_user_namespace(
    tmp_path: Path,
) -> None:
    _write(
        tmp_path,
        **{
            "prog.py": """\
import ctypes, os, threading, time
import json, email.parser
deadline = time.monotonic() + 5
while len(os.listdir("/proc/self/task")) > 1 and time.monotonic() < deadline:
    time.sleep(0.05)
libc = ctypes.CDLL(None, use_errno=True)
tasks = len(os.listdir("/proc/self/task"))
done = libc.unshare(0x10000000) == 0  # CLONE_NEWUSER: refused to a multi-threaded process
print(threading.active_count(), [t.name for t in threading.enumerate()], tasks, done or os.strerror(ctypes.get_errno()))
"""
        },
    )
    runs = three_ways(["prog.py"], tmp_path)
    assert runs["plain"].returncode == 0, runs["plain"].stderr
    for name, run in runs.items():
        assert run.stdout == runs["plain"].stdout, (name, run.stderr)


def test_a_program_that_imports_nothing_more_is_single_threaded_within_a_second(tmp_path: Path) -> None:
    # IMPORTWATCH=1 sees site's own steps (sitecustomize, usercustomize) before the program's first line.
    code = """\
import os, time
end = time.monotonic() + 1
while len(os.listdir("/proc/self/task")) > 1 and time.monotonic() < end:
    time.sleep(0.01)
print(len(os.listdir("/proc/self/task")))
"""
    for name, run in three_ways(["-c", code], tmp_path).items():
        assert (run.returncode, run.stdout) == (0, "1\n"), (name, run.stderr)


# -- an asynchronous exception the program raises in its own thread ------------------------------------
ASYNC_EXCEPTION_AFTER_AN_IMPORT = """
import ctypes, importlib, os, threading, time
set_async_exc = ctypes.pythonapi.PyThreadState_SetAsyncExc
set_async_exc.argtypes = (ctypes.c_ulong, ctypes.py_object)
class AsyncExc(Exception):
    pass
lost = 0
for i in range(20):
    pid = os.fork()
    if pid == 0:  # a fork child's first step starts our heartbeat, as any step after an idle spell does
        importlib.import_module(f"mod_{i}")
        try:
            set_async_exc(threading.get_ident(), ctypes.py_object(AsyncExc))
            deadline = time.monotonic() + 5
            while time.monotonic() < deadline:
                pass
        except AsyncExc:
            os._exit(0)
        os._exit(3)
    lost += os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]) != 0
print("lost", lost)
"""


@pytest.mark.parametrize("pure", ["0", "1"], ids=["C", "pure"])
def test_an_asynchronous_exception_the_program_aims_at_its_own_thread_reaches_it(
    tmp_path: Path, pure: str
) -> None:
    """CPython's own test_threading hung under the runner: before 3.12 a new thread's state carries its
    starter's ident until it runs, so the program's PyThreadState_SetAsyncExc, right after an import that
    started our heartbeat, ended the heartbeat instead of raising in the program's thread."""
    _write(
        tmp_path,
        **{f"mod_{i}.py": f"X = {i}\n" for i in range(20)},
        **{"prog.py": ASYNC_EXCEPTION_AFTER_AN_IMPORT},
    )
    runs = three_ways(["prog.py"], tmp_path, IMPORTWATCH_STDERR="stalls", IMPORTWATCH_PURE=pure)
    for name, run in runs.items():
        assert (run.returncode, run.stdout) == (0, "lost 0\n"), (name, run.stderr)
        assert run.stderr == "", (name, run.stderr)
