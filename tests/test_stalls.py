"""The watchdog names the hung import, with the GIL held or not, within the threshold plus a second."""

from __future__ import annotations

import itertools
import signal
import subprocess
import sys
import threading
import time
import types
from pathlib import Path

import pytest

from helpers import HUNG_FINDER, clean_env, importwatch, traced

pytestmark = [pytest.mark.timeout(60), pytest.mark.slow]


def _log_of(tmp_path: Path) -> Path:
    return tmp_path / "trace.log"


def test_hung_extension_is_named_before_dump(built: Path, tmp_path: Path, start) -> None:
    log = _log_of(tmp_path)
    so = next(built.glob("hangext*.so"))
    proc = start(traced("--timeout", "1", "--log", str(log), "-c", "import hangext"), PYTHONPATH=str(built))
    proc.wait_for(f"> dlopen {so} (hangext)", timeout=15)
    began = time.monotonic()
    # faulthandler takes one file: with --log, its dump goes to the log (stderr has the start lines).
    _wait_in_file(log, "Timeout (0:00:01", timeout=15)
    assert time.monotonic() - began <= 1 + 1.0
    stderr = proc.stderr
    # The start lines were written, flushed, before dlopen: module, file.
    assert "> hangext\n" in stderr
    # faulthandler's dump, GIL held: its frames name the file in dlopen (written in pieces: wait).
    _wait_in_file(log, f"dlopen {so} for hangext", timeout=10)
    proc.kill()
    # The log file alone still names the culprit after a SIGKILL.
    text = log.read_text()
    assert "> hangext" in text and f"> dlopen {so} (hangext)" in text
    assert "< hangext" not in text


