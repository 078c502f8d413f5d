"""Deadlocks across the GIL (issue 28, shape 1): an extension's init holds the GIL and waits for a
native mutex whose owner waits for the GIL. The runner's watcher, IMPORTWATCH=1's watcher and
`inspect PID` say so in one line: who holds the GIL in which init, whose mutex it waits for, and
that this thread waits for the GIL; never "waiting" and "running" for one thread.

Two clothes: a C thread started by a first import takes the mutex and calls back into Python
(PyGILState_Ensure) while the second extension's PyInit locks it; a Python thread takes the mutex
with the GIL released and takes the GIL back (PyEval_RestoreThread) while a shared object's
constructor, inside the dlopen of an extension that needs it (or of ctypes.CDLL), locks it.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from cbuild import FIXTURES, compile_extension, compile_shared
from helpers import clean_env, traced

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc"),
]

HANG = FIXTURES / "hang"
GDB = shutil.which("gdb")
needs_gdb = pytest.mark.skipif(GDB is None, reason="gdb is not installed")

# A C thread of gilholder's holds the mutex and waits for the GIL; gillocker's PyInit locks it.
PYINIT = "import gilholder\ngilholder.start()\nimport gillocker\n"
# A Python thread holds the mutex and takes the GIL back; libgilctor.so's constructor locks it.
CONSTRUCTOR = """\
import threading
import gilholder
threading.Thread(target=gilholder.hold, name="prefetch", daemon=True).start()
gilholder.wait_held()
{load}
"""
EXTENSION = CONSTRUCTOR.format(load="import gilctorext")
CDLL = CONSTRUCTOR.format(load="import ctypes, os\nctypes.CDLL(os.path.abspath('libgilctor.so'))")


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("gil")
    state = compile_shared(
        HANG / "gil_state.c", out / "libgilstate.so", soname="libgilstate.so", extra=["-pthread"]
    )
    compile_extension(HANG / "gil_holder_ext.c", out, "gilholder", libs=[state])
    compile_extension(HANG / "gil_locker_ext.c", out, "gillocker", libs=[state])
    ctor = compile_shared(
        HANG / "gil_locker_lib.c", out / "libgilctor.so", soname="libgilctor.so", libs=[state]
    )
    compile_extension(HANG / "plain_ext.c", out, "gilctorext", libs=[ctor])
    for name, code in (("pyinit.py", PYINIT), ("extension.py", EXTENSION), ("cdll.py", CDLL)):
        (out / name).write_text(code)
    return out


def headline(text: str, start: str) -> str:
    """The first outside line whose message starts with START."""
    for line in text.splitlines():
        if f"] outside: {start}" in line:
            return line.split("] outside: ", 1)[1]
    pytest.fail(f"no outside line starting {start!r}:\n{text}")


def owner_in(line: str, pid: int) -> int:
    """The tid of the mutex's owner a headline names, checked to be a thread of PID."""
    found = re.search(r"waits for a mutex held by \S+ \(tid (\d+)\)", line)
    assert found, line
    tid = int(found.group(1))
    assert tid != pid and os.path.isdir(f"/proc/{pid}/task/{tid}"), line
    return tid


def thread_line(text: str, tid: int) -> str:
    return next(line for line in text.splitlines() if f"] outside: thread-{tid} (tid {tid}" in line)


# -- the runner and IMPORTWATCH=1's watcher -------------------------------------------------------------
@needs_gdb
@pytest.mark.timeout(90)
def test_runner_says_pyinit_holds_the_gil_and_the_mutex_owner_waits_for_it(site: Path, start) -> None:
    proc = start(traced("--timeout", "1", "pyinit.py"), cwd=site)
    proc.wait_for("] outside: native stacks", 45)
    pid = proc.process.pid
    head = headline(proc.stderr, "deadlock: ")
    tid = owner_in(head, pid)
    assert head.startswith(
        f"deadlock: MainThread (tid {pid}) holds the GIL in PyInit_gillocker and waits for a mutex held by "
        f"thread-{tid} (tid {tid}); thread-{tid} (tid {tid}) waits for the GIL; in flight: MainThread: "
        "gillocker ("
    ), head
    main = headline(proc.stderr, f"MainThread (tid {pid}")
    assert f"in futex: waiting for a mutex held by tid {tid}" in main, main
    owner = thread_line(proc.stderr, tid)
    assert owner.endswith(
        f"python): waiting for the GIL: waiting; MainThread (tid {pid}) holds the GIL and waits for the "
        "mutex this thread holds"
    ), owner
    assert "running" not in owner, owner
    proc.wait_for("still deadlocked after ", 30)  # the repeat keeps the relation


@needs_gdb
@pytest.mark.timeout(90)
def test_env_mode_watcher_says_a_constructor_holds_the_gil(site: Path, start) -> None:
    env = {"IMPORTWATCH": "1", "IMPORTWATCH_WATCHER": "1", "IMPORTWATCH_TIMEOUT": "1"}
    proc = start([sys.executable, "extension.py"], cwd=site, **env)
    proc.wait_for("] outside: native stacks", 45)
    pid = proc.process.pid
    head = headline(proc.stderr, "deadlock: ")
    tid = owner_in(head, pid)
    assert head.startswith(
        f"deadlock: MainThread (tid {pid}) holds the GIL in the constructor of libgilctor.so and waits for "
        f"a mutex held by thread-{tid} (tid {tid}); thread-{tid} (tid {tid}) waits for the GIL; "
        "in flight: MainThread: gilctorext ("
    ), head
    owner = thread_line(proc.stderr, tid)
    assert ": waiting for the GIL: waiting; " in owner and "running" not in owner, owner


