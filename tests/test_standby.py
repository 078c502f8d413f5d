"""Our modules run from their compiled files without the import system: start-up's at once, the stall report's at the first look that needs them.

A copy of importwatch's source runs from PYTHONPATH, so that a test can take its files away
while the program runs (as a file system that blocks would hold them) or leave one stale.
"""

from __future__ import annotations

import compileall
import importlib.util
import os
import py_compile
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from helpers import HUNG_FINDER, clean_env
from importwatch.tracing import accelerator, standby

pytestmark = [pytest.mark.slow, pytest.mark.timeout(120)]

# Start-up's modules of ours (tracing/standby.py's START_UP), and those imported the usual way: before
# it can run them (the packages, what the packages import, standby.py itself) and the C accelerator,
# an extension module, where it is used (the traced processes get this one's IMPORTWATCH_PURE).
START_UP = standby.START_UP
USUAL_WAY = {
    "_importwatch_boot",
    "importwatch",
    "importwatch.tracing",
    "importwatch.tracing.handback",
    "importwatch.tracing.phases",
    "importwatch.tracing.standby",
} | ({"importwatch.tracing._speedups"} if accelerator.ACCELERATOR is not None else set())
# Three of the stall report's modules (tracing/watchdog.py's KIT).
KIT = ("importwatch.tracing.cpushare", "importwatch.tracing.stalls", "importwatch.tracing.report")
FIRST_LINE = f"import sys\nprint('kit at start:', any(name in sys.modules for name in {KIT!r}), flush=True)\n"
# Our files go away while the program runs; then a finder hangs holding importlib's global lock.
GONE_THEN_HUNG = FIRST_LINE + HUNG_FINDER.format(
    body="import shutil\nshutil.rmtree({copy!r})\nimport hangs\n"
)


@pytest.fixture
def copy(tmp_path: Path) -> Path:
    """A folder holding a copy of importwatch's source (its C accelerator too), compiled."""
    import importwatch

    folder = tmp_path / "copy"
    shutil.copytree(
        Path(importwatch.__file__).parent,
        folder / "importwatch",
        ignore=shutil.ignore_patterns("__pycache__"),
    )
    assert compileall.compile_dir(str(folder), quiet=1)
    return folder


def _env(copy: Path, writes_bytecode: bool, **extra: str) -> dict[str, str]:
    """The environment for importwatch's COPY, plus EXTRA. WRITES_BYTECODE: whether importlib may write
    compiled files (PYTHONDONTWRITEBYTECODE unset), whatever the developer's or CI's environment says."""
    env = clean_env(PYTHONPATH=str(copy), **extra)
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    if not writes_bytecode:
        env["PYTHONDONTWRITEBYTECODE"] = "1"
    return env


def _run(
    how: str, copy: Path, cwd: Path, timeout: str = "30", ends: bool = False, writes_bytecode: bool = True
) -> subprocess.CompletedProcess:
    """run.py traced by HOW with the stall threshold TIMEOUT (and --exit-on-stall when ENDS)."""
    env = _env(copy, writes_bytecode)
    if how == "runner":
        ending = ["--exit-on-stall"] if ends else []
        command = [
            sys.executable,
            "-m",
            "importwatch",
            "--no-watcher",
            "--timeout",
            timeout,
            *ending,
            "run.py",
        ]
    else:
        command = [sys.executable, "run.py"]
        env.update(
            IMPORTWATCH="1", IMPORTWATCH_TIMEOUT=timeout, IMPORTWATCH_EXIT_ON_STALL="1" if ends else "0"
        )
    return subprocess.run(command, cwd=cwd, env=env, capture_output=True, text=True, timeout=90)


