"""importwatch inspect PID: real processes started without importwatch and left hung, inspected from outside.

Each case runs with gdb, with py-spy alone (a PATH without gdb), with pystack alone, and with no
helper at all (an empty PATH), as far as this machine has them.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from cbuild import FIXTURES, compile_extension, compile_shared, dist_info, stand_in_torch
from helpers import clean_env

pytestmark = pytest.mark.slow  # every test here starts processes

HANG = FIXTURES / "hang"
OUTSIDE = FIXTURES / "outside"
CUDA = FIXTURES / "cuda"
GDB = shutil.which("gdb")
PYSPY = shutil.which("py-spy", path=str(Path(sys.executable).parent)) or shutil.which("py-spy")
PYSTACK = shutil.which("pystack", path=str(Path(sys.executable).parent)) or shutil.which("pystack")

DEADLOCK = """\
import sys, threading, time
held = threading.Lock()
held.acquire()
# The loader thread imports lockedmod, whose code waits for `held`; this thread holds `held` and
# then imports lockedmod too: it waits for the module's import lock, held by the loader.
threading.Thread(target=lambda: __import__("lockedmod"), name="loader").start()
time.sleep(0.3)
import lockedmod
"""
LOCKED = "import __main__\n__main__.held.acquire()\n"
READER = "import sys\nname = sys.stdin.readline().strip()\nprint('hello', name, flush=True)\n"


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A site with a stand-in torch 2.3.1+cu121, an extension built for CUDA 11 and torch 2.1.0 whose
    constructor blocks, one whose PyInit blocks, and the modules of a deadlock."""
    out = tmp_path_factory.mktemp("inspect")
    site = out / "site"
    torch = stand_in_torch(site, "2.3.1+cu121", "12.1")
    libc10 = compile_shared(CUDA / "dep.c", torch / "lib" / "libc10.so", soname="libc10.so")
    cuda11 = compile_shared(
        CUDA / "cudart_standin.c", out / "cuda11" / "libcudart.so.11.0", soname="libcudart.so.11.0"
    )
    wedged = compile_extension(HANG / "blocking_ext.c", site, "fastkern._kernels", libs=[cuda11, libc10])
    dist_info(site, "fastkern", "1.4.0+cu118", ["numpy", "torch==2.1.0"], [wedged])
    compile_extension(OUTSIDE / "init_ext.c", site, "slowinit._core")
    (site / "lockedmod.py").write_text(LOCKED)
    (site / "deadlock.py").write_text(DEADLOCK)
    (site / "reader.py").write_text(READER)
    return site


@pytest.fixture
def spawn(site: Path, in_session):
    """spawn(ARGS) starts `python ARGS` without importwatch, in its own session; killed after the test."""

    def _spawn(*args: str, stdin=subprocess.DEVNULL) -> subprocess.Popen:
        command = [sys.executable, *args]
        return in_session(
            command, stdin=stdin, stdout=subprocess.PIPE, env=clean_env(PYTHONPATH=str(site)), cwd=site
        )

    return _spawn


def tools(tmp_path: Path, *names: str) -> str:
    """A PATH holding only the named helpers (an empty folder when none)."""
    folder = tmp_path / f"bin-{'-'.join(names) or 'none'}"
    folder.mkdir(exist_ok=True)
    for name in names:
        found = {"py-spy": PYSPY, "pystack": PYSTACK}.get(name) or shutil.which(name)
        assert found is not None
        if not (folder / name).exists():
            (folder / name).symlink_to(found)
    return str(folder)


def inspect(pid: int, *args: str, path: str | None = None) -> subprocess.CompletedProcess:
    env = clean_env()
    if path is not None:
        env["PATH"] = path
    return subprocess.run(
        [sys.executable, "-m", "importwatch", "inspect", str(pid), *args],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
        stdin=subprocess.DEVNULL,
    )


def inspect_until(pid: int, wanted: str, *args: str, path: str | None = None) -> subprocess.CompletedProcess:
    """Inspect until the report says WANTED (the process reaches its hang), for at most 60 s."""
    deadline = time.monotonic() + 60
    while True:
        done = inspect(pid, *args, path=path)
        if wanted in done.stdout or time.monotonic() > deadline:
            return done
        time.sleep(0.5)


def wait_for_mapping(pid: int, name: str) -> None:
    deadline = time.monotonic() + 60
    while name not in Path(f"/proc/{pid}/maps").read_text():
        assert time.monotonic() < deadline, f"{name} never mapped in {pid}"
        time.sleep(0.1)