def _wait_in_file(path: Path, text: str, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if path.exists() and text in path.read_text(errors="replace"):
            return
        time.sleep(0.02)
    pytest.fail(f"{text!r} not in {path} after {timeout} s")


def test_gil_held_stall_dumps_on_stderr_within_a_second(built: Path, start) -> None:
    proc = start(traced("--timeout", "1.5", "-c", "import hangext"), PYTHONPATH=str(built))
    proc.wait_for("> dlopen", timeout=15)
    began = time.monotonic()
    proc.wait_for("Timeout (0:00:01.", timeout=15)
    assert time.monotonic() - began <= 1.5 + 1.0, proc.stderr
    proc.wait_after("Timeout", f"in dlopen {built / 'hangext'}")  # the frame named after the load


def test_ctypes_library_whose_constructor_blocks(built: Path, tmp_path: Path, start) -> None:
    lib = built / "libblocking.so"
    code = f"import ctypes; ctypes.CDLL({str(lib)!r})"
    proc = start(traced("--timeout", "1", "-c", code))
    proc.wait_for("Timeout", timeout=15)
    assert f"> dlopen {lib} (ctypes)" in proc.stderr
    proc.wait_after("Timeout", f"dlopen {lib} for ctypes")


def test_extension_crash_is_logged_with_the_import_in_flight(built: Path, tmp_path: Path) -> None:
    log = _log_of(tmp_path)
    result = importwatch("--log", str(log), "-c", "import crashext", env=clean_env(PYTHONPATH=str(built)))
    assert result.returncode == -signal.SIGSEGV
    text = log.read_text()
    assert "Fatal Python error: Segmentation fault" in text
    so = next(built.glob("crashext*.so"))
    assert f"dlopen {so} for crashext" in text  # faulthandler's frame names the file
    assert "> crashext" in result.stderr and "< crashext" not in result.stderr


def _package(tmp_path: Path, files: dict[str, str]) -> Path:
    for name, source in files.items():
        path = tmp_path / "pkgs" / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(source)
    return tmp_path / "pkgs"


def test_pure_python_stall_reports_the_chain_and_resumes(tmp_path: Path) -> None:
    root = _package(
        tmp_path,
        {
            "outer.py": "import middle\n",
            "middle.py": "import sleepy\n",
            "sleepy.py": "import time\ntime.sleep(3.5)\n",
        },
    )
    result = importwatch("--timeout", "1", "-c", "import outer", env=clean_env(PYTHONPATH=str(root)))
    assert result.returncode == 0, result.stderr
    stall = next(line for line in result.stderr.splitlines() if "STALL" in line)
    assert "MainThread: outer (loading" in stall
    assert "> middle (loading" in stall and "> sleepy (loading" in stall
    assert str(root / "sleepy.py") in stall
    assert "most recent call first" in result.stderr and 'sleepy.py", line 2' in result.stderr
    # Repeats grow: one report at 1 s, the next at 2 s (later when the watcher's gdb holds the process
    # for a while; well before the end at 3.5 s), the third would be at 4 s: resumed before it.
    assert result.stderr.count("STALL") == 2
    assert "RESUMED after 3." in result.stderr and "sleepy ended" in result.stderr


def test_two_threads_importing_at_once_are_both_named(tmp_path: Path) -> None:
    root = _package(
        tmp_path,
        {
            "slow_a.py": "import time\ntime.sleep(1.8)\n",
            "slow_b.py": "import time\ntime.sleep(1.8)\n",
        },
    )
    code = (
        "import threading\n"
        "t = threading.Thread(target=__import__, args=('slow_b',), name='loader')\n"
        "t.start(); import slow_a; t.join()\n"
    )
    result = importwatch("--timeout", "1", "-c", code, env=clean_env(PYTHONPATH=str(root)))
    assert result.returncode == 0, result.stderr
    report = [line for line in result.stderr.splitlines() if "STALL" in line or "also in flight" in line]
    text = "\n".join(report)
    assert "MainThread: slow_a" in text and "loader: slow_b" in text
    assert " loader] > slow_b" in result.stderr  # lines of other threads carry the thread's name


def test_waits_for_import_locks_name_the_lock(tmp_path: Path) -> None:
    """A slow finder holds importlib's global lock; a slow loader holds its module's lock.

    Each of two threads waits for the other's lock in turn: the report tells
    finding from waiting, and which thread holds a module lock.
    """
    code = (
        "import importlib.machinery, sys, threading, time\n"
        "class Slow:\n"
        "    def find_spec(self, name, path=None, target=None):\n"
        "        if name == 'slow_find':\n"
        "            time.sleep(2.2)\n"
        "        if name == 'slow_create':\n"
        "            return importlib.machinery.ModuleSpec(name, self)\n"
        "    def create_module(self, spec):\n"
        "        time.sleep(2.2)\n"
        "    def exec_module(self, module):\n"
        "        pass\n"
        "sys.meta_path.insert(0, Slow())\n"
        "def load(name):\n"
        "    try:\n"
        "        __import__(name)\n"
        "    except ImportError:\n"
        "        pass\n"
        "for name in ('slow_find', 'slow_create'):\n"
        "    t = threading.Thread(target=load, args=(name,), name='first-' + name); t.start()\n"
        "    time.sleep(0.3); load(name); t.join()\n"
    )
    result = importwatch("--timeout", "1", "-c", code, env=clean_env())
    assert result.returncode == 0, result.stderr
    report = "\n".join(line for line in result.stderr.splitlines() if "in flight" in line)
    assert "first-slow_find: slow_find (finding, " in report
    assert "MainThread: slow_find (waiting for the import lock, " in report
    assert "first-slow_create: slow_create (loading, " in report  # in create_module: not in sys.modules yet
    assert "MainThread: slow_create (waiting for the module lock held by first-slow_create, " in report


def test_the_first_import_after_a_quiet_spell_is_watched_even_if_it_holds_the_gil(
    tmp_path: Path, start
) -> None:
    """Nothing was in flight, so nothing was armed; the import holds the GIL at once.

    The heartbeat cannot run to arm faulthandler's timer, so starting the import must arm it.
    """
    root = _package(tmp_path, {"gilhog.py": "import ctypes\nctypes.PyDLL(None).sleep(30)\n"})
    code = "import ctypes, time\ntime.sleep(1.5)\nimport gilhog\n"  # PyDLL calls keep the GIL
    proc = start(traced("--timeout", "2", "-c", code), PYTHONPATH=str(root))
    proc.wait_for("> gilhog", timeout=15)
    began = time.monotonic()
    proc.wait_for("Timeout (", timeout=15)
    assert time.monotonic() - began <= 2 + 1.0, proc.stderr
    proc.wait_after("Timeout (", "gilhog.py")


@pytest.mark.parametrize("path", ["0", "1"], ids=["c", "pure"])
def test_a_first_import_while_a_longer_deadline_is_armed_is_watched_to_its_own(
    tmp_path: Path, start, path: str
) -> None:
    """Another thread's phase with a threshold of a minute has armed faulthandler's timer for then; this
    thread's first import, which holds the GIL at once, needs its own deadline, two seconds on. The C hook
    leaves out that call only where it would do nothing (_speedups_cover.h): here it must not."""
    # ctypes.pythonapi: no library loaded, so no step of the import's own arms the timer (native.py).
    root = _package(tmp_path, {"gilhog.py": "import ctypes\nctypes.pythonapi.sleep(30)\n"})
    code = (
        "import ctypes, threading, time, importwatch\n"
        "def long():\n    with importwatch.phase('long', timeout=60):\n        time.sleep(30)\n"
        "threading.Thread(target=long, daemon=True).start()\ntime.sleep(0.6)\nimport gilhog\n"
    )
    proc = start(traced("--timeout", "2", "-c", code), PYTHONPATH=str(root), IMPORTWATCH_PURE=path)
    proc.wait_for("> gilhog", timeout=15)
    began = time.monotonic()
    proc.wait_for("Timeout (", timeout=15)
    assert time.monotonic() - began <= 2 + 1.0, proc.stderr
    proc.wait_after("Timeout (", "gilhog.py")


def test_a_step_that_begins_while_the_heartbeat_leaves_keeps_it_there() -> None:
    """The heartbeat's _idle found nothing in flight; then the GIL changed hands and a step began before
    the watchdog was dormant. That step called nothing (the deadline armed still stood for it), so the
    heartbeat must not leave it unwatched: _idle reads the chains again once dormant."""
    from importwatch.tracing import watchdog

    class Begins(dict):  # no chain at _idle's first look, one by its second
        looks = 0

        def __bool__(self) -> bool:
            self.looks += 1
            return self.looks > 1

    dog = watchdog.Watchdog.__new__(watchdog.Watchdog)  # the state alone: no heartbeat, no timer
    dog.__dict__.update(tracer=types.SimpleNamespace(stacks=Begins()), _lock=threading.RLock(), _stalled={})
    dog.__dict__.update(_forking=False, _generation=1, _running=True, _armed_for=None, _dormant=False)
    dog._gone = gone = threading.Lock()
    assert dog._idle(1) is False
    assert (dog._dormant, dog._gone) == (False, gone)


def test_the_cover_a_first_step_needs_no_call_in_is_where_step_begins_would_do_nothing(monkeypatch) -> None:
    """Both hooks leave out a thread's first step_begins(None) within tracer.cover, which the watchdog
    publishes (Watchdog._tell_due): held here to step_begins itself, on states and times around each bound."""
    from importwatch.tracing import watchdog

    clock = [0.0]
    monkeypatch.setattr(watchdog, "CLOCKS", type("Clocks", (), {"monotonic": staticmethod(lambda: clock[0])}))
    grace, covered, outside = 0.3, [], []
    for timeout in (2.0, 30.0, 0.3):
        interval, longest = min(0.25, timeout / 4), max(min(0.25, timeout / 4), timeout / 8)
        start = 1000.0  # when the step that armed the deadline began
        for armed, look, dormant in itertools.product(
            (None, start + timeout + grace, start + 60.0), (0.0, start + 0.2, start + timeout), (False, True)
        ):
            dog = watchdog.Watchdog.__new__(watchdog.Watchdog)  # the state alone: no heartbeat, no timer
            dog.__dict__.update(timeout=timeout, interval=interval, longest=longest, _armed_for=armed)
            dog.__dict__.update(_next_look=0.0, _dormant=dormant, _stalled={}, _lock=threading.RLock())
            dog.tracer = types.SimpleNamespace(progress_due=None, cover=None)
            dog._tell_due(look)
            low, high = dog.tracer.cover
            bounds = [start, start + longest, look + interval - timeout, low, high]
            times = {b + d for b in bounds if b < 1e300 for d in (-1e-3, -2e-6, -1e-9, 0.0, 1e-9, 2e-6, 1e-3)}
            for now in sorted(times | {start + longest / 2}):
                calls: list[str] = []
                for name in ("_arm", "wake_up", "wake"):
                    setattr(dog, name, lambda *args, name=name, calls=calls: calls.append(name))
                clock[0] = now
                dog.step_begins(None)
                if low <= now < high:
                    assert calls == [], (timeout, armed, look, dormant, now, (low, high), calls)
                    covered.append(now)
                else:
                    outside.append(calls != [])
    assert covered and any(outside)  # the test can fail both ways


def test_exit_on_stall_ends_with_status_1(built: Path) -> None:
    result = importwatch(
        "--timeout", "1", "--exit-on-stall", "-c", "import hangext", env=clean_env(PYTHONPATH=str(built))
    )
    assert result.returncode == 1
    assert "Timeout" in result.stderr and "> dlopen" in result.stderr


def test_exit_on_stall_gil_free(tmp_path: Path) -> None:
    root = _package(tmp_path, {"forever.py": "import time\ntime.sleep(600)\n"})
    result = importwatch(
        "--timeout", "1", "--exit-on-stall", "-c", "import forever", env=clean_env(PYTHONPATH=str(root))
    )
    assert result.returncode == 1
    assert "STALL" in result.stderr and "forever (loading" in result.stderr
    assert "exiting with status 1" in result.stderr


def test_sigusr1_dumps_stacks_on_demand(tmp_path: Path, start) -> None:
    code = "import sys, time; print('ready', flush=True); time.sleep(30)"
    proc = start(traced("--dump-on-sigusr1", "-c", code))
    assert proc.process.stdout.readline() == b"ready\n"
    proc.process.send_signal(signal.SIGUSR1)
    proc.wait_for("most recent call first", timeout=10)
    assert proc.process.poll() is None  # the program goes on


def test_sigusr1_left_alone_when_program_has_a_handler(tmp_path: Path) -> None:
    code = (
        "import os, signal\n"
        "signal.signal(signal.SIGUSR1, lambda *a: print('mine'))\n"
        "os.kill(os.getpid(), signal.SIGUSR1)\n"
    )
    result = importwatch("--dump-on-sigusr1", "-c", code)
    assert result.stdout == "mine\n" and "most recent call first" not in result.stderr


def test_watchdog_off_with_timeout_zero(tmp_path: Path) -> None:
    root = _package(tmp_path, {"nap.py": "import time\ntime.sleep(1.2)\n"})
    result = importwatch("--timeout", "0", "-c", "import nap", env=clean_env(PYTHONPATH=str(root)))
    assert result.returncode == 0 and "STALL" not in result.stderr and "< nap" in result.stderr


@pytest.mark.skipif(sys.platform != "linux", reason="Linux only")
def test_resumed_after_gil_held_stall(built: Path) -> None:
    env = clean_env(PYTHONPATH=str(built), HANG_SECONDS="2")
    result = importwatch("--timeout", "1", "-c", "import hangext", env=env)
    assert result.returncode == 0, result.stderr
    assert "Timeout" in result.stderr
    assert "RESUMED" in result.stderr and "< hangext" in result.stderr


def test_busy_import_is_slow_not_stuck_and_not_ended(tmp_path: Path) -> None:
    root = _package(
        tmp_path,
        {"spin.py": "import time\nend = time.monotonic() + 2.2\nwhile time.monotonic() < end:\n    pass\n"},
    )
    env = clean_env(PYTHONPATH=str(root))
    result = importwatch("--timeout", "1", "--exit-on-stall", "--no-watcher", "-c", "import spin", env=env)
    assert result.returncode == 0, result.stderr
    assert "STALL" in result.stderr and "busy, not stuck: MainThread used" in result.stderr
    assert "exiting with status 1" not in result.stderr and "< spin " in result.stderr


_FINDER_BODIES = {
    "plain": "import hangs\n",
    # handling an exception while it hangs: what a retry loop's look reads
    "in an except clause": "try:\n    import json_fast\nexcept ImportError:\n    import hangs\n",
}


@pytest.mark.timeout(60)
@pytest.mark.parametrize("body", sorted(_FINDER_BODIES))
@pytest.mark.parametrize("how", ["runner", "IMPORTWATCH=1"])
def test_a_finder_that_hangs_holding_the_import_lock_is_reported_whole_and_ended(tmp_path: Path, how, body):
    (tmp_path / "run.py").write_text(HUNG_FINDER.format(body=_FINDER_BODIES[body]))
    env = clean_env(PYTHONPATH=str(tmp_path))
    if how == "runner":
        done = importwatch(
            "--timeout", "1", "--exit-on-stall", "--no-watcher", "run.py", env=env, cwd=tmp_path
        )
    else:
        env.update(IMPORTWATCH="1", IMPORTWATCH_TIMEOUT="1", IMPORTWATCH_EXIT_ON_STALL="1")
        done = subprocess.run(
            [sys.executable, "run.py"], env=env, cwd=tmp_path, capture_output=True, text=True, timeout=50
        )
    assert done.returncode == 1, done.stderr
    assert "in flight: MainThread: hangs (finding, " in done.stderr, done.stderr
    assert "Stacks of the program's threads" in done.stderr and "exiting with status 1" in done.stderr
