"""The answer first: a stall report opens with one headline, repeats are one line, the stacks are the
program's, --stderr none says nothing, and an interrupted import says it was interrupted."""

from __future__ import annotations

import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from cbuild import FIXTURES, compile_shared
from helpers import clean_env, importwatch, traced

pytestmark = [pytest.mark.slow, pytest.mark.timeout(90)]
needs_gdb = pytest.mark.skipif(shutil.which("gdb") is None, reason="gdb is not installed")


def _package(tmp_path: Path, seconds: float) -> Path:
    """outer imports middle imports sleepy, which sleeps SECONDS."""
    root = tmp_path / "pkgs"
    root.mkdir()
    (root / "outer.py").write_text("import middle\n")
    (root / "middle.py").write_text("import sleepy\n")
    (root / "sleepy.py").write_text(f"import time\ntime.sleep({seconds})\n")
    return root


def _ours(line: str) -> bool:
    return line.startswith("[importwatch ")


def _report_block(stderr: str) -> list[str]:
    """The in-process report: from the first STALL line to the next line of ours that is not its own."""
    lines = stderr.splitlines()
    first = next(i for i, line in enumerate(lines) if "] STALL " in line)
    block = [lines[first]]
    for line in lines[first + 1 :]:
        if _ours(line) and not any(k in line for k in ("also in flight", "context:", "busy, not stuck")):
            break
        block.append(line)
    return block


def test_a_first_report_opens_with_a_headline_and_fits_a_screen(tmp_path: Path) -> None:
    root = _package(tmp_path, 2.8)
    log = tmp_path / "run.log"
    env = clean_env(PYTHONPATH=str(root))
    done = importwatch("--timeout", "1", "--log", str(log), "--no-watcher", "-c", "import outer", env=env)
    assert done.returncode == 0, done.stderr
    block = _report_block(done.stderr)
    headline = block[0]
    # One line: how long, stuck (not busy), where in the program's code, and the chain outermost first.
    assert (
        f"STALL 1.0 s without progress at {root / 'sleepy.py'}:2 in <module>; in flight: MainThread: "
        in headline
    )
    assert headline.index("outer (") < headline.index("> middle (") < headline.index("> sleepy (")
    assert len(block) <= 30, "\n".join(block)
    # The program's frames on the terminal, the rest counted; every frame of every thread in the log.
    assert f'  File "{root / "sleepy.py"}", line 2 in <module>' in block
    assert any(line.startswith("  ... ") and line.endswith(" interpreter frames") for line in block)
    assert not any("watchdog.py" in line or "runpy" in line for line in block), block
    assert block[-1] == f"full stacks in {log}"
    text = log.read_text()
    assert "importwatch-heartbeat (importwatch's own):" in text and "watchdog.py" in text
    assert "frozen importlib._bootstrap" in text


def test_without_a_log_the_terminal_is_short_and_keeps_the_culprits_stack(tmp_path: Path) -> None:
    root = _package(tmp_path, 1.8)
    env = clean_env(PYTHONPATH=str(root))
    done = importwatch("--timeout", "1", "--no-watcher", "-c", "import outer", env=env)
    assert done.returncode == 0, done.stderr
    block = _report_block(done.stderr)
    assert len(block) <= 30, "\n".join(block)
    for name, line in (("sleepy", 2), ("middle", 1), ("outer", 1)):
        assert f'  File "{root / (name + ".py")}", line {line} in <module>' in block, block
    assert not any("full stacks in" in line or "watchdog.py" in line for line in block), block


def test_an_unchanged_stall_is_reported_again_in_one_line_at_growing_intervals(tmp_path: Path) -> None:
    root = _package(tmp_path, 4.4)
    env = clean_env(PYTHONPATH=str(root))
    done = importwatch("--timeout", "0.5", "-c", "import outer", env=env)
    assert done.returncode == 0, done.stderr
    lines = done.stderr.splitlines()
    stalls = [i for i, line in enumerate(lines) if "] STALL " in line]
    # At 0.5, 1, 2 and 4 s: the first in full, then a line each.
    assert len(stalls) == 4, done.stderr
    for number, index in enumerate(stalls[1:], 2):
        assert "] STALL still stuck after " in lines[index] and f" s (report {number}) at " in lines[index]
        assert _ours(lines[index + 1]), lines[index : index + 2]  # no stacks, no detail after it
    # The watcher's repeats, too: its headline alone, said to be a repeat.
    repeats = [line for line in lines if "] outside: still waiting after " in line]
    assert repeats, done.stderr
    first_look = next(i for i, line in enumerate(lines) if "] outside: waiting: " in line)
    looks = [i for i, line in enumerate(lines) if "] outside: " in line and i > first_look]
    for index in [i for i, line in enumerate(lines) if "] outside: still waiting after " in line]:
        assert " (report " in lines[index] and "; in flight: MainThread: outer (" in lines[index]
    assert len(looks) < 12 + len(repeats), done.stderr  # a repeat brings no thread lines with it


