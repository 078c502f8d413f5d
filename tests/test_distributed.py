"""torch's init steps that block (rendezvous, first CUDA call, stale build lock), and DataLoader workers.

The torch tests run the real torch (CPU build, gloo backend) in subprocesses and
are skipped where torch does not import in the test interpreter.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from helpers import clean_env
from importwatch.events.read import parse_line
from importwatch.tracing.blocking import Rendezvous

try:
    import torch  # noqa: F401

    HAVE_TORCH = True
except Exception:  # not installed, or broken: either way these tests cannot run
    HAVE_TORCH = False

skip_without_torch = pytest.mark.skipif(not HAVE_TORCH, reason="torch does not import in this interpreter")


# Joins the process group with torch's own timeout kept short, so that nothing outlives a test.
INIT = """
import datetime
import torch.distributed as dist
dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=15))
print("joined", flush=True)
"""


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def start(tmp_path: Path, source: str, log: str, env: dict[str, str], *options: str) -> subprocess.Popen:
    script = tmp_path / "job.py"
    script.write_text(textwrap.dedent(source))
    return subprocess.Popen(
        [sys.executable, "-m", "importwatch", "--no-watcher", "--log", log, *options, str(script)],
        cwd=tmp_path,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )


def read_events(path: Path) -> list:
    return events_of(path.read_text() if path.exists() else "")


def events_of(text: str) -> list:
    """The events of TEXT but site's .pth lines (steps named `.pth`, before the program runs)."""
    events = [event for event in map(parse_line, text.splitlines()) if event is not None]
    return [event for event in events if not (event.kind in ("step", "step_end") and event.name == ".pth")]


def wait_for(path: Path, kind: str, seconds: float = 30) -> list:
    """The log's events once one of KIND has been written, with all that follows it.

    A stall report's context lines come after its first line: the report is
    whole once faulthandler's dump, its last part, has begun.
    """
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        text = path.read_text() if path.exists() else ""
        events = events_of(text)
        whole = kind != "stall" or "Stacks of the program's threads" in text
        if whole and any(event.kind == kind for event in events):
            return events
        time.sleep(0.1)
    raise AssertionError(f"no {kind} event in {path} after {seconds} s:\n" + path.read_text()[-3000:])


def stop(process: subprocess.Popen) -> None:
    process.kill()
    process.wait(timeout=10)


def events_until_stall(tmp_path: Path, source: str, log: Path, env: dict[str, str]) -> list:
    """Run SOURCE traced with a 1 s threshold until its first stall report is whole; its events."""
    process = start(tmp_path, source, str(log), env, "--timeout", "1")
    try:
        return wait_for(log, "stall")
    finally:
        stop(process)


def context_of_first_stall(events: list) -> list[str]:
    first = next(index for index, event in enumerate(events) if event.kind == "stall")
    lines = []
    for event in events[first + 1 :]:
        if event.kind == "stall_context":
            lines.append(event.text.strip()[len("context: ") :])
        elif event.kind != "stall_thread":
            break
    return lines


# -- the rendezvous, in words (no torch needed) ------------------------------------------


def test_missing_and_inconsistent_rendezvous_settings_are_said_in_words() -> None:
    unset = Rendezvous({"RANK": "3", "WORLD_SIZE": "2", "LOCAL_RANK": "5"})
    assert unset.missing == ["MASTER_ADDR", "MASTER_PORT"]
    assert unset.variables() == "RANK=3 WORLD_SIZE=2 LOCAL_RANK=5; not set: MASTER_ADDR, MASTER_PORT"
    assert unset.problems == [
        "MASTER_ADDR is not set: env:// needs the address where rank 0 listens",
        "MASTER_PORT is not set: env:// needs the port where rank 0 listens",
        "rank 3 is not below the world size 2: no such rank",
        "LOCAL_RANK=5 is above the rank 3",
    ]
    bad = Rendezvous({"MASTER_ADDR": "h", "MASTER_PORT": "http", "RANK": "0", "WORLD_SIZE": "2"}, rank=1)
    assert bad.problems == [
        "MASTER_PORT='http' is not a whole number",
        "rank=1 was passed but RANK=0: the argument wins",
    ]
    assert (bad.rank, bad.world_size, bad.host, bad.port) == (1, 2, "h", None)
    empty = Rendezvous({"MASTER_ADDR": "", "MASTER_PORT": "70000"})
    assert "MASTER_ADDR is not set: env:// needs the address where rank 0 listens" in empty.problems
    assert "MASTER_PORT=70000 is not a TCP port (1-65535)" in empty.problems
    assert "RANK is not set and no rank= was passed" in empty.problems
    # tcp:// carries its own address and needs rank and world_size as arguments; the variables are not read.
    tcp = Rendezvous({}, init_method="tcp://10.0.0.1:23456", rank=0, world_size=4)
    assert (tcp.host, tcp.port, tcp.rank, tcp.world_size, tcp.problems) == ("10.0.0.1", 23456, 0, 4, [])
    assert Rendezvous({}, store=True, rank=0, world_size=1).problems == []


