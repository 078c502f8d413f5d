"""The program's own faulthandler, signals and children work as under plain python, side by side."""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from helpers import clean_env
from test_accelerator import BUILT
from test_fork_fidelity import MODES, run, side_by_side, write

pytestmark = pytest.mark.slow  # every test here starts processes


# -- faulthandler -------------------------------------------------------------------------
@pytest.mark.timeout(180)
def test_the_programs_own_faulthandler_deadline_fires_and_exits(tmp_path: Path) -> None:
    write(tmp_path, "import time\ntime.sleep(0.3)\n", "nap.py")
    script = write(
        tmp_path,
        """
        import faulthandler, time

        faulthandler.dump_traceback_later(1.0, exit=True)
        import nap, json  # imports while the program's deadline is armed
        time.sleep(60)
        print("not reached")
        """,
    )
    for mode, result in side_by_side(script, PYTHONPATH=str(tmp_path)).items():
        assert result.returncode == 1 and result.stdout == "", (mode, result.stderr[-2000:])
        assert "Timeout (0:00:01)!" in result.stderr, mode


FAULTHANDLER_REFUSES = """
    import faulthandler, pickle, traceback

    calls = (
        lambda: faulthandler.dump_traceback_later("soon"),
        lambda: faulthandler.dump_traceback_later(-1),
        lambda: faulthandler.enable(file=object()),
        lambda: faulthandler.cancel_dump_traceback_later(1),
        lambda: faulthandler.disable(all_threads=True),
    )
    for call in calls:
        try:
            call()
        except Exception:
            print(traceback.format_exc().replace(__file__, "JOB"))
    for function in (faulthandler.enable, faulthandler.dump_traceback_later, faulthandler.is_enabled):
        print(function.__module__, function.__name__, function.__qualname__, function.__doc__[:20])
        try:
            print("pickles", pickle.loads(pickle.dumps(function)) is function)
        except pickle.PicklingError:
            print("pickles not")
    print("enabled", faulthandler.is_enabled())
    faulthandler.enable()
    print("enabled", faulthandler.is_enabled())


    class Holder:  # a builtin held by a class is not bound by its instances
        arm, cancel, enabled = faulthandler.dump_traceback_later, faulthandler.cancel_dump_traceback_later, faulthandler.is_enabled


    Holder().arm(60)
    Holder().cancel()
    print("held", Holder().enabled())
"""


@pytest.mark.parametrize("pure", ["0", "1"], ids=["C", "pure"])
def test_a_faulthandler_call_the_builtin_refuses_raises_its_own_error(tmp_path: Path, pure: str) -> None:
    # Ours stand in for faulthandler's functions: the builtin itself checks the arguments, and with the
    # C accelerator no frame of ours is in the traceback (the pure twin's one frame is left out here).
    if pure == "0" and not BUILT:
        pytest.skip("the C accelerator is not built for this Python")
    script = write(tmp_path, FAULTHANDLER_REFUSES)
    results = side_by_side(script, IMPORTWATCH_PURE=pure)
    plain = results.pop("plain")
    assert plain.returncode == 0 and plain.stdout.count("Traceback") == 5, plain
    assert "enabled False\nenabled True\nheld True\n" in plain.stdout
    for mode, result in results.items():
        lines = result.stdout.splitlines()
        if pure == "1":  # the twin's one frame in each: its file line, its source line, carets (3.11 on)
            ours = [i for i, line in enumerate(lines) if "importwatch" in line]
            assert len(ours) == 5, (mode, result.stdout)
            drop = {i + 1 for i in ours} | set(ours)
            drop |= {
                i + 2
                for i in ours
                if i + 2 < len(lines) and lines[i + 2].strip() and not lines[i + 2].strip(" ~^")
            }
            lines = [line for i, line in enumerate(lines) if i not in drop]
            # The twin's stand-ins for builtins are bound methods, which pickle by value: not here.
            lines = [line for line in lines if not line.startswith("pickles")]
            expected = [line for line in plain.stdout.splitlines() if not line.startswith("pickles")]
        else:
            expected = plain.stdout.splitlines()
        assert result.returncode == 0 and lines == expected, (mode, result.stdout, result.stderr[-2000:])