def python_frames_read(out: str) -> bool:
    return "could not read Python's frames" not in out


# -- a constructor that blocks inside dlopen, with the GIL held ---------------------------------------
@pytest.mark.skipif(GDB is None, reason="gdb is not installed")
@pytest.mark.timeout(180)
def test_wedged_constructor_with_gdb_names_chain_file_and_verdicts(spawn, site: Path, tmp_path: Path) -> None:
    process = spawn("-c", "import json\nimport fastkern._kernels")
    wait_for_mapping(process.pid, "_kernels")
    done = inspect_until(process.pid, "its constructor runs, inside dlopen", path=tools(tmp_path, "gdb"))
    out = done.stdout
    assert done.returncode == 1, out + done.stderr
    assert f"process     {process.pid}: {sys.executable} -c " in out
    assert "python      " + ".".join(map(str, sys.version_info[:3])) in out
    assert "last CPU    " in out and "started     " in out
    assert "torch       2.3.1+cu121 (built for CUDA 12.1)" in out
    assert "stacks      read with gdb" in out
    kernels = next(site.glob("fastkern/_kernels*.so"))
    assert f"loading module fastkern._kernels, {kernels} (its constructor runs, inside dlopen" in out
    assert "block_in_constructor from " in out  # the native frame that blocks
    if python_frames_read(out):
        assert "import in flight: fastkern._kernels" in out
    # The shared object's facts: what it needs against this torch, and what its distribution pins.
    assert f"  {kernels} (from fastkern 1.4.0+cu118): needs libcudart.so.11.0, libc10.so" in out
    assert (
        "! fastkern 1.4.0+cu118 requires torch==2.1.0 but torch 2.3.1+cu121 is installed: "
        "install the fastkern release built for torch 2.3.1"
    ) in out
    assert "needs libcudart.so.11.0 (CUDA 11) but torch 2.3.1 is built for CUDA 12.1" in out
    assert "hangs in import fastkern._kernels" in out or "hangs loading " in out
    # The rerun under importwatch, from the program's own folder and command line.
    assert f"cd {site} && {sys.executable} -m importwatch -c " in out
    assert f"cd {site} && IMPORTWATCH=1 {sys.executable} -c " in out
    # Nothing was changed: the process still waits where it waited.
    assert process.poll() is None
    assert "pause" in Path(f"/proc/{process.pid}/wchan").read_text()


@pytest.mark.skipif(PYSPY is None, reason="py-spy is not installed (pip install py-spy)")
@pytest.mark.timeout(180)
def test_wedged_constructor_with_py_spy_and_no_gdb(spawn, site: Path, tmp_path: Path) -> None:
    process = spawn("-c", "import fastkern._kernels")
    wait_for_mapping(process.pid, "_kernels")
    done = inspect_until(process.pid, '"initialising"', "--json", path=tools(tmp_path, "py-spy"))
    assert done.returncode == 1, done.stdout + done.stderr
    report = json.loads(done.stdout)
    assert report["tool"] == "py-spy"
    (thread,) = report["threads"]
    assert thread["chain"] == ["fastkern._kernels"]
    assert thread["name"] == "MainThread"
    assert thread["verdict"] == "waiting"
    assert thread["load"]["module"] == "fastkern._kernels"
    assert any("_find_and_load (<frozen importlib._bootstrap>:" in frame for frame in thread["python"])
    (library,) = report["libraries"]
    assert library["distribution"] == "fastkern 1.4.0+cu118"
    assert library["needs"] == ["libcudart.so.11.0"] and library["torch_links"] == ["libc10.so"]
    assert any(
        problem.startswith("! fastkern 1.4.0+cu118 requires torch==2.1.0") for problem in report["problems"]
    )


@pytest.mark.skipif(PYSPY is None or GDB is None, reason="needs both py-spy and gdb")
@pytest.mark.timeout(180)
def test_with_both_helpers_py_spy_reads_python_and_gdb_the_native_frames(
    spawn, site: Path, tmp_path: Path
) -> None:
    process = spawn("-c", "import fastkern._kernels")
    wait_for_mapping(process.pid, "_kernels")
    done = inspect_until(process.pid, '"initialising"', "--json", path=tools(tmp_path, "py-spy", "gdb"))
    report = json.loads(done.stdout)
    assert report["tool"] == "py-spy, gdb"
    (thread,) = report["threads"]
    assert thread["chain"] == ["fastkern._kernels"]
    assert any(frame.startswith("#1 block_in_constructor from ") for frame in thread["native"])
    assert thread["load"]["how"] == "its constructor runs, inside dlopen"
    assert thread["load"]["source"] == "its native stack"
    no_native = inspect(process.pid, "--json", "--no-native", path=tools(tmp_path, "py-spy", "gdb"))
    report = json.loads(no_native.stdout)
    assert report["tool"] == "py-spy" and report["threads"][0]["native"] == []
    assert report["threads"][0]["chain"] == ["fastkern._kernels"]