def test_the_probe_tells_a_listening_port_from_a_closed_one_and_a_bad_name() -> None:
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen()
        port = server.getsockname()[1]
        env = {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port), "RANK": "1", "WORLD_SIZE": "2"}
        assert "answers: rank 0's store is up" in Rendezvous(env).probe(socket)
    assert "nothing listens there (connection refused)" in Rendezvous(env).probe(socket)
    env["MASTER_ADDR"] = "no-such-host.invalid"
    assert "MASTER_ADDR=no-such-host.invalid does not resolve" in Rendezvous(env).probe(socket)


# -- real torch ----------------------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.timeout(60)
@pytest.mark.parametrize("rank", ["0", "1"])
@pytest.mark.torch
@skip_without_torch
def test_a_rendezvous_missing_a_peer_gets_a_report_naming_the_step_and_the_variables(
    tmp_path: Path, rank: str
) -> None:
    port = str(free_port())
    env = clean_env(MASTER_ADDR="127.0.0.1", MASTER_PORT=port, RANK=rank, WORLD_SIZE="2")
    log = tmp_path / "job.log"
    events = events_until_stall(tmp_path, INIT, log, env)
    step = next(event for event in events if event.kind == "step")
    assert step.name == "torch.distributed.init_process_group"
    assert step.rank == int(rank)  # the rank is on every line
    for fact in (
        "backend=gloo",
        "init_method=env://",
        f"MASTER_PORT={port}",
        "WORLD_SIZE=2",
        "not set: LOCAL_RANK",
    ):
        assert fact in step.text
    stall = next(event for event in events if event.kind == "stall")
    assert "in flight: MainThread: step torch.distributed.init_process_group (" in stall.text
    context = context_of_first_stall(events)
    assert (
        context[0]
        == f"torch.distributed.init_process_group: rank {rank} of 2 waits for its peers at 127.0.0.1:{port} (env://)"
    )
    assert (
        context[1]
        == f"MASTER_ADDR=127.0.0.1 MASTER_PORT={port} RANK={rank} WORLD_SIZE=2; not set: LOCAL_RANK"
    )
    if rank == "0":  # its own store answers: the wait is for rank 1
        assert context[2].endswith(
            "answers: rank 0's store is up, so the wait is for ranks that have not joined"
        )
    else:
        assert "nothing listens there (connection refused): rank 0 has not started its store" in context[2]
    assert context[2].startswith("MASTER_ADDR=127.0.0.1 resolves to 127.0.0.1;")


@pytest.mark.slow
@pytest.mark.timeout(60)
@pytest.mark.torch
@skip_without_torch
def test_a_missing_master_addr_is_named_as_missing(tmp_path: Path) -> None:
    env = clean_env(MASTER_PORT=str(free_port()), RANK="0", WORLD_SIZE="2")
    log = tmp_path / "job.log"
    process = start(tmp_path, INIT, str(log), env, "--timeout", "1")
    process.communicate(timeout=30)
    events = read_events(log)
    step = next(event for event in events if event.kind == "step")
    assert "not set: MASTER_ADDR, LOCAL_RANK" in step.text
    # What the step will lack is a verdict on it, not importwatch's own warning.
    warnings = [event.text for event in events if event.kind == "verdict"]
    missing = "MASTER_ADDR is not set: env:// needs the address where rank 0 listens"
    assert f"! torch.distributed.init_process_group: {missing}" in warnings
    end = next(event for event in events if event.kind == "step_end")
    assert end.error.startswith("ValueError:") and "MASTER_ADDR" in end.error


@pytest.mark.slow
@pytest.mark.timeout(60)
@pytest.mark.torch
@skip_without_torch
def test_two_ranks_still_meet_after_a_stall_report_probed_the_store(tmp_path: Path) -> None:
    env = clean_env(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()), WORLD_SIZE="2")
    first = start(tmp_path, INIT, "rank-{rank}.log", {**env, "RANK": "0"}, "--timeout", "1")
    try:
        wait_for(tmp_path / "rank-0.log", "stall")  # reported, and its port probed, while alone
        second = start(tmp_path, INIT, "rank-{rank}.log", {**env, "RANK": "1"}, "--timeout", "1")
        outputs = [process.communicate(timeout=40)[0] for process in (first, second)]
    finally:
        for process in (first, second):
            if process.poll() is None:
                stop(process)
    assert outputs == ["joined\n", "joined\n"]
    events = read_events(tmp_path / "rank-0.log")
    kinds = [event.kind for event in events if event.kind in ("step", "stall", "resumed", "step_end")]
    assert kinds[0] == "step" and kinds[-2:] == ["resumed", "step_end"] and "stall" in kinds
    assert not [event for event in events if event.kind == "step_end" and event.error]