@pytest.mark.timeout(180)
def test_the_programs_deadline_after_a_stall_report_of_ours(tmp_path: Path) -> None:
    # Our threshold (1 s) comes first, during an import that sleeps; the program's (3 s) still fires.
    write(tmp_path, "import time\ntime.sleep(2)\n", "nap.py")
    script = write(
        tmp_path,
        """
        import faulthandler, time

        faulthandler.dump_traceback_later(3.0, exit=True)
        import nap
        time.sleep(60)
        print("not reached")
        """,
    )
    for mode in MODES:
        result = run(mode, script, PYTHONPATH=str(tmp_path), IMPORTWATCH_TIMEOUT="1")
        assert result.returncode == 1 and result.stdout == "", (mode, result.stderr[-2000:])
        assert mode == "plain" or "STALL" in result.stderr, mode
        # Exit status 1 is the program's deadline (ours never exits without --exit-on-stall). Armed
        # again after ours, its header gives the time it had left then (see the README's Limits).
        assert "Timeout (" in result.stderr, mode


@pytest.mark.timeout(120)
def test_faulthandler_reads_back_what_the_program_set(tmp_path: Path) -> None:
    script = write(
        tmp_path,
        """
        import faulthandler, sys

        seen = [faulthandler.is_enabled()]
        faulthandler.enable()
        seen.append(faulthandler.is_enabled())
        faulthandler.disable()
        seen.append(faulthandler.is_enabled())
        faulthandler.dump_traceback_later(30)
        faulthandler.cancel_dump_traceback_later()
        print(seen)
        """,
    )
    for mode, result in side_by_side(script).items():
        assert (result.returncode, result.stdout) == (0, "[False, True, False]\n"), (
            mode,
            result.stderr[-2000:],
        )


@pytest.mark.timeout(180)
def test_pytest_without_its_faulthandler_plugin_sees_it_off(tmp_path: Path) -> None:
    write(
        tmp_path,
        "import faulthandler\n\ndef test_off():\n    assert not faulthandler.is_enabled()\n",
        "test_fh.py",
    )
    args = ["-m", "pytest", "-p", "no:faulthandler", "-p", "no:cacheprovider", "-q", "test_fh.py"]
    commands = {
        "plain": ([sys.executable, *args], {}),
        "runner": ([sys.executable, "-m", "importwatch", *args], {}),
        "variable": ([sys.executable, *args], {"IMPORTWATCH": "1"}),
        "plugin": ([sys.executable, *args, "-p", "importwatch"], {}),
    }
    for mode, (command, env) in commands.items():
        result = subprocess.run(
            command, capture_output=True, text=True, timeout=120, env=clean_env(**env), cwd=tmp_path
        )
        assert result.returncode == 0 and "1 passed" in result.stdout, (mode, result.stdout[-2000:])


# -- SIGUSR1 --------------------------------------------------------------------------------
SIGUSR1_SELF = """
    import os, signal, time
    print("sending", flush=True)
    os.kill(os.getpid(), signal.SIGUSR1)
    time.sleep(1)
    print("survived")
"""


@pytest.mark.timeout(120)
def test_sigusr1_ends_the_program_as_under_plain_python(tmp_path: Path) -> None:
    for mode, result in side_by_side(write(tmp_path, SIGUSR1_SELF)).items():
        assert result.returncode == -signal.SIGUSR1 and result.stdout == "sending\n", (mode, result.stderr)
        assert "most recent call first" not in result.stderr, mode


@pytest.mark.timeout(120)
def test_sigusr1_dumps_only_when_asked(tmp_path: Path) -> None:
    script = write(tmp_path, SIGUSR1_SELF)
    asked = [
        subprocess.run(command, capture_output=True, text=True, timeout=60, env=env, cwd=tmp_path)
        for command, env in (
            ([sys.executable, "-m", "importwatch", "--dump-on-sigusr1", str(script)], clean_env()),
            ([sys.executable, str(script)], clean_env(IMPORTWATCH="1", IMPORTWATCH_DUMP_ON_SIGUSR1="1")),
        )
    ]
    for result in asked:
        assert (result.returncode, result.stdout) == (0, "sending\nsurvived\n"), result.stderr[-2000:]
        assert "most recent call first" in result.stderr


# -- PID 1 and child subreapers ----------------------------------------------------------------
WAITS = """
    import os
    try:
        os.wait()
        print("os.wait() found a child")
    except ChildProcessError:
        print("no child")
"""