def test_stderr_none_writes_nothing_at_a_stall_that_leaves_the_gil_free(tmp_path: Path) -> None:
    root = _package(tmp_path, 1.8)
    env = clean_env(PYTHONPATH=str(root))
    plain = subprocess.run([sys.executable, "-c", "import outer"], env=env, capture_output=True, timeout=60)
    done = importwatch("--timeout", "1", "--stderr", "none", "-c", "import outer", env=env)
    assert (plain.returncode, plain.stderr) == (0, b"")
    assert (done.returncode, done.stderr) == (0, "")


def test_stderr_none_writes_nothing_at_a_stall_that_holds_the_gil(built: Path) -> None:
    env = clean_env(PYTHONPATH=str(built), HANG_SECONDS="2")
    done = importwatch("--timeout", "1", "--stderr", "none", "-c", "import hangext", env=env)
    assert (done.returncode, done.stderr) == (0, "")


def test_ctrl_c_at_a_stall_says_the_import_was_interrupted(tmp_path: Path, start) -> None:
    root = _package(tmp_path, 60)
    # Ctrl-C as at a terminal: a shell without job control starts background jobs with SIGINT ignored.
    code = "import signal; signal.signal(signal.SIGINT, signal.default_int_handler); import outer"
    proc = start(traced("--timeout", "1", "--no-watcher", "-c", code), PYTHONPATH=str(root))
    proc.wait_for("] STALL ", 30)
    proc.wait_for("interpreter frames", 30)  # the whole report is out
    proc.process.send_signal(signal.SIGINT)
    assert proc.finish() != 0
    assert "RESUMED after " in proc.stderr and ": sleepy interrupted (KeyboardInterrupt)" in proc.stderr
    assert "sleepy ended" not in proc.stderr


def test_a_busy_import_is_headed_busy(tmp_path: Path) -> None:
    root = tmp_path / "pkgs"
    root.mkdir()
    (root / "spin.py").write_text(
        "import time\nend = time.monotonic() + 2.2\nwhile time.monotonic() < end:\n    pass\n"
    )
    env = clean_env(PYTHONPATH=str(root))
    done = importwatch("--timeout", "1", "--no-watcher", "-c", "import spin", env=env)
    assert done.returncode == 0, done.stderr
    headline = next(line for line in done.stderr.splitlines() if "] STALL " in line)
    assert "] STALL 1.0 s busy, not stuck at " in headline and "without progress" not in headline


@pytest.fixture(scope="module")
def libctor(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("ctor")
    compile_shared(FIXTURES / "outside" / "ctor_lib.c", out / "libctor.so")
    return out / "libctor.so"


def test_the_watchers_headline_names_the_constructor_that_runs(libctor: Path, start) -> None:
    code = f"import ctypes; ctypes.CDLL({str(libctor)!r})"
    proc = start(traced("--timeout", "1", "-c", code))
    proc.wait_for("] outside: waiting: ", 30)
    headline = next(line for line in proc.stderr.splitlines() if "] outside: waiting: " in line)
    assert "(in pause: waiting for a signal); in the constructor of libctor.so; " in headline, headline
    assert f"; in flight: MainThread: dlopen {libctor} (" in headline
    proc.kill()


@needs_gdb
def test_the_watchers_native_stacks_fold_the_interpreters_frames(tmp_path: Path, start) -> None:
    root = _package(tmp_path, 60)
    proc = start(traced("--timeout", "1", "-c", "import outer"), PYTHONPATH=str(root))
    proc.wait_for("] outside: native stacks (gdb", 30)
    proc.wait_for("of importwatch's own)", 30)
    lines = [line.split("] outside: ", 1)[1] for line in proc.stderr.splitlines() if "] outside: " in line]
    title = next(i for i, line in enumerate(lines) if line.startswith("native stacks (gdb"))
    stacks = lines[title + 1 :]
    assert any(line.strip().endswith("interpreter frames") for line in stacks), stacks
    assert not any("_PyEval_EvalFrameDefault" in line for line in stacks), stacks
    assert not any("_speedups" in line for line in stacks), stacks  # our C hook's, folded with importlib's
    assert len(stacks) <= 12, stacks
    proc.kill()


def test_a_wait_resumed_after_a_stop_is_named_restart_syscall(tmp_path: Path, start) -> None:
    # poll with a timeout resumes, after a stop, in restart_syscall (as a sleep does after a debugger).
    (tmp_path / "polling.py").write_text("import select\nselect.poll().poll(60000)\n")
    proc = start(traced("--timeout", "1.5", "-c", "import polling"), PYTHONPATH=str(tmp_path))
    proc.wait_for("> polling", 30)
    time.sleep(0.2)
    proc.process.send_signal(signal.SIGSTOP)
    time.sleep(0.1)
    proc.process.send_signal(signal.SIGCONT)
    proc.wait_for("] outside: waiting: ", 30)
    headline = next(line for line in proc.stderr.splitlines() if "] outside: waiting: " in line)
    assert "syscall 219" not in proc.stderr and "syscall 128" not in proc.stderr
    assert "(in restart_syscall: an interrupted sleep or wait, resumed)" in headline, headline
    proc.kill()
