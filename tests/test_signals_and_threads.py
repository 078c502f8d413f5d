"""Our threads never take the program's signals, nor its faulthandler deadline, side by side with plain python."""

from __future__ import annotations

import sys
import time
from pathlib import Path

import pytest

from test_side_by_side import three_ways

pytestmark = pytest.mark.timeout(180)


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
        assert lines == ["child threads taking signals: 0", "parent threads taking signals: 0"], (name, run.stderr)


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