# Becomes a child subreaper, then runs the rest of its command line in its place (the flag survives exec),
# with the environment REAPER_ENV gives: it runs untraced itself, so no watcher of its own is being started
# when it becomes a subreaper (that case, a subreaper made within the watcher's start, is in docs/limits.md).
SUBREAPER = """
import ctypes, json, os, sys
if ctypes.CDLL(None, use_errno=True).prctl(36, 1, 0, 0, 0) != 0:  # PR_SET_CHILD_SUBREAPER
    sys.exit(f"prctl: {os.strerror(ctypes.get_errno())}")
os.execve(sys.argv[1], sys.argv[1:], json.loads(os.environ["REAPER_ENV"]))
"""


def _commands(script: Path, **env: str) -> dict[str, tuple[list[str], dict[str, str]]]:
    """The program as plain python, the runner (watcher on by default) and IMPORTWATCH=1 with the watcher."""
    return {
        "plain": ([sys.executable, str(script)], clean_env()),
        "runner": ([sys.executable, "-m", "importwatch", str(script)], clean_env(**env)),
        "variable": (
            [sys.executable, str(script)],
            clean_env(IMPORTWATCH="1", IMPORTWATCH_WATCHER="1", **env),
        ),
    }


# The watcher is started without a copy of the program where the C accelerator is built (one clone
# sharing its memory), by a double fork in the pure-Python twin: both ways, the same outcome.
LAUNCHES = pytest.mark.parametrize(
    "launch", [{"IMPORTWATCH_PURE": "0"}, {"IMPORTWATCH_PURE": "1"}], ids=["C", "pure"]
)

# A module that sleeps past the threshold (the watcher's outside view says so), then a wait for children.
SLEEPS_THEN_WAITS = """
    import nap
""" + WAITS.lstrip("\n")


@pytest.mark.timeout(120)
@LAUNCHES
def test_the_watcher_reports_from_outside_and_is_never_the_programs_child(
    tmp_path: Path, launch: dict[str, str]
) -> None:
    write(tmp_path, "import time\ntime.sleep(1.2)\n", "nap.py")
    script = write(tmp_path, SLEEPS_THEN_WAITS)
    for mode, (command, env) in _commands(script, IMPORTWATCH_TIMEOUT="0.4", **launch).items():
        result = subprocess.run(command, capture_output=True, text=True, timeout=60, env=env, cwd=tmp_path)
        assert (result.returncode, result.stdout) == (0, "no child\n"), (mode, result.stderr[-2000:])
        outside = [line for line in result.stderr.splitlines() if "] outside: " in line]
        if mode == "plain":
            assert result.stderr == ""
        else:
            assert any("outside: waiting" in line and "nap" in line for line in outside), (
                mode,
                result.stderr,
            )


NEEDS_C = pytest.mark.skipif(
    importlib.util.find_spec("importwatch.tracing._speedups") is None,
    reason="the C accelerator is not built here",
)


def _run_naps(tmp_path: Path, code: str) -> subprocess.CompletedProcess:
    """CODE, which imports nap (a module that sleeps past the threshold), with the C accelerator and the watcher."""
    write(tmp_path, "import time\ntime.sleep(1.2)\n", "nap.py")
    script = write(tmp_path, code)
    env = clean_env(IMPORTWATCH_WATCHER="1", IMPORTWATCH_PURE="0")
    return subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=60, env=env)


def _reported_from_outside(result: subprocess.CompletedProcess) -> None:
    """The program ran as under plain python and the watcher, never its child, reported the nap from outside."""
    assert (result.returncode, result.stdout) == (0, "no child\n"), result.stderr[-2000:]
    assert "no watcher process" not in result.stderr
    assert any("outside: waiting" in line and "nap" in line for line in result.stderr.splitlines()), (
        result.stderr
    )


# A sandbox may refuse the C way's clone (seccomp): the double fork then starts the watcher.
REFUSED_CLONE = """
    from importwatch.tracing.accelerator import ACCELERATOR

    def refused(*args):
        raise PermissionError(1, "clone refused")

    ACCELERATOR.spawn_detached = refused
    import importwatch
    importwatch.install(timeout=0.4)
    import nap
""" + WAITS.lstrip("\n")


