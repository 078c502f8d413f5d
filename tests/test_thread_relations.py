"""Who waits for whom, said in one line: a cycle of threads each waiting for the next's module lock or
in Thread.join for it (two threads and three), and a program whose main code has ended waiting at exit,
in threading's shutdown, for a thread hung in an import. Each shape under the runner, under
`IMPORTWATCH=1` and seen from outside by `inspect PID` (issue 28, shapes 2 and 3)."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from helpers import Running, clean_env, importwatch, traced

pytestmark = pytest.mark.slow  # every test here starts processes

GDB = shutil.which("gdb")
PYSPY = shutil.which("py-spy", path=str(Path(sys.executable).parent)) or shutil.which("py-spy")

# A package whose body starts a warm-up thread and joins it; the thread's module imports from the
# package, still initialising: MainThread holds app's module lock and joins warmup, which waits for it.
WARMUP = {
    "app/__init__.py": (
        "import threading\n"
        "settings = {'size': 1}\n"
        "def _warm():\n"
        "    import app.cache\n"
        "_thread = threading.Thread(target=_warm, name='warmup')\n"
        "_thread.start()\n"
        "_thread.join()\n"
    ),
    "app/cache.py": "from app import settings\n",
    "main_warmup.py": "import app\n",
}
# Three threads: MainThread holds x and waits for y's lock; warmup, in y's body, joins prefetch;
# prefetch waits for x's lock. importlib's own deadlock check sees none of it (a join is no module lock).
THREE = {
    "x.py": (
        "import threading, time\n"
        "threading.Thread(target=lambda: __import__('y'), name='warmup').start()\n"
        "time.sleep(0.5)\n"
        "import y\n"
    ),
    "y.py": (
        "import threading\n"
        "t = threading.Thread(target=lambda: __import__('x'), name='prefetch')\n"
        "t.start()\n"
        "t.join()\n"
    ),
    "main_three.py": "import x\n",
}
# The main code ends before it feeds the queue a non-daemon thread's import waits on.
AT_EXIT = {
    "jobs.py": "import queue, threading\ntodo = queue.Queue()\nready = threading.Event()\n",
    "handlers.py": "import jobs\nfirst = jobs.todo.get()\n",
    "service.py": (
        "import threading\n"
        "import jobs\n"
        "threading.Thread(target=lambda: __import__('handlers'), name='loader').start()\n"
        "# an early return: jobs.todo.put(...) never runs\n"
    ),
    # The same shape in other clothes: an Event the main code would have set.
    "plugins.py": "import jobs\njobs.ready.wait()\n",
    "server.py": (
        "import threading\n"
        "def load():\n"
        "    import plugins\n"
        "threading.Thread(target=load, name='plugin-loader').start()\n"
    ),
}
WARMUP_LINE = (
    "context: deadlock: MainThread holds the module lock of app and waits in Thread.join for warmup, "
    "which waits for the module lock of app: neither can go on"
)
THREE_LINE = (
    "context: deadlock: MainThread holds the module lock of x and waits for the module lock of y held by "
    "warmup, which waits in Thread.join for prefetch, which waits for the module lock of x: none of the 3 "
    "can go on"
)


@pytest.fixture(scope="module")
def root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("relations")
    for relative, source in {**WARMUP, **THREE, **AT_EXIT}.items():
        path = root / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(source)
    return root


def _traced(mode: str, root: Path, script: str) -> subprocess.CompletedProcess:
    """SCRIPT run under the runner or IMPORTWATCH=1, a stall after 1 s ending it (status 1)."""
    if mode == "runner":
        return importwatch(
            "--timeout", "1", "--exit-on-stall", "--no-watcher", script,
            env=clean_env(PYTHONPATH=str(root)), cwd=root,
        )  # fmt: skip
    env = clean_env(
        PYTHONPATH=str(root),
        IMPORTWATCH="1",
        IMPORTWATCH_TIMEOUT="1",
        IMPORTWATCH_EXIT_ON_STALL="1",
        IMPORTWATCH_WATCHER="0",
    )
    return subprocess.run(
        [sys.executable, script], env=env, cwd=root, capture_output=True, text=True, timeout=60
    )


# -- inside: the runner and IMPORTWATCH=1 ------------------------------------------------------------
@pytest.mark.timeout(90)
@pytest.mark.parametrize("mode", ["runner", "env"])
def test_two_thread_cycle_of_a_module_lock_and_a_join_is_one_deadlock_line(root: Path, mode: str) -> None:
    done = _traced(mode, root, "main_warmup.py")
    assert done.returncode == 1, done.stderr
    assert WARMUP_LINE in done.stderr, done.stderr


@pytest.mark.timeout(90)
@pytest.mark.parametrize("mode", ["runner", "env"])
def test_three_thread_cycle_is_named_in_one_line_from_the_main_thread(root: Path, mode: str) -> None:
    done = _traced(mode, root, "main_three.py")
    assert done.returncode == 1, done.stderr
    assert THREE_LINE in done.stderr, done.stderr
    assert done.stderr.count("context: deadlock:") == 1, done.stderr  # one cycle, one line


@pytest.mark.timeout(90)
@pytest.mark.parametrize(
    ("mode", "script", "thread", "chain", "wait"),
    [
        ("runner", "service.py", "loader", "handlers", "in queue.get, at {root}/handlers.py:2 in <module>"),
        ("env", "service.py", "loader", "handlers", "in queue.get, at {root}/handlers.py:2 in <module>"),
        ("runner", "server.py", "plugin-loader", "plugins", "at {root}/plugins.py:2 in <module>"),
        ("env", "server.py", "plugin-loader", "plugins", "at {root}/plugins.py:2 in <module>"),
    ],
)
def test_main_code_ended_waiting_at_exit_for_a_hung_import_is_said_first(
    root: Path, mode: str, script: str, thread: str, chain: str, wait: str
) -> None:
    done = _traced(mode, root, script)
    assert done.returncode == 1, done.stderr
    stall = next(line for line in done.stderr.splitlines() if "] STALL " in line)
    assert f"in flight: {thread}: {chain} (" in stall
    assert stall.endswith("; at exit: MainThread waits for it in threading's shutdown"), stall
    context = [line.split("context: ", 1)[1] for line in done.stderr.splitlines() if "context: " in line]
    assert context[0] == (
        f"at exit: the main code has ended and MainThread waits in threading's shutdown for {thread} "
        f"(not a daemon thread), which is importing {chain} and waits {wait.format(root=root)}: if that "
        f"needs the main code, the program never ends; do it before the main code ends, or make {thread} "
        "a daemon"
    ), done.stderr


@pytest.mark.timeout(120)
def test_the_watchers_outside_view_of_the_cycle_says_waiting_not_busy(root: Path, tmp_path: Path) -> None:
    running = Running(
        traced("--timeout", "1", "main_three.py"), tmp_path, clean_env(PYTHONPATH=str(root)), cwd=root
    )
    try:
        running.wait_for(THREE_LINE, 60)
        running.wait_for("outside: prefetch (tid ", 60)
    finally:
        running.kill()
    outside = [line for line in running.stderr.splitlines() if "] outside: " in line and "(tid " in line]
    for name in ("MainThread", "warmup", "prefetch"):
        (line,) = [line for line in outside if f"outside: {name} (tid " in line][:1]
        assert ": waiting;" in line and "busy" not in line and "running" not in line, line


# -- outside: inspect PID ---------------------------------------------------------------------------
@pytest.fixture
def spawn(root: Path, in_session):
    """spawn(SCRIPT) starts `python SCRIPT` without importwatch, in its own session; killed after the test."""
    return lambda script: in_session([sys.executable, script], env=clean_env(PYTHONPATH=str(root)), cwd=root)


def _only(tmp_path: Path, name: str) -> str:
    """A PATH holding only the helper NAME."""
    folder = tmp_path / f"bin-{name}"
    folder.mkdir(exist_ok=True)
    (folder / name).symlink_to(PYSPY if name == "py-spy" else shutil.which(name))
    return str(folder)


def _inspect_until(pid: int, wanted: str, path: str) -> dict:
    """inspect --json until a problem starts with WANTED (the process reached its hang), at most 60 s."""
    env = clean_env(PATH=path)
    deadline = time.monotonic() + 60
    while True:
        done = subprocess.run(
            [sys.executable, "-m", "importwatch", "inspect", str(pid), "--json"],
            capture_output=True, text=True, timeout=120, env=env, stdin=subprocess.DEVNULL,
        )  # fmt: skip
        report = json.loads(done.stdout)
        if any(p.startswith(wanted) for p in report["problems"]) or time.monotonic() > deadline:
            assert done.returncode == 1, done.stdout
            return report
        time.sleep(0.5)


def _tids(report: dict) -> dict[str, int]:
    return {thread["name"]: thread["tid"] for thread in report["threads"]}


@pytest.mark.skipif(PYSPY is None, reason="py-spy is not installed (pip install py-spy)")
@pytest.mark.timeout(180)
def test_inspect_names_a_two_thread_cycle_by_python_names_first(spawn, tmp_path: Path) -> None:
    process = spawn("main_warmup.py")
    report = _inspect_until(process.pid, "deadlock: ", _only(tmp_path, "py-spy"))
    tids = _tids(report)
    assert report["problems"][0] == (
        f"deadlock: MainThread (tid {process.pid}) holds the import lock of app and waits in Thread.join for "
        f"warmup (tid {tids['warmup']}), which waits for the import lock of app: neither can go on"
    ), report["problems"]
    (main,) = [t for t in report["threads"] if t["tid"] == process.pid]
    assert main["joins"] == f"warmup (tid {tids['warmup']})"


@pytest.mark.skipif(PYSPY is None, reason="py-spy is not installed (pip install py-spy)")
@pytest.mark.timeout(180)
def test_inspect_names_a_three_thread_cycle_in_one_line(spawn, tmp_path: Path) -> None:
    process = spawn("main_three.py")
    report = _inspect_until(process.pid, "deadlock: ", _only(tmp_path, "py-spy"))
    tids = _tids(report)
    assert report["problems"][0] == (
        f"deadlock: MainThread (tid {process.pid}) holds the import lock of x and waits for the import lock "
        f"of y, held by warmup (tid {tids['warmup']}), which waits in Thread.join for prefetch (tid "
        f"{tids['prefetch']}), which waits for the import lock of x: none of the 3 can go on"
    ), report["problems"]
    assert sum(p.startswith("deadlock: ") for p in report["problems"]) == 1


@pytest.mark.skipif(GDB is None, reason="gdb is not installed")
@pytest.mark.timeout(180)
def test_inspect_with_gdb_alone_names_the_two_thread_cycle(spawn, tmp_path: Path) -> None:
    """gdb reads no locals: a join is for the one other Python thread when there is only one."""
    process = spawn("main_warmup.py")
    report = _inspect_until(process.pid, "deadlock: ", _only(tmp_path, "gdb"))
    if any("could not read Python's frames" in text for text in report["unseen"]):
        pytest.skip("gdb cannot read this Python's frames (no debug symbols)")
    (other,) = [t for t in report["threads"] if t["tid"] != process.pid]
    assert report["problems"][0] == (
        f"deadlock: MainThread (tid {process.pid}) holds the import lock of app and waits in Thread.join for "
        f"{other['name']} (tid {other['tid']}), which waits for the import lock of app: neither can go on"
    ), report["problems"]


@pytest.mark.parametrize("helper", ["py-spy", "gdb"])
@pytest.mark.timeout(180)
def test_inspect_says_the_main_code_ended_and_waits_at_exit_for_the_hung_import(
    spawn, tmp_path: Path, helper: str
) -> None:
    if (PYSPY if helper == "py-spy" else GDB) is None:
        pytest.skip(f"{helper} is not installed")
    process = spawn("service.py")
    report = _inspect_until(process.pid, "at exit: ", _only(tmp_path, helper))
    if any("could not read Python's frames" in text for text in report["unseen"]):
        pytest.skip("gdb cannot read this Python's frames (no debug symbols)")
    (loader,) = [t for t in report["threads"] if t["tid"] != process.pid]
    if helper == "py-spy":
        assert loader["name"] == "loader"
    first = report["problems"][0]
    assert first.startswith(
        f"at exit: the main code has ended and MainThread (tid {process.pid}) waits in threading's shutdown "
        f"for {loader['name']} (tid {loader['tid']}), which is importing handlers and waits in Queue.get ("
        if helper == "py-spy"
        else f"at exit: the main code has ended and MainThread (tid {process.pid}) waits in threading's "
        f"shutdown for {loader['name']} (tid {loader['tid']}), which is importing handlers and waits in "
    ), first
    assert re.search(r", at <module> \(\S*handlers\.py(:2)?\): if that needs the main code", first), first