@pytest.mark.timeout(180)
def test_wedged_constructor_without_any_helper_is_named_from_the_stack_memory(
    spawn, site: Path, tmp_path: Path
) -> None:
    process = spawn("-c", "import fastkern._kernels")
    wait_for_mapping(process.pid, "_kernels")
    done = inspect_until(process.pid, "loading module", path=tools(tmp_path))
    out = done.stdout
    assert done.returncode == 1, out + done.stderr
    assert "stacks      not read" in out
    kernels = next(site.glob("fastkern/_kernels*.so"))
    assert (
        f"loading module fastkern._kernels, {kernels} (its constructor runs, inside dlopen; from the libraries on its stack"
        in out
    )
    assert "no stacks: none of gdb, py-spy, pystack is installed; install one" in out
    assert "! fastkern 1.4.0+cu118 requires torch==2.1.0" in out


@pytest.mark.skipif(PYSTACK is None, reason="pystack is not installed (pip install pystack)")
@pytest.mark.timeout(180)
def test_wedged_constructor_with_pystack_alone(spawn, site: Path, tmp_path: Path) -> None:
    process = spawn("-c", "import fastkern._kernels")
    wait_for_mapping(process.pid, "_kernels")
    done = inspect_until(process.pid, '"initialising"', "--json", path=tools(tmp_path, "pystack"))
    assert done.returncode == 1, done.stdout + done.stderr
    report = json.loads(done.stdout)
    assert report["tool"] == "pystack"
    (thread,) = report["threads"]
    assert thread["chain"] == ["fastkern._kernels"]
    assert thread["load"]["module"] == "fastkern._kernels"
    assert any("_find_and_load (<frozen importlib._bootstrap>:" in frame for frame in thread["python"])
    # Native frames (pystack stops the process to read them), innermost first as gdb gives them.
    assert any(frame.startswith("block_in_constructor from ") for frame in thread["native"])
    no_native = json.loads(
        inspect(process.pid, "--json", "--no-native", path=tools(tmp_path, "pystack")).stdout
    )
    assert no_native["tool"] == "pystack" and no_native["threads"][0]["native"] == []
    assert no_native["threads"][0]["chain"] == ["fastkern._kernels"]
    assert process.poll() is None


# -- PyInit that blocks after dlopen -------------------------------------------------------------------
@pytest.mark.skipif(GDB is None, reason="gdb is not installed")
@pytest.mark.timeout(180)
def test_blocking_pyinit_is_told_from_a_blocking_constructor(spawn, site: Path, tmp_path: Path) -> None:
    process = spawn("-c", "import slowinit._core")
    wait_for_mapping(process.pid, "_core")
    done = inspect_until(process.pid, "PyInit__core runs", path=tools(tmp_path, "gdb"))
    out = done.stdout
    assert done.returncode == 1, out + done.stderr
    core = next(site.glob("slowinit/_core*.so"))
    assert f"loading module slowinit._core, {core} (its PyInit__core runs, after dlopen" in out
    assert "its constructor runs" not in out
    assert f"  {core}: needs no CUDA or torch library" in out


# -- a module lock deadlock between two threads ---------------------------------------------------------
def _deadlock_checks(report: dict, with_names: bool) -> None:
    threads = {thread["tid"]: thread for thread in report["threads"]}
    main = threads[report["pid"]]
    (loader,) = [thread for tid, thread in threads.items() if tid != report["pid"]]
    assert main["chain"] == ["lockedmod"] and main["lock"] == "lockedmod"
    assert main["lock_holder"] == f"{loader['name']} (tid {loader['tid']})"
    assert loader["chain"] == ["lockedmod"] and loader["lock"] is None
    assert loader["doing"].startswith("running the module's code at <module> (")
    assert "lockedmod.py" in loader["doing"]
    if with_names:
        assert loader["name"] == "loader"
    problems = report["problems"]
    assert any(
        p.startswith(f"MainThread (tid {main['tid']}) hangs in import lockedmod")
        and f"waiting for the import lock of lockedmod, held by {loader['name']}" in p
        for p in problems
    ), problems


