"""The /proc stat parser (facts/procstat.py) on a real process whose command name holds spaces and
parentheses, and the watcher reading such a process to its death."""

from __future__ import annotations

import os
import subprocess
import sys
import threading

import pytest

from helpers import clean_env, importwatch
from importwatch.facts import process as outside
from importwatch.facts import procstat

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")

# A command name as hostile as one can be: the kernel keeps 15 bytes of it, parentheses and spaces included.
COMM = "a) b (c"
_SET_COMM = f"open('/proc/self/comm', 'w').write({COMM!r})"


@pytest.mark.slow
@pytest.mark.timeout(30)
def test_fields_are_read_after_the_last_parenthesis_of_a_real_process():
    code = f"import sys; {_SET_COMM}; print('ready', flush=True); sys.stdin.read()"
    child = subprocess.Popen(
        [sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    try:
        assert child.stdout.readline() == "ready\n"
        with open(f"/proc/{child.pid}/comm") as comm:
            assert comm.read().rstrip("\n") == COMM  # the kernel took it as it is
        with open(f"/proc/{child.pid}/stat", "rb") as stat:
            comm, fields = procstat.split(stat.read())
        assert comm == COMM
        again = procstat.fields(f"/proc/{child.pid}/stat")
        assert again is not None and again[procstat.START_TIME] == fields[procstat.START_TIME]
        assert fields[procstat.STATE] in (b"R", b"S")  # about to wait on its stdin, or waiting
        assert int(fields[procstat.PPID]) == os.getpid()
        assert int(fields[procstat.PGRP]) == os.getpgrp()
        assert int(fields[procstat.THREADS]) == 1
        assert procstat.cpu_ticks(fields) >= 0
        # The watcher's view of it, built on the same parser.
        stat = outside.process_stat(child.pid)
        assert stat is not None and stat.comm == COMM and stat.ppid == os.getpid()
        assert stat.state_name in ("running", "sleeping") and stat.start == int(fields[procstat.START_TIME])
        (sample,) = outside.sample_threads(child.pid).values()
        assert sample.comm == COMM and sample.tid == child.pid
    finally:
        child.kill()
        child.wait()


def test_own_threads_are_counted():
    fields = procstat.fields("/proc/self/stat")
    assert fields is not None and int(fields[procstat.THREADS]) == threading.active_count()


@pytest.mark.slow
def test_a_process_that_is_gone_reads_as_none(tmp_path):
    done = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True
    )
    gone = int(done.stdout)
    assert procstat.fields(f"/proc/{gone}/stat") is None or gone == os.getpid()
    assert procstat.fields(str(tmp_path / "missing")) is None


@pytest.mark.slow
@pytest.mark.timeout(40)
def test_the_watcher_reads_the_death_of_a_process_with_such_a_name(tmp_path):
    # Its start time, read at launch, must match the one read at its death, through the new name:
    # else the watcher would take it for a process that exec'd and say nothing.
    (tmp_path / "quitter.py").write_text(f"import os, time\n{_SET_COMM}\ntime.sleep(0.3)\nos._exit(7)\n")
    done = importwatch("--timeout", "5", "-c", "import quitter", cwd=tmp_path, env=clean_env())
    assert done.returncode == 7
    died = [line for line in done.stderr.splitlines() if "outside: died during import" in line]
    assert len(died) == 1 and "exited with status 7" in died[0] and "quitter" in died[0], done.stderr