@pytest.mark.timeout(90)
@pytest.mark.parametrize("kind", ["normal", "pi", "robust"])
def test_without_a_debugger_the_watcher_still_names_the_mutex_owner(
    site: Path, start, tmp_path: Path, kind: str
) -> None:
    # A normal mutex keeps its owner's tid beside the futex word; a PI or a robust one in it.
    empty = tmp_path / "no-helpers"
    empty.mkdir()
    proc = start(traced("--timeout", "1", "pyinit.py"), cwd=site, PATH=str(empty), GIL_STATE_MUTEX=kind)
    proc.wait_for("] outside: no native stacks", 45)
    pid = proc.process.pid
    head = headline(proc.stderr, "waiting: ")
    tid = owner_in(head, pid)
    assert head.startswith(
        f"waiting: MainThread (tid {pid}) holds the GIL in the load of gillocker.cpython-"
    ), head
    assert f"and waits for a mutex held by thread-{tid} (tid {tid}); if that thread waits for the GIL" in head
    assert "no native stacks to tell (install gdb)" in head
    assert f"it holds the mutex MainThread (tid {pid}) waits for" in thread_line(proc.stderr, tid)


@needs_gdb
@pytest.mark.timeout(90)
def test_a_mutex_owner_that_waits_for_no_gil_is_no_deadlock(site: Path, start) -> None:
    # The same waits but the owner's: it sleeps, holding the mutex. The headline names the owner,
    # and never says deadlock.
    proc = start(traced("--timeout", "1", "pyinit.py"), cwd=site, GIL_HOLDER_SLEEPS="1")
    proc.wait_for("] outside: native stacks", 45)
    pid = proc.process.pid
    head = headline(proc.stderr, "waiting: ")
    tid = owner_in(head, pid)
    assert head.startswith(
        f"waiting: MainThread (tid {pid}) holds the GIL in PyInit_gillocker and waits for a mutex held by "
        f"thread-{tid} (tid {tid}); in flight: "
    ), head
    assert "deadlock" not in proc.stderr
    owner = thread_line(proc.stderr, tid)
    assert "in pause" in owner and f"it holds the mutex MainThread (tid {pid}) waits for" in owner, owner


# -- inspect ----------------------------------------------------------------------------------------------
@pytest.fixture
def spawn(site: Path, in_session):
    """spawn(SCRIPT) runs `python SCRIPT` without importwatch in SITE; killed after the test."""
    return lambda script: in_session([sys.executable, script], env=clean_env(), cwd=site)


def inspect_until(pid: int, wanted: str, *args: str) -> subprocess.CompletedProcess:
    """`importwatch inspect PID ARGS` until its output says WANTED (the process reaches its hang)."""
    deadline = time.monotonic() + 60
    while True:
        done = subprocess.run(
            [sys.executable, "-m", "importwatch", "inspect", str(pid), *args],
            capture_output=True,
            text=True,
            timeout=120,
            env=clean_env(),
            stdin=subprocess.DEVNULL,
        )
        if wanted in done.stdout or time.monotonic() > deadline:
            return done
        time.sleep(0.5)


@needs_gdb
@pytest.mark.timeout(150)
def test_inspect_says_deadlock_first_and_the_owner_waits_for_the_gil(spawn) -> None:
    process = spawn("pyinit.py")
    pid = process.pid
    done = inspect_until(pid, '"deadlock: ', "--json")
    assert done.returncode == 1, done.stdout + done.stderr
    report = json.loads(done.stdout)
    head = report["problems"][0]
    tid = owner_in(head, pid)
    owner = next(thread for thread in report["threads"] if thread["tid"] == tid)
    assert head.startswith(
        f"deadlock: MainThread (tid {pid}) holds the GIL in PyInit_gillocker and waits for "
    )
    assert head.endswith(f"(tid {tid}) waits for the GIL"), head
    assert owner["verdict"] == "waiting" and owner["state"] == "waiting for the GIL", owner
    assert (
        owner["relation"] == f"MainThread (tid {pid}) holds the GIL and waits for the mutex this thread holds"
    )
    text = inspect_until(pid, "deadlock: ").stdout
    verdicts = text.split("verdict: ", 1)[1].splitlines()
    assert verdicts[1].strip().startswith("deadlock: MainThread"), text
    shown = next(line for line in text.splitlines() if f"(tid {tid}): " in line)
    assert "waiting for the GIL" in shown and "running" not in shown, text


@needs_gdb
@pytest.mark.timeout(150)
def test_inspect_names_the_constructor_in_a_ctypes_load(spawn) -> None:
    # ctypes.CDLL keeps the GIL through dlopen: the constructor of the library it loads holds it.
    process = spawn("cdll.py")
    done = inspect_until(process.pid, "deadlock: ")
    assert done.returncode == 1, done.stdout + done.stderr
    verdicts = done.stdout.split("verdict: ", 1)[1].splitlines()
    assert (
        verdicts[1]
        .strip()
        .startswith(
            f"deadlock: MainThread (tid {process.pid}) holds the GIL in the constructor of libgilctor.so and "
            "waits for a mutex held by "
        )
    ), done.stdout
    assert verdicts[1].strip().endswith("waits for the GIL"), done.stdout