@pytest.mark.skipif(GDB is None, reason="gdb is not installed")
@pytest.mark.timeout(180)
def test_module_lock_deadlock_names_both_threads_with_gdb(spawn, tmp_path: Path) -> None:
    process = spawn("deadlock.py")
    done = inspect_until(process.pid, "held by", "--json", path=tools(tmp_path, "gdb"))
    report = json.loads(done.stdout)
    if not python_frames_read(" ".join(report["unseen"])):
        pytest.skip("gdb cannot read this Python's frames (no debug symbols)")
    assert done.returncode == 1, done.stdout
    _deadlock_checks(report, with_names=False)


@pytest.mark.skipif(PYSPY is None, reason="py-spy is not installed (pip install py-spy)")
@pytest.mark.timeout(180)
def test_module_lock_deadlock_names_both_threads_with_py_spy(spawn, tmp_path: Path) -> None:
    process = spawn("deadlock.py")
    done = inspect_until(process.pid, "held by", "--json", path=tools(tmp_path, "py-spy"))
    assert done.returncode == 1, done.stdout
    _deadlock_checks(json.loads(done.stdout), with_names=True)


@pytest.mark.skipif(PYSTACK is None, reason="pystack is not installed (pip install pystack)")
@pytest.mark.timeout(180)
def test_module_lock_deadlock_names_both_threads_with_pystack(spawn, tmp_path: Path) -> None:
    process = spawn("deadlock.py")
    done = inspect_until(process.pid, "held by", "--json", path=tools(tmp_path, "pystack"))
    assert done.returncode == 1, done.stdout
    report = json.loads(done.stdout)
    assert report["tool"] == "pystack"
    _deadlock_checks(report, with_names=False)  # pystack gives the OS thread's name, not Python's


# -- a blocked read of stdin -----------------------------------------------------------------------------
@pytest.mark.timeout(180)
def test_blocked_read_of_stdin_is_named_and_the_process_runs_on_unchanged(spawn, tmp_path: Path) -> None:
    process = spawn("reader.py", stdin=subprocess.PIPE)
    paths = [None, tools(tmp_path)]
    for path in paths:
        done = inspect_until(process.pid, "waits for input on stdin", path=path)
        assert done.returncode == 1, done.stdout + done.stderr
        assert f"MainThread (tid {process.pid}) waits for input on stdin: a pipe" in done.stdout
        assert f"also held by pid {os.getpid()}" in done.stdout  # the writer: this test
    # Inspecting stopped nothing and sent nothing: the program reads its line and ends as usual.
    out, _ = process.communicate(b"alice\n", timeout=30)
    assert out == b"hello alice\n"
    assert process.returncode == 0


# -- a deep chain: the program's own frames are all shown, importlib's folded -------------------------------
DEEP_MAIN = "import sys\nsys.path.insert(0, sys.argv[1])\nimport deep1\n"


@pytest.mark.skipif(PYSPY is None and GDB is None, reason="needs py-spy or gdb")
@pytest.mark.timeout(180)
def test_a_deep_import_chain_shows_the_programs_outermost_frame_and_folds_importlibs(
    spawn, tmp_path: Path
) -> None:
    # run.py:3 imports deep1, which imports deep2 ... deep5, which sleeps: over 30 frames, the
    # outermost (the program's own line 3) far beyond the innermost 12.
    for level in range(1, 5):
        (tmp_path / f"deep{level}.py").write_text(f"import deep{level + 1}\n")
    (tmp_path / "deep5.py").write_text("import time\nprint('up', flush=True)\ntime.sleep(600)\n")
    (tmp_path / "run.py").write_text(DEEP_MAIN)
    process = spawn(str(tmp_path / "run.py"), str(tmp_path))
    assert process.stdout is not None and process.stdout.readline() == b"up\n"
    helper = "py-spy" if PYSPY else "gdb"
    done = inspect(process.pid, path=tools(tmp_path, helper))
    out = done.stdout
    assert done.returncode == 1, out + done.stderr
    (line,) = [text for text in out.splitlines() if text.startswith("    python, outermost first: ")]
    steps = line.split(": ", 1)[1].split(" > ")
    # py-spy names a file relative to the process's folder where it can: the file's name is enough.
    # gdb's reading of Python frames on older interpreters gives no line number.
    outermost = ("run.py:3)",) if helper == "py-spy" else ("run.py:3)", "run.py)")
    assert steps[0].startswith("<module> (") and steps[0].endswith(outermost), line
    assert [
        os.path.basename(step.split(" (")[1].rstrip(")").split(":")[0])
        for step in steps
        if step.startswith("<module>")
    ] == ["run.py", "deep1.py", "deep2.py", "deep3.py", "deep4.py", "deep5.py"]
    folded = [step for step in steps if step.startswith("... ")]
    assert len(folded) == 5 and all(step.endswith(" importlib frames") for step in folded)
    assert "[" not in line
    report = json.loads(inspect(process.pid, "--json", path=tools(tmp_path, helper)).stdout)
    (thread,) = report["threads"]
    assert thread["python"][-1].endswith(outermost)
    assert thread["chain"] == ["deep1", "deep2", "deep3", "deep4", "deep5"]


