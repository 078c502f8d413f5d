"""Forks behave as under plain python: side by side, plain python, the runner and IMPORTWATCH=1."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from helpers import clean_env

pytestmark = pytest.mark.slow  # every test here starts processes

MODES = ("plain", "runner", "variable")


def run(mode: str, script: Path, *args: str, timeout: float = 60, **env: str) -> subprocess.CompletedProcess:
    """SCRIPT as plain python runs it, under the runner, or with IMPORTWATCH=1."""
    command = [sys.executable, str(script), *args]
    if mode == "runner":
        command[1:1] = ["-m", "importwatch"]
    if mode == "variable":
        env["IMPORTWATCH"] = "1"
    return subprocess.run(
        command, capture_output=True, text=True, timeout=timeout, env=clean_env(**env), cwd=script.parent
    )


def write(tmp_path: Path, source: str, name: str = "job.py") -> Path:
    path = tmp_path / name
    path.write_text(textwrap.dedent(source))
    return path


def side_by_side(script: Path, *args: str, **env: str) -> dict[str, subprocess.CompletedProcess]:
    return {mode: run(mode, script, *args, **env) for mode in MODES}


# -- a fork from another thread ----------------------------------------------------------
FORK_FROM_A_THREAD = """
    import os, sys, threading, time

    def work():
        pid = os.fork()
        if pid == 0:
            if sys.argv[1] == "imports":
                import colorsys  # starts the child's tracing, and its heartbeat
            return  # the child's only thread ends: so does the child, under plain python
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            done, status = os.waitpid(pid, os.WNOHANG)
            if done:
                print("child exited", status, flush=True)
                return
            time.sleep(0.01)
        print("child still alive", flush=True)
        os.kill(pid, 9)
        os.waitpid(pid, 0)

    thread = threading.Thread(target=work)
    thread.start()
    thread.join()
"""


@pytest.mark.timeout(120)
@pytest.mark.parametrize("child", ["imports", "imports-nothing"])
def test_a_child_forked_from_a_thread_ends_with_its_thread(tmp_path: Path, child: str) -> None:
    results = side_by_side(write(tmp_path, FORK_FROM_A_THREAD), child)
    for mode, result in results.items():
        assert (result.returncode, result.stdout) == (0, "child exited 0\n"), (mode, result.stderr[-2000:])


# -- forks while another thread imports ----------------------------------------------------
@pytest.mark.timeout(300)
def test_forks_while_another_thread_imports_in_a_loop(tmp_path: Path) -> None:
    script = write(
        tmp_path,
        """
        import importlib, os, sys, threading

        def load():
            i = 0
            while True:
                try:
                    importlib.import_module(f"nosuch_{i}")
                except ImportError:
                    pass
                i += 1

        threading.Thread(target=load, daemon=True).start()
        for _ in range(20):
            pid = os.fork()
            if pid == 0:
                sys.exit(0)  # runs the exit handlers, ours among them
            os.waitpid(pid, 0)
        print("forked 20")
        """,
    )
    for attempt in range(3):
        for mode, result in side_by_side(script).items():
            assert (result.returncode, result.stdout) == (0, "forked 20\n"), (
                attempt,
                mode,
                result.stderr[-2000:],
            )


@pytest.mark.timeout(300)
def test_workers_forked_while_a_plugin_loader_imports_thousands(tmp_path: Path) -> None:
    plugins = tmp_path / "plugins"
    plugins.mkdir()
    (plugins / "__init__.py").write_text("")
    for i in range(3000):
        (plugins / f"p{i}.py").write_text(f"VALUE = {i}\n")
    script = write(
        tmp_path,
        """
        import importlib, os, sys, threading

        def load_plugins():
            for i in range(3000):
                importlib.import_module(f"plugins.p{i}")

        loader = threading.Thread(target=load_plugins)
        loader.start()
        workers = []
        for n in range(8):
            pid = os.fork()
            if pid == 0:
                import json  # a worker imports, then leaves through the exit handlers
                sys.exit(0)
            workers.append(pid)
        statuses = [os.waitpid(pid, 0)[1] for pid in workers]
        loader.join()
        print("workers", statuses)
        """,
    )
    for attempt in range(3):
        for mode, result in side_by_side(script).items():
            assert result.returncode == 0, (attempt, mode, result.stderr[-2000:])
            assert result.stdout == f"workers {[0] * 8}\n", (attempt, mode)


# -- the 3.12+ warning about forking a multi-threaded process ----------------------------------
WARNING_CASES = """
    import os, sys, threading, time

    if "thread" in sys.argv[2:]:
        threading.Thread(target=threading.Event().wait, daemon=True).start()

    def fork_once():
        pid = os.fork()
        if pid == 0:
            os._exit(0)
        os.waitpid(pid, 0)

    case = sys.argv[1]
    if case == "single":
        fork_once()
    elif case == "loop":
        for _ in range(50):
            fork_once()
    elif case == "multiprocessing":
        import multiprocessing

        context = multiprocessing.get_context("fork")
        for _ in range(5):
            process = context.Process(target=int)
            process.start()
            process.join()
    elif case == "between-imports":
        import colorsys
        fork_once()
        import json
        fork_once()
    elif case == "inside-an-import":
        import forks_at_import
    print("done")
