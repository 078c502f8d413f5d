"""The watcher process: what it says from outside about stalled, stopped and dead traced processes."""

from __future__ import annotations

import fcntl
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from cbuild import FIXTURES, compile_extension, compile_shared
from helpers import clean_env, importwatch, traced, watchers_of
from importwatch.facts import process as outside

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")

OUTSIDE = FIXTURES / "outside"


@pytest.fixture(scope="module")
def exts(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("outside")
    compile_extension(OUTSIDE / "init_ext.c", out, "initext")
    compile_shared(OUTSIDE / "ctor_lib.c", out / "libctor.so")
    return out


def assert_watcher_leaves(pid: int, watcher: list[int], reaped: bool = False) -> None:
    """The watcher is gone soon after the traced process, and is nobody's zombie for long.

    It is an orphan from the start, so init reaps it; some inits reap every few seconds.
    """
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline and watchers_of(pid):
        time.sleep(0.05)
    assert watchers_of(pid) == []
    for wpid in watcher:
        stat = outside.process_stat(wpid)
        assert stat is None or stat.ppid not in (pid, os.getpid()), f"watcher {wpid} is a child of ours"
    if not reaped:
        return
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and any(outside.process_stat(wpid) for wpid in watcher):
        time.sleep(0.1)
    assert not any(outside.process_stat(wpid) for wpid in watcher), "the watcher is a zombie nobody reaps"


def wait_text(proc, text: str, timeout: float) -> str:
    """Wait for TEXT on the stderr of PROC even after it ended (the watcher writes after the death)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if text in proc.stderr:
            return proc.stderr
        time.sleep(0.05)
    pytest.fail(f"{text!r} did not appear within {timeout} s; stderr:\n{proc.stderr}")


def wait_watcher(pid: int) -> list[int]:
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:
        found = watchers_of(pid)
        if found:
            return found
        time.sleep(0.02)
    pytest.fail(f"no watcher for {pid}")


def outside_lines(text: str) -> list[str]:
    return [line for line in text.splitlines() if "] outside: " in line]


@pytest.mark.slow
@pytest.mark.timeout(40)
def test_hung_init_is_waiting_names_the_so_and_sigkill_names_the_import(exts, start):
    proc = start(traced("--timeout", "1", "-c", "import initext"), cwd=exts)
    pid = proc.process.pid
    watcher = wait_watcher(pid)
    assert os.getppid() not in watcher and all(outside.process_stat(w).ppid != pid for w in watcher)
    proc.wait_for("outside: most likely initialising: ", 10)  # after the headline and thread lines
    text = proc.stderr
    head = next(line for line in outside_lines(text) if "outside: waiting:" in line)
    assert f"[importwatch {pid} " in head  # the traced pid, not the watcher's
    assert "initext" in head and "dlopen " in head
    main = next(line for line in outside_lines(text) if "outside: MainThread (tid" in line)
    assert "sleeping" in main and ": waiting" in main and "in pause" in main
    assert "busy" not in head
    assert any("initialising: " in line and "initext" in line for line in outside_lines(text)), text
    os.kill(pid, signal.SIGKILL)
    wait_text(proc, "outside: died during import", 10)
    died = next(line for line in outside_lines(proc.stderr) if "died during import" in line)
    assert "SIGKILL" in died and "initext" in died
    proc.finish()
    assert_watcher_leaves(pid, watcher)


@pytest.mark.slow
@pytest.mark.timeout(40)
def test_busy_init_is_busy_not_a_hang(exts, start):
    proc = start(traced("--timeout", "1", "-c", "import initext; print('ok')"), cwd=exts, OUTSIDE_BUSY="2.5")
    pid = proc.process.pid
    watcher = wait_watcher(pid)
    assert proc.finish() == 0
    assert_watcher_leaves(pid, watcher)
    lines = outside_lines(proc.stderr)
    assert any("outside: busy, not stuck: MainThread running" in line for line in lines), proc.stderr
    assert not any("outside: waiting:" in line or "died" in line for line in lines)
    busy = [line for line in lines if "outside: busy, not stuck" in line]
    # The advice fits the machine: CUDA JIT only where an NVIDIA driver is loaded.
    assert all(("CUDA JIT" in line) == os.path.exists("/proc/driver/nvidia/version") for line in busy), busy


@pytest.mark.slow
@pytest.mark.timeout(40)
def test_lock_file_held_by_another_process_is_named(tmp_path, start):
    lock = tmp_path / "build.lock"
    (tmp_path / "lockwait.py").write_text(
        f"import fcntl, os\nfd = os.open({str(lock)!r}, os.O_RDWR)\nfcntl.flock(fd, fcntl.LOCK_EX)\n"
    )
    holder = os.open(lock, os.O_RDWR | os.O_CREAT)
    try:
        fcntl.flock(holder, fcntl.LOCK_EX)
        proc = start(traced("--timeout", "1", "-c", "import lockwait"), cwd=tmp_path)
        proc.wait_for("outside: MainThread (tid", 10)
    finally:
        os.close(holder)
    main = next(line for line in outside_lines(proc.stderr) if "outside: MainThread (tid" in line)
    assert f"waiting for a lock on {lock}" in main and f"held by pid {os.getpid()}" in main


@pytest.mark.slow
@pytest.mark.timeout(40)
def test_socket_peer_that_never_answers_is_named(tmp_path, start):
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(4)  # the kernel completes the handshake; nobody ever accepts or sends
    port = server.getsockname()[1]
    (tmp_path / "peerwait.py").write_text(
        f"import socket\nsocket.create_connection(('127.0.0.1', {port})).recv(1)\n"
    )
    try:
        proc = start(traced("--timeout", "1", "-c", "import peerwait"), cwd=tmp_path)
        proc.wait_for("outside: MainThread (tid", 10)
    finally:
        server.close()
    main = next(line for line in outside_lines(proc.stderr) if "outside: MainThread (tid" in line)
    assert f"-> 127.0.0.1:{port}" in main and "TCP socket" in main, main


@pytest.mark.slow
@pytest.mark.timeout(40)
def test_stopped_process_is_stopped(tmp_path, start):
    (tmp_path / "slowmod.py").write_text("import time\ntime.sleep(60)\n")
    proc = start(traced("--timeout", "1", "-c", "import slowmod"), cwd=tmp_path)
    proc.wait_for("> slowmod", 10)
    os.kill(proc.process.pid, signal.SIGSTOP)
    proc.wait_for("outside: stopped:", 10)
    assert "kill -CONT" in proc.stderr
    os.kill(proc.process.pid, signal.SIGCONT)


@pytest.mark.slow
@pytest.mark.timeout(40)
@pytest.mark.parametrize(
    "code, status",
    [("print('fine')", 0), ("import os; os.abort()", -signal.SIGABRT), ("import os; os._exit(3)", 3)],
)
def test_watcher_leaves_with_the_program(code, status, tmp_path):
    process = subprocess.Popen(
        traced("--timeout", "1", "-c", f"import time; time.sleep(0.3); {code}"),
        env=clean_env(),
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    watcher = wait_watcher(process.pid)
    started = time.monotonic()
    # The watcher holds a copy of stderr: the pipe must still close promptly after the program ends.
    _, err = process.communicate(timeout=20)
    assert process.returncode == status
    assert time.monotonic() - started < 5
    assert_watcher_leaves(process.pid, watcher, reaped=status == 0)
    assert b"died" not in err  # nothing was in flight


@pytest.mark.slow
@pytest.mark.timeout(40)
def test_exit_during_import_without_clean_exit(tmp_path):
    (tmp_path / "quitter.py").write_text("import os, time\ntime.sleep(0.3)\nos._exit(7)\n")
    done = importwatch("--timeout", "5", "-c", "import quitter", cwd=tmp_path)
    assert done.returncode == 7
    died = [line for line in done.stderr.splitlines() if "outside: died during import" in line]
    assert len(died) == 1 and "exited with status 7" in died[0] and "quitter" in died[0], done.stderr


@pytest.mark.slow
@pytest.mark.timeout(20)
def test_no_watcher_option_and_env(tmp_path):
    done = importwatch("--no-watcher", "-c", "import os; print(os.getpid())")
    assert done.returncode == 0
    assert "no watcher" not in done.stderr
    env = clean_env(IMPORTWATCH="1", IMPORTWATCH_WATCHER="bogus")
    done = subprocess.run([sys.executable, "-c", "pass"], env=env, capture_output=True, text=True, timeout=20)
    assert done.returncode == 0 and "IMPORTWATCH_WATCHER" in done.stderr


@pytest.mark.slow
@pytest.mark.timeout(40)
@pytest.mark.skipif(shutil.which("gdb") is None, reason="gdb is not installed")
def test_native_stack_shows_dlopen_of_a_hung_constructor(exts, start):
    code = f"import ctypes; ctypes.CDLL({str(exts / 'libctor.so')!r})"
    proc = start(traced("--timeout", "1", "-c", code), cwd=exts)
    proc.wait_for("outside: native stacks", 10)
    # Innermost frame first, one line each: dlopen's comes after the constructor's.
    proc.wait_after("never_returns", "dlopen", timeout=30)
    lines = outside_lines(proc.stderr)
    frames = [line for line in lines if "outside:     #" in line]
    assert any("dlopen" in line for line in frames), proc.stderr
    assert any("never_returns" in line for line in frames)
    assert any("initialising: " in line and "libctor.so" in line for line in lines)


def test_describe_status_names_the_signal():
    assert outside.describe_status(signal.SIGKILL).startswith("was killed by SIGKILL")
    assert outside.describe_status(3 << 8) == "exited with status 3"