@pytest.mark.slow
@pytest.mark.timeout(60)
@pytest.mark.torch
@skip_without_torch
def test_a_stale_extension_build_lock_is_named_with_its_age(tmp_path: Path) -> None:
    build = tmp_path / "build"
    build.mkdir()
    lock = build / "lock"
    lock.touch()
    three_hours_ago = time.time() - 3 * 3600
    os.utime(lock, (three_hours_ago, three_hours_ago))
    (tmp_path / "ext.cpp").write_text("int answer() { return 42; }\n")
    source = """
        from torch.utils.cpp_extension import load
        load("myext", ["ext.cpp"], build_directory="build")
        """
    log = tmp_path / "job.log"
    events = events_until_stall(tmp_path, source, log, clean_env())
    step = next(event for event in events if event.kind == "step")
    assert step.name == "torch.utils.cpp_extension.load"
    assert f"build_directory={build.name}" in step.text
    warnings = [event.text for event in events if event.kind == "verdict"]
    assert any(f"lock file {lock} is 3.0 h old" in text and "remove it" in text for text in warnings), (
        warnings
    )
    context = context_of_first_stall(events)
    assert any(f"waits for the lock file {lock}, 3.0 h old" in line for line in context), context


@pytest.mark.slow
@pytest.mark.timeout(60)
@pytest.mark.torch
@skip_without_torch
def test_the_first_cuda_initialisation_is_a_step(tmp_path: Path) -> None:
    source = """
        import torch
        try:
            torch.zeros(1, device="cuda")
        except Exception as error:
            print(type(error).__name__)
        print(torch.cuda.is_initialized())
        """
    log = tmp_path / "job.log"
    process = start(tmp_path, source, str(log), clean_env(CUDA_VISIBLE_DEVICES="0"))
    output, _ = process.communicate(timeout=30)
    steps = [event for event in read_events(log) if event.kind in ("step", "step_end")]
    assert [event.name for event in steps] == ["torch.cuda._lazy_init"] * 2
    assert "(first CUDA initialisation) CUDA_VISIBLE_DEVICES=0" in steps[0].text
    if output.endswith("False\n"):  # a CPU build (or no GPU): the step says why it failed
        assert steps[1].error is not None


FAILING_STEPS = {
    "cuda": "import torch\ntorch.zeros(1).cuda()\n",  # a CPU build: torch's own AssertionError
    "rendezvous": (
        "import torch.distributed as dist\ndist.init_process_group('gloo', init_method='env://')\n"
    ),  # no MASTER_ADDR: torch's own ValueError
}


@pytest.mark.slow
@pytest.mark.timeout(120)
@pytest.mark.torch
@skip_without_torch
@pytest.mark.parametrize("step", list(FAILING_STEPS))
def test_a_failing_step_s_traceback_reads_as_under_plain_python(tmp_path: Path, step: str) -> None:
    # The step is a door (hook.door): with the C accelerator no frame of ours lies below torch's.
    from importwatch.tracing.accelerator import ACCELERATOR

    if ACCELERATOR is None:
        pytest.skip("the pure-Python twin adds a frame of its own (README)")
    (tmp_path / "main.py").write_text(FAILING_STEPS[step])
    log = tmp_path / "job.log"
    env = clean_env(RANK="0", WORLD_SIZE="1")
    runs = {
        name: subprocess.run(
            command, cwd=tmp_path, env=clean_env(**env, **extra), capture_output=True, text=True, timeout=90
        )
        for name, command, extra in (
            ("plain", [sys.executable, "main.py"], {}),
            ("IMPORTWATCH=1", [sys.executable, "main.py"], {"IMPORTWATCH": "1", "IMPORTWATCH_LOG": str(log)}),
        )
    }
    tracebacks = {name: run.stderr[run.stderr.index("Traceback") :] for name, run in runs.items()}
    assert tracebacks["IMPORTWATCH=1"] == tracebacks["plain"], tracebacks
    ends = [event for event in read_events(log) if event.kind == "step_end"]
    assert len(ends) == 1 and ends[0].error is not None, ends


@pytest.mark.slow
@pytest.mark.timeout(60)
@pytest.mark.torch
@skip_without_torch
def test_dataloader_workers_each_appear_with_their_pid_in_their_own_file(tmp_path: Path) -> None:
    (tmp_path / "logs").mkdir()
    source = """
        import os
        import torch
        from torch.utils.data import DataLoader, Dataset

        class Pids(Dataset):
            def __len__(self):
                return 4

            def __getitem__(self, index):
                return torch.tensor(os.getpid())

        if __name__ == "__main__":
            pids = {int(pid) for batch in DataLoader(Pids(), batch_size=1, num_workers=2) for pid in batch}
            print(os.getpid(), *sorted(pids))
        """
    process = start(tmp_path, source, "logs/iw-{pid}.log", clean_env())
    output, _ = process.communicate(timeout=50)
    main, *workers = map(int, output.split())
    assert len(workers) == 2 and main not in workers
    for pid in workers:
        events = read_events(tmp_path / "logs" / f"iw-{pid}.log")
        assert events and {event.pid for event in events} == {pid}
        assert events[0].kind == "fork" and events[0].text == f"fork child of {main}"
    assert read_events(tmp_path / "logs" / f"iw-{main}.log")[0].kind == "start"