@pytest.mark.timeout(120)
@NEEDS_C
def test_where_the_c_start_is_refused_the_double_fork_starts_the_watcher(tmp_path: Path) -> None:
    _reported_from_outside(_run_naps(tmp_path, REFUSED_CLONE))


# Waits for children and counts SIGCHLD from its first line on, while the watcher may still be starting
# (a thread of ours starts it: the program does not wait for that).
WAITS_AT_ONCE = """
    import os, signal, time

    signals = []
    signal.signal(signal.SIGCHLD, lambda number, frame: signals.append(number))
    seen = []
    deadline = time.monotonic() + 0.3
    while time.monotonic() < deadline:
        try:
            seen.append(os.waitpid(-1, os.WNOHANG))
        except ChildProcessError:
            pass
    print(f"children seen {seen}, SIGCHLD {len(signals)}")
"""


@pytest.mark.timeout(120)
@LAUNCHES
def test_the_watchers_start_under_way_is_never_the_programs_child(
    tmp_path: Path, launch: dict[str, str]
) -> None:
    script = write(tmp_path, WAITS_AT_ONCE)
    for mode, (command, env) in _commands(script, **launch).items():
        result = subprocess.run(command, capture_output=True, text=True, timeout=60, env=env, cwd=tmp_path)
        assert (result.returncode, result.stdout) == (0, "children seen [], SIGCHLD 0\n"), (
            mode,
            result.stderr[-2000:],
        )
        assert "no watcher process" not in result.stderr, mode


# The C start itself, with a handler for SIGCHLD installed first: the intermediate sends none and is
# reaped by our thread, never by the program's wait; the descriptors handed over are closed once held.
C_START = """
    import os, signal
    from importwatch.tracing import _speedups

    signals = []
    signal.signal(signal.SIGCHLD, lambda number, frame: signals.append(number))
    handed, kept = os.pipe()
    _speedups.spawn_detached(b"/bin/sh", [b"/bin/sh", b"-c", b"exit 0"], [], 2, (), (handed,))
    started = _speedups.spawn_started(30.0)
    try:
        os.fstat(handed)
        handed_closed = False
    except OSError:
        handed_closed = True
    try:
        os.waitpid(-1, os.WNOHANG)
        child = "a child"
    except ChildProcessError:
        child = "no child"
    os.fstat(kept)
    print(started > 0, handed_closed, child, len(signals))
"""


@pytest.mark.timeout(120)
@NEEDS_C
def test_the_c_start_sends_the_program_no_sigchld_and_closes_what_it_handed_over(tmp_path: Path) -> None:
    script = write(tmp_path, C_START)
    result = subprocess.run(
        [sys.executable, str(script)], capture_output=True, text=True, timeout=60, env=clean_env()
    )
    assert (result.returncode, result.stdout) == (0, "True True no child 0\n"), result.stderr[-2000:]


# The watcher's python cannot be run: the thread that starts it finds out after the program went on.
UNRUNNABLE_WATCHER = """
    import os, sys

    sys.executable = os.path.abspath("notpython")  # exists, but may not be run
    import importwatch
    importwatch.install(timeout=5)
    sys.executable = os.path.abspath("notpython")
    import json, email  # a step with nothing in flight looks at our descriptors, and at the start
    print("ran on")
"""


@pytest.mark.timeout(120)
@NEEDS_C
def test_a_watcher_that_cannot_start_in_the_background_is_said_once(tmp_path: Path) -> None:
    (tmp_path / "notpython").write_text("not a program\n")
    script = write(tmp_path, UNRUNNABLE_WATCHER)
    env = clean_env(IMPORTWATCH_WATCHER="1", IMPORTWATCH_PURE="0")
    result = subprocess.run(
        [sys.executable, str(script)], capture_output=True, text=True, timeout=60, env=env, cwd=tmp_path
    )
    assert (result.returncode, result.stdout) == (0, "ran on\n"), result.stderr[-2000:]
    said = [line for line in result.stderr.splitlines() if "no watcher process" in line]
    assert len(said) == 1 and "Permission denied" in said[0], result.stderr[-2000:]