@pytest.mark.parametrize("how", ["runner", "IMPORTWATCH=1"])
def test_the_stall_report_comes_from_memory_once_our_files_are_gone(
    tmp_path: Path, copy: Path, how: str
) -> None:
    (tmp_path / "run.py").write_text(GONE_THEN_HUNG.format(copy=str(copy)))
    done = _run(how, copy, tmp_path, timeout="1", ends=True)
    assert done.stdout == "kit at start: False\n", done.stderr
    assert not copy.exists()
    assert done.returncode == 1, done.stderr
    assert "in flight: MainThread: hangs (finding, " in done.stderr, done.stderr
    assert "Stacks of the program's threads" in done.stderr and "exiting with status 1" in done.stderr
    assert "watchdog error" not in done.stderr and "internal error" not in done.stderr, done.stderr


@pytest.mark.parametrize("writes_bytecode", [True, False], ids=["writes", "PYTHONDONTWRITEBYTECODE"])
def test_a_stale_compiled_file_is_imported_at_start_then_read_again(
    tmp_path: Path, copy: Path, writes_bytecode: bool
) -> None:
    """An edited module (its source newer than its compiled file): start-up imports the report's
    modules the usual way, which writes the compiled file afresh; the next start reads it. Where
    compiled files are not written, every start imports them, and nothing else changes."""
    source = copy / "importwatch" / "tracing" / "stalls.py"
    stat = source.stat()
    os.utime(source, ns=(stat.st_atime_ns, stat.st_mtime_ns + 10**10))
    (tmp_path / "run.py").write_text(FIRST_LINE)
    first, second = (_run("runner", copy, tmp_path, writes_bytecode=writes_bytecode) for _ in range(2))
    assert (first.returncode, first.stdout) == (0, "kit at start: True\n"), first.stderr
    expected = f"kit at start: {not writes_bytecode}\n"
    assert (second.returncode, second.stdout) == (0, expected), second.stderr
    assert "watchdog error" not in second.stderr and "internal error" not in second.stderr, second.stderr


def test_a_hash_checked_compiled_file_is_imported_at_start(tmp_path: Path, copy: Path) -> None:
    """Checked by hash (as reproducible builds compile): telling it fresh means hashing the source,
    so start-up imports the modules the usual way, every time."""
    source = copy / "importwatch" / "tracing" / "report.py"
    py_compile.compile(
        str(source), invalidation_mode=py_compile.PycInvalidationMode.CHECKED_HASH, doraise=True
    )
    (tmp_path / "run.py").write_text(FIRST_LINE)
    for _ in range(2):
        done = _run("runner", copy, tmp_path)
        assert (done.returncode, done.stdout) == (0, "kit at start: True\n"), done.stderr


# A step a look long runs the report's modules (at the heartbeat's first look); a thread of the
# program's watches sys.modules meanwhile. Our modules run from their bytes must take nothing that
# start-up holds back from the program (__future__ above all, which plain python has not loaded):
# lent into sys.modules by the heartbeat, the program's own import of it in that moment would be no
# import, and it would be taken out of sys.modules again under the program's feet.
LONG_STEP = """
import sys, threading, time
seen = set()
def watch():
    while not done:
        seen.update(name for name in ("__future__",) if name in sys.modules)
done = False
watcher = threading.Thread(target=watch)
watcher.start()
time.sleep(0.7)
done = True
watcher.join()
"""
AFTER = (
    "import sys\nprint('kit ran:', all(name in sys.modules for name in {kit!r}))\n"
    "print('seen:', sorted(longstep.seen), '__future__' in sys.modules)\n"
)


def test_the_report_s_modules_run_from_their_bytes_take_nothing_held_back(tmp_path: Path, copy: Path) -> None:
    (tmp_path / "longstep.py").write_text(LONG_STEP)
    (tmp_path / "run.py").write_text("import longstep\n" + AFTER.format(kit=KIT))
    plain = subprocess.run(
        [sys.executable, "run.py"], cwd=tmp_path, env=clean_env(), capture_output=True, text=True, timeout=60
    )
    assert plain.stdout == "kit ran: False\nseen: [] False\n", plain.stderr
    for how in ("runner", "IMPORTWATCH=1"):
        done = _run(how, copy, tmp_path)
        assert done.stdout == "kit ran: True\nseen: [] False\n", (how, done.stderr)
        ours = [line for line in done.stderr.splitlines() if " importwatch-heartbeat] " in line]
        assert not [line for line in ours if "> " in line], (how, ours)


