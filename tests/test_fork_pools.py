"""A fork child that inherits a runtime's thread pool, and a lock, it can never get: told as such.

The parent runs an OpenMP parallel region (GNU libgomp keeps its pool of threads), then forks; in
the child, an import runs another region and waits on a futex for the pool's threads, which stayed
in the parent. Each view names it: the child's own watcher (runner, IMPORTWATCH=1 with the watcher),
the child's own stall report (GIL free) and `inspect` on the child. A process with one thread never
hears that its futex is "held by another thread".
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from cbuild import FIXTURES, compile_extension
from helpers import clean_env, traced

pytestmark = [
    pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc"),
    pytest.mark.slow,
]

# The job: the parent uses OpenMP, forks, and the child imports a module that uses it again.
JOB = """\
import os, sys
import ompkern
print("parent region:", ompkern.run(), flush=True)
{fork}
"""
AT_TOP = """\
if os.fork() == 0:
    import ompwork
    os._exit(0)
os.wait()
"""
# The same relation in other clothes: the fork happens inside an import, which the child goes on with.
INSIDE_IMPORT = """\
import launcher
os.wait()
"""
LAUNCHER = """\
import os
if os.fork() == 0:
    import ompwork
    os._exit(0)
"""
HEADLINE = "fork child of {parent}; waits for GNU OpenMP (libgomp)'s thread pool (libgomp"


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("omp")
    try:
        compile_extension(FIXTURES / "fork" / "omp_ext.c", out, "ompkern", extra=["-fopenmp"])
    except RuntimeError as error:
        pytest.skip(f"no OpenMP compiler support: {str(error).splitlines()[-1]}")
    return out


def job(folder: Path, body: str, release_gil: bool = False) -> Path:
    call = "run_nogil" if release_gil else "run"
    (folder / "ompwork.py").write_text(f"import ompkern\nompkern.{call}()\n")
    (folder / "launcher.py").write_text(LAUNCHER)
    (folder / "run.py").write_text(JOB.format(fork=body))
    return folder / "run.py"


class Job:
    """A job started in a session of its own (in_session: the hung child dies with it), its output in a file."""

    def __init__(self, in_session, command: list[str], cwd: Path, env: dict[str, str], log: Path) -> None:
        self.log = log
        with open(log, "wb") as out:
            self.process = in_session(command, cwd=cwd, env=env, stdout=out, stderr=subprocess.STDOUT)

    def wait_for(self, text: str, timeout: float, pid: int | None = None) -> str:
        """The output once TEXT is in it (in a line of PID's, when given); fails after TIMEOUT."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            seen = self.log.read_text(errors="replace")
            if text in (seen if pid is None else "\n".join(lines_of(seen, pid))):
                return seen
            time.sleep(0.1)
        pytest.fail(f"{text!r} did not appear within {timeout} s:\n{self.log.read_text(errors='replace')}")


@pytest.fixture
def group(in_session):
    return lambda *args: Job(in_session, *args)


def lines_of(text: str, pid: int) -> list[str]:
    return [line for line in text.splitlines() if line.startswith(f"[importwatch {pid} ")]


def child_of(text: str) -> tuple[int, int]:
    """(the child's pid, its parent's) from its `fork child of` line."""
    line = next(line for line in text.splitlines() if "] fork child of " in line)
    return int(line.split()[1]), int(line.rsplit(" ", 1)[1])


@pytest.mark.timeout(60)
@pytest.mark.parametrize("where", ["at top", "inside an import"])
@pytest.mark.parametrize("how", ["runner", "IMPORTWATCH=1 with the watcher"])
def test_the_childs_watcher_names_the_orphaned_pool(site, tmp_path, group, how, where):
    script = job(tmp_path, AT_TOP if where == "at top" else INSIDE_IMPORT)
    env = clean_env(PYTHONPATH=str(site), OMP_NUM_THREADS="4")
    if how == "runner":
        command = traced("--timeout", "1.5", str(script))
    else:
        command = [sys.executable, str(script)]
        env.update(IMPORTWATCH="1", IMPORTWATCH_TIMEOUT="1.5", IMPORTWATCH_WATCHER="1")
    running = group(command, tmp_path, env, tmp_path / "out.txt")
    seen = running.wait_for("its pool has no threads here", 30)
    child, parent = child_of(seen)
    # The child's line of our heartbeat comes after its MainThread's; the parent's watcher may list its own.
    seen = running.wait_for("outside: importwatch-heartbeat (tid", 10, pid=child)
    ours = lines_of(seen, child)
    head = next(line for line in ours if "outside: waiting: " in line)
    assert HEADLINE.format(parent=parent) in head and "multiprocessing.set_start_method('spawn')" in head
    assert "in flight: MainThread: " + ("ompwork" if where == "at top" else "launcher") in head, head
    assert any("outside: importwatch-heartbeat (tid" in line for line in ours), seen
    assert not any("held by another thread" in line for line in ours), seen
    assert not any("> fcntl" in line for line in ours), "the child's watcher is not the program's import"


@pytest.mark.timeout(60)
def test_the_childs_stall_report_names_the_orphaned_pool(site, tmp_path, group):
    # The region runs with the GIL released: the child's own heartbeat can report, with no watcher.
    script = job(tmp_path, AT_TOP, release_gil=True)
    env = clean_env(PYTHONPATH=str(site), OMP_NUM_THREADS="4", IMPORTWATCH="1", IMPORTWATCH_TIMEOUT="1")
    running = group([sys.executable, str(script)], tmp_path, env, tmp_path / "out.txt")
    seen = running.wait_for("  context: MainThread: fork child of", 30)
    child, parent = child_of(seen)
    context = next(line for line in lines_of(seen, child) if "context: MainThread: fork child of" in line)
    assert HEADLINE.format(parent=parent) in context
    ours = lines_of(seen, child)
    assert not any("> importwatch" in line or "> struct" in line for line in ours), seen


@pytest.mark.timeout(90)
@pytest.mark.skipif(shutil.which("gdb") is None and shutil.which("py-spy") is None, reason="no stack reader")
def test_inspect_names_the_orphaned_pool_of_a_process_started_without_importwatch(site, tmp_path, group):
    script = job(tmp_path, AT_TOP)
    env = clean_env(PYTHONPATH=str(site), OMP_NUM_THREADS="4")
    running = group([sys.executable, "-u", str(script)], tmp_path, env, tmp_path / "out.txt")
    running.wait_for("parent region: 4", 20)
    child = None
    deadline = time.monotonic() + 10
    while child is None and time.monotonic() < deadline:
        children = (
            Path(f"/proc/{running.process.pid}/task/{running.process.pid}/children").read_text().split()
        )
        child = int(children[0]) if children else None
        time.sleep(0.05)
    assert child is not None
    time.sleep(1.0)  # let it reach the region's wait
    done = subprocess.run(
        [sys.executable, "-m", "importwatch", "inspect", str(child)], env=clean_env(), capture_output=True,
        text=True, timeout=80,
    )  # fmt: skip
    assert done.returncode == 1, done.stdout + done.stderr
    verdict = done.stdout[done.stdout.index("verdict:") :].splitlines()
    assert HEADLINE.format(parent=running.process.pid) in verdict[1], done.stdout
    assert "held by another thread" not in done.stdout


LOCKED = """\
import os, threading, time
lock = threading.Lock()
held = threading.Event()
def hold():
    with lock:
        held.set()
        time.sleep(60)
threading.Thread(target=hold, daemon=True).start()
held.wait()
if os.fork() == 0:
    import waiter  # takes the lock a thread held at the fork: that thread is not in the child
    os._exit(0)
os.wait()
"""


@pytest.mark.timeout(60)
def test_a_lock_held_at_fork_is_not_held_by_another_thread_in_the_child(tmp_path, group):
    (tmp_path / "waiter.py").write_text("import __main__\n__main__.lock.acquire()\n")
    (tmp_path / "run.py").write_text(LOCKED)
    env = clean_env(PYTHONPATH=str(tmp_path), PYTHONWARNINGS="ignore")
    running = group(traced("--timeout", "1", "run.py"), tmp_path, env, tmp_path / "out.txt")
    seen = running.wait_for("outside: MainThread (tid", 30)
    child, _ = child_of(seen)
    ours = lines_of(seen, child)
    main = next(line for line in ours if "outside: MainThread (tid" in line)
    assert "in futex, with no other thread in this process to wake it" in main, seen
    assert not any("held by another thread" in line for line in ours), seen