# A sandbox that refuses a clone sharing memory (as a seccomp profile may): a filter of our own makes
# clone(2) with CLONE_VM and without CLONE_THREAD fail with EPERM (threads still start). The probe
# (CLONE_VM | CLONE_FS | CLONE_NEWUSER, which the kernel itself refuses with EINVAL) shows the filter holds.
SECCOMP_SANDBOX = """
    import ctypes, errno, os, struct

    libc = ctypes.CDLL(None, use_errno=True)
    ALLOW, EPERM = 0x7FFF0000, 0x00050000 | errno.EPERM
    program = [  # (code, jt, jf, k): classic BPF over struct seccomp_data
        (0x20, 0, 0, 4),  # the architecture
        (0x15, 0, 6, 0xC000003E),  # x86_64, else allow
        (0x20, 0, 0, 0),  # the system call's number
        (0x15, 0, 4, 56),  # clone, else allow
        (0x20, 0, 0, 16),  # its flags (low half)
        (0x45, 2, 0, 0x10000),  # CLONE_THREAD: allow
        (0x45, 0, 1, 0x100),  # CLONE_VM: refuse, else allow
        (0x06, 0, 0, EPERM),
        (0x06, 0, 0, ALLOW),
    ]
    filters = ctypes.create_string_buffer(b"".join(struct.pack("HBBI", *row) for row in program))
    fprog = struct.pack("HxxxxxxP", len(program), ctypes.addressof(filters))
    if libc.prctl(38, 1, 0, 0, 0) != 0 or libc.prctl(22, 2, ctypes.c_char_p(fprog), 0, 0) != 0:
        raise SystemExit(f"seccomp: {os.strerror(ctypes.get_errno())}")
    if libc.syscall(56, 0x100 | 0x200 | 0x10000000, 0, 0, 0, 0) != -1 or ctypes.get_errno() != errno.EPERM:
        raise SystemExit("the filter does not refuse a clone that shares memory")
    import importwatch
    importwatch.install(timeout=0.4)
    import nap
""" + WAITS.lstrip("\n")


@pytest.mark.timeout(120)
@NEEDS_C
@pytest.mark.skipif(os.uname().machine != "x86_64", reason="the filter names x86_64's system calls")
def test_where_a_sandbox_refuses_a_clone_sharing_memory_copies_start_the_watcher(tmp_path: Path) -> None:
    result = _run_naps(tmp_path, SECCOMP_SANDBOX)
    if result.returncode != 0 and "seccomp:" in result.stderr:
        pytest.skip(f"no seccomp filter here: {result.stderr.strip()}")
    _reported_from_outside(result)


@pytest.mark.timeout(120)
@LAUNCHES
def test_a_child_subreaper_gets_no_watcher_child(tmp_path: Path, launch: dict[str, str]) -> None:
    script = write(tmp_path, WAITS)
    reaper = write(tmp_path, SUBREAPER, "reaper.py")
    for mode, (command, env) in _commands(script, **launch).items():
        result = subprocess.run(
            [sys.executable, str(reaper), *command], capture_output=True, text=True, timeout=60,
            env=clean_env(REAPER_ENV=json.dumps(env)),
        )  # fmt: skip
        assert (result.returncode, result.stdout) == (0, "no child\n"), (mode, result.stderr[-2000:])
        if mode != "plain":
            said = [line for line in result.stderr.splitlines() if "no watcher process" in line]
            assert len(said) == 1 and "child subreaper" in said[0], (mode, result.stderr[-2000:])


@pytest.mark.timeout(120)
@pytest.mark.skipif(os.geteuid() != 0 or shutil.which("unshare") is None, reason="needs root and unshare")
def test_pid_1_gets_no_watcher_child(tmp_path: Path) -> None:
    script = write(tmp_path, WAITS)
    for mode, (command, env) in _commands(script).items():
        result = subprocess.run(
            ["unshare", "--pid", "--fork", *command], capture_output=True, text=True, timeout=60, env=env
        )
        if result.returncode != 0 and "unshare" in result.stderr:
            pytest.skip(f"unshare --pid is not allowed here: {result.stderr.strip()}")
        assert (result.returncode, result.stdout) == (0, "no child\n"), (mode, result.stderr[-2000:])
        if mode != "plain":
            said = [line for line in result.stderr.splitlines() if "no watcher process" in line]
            assert len(said) == 1 and "PID 1" in said[0], (mode, result.stderr[-2000:])