def _native_module() -> str:
    """An extension module this Python loads from a file: a native load."""
    for name in ("math", "_json", "_struct", "select", "_socket"):
        spec = importlib.util.find_spec(name)
        if spec is not None and (spec.origin or "").endswith(".so"):
            return name
    pytest.skip("every probed extension module is built into this interpreter")


@pytest.mark.parametrize("pure", ["0", "1"], ids=["C", "pure"])
def test_a_first_native_load_s_facts_run_from_their_bytes_take_nothing_held_back(
    tmp_path: Path, copy: Path, pure: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The facts modules read at start-up for the first native load (native.FIRST_FACTS) run in the program's
    import: one importing __future__ there would make it the program's, logged and left in sys.modules."""
    (tmp_path / "run.py").write_text(f"import sys, {_native_module()}\nprint('__future__' in sys.modules)\n")
    plain = subprocess.run(
        [sys.executable, "run.py"], cwd=tmp_path, env=clean_env(), capture_output=True, text=True, timeout=60
    )
    assert plain.stdout == "False\n", plain.stderr
    monkeypatch.setenv("IMPORTWATCH_PURE", pure)
    for how in ("runner", "IMPORTWATCH=1"):
        done = _run(how, copy, tmp_path)
        assert done.stdout == "False\n" and "> __future__" not in done.stderr, (how, done.stderr)
        assert "> dlopen " in done.stderr and "internal error" not in done.stderr, (how, done.stderr)


def _imported_the_usual_way(copy: Path, cwd: Path, writes_bytecode: bool = True) -> set[str]:
    """Our modules that IMPORTWATCH=1 python -X importtime imports through the import system (importtime
    sees no others) before run.py's first line."""
    env = _env(copy, writes_bytecode, IMPORTWATCH="1")
    done = subprocess.run(
        [sys.executable, "-X", "importtime", "run.py"],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0 and "internal error" not in done.stderr, done.stderr
    assert set(START_UP) <= set(done.stdout.split()), done.stdout  # each one loaded all the same
    names = {
        line.rsplit("|", 1)[1].strip() for line in done.stderr.splitlines() if line.startswith("import time:")
    }
    return {name for name in names if name.startswith(("importwatch", "_importwatch"))}


RECORD_OURS = "import sys\nprint(*sorted(name for name in sys.modules if name.startswith('importwatch')))\n"


def test_start_up_s_modules_run_without_the_import_system(tmp_path: Path, copy: Path) -> None:
    """Every one of start-up's modules is listed, each after the modules of ours it imports: else it,
    or what it imports, would go through the import system."""
    (tmp_path / "run.py").write_text(RECORD_OURS)
    assert _imported_the_usual_way(copy, tmp_path) == USUAL_WAY


@pytest.mark.parametrize("writes_bytecode", [True, False], ids=["writes", "PYTHONDONTWRITEBYTECODE"])
def test_a_stale_start_up_module_is_imported_the_usual_way(
    tmp_path: Path, copy: Path, writes_bytecode: bool
) -> None:
    """Its source newer than its compiled file: imported the usual way, which writes that afresh (where
    python may), and the next start runs it from there; the others run from theirs all the while."""
    source = copy / "importwatch" / "tracing" / "sink.py"
    stat = source.stat()
    os.utime(source, ns=(stat.st_atime_ns, stat.st_mtime_ns + 10**10))
    (tmp_path / "run.py").write_text(RECORD_OURS)
    first, second = (_imported_the_usual_way(copy, tmp_path, writes_bytecode) for _ in range(2))
    assert first == USUAL_WAY | {"importwatch.tracing.sink"}
    assert second == (USUAL_WAY if writes_bytecode else first)


# What a module's import makes of it, beside its code: what a program or a tool may read.
ATTRIBUTES = """
import sys
def describe(module):
    spec = module.__spec__
    return (module.__name__, module.__file__, module.__cached__, module.__package__,
            getattr(module, "__path__", None), type(module.__loader__).__name__, module.__loader__.name,
            module.__loader__.path, spec.name, spec.origin, spec.cached, spec.parent, spec.has_location,
            spec.submodule_search_locations, spec.loader is module.__loader__,
            sys.modules[spec.parent].__dict__.get(spec.name.rpartition(".")[2]) is module)
for name in {names!r}:
    __import__(name)
    print(describe(sys.modules[name]))
"""


def test_start_up_s_modules_are_made_as_an_import_makes_them(tmp_path: Path, copy: Path) -> None:
    (tmp_path / "run.py").write_text(ATTRIBUTES.format(names=START_UP))
    plain = subprocess.run(
        [sys.executable, "run.py"],
        cwd=tmp_path,
        env=clean_env(PYTHONPATH=str(copy)),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert plain.returncode == 0, plain.stderr
    traced = _run("IMPORTWATCH=1", copy, tmp_path)
    assert traced.returncode == 0, traced.stderr
    assert traced.stdout == plain.stdout
    assert len(plain.stdout.splitlines()) == len(START_UP)


# The files that start-up's functions name: their compiled files were made in another folder.
CODE_FILES = """
import sys, types
for name in {names!r}:
    __import__(name)
    module = sys.modules[name]
    named = {{f.__code__.co_filename for f in vars(module).values()
             if isinstance(f, types.FunctionType) and f.__module__ == name}}
    print(name, sorted(named))
"""


def test_start_up_s_modules_compiled_elsewhere_name_their_source_as_an_import_does(
    tmp_path: Path, copy: Path
) -> None:
    """importlib gives a module's code the path of the source it found (a wheel's files compiled in a build
    folder, a venv moved): start-up's own running of the compiled code must too."""
    assert compileall.compile_dir(str(copy), quiet=1, force=True, ddir="/built/elsewhere")
    (tmp_path / "run.py").write_text(CODE_FILES.format(names=START_UP))
    plain = subprocess.run(
        [sys.executable, "run.py"], cwd=tmp_path, env=_env(copy, writes_bytecode=False),
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert plain.returncode == 0, plain.stderr
    assert "/built/elsewhere" not in plain.stdout and str(copy) in plain.stdout
    traced = _run("IMPORTWATCH=1", copy, tmp_path, writes_bytecode=False)
    assert traced.returncode == 0, traced.stderr
    assert traced.stdout == plain.stdout


# What a program sees of the collector at its first line (start-up turns it off while its modules run).
COLLECTOR = (
    "import sys\nloaded = 'gc' in sys.modules\nimport gc\n"
    "print(loaded, gc.isenabled(), gc.get_threshold(), gc.get_freeze_count())\n"
)


def test_the_program_finds_the_collector_as_under_plain_python(tmp_path: Path, copy: Path) -> None:
    (tmp_path / "run.py").write_text(COLLECTOR)
    plain = subprocess.run(
        [sys.executable, "run.py"],
        cwd=tmp_path,
        env=_env(copy, True),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert plain.stdout.startswith("False True ("), plain.stderr  # the thresholds are this Python's
    for how in ("runner", "IMPORTWATCH=1"):
        done = _run(how, copy, tmp_path)
        assert (done.returncode, done.stdout) == (0, plain.stdout), (how, done.stderr)


def test_a_collector_turned_off_before_start_up_stays_off(tmp_path: Path, copy: Path) -> None:
    """As where a .pth before importwatch's (an editable install's wait) turned it off."""
    program = (
        "import gc, sys\ngc.disable()\nfrom importwatch.tracing import standby\n"
        "standby.load(standby.START_UP)\nprint(gc.isenabled(), 'importwatch.tracing.session' in sys.modules)\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", program],
        cwd=tmp_path,
        env=_env(copy, True),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert (done.returncode, done.stdout) == (0, "False True\n"), done.stderr