# -- nothing suspect, and bad usage -----------------------------------------------------------------------
@pytest.mark.timeout(120)
def test_a_sleeping_program_is_nothing_suspect(spawn) -> None:
    process = spawn("-c", "import time\nprint('up', flush=True)\ntime.sleep(600)")
    assert process.stdout is not None and process.stdout.readline() == b"up\n"
    done = inspect(process.pid)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "verdict: nothing suspect" in done.stdout
    assert "in clock_nanosleep: sleeping on a timer" in done.stdout or "sleeping" in done.stdout


def _not_python() -> subprocess.Popen:
    return subprocess.Popen(["sleep", "600"], start_new_session=True)


@pytest.mark.timeout(60)
def test_bad_usage_is_one_line_and_exit_2() -> None:
    other = _not_python()
    try:
        cases = {
            "abc": "inspect: 'abc' is not a process id",
            "0": "inspect: '0' is not a process id",
            "999999999": "inspect: no such process: 999999999",
            str(other.pid): f"inspect: process {other.pid} (sleep 600) is not a Python process",
        }
        for arg, message in cases.items():
            done = inspect(arg)  # type: ignore[arg-type]
            assert done.returncode == 2, (arg, done.stderr)
            assert done.stderr == f"importwatch: error: {message}\n"
            assert done.stdout == ""
        done = subprocess.run(
            [sys.executable, "-m", "importwatch", "inspect"], capture_output=True, text=True, timeout=60
        )
        assert done.returncode == 2 and done.stderr.count("\n") == 1 and "PID" in done.stderr
    finally:
        other.kill()
        other.wait()


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to run inspect as another user")
@pytest.mark.skipif(shutil.which("setpriv") is None, reason="needs setpriv to run inspect as another user")
@pytest.mark.timeout(60)
def test_a_process_of_another_user_is_not_permitted(spawn) -> None:
    process = spawn("-c", "import time\ntime.sleep(600)")
    command = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups"]
    done = subprocess.run(
        [*command, sys.executable, "-m", "importwatch", "inspect", str(process.pid)],
        capture_output=True,
        text=True,
        timeout=60,
        cwd="/",
    )
    if not done.stderr.startswith("importwatch: "):  # (not its path: a venv's may name importwatch too)
        pytest.skip(f"this interpreter cannot run as another user here: {done.stderr.strip()[-200:]}")
    assert done.returncode == 2, done.stderr
    assert done.stderr == (
        f"importwatch: error: inspect: not permitted to read process {process.pid} (owned by root): "
        "run inspect as that user, or as root\n"
    )


# -- a process inspect must leave as it is: stopped, or held by another debugger ------------------------
def _state(pid: int) -> str:
    return Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[0]


def _tracer(pid: int) -> int:
    status = Path(f"/proc/{pid}/status").read_text()
    return int(status.split("TracerPid:", 1)[1].split()[0])


def _installed() -> tuple[str, ...]:
    return tuple(name for name, path in (("gdb", GDB), ("py-spy", PYSPY), ("pystack", PYSTACK)) if path)


