"""A thread's words fit what it does and the machine it runs on.

A thread that wakes briefly and sleeps again (a timed poll, as a thread taking the GIL every 5 ms)
is waiting; caught running at the look, it is still never called "waiting (running, 1% CPU)". And
the advice for a busy import names CUDA JIT only on a machine with an NVIDIA driver.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from helpers import clean_env, importwatch
from importwatch.facts import process
from importwatch.tools.inspection import render
from importwatch.watcher.report import Composing

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")

# A thread that runs 20 ms, then sleeps 0.4 s: about 5% of a CPU, and now and then running at a look.
POLLER = """
import threading, time
def poll():
    while True:
        end = time.monotonic() + 0.02
        while time.monotonic() < end:
            pass
        time.sleep(0.4)
thread = threading.Thread(target=poll, name="poller", daemon=True)
thread.start()
print(thread.native_id, flush=True)
thread.join()
"""
NVIDIA = os.path.exists("/proc/driver/nvidia/version")


def _caught_running(pid: int, tid: int, seconds: float) -> tuple[process.ThreadSample, float]:
    """A real look at thread TID in state R, and its CPU share over the 0.3 s or more before it."""
    history: list[tuple[float, process.ThreadSample]] = []
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        now = time.monotonic()
        sample = process.sample_threads(pid, detail=True).get(tid)
        assert sample is not None, "the poller is gone"
        earlier = [(when, old) for when, old in history if now - when >= 0.3]
        if sample.state == "R" and earlier:
            when, before = earlier[-1]
            share = process.cpu_share(before, sample, now - when)
            if share is not None and process.verdict(sample, share) == process.WAITING:
                return sample, share
        history.append((now, sample))
        history = [(when, old) for when, old in history if now - when < 2]
        time.sleep(0.002)
    pytest.fail("never caught the poller running at a look within its idle share")


@pytest.mark.slow
@pytest.mark.timeout(60)
def test_a_thread_caught_running_between_sleeps_is_waiting_not_running() -> None:
    child = subprocess.Popen([sys.executable, "-c", POLLER], stdout=subprocess.PIPE, text=True)
    try:
        tid = int(child.stdout.readline())
        sample, share = _caught_running(child.pid, tid, 40)
    finally:
        child.kill()
        child.wait()
        child.stdout.close()
    watcher = Composing._state_text(sample, share)  # the watcher's `NAME STATE, N% CPU: waiting`
    assert "running" not in watcher and watcher.startswith(process.POLLING), watcher
    thread = {
        "tid": tid, "name": "poller", "state": sample.state_name, "wchan": sample.wchan or None,
        "verdict": process.verdict(sample, share), "cpu": share, "last_ran": 0.0, "waits_on": None,
        "chain": [], "doing": None, "python": [], "native": [],
    }  # fmt: skip
    line = render._thread(thread)[0]  # inspect's thread line
    assert line.startswith(f"  poller (tid {tid}): waiting ({process.POLLING}, "), line
    assert "running" not in line


@pytest.mark.slow
@pytest.mark.timeout(60)
def test_busy_advice_names_cuda_jit_only_with_an_nvidia_driver(tmp_path: Path) -> None:
    (tmp_path / "spin.py").write_text(
        "import time\nend = time.monotonic() + 2.5\nwhile time.monotonic() < end:\n    pass\n"
    )
    env = clean_env(PYTHONPATH=str(tmp_path))
    result = importwatch("--timeout", "1", "-c", "import spin", env=env, cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    busy = [line for line in result.stderr.splitlines() if "busy, not stuck" in line]
    assert busy, result.stderr
    assert any("used" in line and "ends by itself" in line for line in busy), busy  # in process
    for line in busy:
        assert ("CUDA JIT" in line) == NVIDIA, line
