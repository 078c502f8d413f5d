"""Every process of a job is traced and told apart: fork, spawned workers, children, shared log files."""

from __future__ import annotations

import re
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from helpers import clean_env, importwatch
from importwatch.events.read import parse_line

pytestmark = pytest.mark.slow  # every test here starts processes


def write_script(tmp_path: Path, source: str) -> Path:
    script = tmp_path / "job.py"
    script.write_text(textwrap.dedent(source))
    return script


def read_events(path: Path) -> list:
    return [event for event in map(parse_line, path.read_text().splitlines()) if event is not None]


def per_pid_logs(directory: Path) -> dict[int, list]:
    logs = {}
    for path in directory.glob("iw-*.log"):
        logs[int(path.stem.split("-")[1])] = read_events(path)
    return logs


@pytest.mark.timeout(30)
def test_a_forked_child_has_its_own_pid_file_and_watchdog_and_exits(tmp_path: Path) -> None:
    (tmp_path / "logs").mkdir()
    script = write_script(
        tmp_path,
        """
        import os, time
        import importwatch

        with importwatch.phase("prepare"):
            pid = os.fork()
            if pid == 0:
                with importwatch.phase("child work", timeout=0.4):
                    time.sleep(0.8)
                importwatch.checkpoint("child done")
                os._exit(0)
            os.waitpid(pid, 0)
        print(os.getpid(), pid)
        """,
    )
    result = importwatch("--log", "logs/iw-{pid}.log", str(script), cwd=tmp_path, env=clean_env(), timeout=30)
    assert result.returncode == 0, result.stderr
    parent, child = map(int, result.stdout.split())
    logs = per_pid_logs(tmp_path / "logs")
    assert set(logs) == {parent, child}
    assert {event.pid for event in logs[parent]} == {parent}
    assert {event.pid for event in logs[child]} == {child}
    kinds = [(event.kind, event.name or event.text) for event in logs[child] if event.kind != "stall_context"]
    # The child starts inside the parent's phase, says where it came from, and is watched on its own.
    assert kinds[0] == ("fork", f"fork child of {parent}")
    assert ("phase", "child work") in kinds and ("checkpoint", "child done") in kinds
    stall = next(event for event in logs[child] if event.kind == "stall")
    assert "phase child work" in stall.text
    assert not any(event.kind == "stall" for event in logs[parent])
    assert [event.kind for event in logs[parent]][-1] == "phase_end"


@pytest.mark.timeout(60)
def test_the_runner_passes_tracing_on_to_spawned_workers_and_child_pythons(tmp_path: Path) -> None:
    (tmp_path / "logs").mkdir()
    script = write_script(
        tmp_path,
        """
        import os, subprocess, sys
        import multiprocessing as mp
        import importwatch

        def work(queue):
            importwatch.checkpoint("spawned worker")
            queue.put((os.getpid(), os.environ["IMPORTWATCH_TIMEOUT"]))

        CHILD = "import importwatch, os; importwatch.checkpoint('child'); print(os.getpid())"

        if __name__ == "__main__":
            context = mp.get_context("spawn")
            queue = context.Queue()
            worker = context.Process(target=work, args=(queue,))
            worker.start()
            pid, timeout = queue.get(timeout=20)
            worker.join()
            child = subprocess.run(
                [sys.executable, "-c", CHILD], capture_output=True, text=True, check=True
            )
            print(pid, timeout, child.stdout.strip())
        """,
    )
    result = importwatch(
        "--timeout",
        "7.5",
        "--log",
        "logs/iw-{pid}.log",
        str(script),
        cwd=tmp_path,
        env=clean_env(),
        timeout=60,
    )
    assert result.returncode == 0, result.stderr
    worker, timeout, child = result.stdout.split()
    assert timeout == "7.5"  # the runner's options reach the children as IMPORTWATCH_* variables
    logs = per_pid_logs(tmp_path / "logs")
    for pid, name in ((int(worker), "spawned worker"), (int(child), "child")):
        # A fresh interpreter, traced from its start by the .pth, in its own file (a relative --log
        # still lands in the runner's directory).
        assert logs[pid][0].kind == "start", logs[pid][:3]
        assert {event.pid for event in logs[pid]} == {pid}
        assert any(event.kind == "checkpoint" and event.name == name for event in logs[pid])


@pytest.mark.timeout(60)
def test_eight_processes_appending_to_one_log_write_only_whole_lines(tmp_path: Path) -> None:
    log = tmp_path / "shared.log"
    go = tmp_path / "go"
    lines_each = 3000
    # All start writing at once, when all are ready (else each is done before the next has
    # started). Every tenth line is up to 6000 bytes: longer than PIPE_BUF. Writing each line in
    # two writes instead of one tears about a thousand lines here.
    code = textwrap.dedent(
        f"""
        import os, sys, time
        import importwatch
        tag = sys.argv[1]
        open(os.path.join({str(tmp_path)!r}, "ready-" + tag), "w").close()
        while not os.path.exists({str(go)!r}):
            time.sleep(0.001)
        for n in range({lines_each}):
            length = n * 37 % 6000 if n % 10 == 0 else n % 200
            importwatch.checkpoint(f"{{tag}} {{n}} " + "x" * length + " end")
        """
    )
    writers = [
        subprocess.Popen(
            [sys.executable, "-c", code, f"w{index}"],
            env=clean_env(IMPORTWATCH="1", IMPORTWATCH_LOG=str(log)),
            stderr=subprocess.DEVNULL,
        )
        for index in range(8)
    ]
    deadline = time.monotonic() + 30
    while len(list(tmp_path.glob("ready-*"))) < 8 and time.monotonic() < deadline:
        time.sleep(0.01)
    go.touch()
    assert [writer.wait(timeout=50) for writer in writers] == [0] * 8
    seen: dict[str, list[int]] = {}
    pattern = re.compile(r"^(w\d) (\d+) (x*) end$")
    for line in log.read_text().splitlines():
        event = parse_line(line)
        assert event is not None, line[:200]
        if event.kind != "checkpoint":
            # (site's .pth lines run as steps: `> step .pth FILE:LINE`)
            kinds = ("start", "env", "import", "import_end", "native", "native_end", "step", "step_end")
            assert event.kind in kinds, line[:200]
            continue
        match = pattern.match(event.name)
        assert match is not None, line[:200]
        tag, n, xs = match.group(1), int(match.group(2)), match.group(3)
        assert len(xs) == (n * 37 % 6000 if n % 10 == 0 else n % 200), line[:200]
        seen.setdefault(tag, []).append(n)
    assert seen == {f"w{index}": list(range(lines_each)) for index in range(8)}


@pytest.mark.timeout(30)
def test_a_log_path_with_rank_and_pid_gives_one_file_per_process(tmp_path: Path) -> None:
    script = write_script(
        tmp_path,
        """
        import os
        import importwatch
        pid = os.fork()
        if pid == 0:
            importwatch.checkpoint("child")
            os._exit(0)
        os.waitpid(pid, 0)
        print(os.getpid(), pid)
        """,
    )
    result = importwatch(
        "--log", "r{rank}-{pid}.log", str(script), cwd=tmp_path, env=clean_env(RANK="5"), timeout=30
    )
    assert result.returncode == 0, result.stderr
    parent, child = result.stdout.split()
    assert sorted(path.name for path in tmp_path.glob("*.log")) == sorted(
        [f"r5-{parent}.log", f"r5-{child}.log"]
    )
    child_events = read_events(tmp_path / f"r5-{child}.log")
    assert [(event.kind, event.rank) for event in child_events] == [("fork", 5), ("checkpoint", 5)]