"""


@pytest.mark.timeout(300)
@pytest.mark.parametrize("thread", ["", "thread"])
@pytest.mark.parametrize("case", ["single", "loop", "multiprocessing", "between-imports", "inside-an-import"])
def test_the_fork_warning_appears_exactly_as_under_plain_python(
    tmp_path: Path, case: str, thread: str
) -> None:
    write(
        tmp_path,
        "import os\npid = os.fork()\nif pid == 0:\n    os._exit(0)\nos.waitpid(pid, 0)\n",
        "forks_at_import.py",
    )
    script = write(tmp_path, WARNING_CASES)
    results = side_by_side(script, case, thread, PYTHONPATH=str(tmp_path))
    counts = {
        mode: result.stderr.count("is multi-threaded, use of fork()") for mode, result in results.items()
    }
    assert all(result.stdout == "done\n" for result in results.values()), results
    assert counts["runner"] == counts["variable"] == counts["plain"], counts
    if sys.version_info >= (3, 12) and case in ("single", "loop") and thread:
        assert counts["plain"] == 1  # the case is real: plain python does warn, once per location


@pytest.mark.timeout(120)
def test_warning_filters_stay_the_programs(tmp_path: Path) -> None:
    script = write(
        tmp_path,
        """
        import os, threading, warnings

        print(warnings.filters)
        threading.Thread(target=threading.Event().wait, daemon=True).start()
        for _ in range(3):
            pid = os.fork()
            if pid == 0:
                os._exit(0)
            os.waitpid(pid, 0)
        print(warnings.filters)
        """,
    )
    results = side_by_side(script)
    assert results["plain"].returncode == 0
    assert results["runner"].stdout == results["variable"].stdout == results["plain"].stdout


# -- fork children: nothing until their first import ---------------------------------------------
@pytest.mark.timeout(120)
def test_a_child_that_execs_at_once_costs_nothing_and_prints_nothing(tmp_path: Path) -> None:
    script = write(
        tmp_path,
        """
        import os, subprocess

        read, write = os.pipe()

        def before_exec():  # runs in the child, between the fork and the exec
            os.write(write, str(len(os.listdir("/proc/self/task"))).encode())

        subprocess.run(["true"], preexec_fn=before_exec, pass_fds=(write,), check=True)
        os.close(write)
        print("threads in the child before exec:", os.read(read, 16).decode())
        """,
    )
    for mode, result in side_by_side(script).items():
        assert result.stdout == "threads in the child before exec: 1\n", (mode, result.stderr[-2000:])
        assert "fork child of" not in result.stderr, mode


@pytest.mark.timeout(120)
def test_a_fork_child_that_imports_says_so_first_and_is_watched(tmp_path: Path) -> None:
    write(tmp_path, "import time\ntime.sleep(2.5)\n", "slowmod.py")
    script = write(
        tmp_path,
        """
        import os

        pid = os.fork()
        if pid == 0:
            import slowmod
            os._exit(0)
        os.waitpid(pid, 0)
        print(os.getpid(), pid)
        """,
    )
    for mode in ("runner", "variable"):
        result = run(mode, script, IMPORTWATCH_TIMEOUT="1", PYTHONPATH=str(tmp_path))
        parent, child = result.stdout.split()
        lines = [line for line in result.stderr.splitlines() if line.startswith(f"[importwatch {child} ")]
        assert lines[0].endswith(f"] fork child of {parent}"), (mode, lines)
        assert lines[1].endswith("> slowmod"), (mode, lines)
        assert any("STALL" in line and "slowmod" in line for line in lines), (mode, result.stderr[-3000:])