@pytest.mark.parametrize("helpers", [("gdb", "py-spy"), ("gdb",), ("py-spy",), ("pystack",), ()])
@pytest.mark.timeout(180)
def test_a_stopped_process_stays_stopped_and_no_debugger_attaches(
    spawn, site: Path, tmp_path: Path, helpers: tuple[str, ...]
) -> None:
    if not set(helpers) <= set(_installed()):
        pytest.skip(f"needs {' and '.join(helpers)}")
    process = spawn("-c", "import fastkern._kernels")
    wait_for_mapping(process.pid, "_kernels")
    os.kill(process.pid, signal.SIGSTOP)
    _, status = os.waitpid(process.pid, os.WUNTRACED)  # the stop, as its parent sees it
    assert os.WIFSTOPPED(status)
    done = inspect(process.pid, "--json", path=tools(tmp_path, *helpers))
    assert done.returncode == 1, done.stdout + done.stderr
    report = json.loads(done.stdout)
    # Just as it was: stopped, and nothing its parent could see happened (no continue, no new stop).
    assert _state(process.pid) == "T"
    assert os.waitpid(process.pid, os.WNOHANG | os.WUNTRACED | os.WCONTINUED) == (0, 0)
    assert "gdb" not in (report["tool"] or "")
    (thread,) = report["threads"]
    assert thread["native"] == []
    # The load is still named, from the code addresses on its stack, read through /proc.
    assert thread["load"]["how"] == "its constructor runs, inside dlopen"
    assert thread["load"]["source"] == "the libraries on its stack (no debugger)"
    assert thread["load"]["module"] == "fastkern._kernels"
    assert (
        "no native stacks: it is stopped, and a debugger's attach and detach may let it run "
        "on, so no debugger is attached to it: only py-spy --nonblocking or pystack --no-block and /proc "
        "read it"
    ) in report["unseen"]
    assert report["problems"][0].startswith(f"process {process.pid} is stopped: nothing runs")
    if "py-spy" in helpers or "pystack" in helpers:
        assert report["tool"] == helpers[-1]
        assert thread["chain"] == ["fastkern._kernels"]
    else:
        assert any(note.startswith("no Python frames: install py-spy") for note in report["unseen"])


@pytest.mark.skipif(GDB is None, reason="gdb is not installed")
@pytest.mark.timeout(180)
def test_a_process_another_debugger_holds_is_read_without_attaching(spawn, tmp_path: Path) -> None:
    process = spawn("-c", "import time\nprint('up', flush=True)\ntime.sleep(600)")
    assert process.stdout is not None and process.stdout.readline() == b"up\n"
    assert GDB is not None
    # Someone's gdb, attached and waiting for its next command.
    other = subprocess.Popen(
        [GDB, "-nx", "-q", "-p", str(process.pid)],
        stdin=subprocess.PIPE,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    try:
        deadline = time.monotonic() + 60
        while _tracer(process.pid) != other.pid:
            if other.poll() is not None or time.monotonic() > deadline:
                pytest.skip("gdb could not attach to the process here")
            time.sleep(0.1)
        before = _state(process.pid)
        done = inspect(process.pid, "--json", path=tools(tmp_path, *_installed()))
        report = json.loads(done.stdout)
        assert _tracer(process.pid) == other.pid and _state(process.pid) == before
        assert "gdb" not in (report["tool"] or "")
        assert any(
            note.startswith(f"no native stacks: pid {other.pid} (")
            and "is debugging it, so no debugger" in note
            for note in report["unseen"]
        ), report["unseen"]
        if PYSPY is not None or PYSTACK is not None:
            assert report["tool"] == ("py-spy" if PYSPY is not None else "pystack")
            assert report["threads"][0]["python"][0].startswith("<module> (<string>:")
    finally:
        other.kill()
        other.wait(timeout=30)


def test_a_helper_that_reads_nothing_or_cannot_run_is_named_with_its_reason(spawn, tmp_path: Path) -> None:
    process = spawn("-c", "import time\nprint('up', flush=True)\ntime.sleep(600)")
    assert process.stdout is not None and process.stdout.readline() == b"up\n"
    folder = tmp_path / "bin"
    folder.mkdir()
    # A py-spy that answers with an error and no stacks, and a pystack the system cannot run.
    (folder / "py-spy").write_text(
        "#!/bin/sh\necho 'Error: no permission to read this process' >&2\nexit 1\n"
    )
    (folder / "pystack").write_bytes(b"\x7fELF not a real program\n")
    for helper in ("py-spy", "pystack"):
        (folder / helper).chmod(0o755)
    report = json.loads(inspect(process.pid, "--json", path=str(folder)).stdout)
    assert "py-spy read no Python frames: Error: no permission to read this process" in report["unseen"]
    assert any(text.startswith("pystack failed: [Errno 8] ") for text in report["unseen"]), report["unseen"]
