"""Fidelity corpus: real projects' test suites run plain and under importwatch, outcome by outcome.

    python benchmarks/fidelity.py [SUITE ...] [--modes plain,env,plugin,runner] [--stderr stalls]
                                  [--cache DIR]

SUITE is any of six, more-itertools, click, packaging, markupsafe, jinja2, attrs, python-dateutil,
numpy, psutil, msgpack, pytest, cpython (default: all). For each, the pinned sdist is fetched from the package index with
`pip download --no-binary :all: --no-deps` (kept in the cache folder), unpacked, and its test
requirements are installed into a venv of its own, with this checkout of importwatch installed
editable. numpy is the exception: an sdist of numpy needs a long build, so its wheel is installed
and the tests it ships (`numpy/_core/tests/test_multiarray.py`, `test_multithreading.py`) run as
`pytest --pyargs` from an empty folder. cpython is the running interpreter's own regression tests
(its `test` package, run by `python -m test -j2`, which writes the same JUnit XML) in a venv that
holds nothing but importwatch: the import system, threads, signals, descriptors, subprocesses and
subinterpreters, each tested by the people who wrote them; the plugin mode does not apply to it, and
a few files are left out (GUI, network, and those that take many minutes). markupsafe must have built its C speedups (its tests run
both implementations): a venv without them is a setup failure. The suite then runs once per mode,
each in a fresh copy of the unpacked sources:

    plain    python -m pytest ...
    env      IMPORTWATCH=1 python -m pytest ...
    plugin   python -m pytest -p importwatch ...
    runner   python -m importwatch -m pytest ...

`--stderr stalls` (or none) runs the traced modes quiet, with `IMPORTWATCH_STDERR` set: the mode an
always-on fleet uses, where a program's stderr must be byte-identical to plain python's until there
is something to report. Its target is 0 differences on every suite, pytest's own included
(`fidelity.py pytest --stderr stalls`), whose tests read their children's stderr.

Outcomes are read from pytest's JUnit XML. The script prints, per suite, the number of tests, the
differences from the plain run and the wall time of each mode, then every test id whose outcome
differs, with the first line of its message. Exit status: 0 when every mode matches the plain
run, 1 when any outcome differs (or a run ended without its XML), 2 for bad usage, 3 when a suite
could not be fetched or installed (one line says which).
Each run's output and XML stay under CACHE/work/SUITE/MODE/ until the next run, to find causes.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import tarfile
import time
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import NamedTuple

ROOT = Path(__file__).resolve().parent.parent


class Suite(NamedTuple):
    """A project whose own test suite is run: what to fetch, what to install, where its tests are."""

    requirement: str  # pinned, so that a table can be reproduced
    tests: tuple[str, ...]  # paths inside the unpacked sdist
    deps: tuple[str, ...]  # test requirements; "." is the project itself, "[x]" its extra
    wheel: bool = False  # installed from its wheel (in deps); tests are the modules it ships
    check: str = ""  # python code that must run in the venv once installed (a C extension built)
    regrtest: bool = False  # CPython's own tests: `python -m test TESTS`, no pytest, no plugin mode


# The files of the interpreter's test package that the cpython suite leaves out: GUI (tkinter, idle,
# turtle), the network (test_socket waits out its 10-minute limit here), a build tree (embed, tools,
# peg_generator, gdb), and the longest (asyncio, concurrent_futures, multiprocessing's, venv, ensurepip,
# lib2to3, unparse, regrtest's own).
CPYTHON_LEFT_OUT = (
    "test_socket", "test_embed", "test_tools", "test_peg_generator", "test_venv", "test_ensurepip", "test_idle",
    "test_tkinter", "test_ttk", "test_ttk_textonly", "test_turtle", "test_gdb", "test_distutils",
    "test_concurrent_futures", "test_multiprocessing_fork", "test_multiprocessing_forkserver",
    "test_multiprocessing_spawn", "test_asyncio", "test_lib2to3", "test_unparse", "test_regrtest",
)  # fmt: skip

SUITES: dict[str, Suite] = {
    "six": Suite("six==1.17.0", ("test_six.py",), ("pytest",)),
    "more-itertools": Suite("more-itertools==11.2.1", ("tests",), ("pytest", ".")),
    "click": Suite("click==8.5.1", ("tests",), ("pytest", ".")),
    "packaging": Suite(
        "packaging==26.4", ("tests",), ("pytest", "pretend", "hypothesis", "tomli_w", "pip", ".")
    ),
    "markupsafe": Suite(
        "markupsafe==3.0.3", ("tests",), ("pytest", "."), check="import markupsafe._speedups"
    ),
    "jinja2": Suite("jinja2==3.1.6", ("tests",), ("pytest", "trio", "markupsafe==3.0.3", ".")),
    "attrs": Suite("attrs==25.4.0", ("tests",), ("pytest", "hypothesis", "pympler", "cloudpickle", ".")),
    # dateutil's suite turns warnings into errors: pytest 9 warns of its generator parametrize, and its
    # conftest marks tests no_cover, a mark pytest-cov registers (without them, collection failed and
    # its 2 errors read as 2 tests).
    "python-dateutil": Suite(
        "python-dateutil==2.9.0.post0",
        ("tests",),
        ("pytest==8.4.2", "pytest-cov", "hypothesis", "freezegun", "six", "."),
    ),
    "numpy": Suite(
        "numpy==2.3.5",
        ("numpy._core.tests.test_multiarray", "numpy._core.tests.test_multithreading"),
        ("pytest", "hypothesis", "numpy==2.3.5"),
        wheel=True,
    ),
    # psutil reads this process's threads, descriptors and children from the kernel: what tracing adds
    # there (a thread of ours, a copy of stderr) is what its tests can see.
    "psutil": Suite(
        "psutil==7.1.3", ("psutil.tests",), ("pytest", "pytest-subtests", "psutil==7.1.3"), wheel=True
    ),
    "msgpack": Suite("msgpack==1.1.2", ("test",), ("pytest", "."), check="import msgpack._cmsgpack"),
    # pytest's own suite runs against the pytest built from the same sdist, with its dev extra.
    "pytest": Suite("pytest==9.2.0", ("testing",), (".[dev]",)),
    "cpython": Suite(
        f"cpython=={sys.version.split()[0]}", ("-x", *CPYTHON_LEFT_OUT), (), wheel=True, regrtest=True
    ),
}

MODES = ("plain", "env", "plugin", "runner")


class Run(NamedTuple):
    """One suite under one mode: outcome per test id, wall time, pytest's exit status."""

    outcomes: dict[str, tuple[str, str]]  # test id -> (outcome, first line of its message)
    wall: float
    status: int
    note: str  # why there are no outcomes (timed out, no XML), else ""


def log(message: str) -> None:
    print(f"fidelity: {message}", file=sys.stderr, flush=True)


SETUP_FAILED = 3


class SetupError(Exception):
    """A suite could not be fetched or installed: not a difference in outcomes."""


def pip(python: Path, *args: str) -> None:
    command = [str(python), "-m", "pip", "-q", "--disable-pip-version-check", *args]
    if subprocess.run(command).returncode != 0:
        raise SetupError(f"pip failed: {' '.join(command[1:])}")


def fetch(name: str, suite: Suite, cache: Path) -> Path | None:
    """The sdist of SUITE, downloaded once into CACHE/sdists; None for a suite installed from its wheel."""
    if suite.wheel:
        return None
    sdists = cache / "sdists"
    sdists.mkdir(parents=True, exist_ok=True)
    version = suite.requirement.split("==")[1]
    stem = f"{name.replace('-', '_')}-{version}"
    names = (f"{stem}.tar.gz", f"{name}-{version}.tar.gz")
    found = [path for path in sdists.glob("*.tar.gz") if path.name.lower() in names]
    if not found:
        log(f"downloading {suite.requirement}")
        pip(
            Path(sys.executable),
            "download",
            "--no-binary",
            ":all:",
            "--no-deps",
            "-d",
            str(sdists),
            suite.requirement,
        )
        found = [path for path in sdists.glob("*.tar.gz") if path.name.lower() in names]
    if not found:
        raise SetupError(f"pip download of {suite.requirement} gave no {names[0]}")
    return found[0]


def unpack(sdist: Path, into: Path) -> Path:
    """Extract SDIST into INTO (emptied first); returns the project's top folder."""
    shutil.rmtree(into, ignore_errors=True)
    into.mkdir(parents=True)
    with tarfile.open(sdist) as archive:
        if sys.version_info >= (3, 12):
            archive.extractall(into, filter="data")
        else:
            archive.extractall(into)  # a pinned sdist from the index
    (top,) = into.iterdir()
    return top


def prepare(name: str, suite: Suite, sdist: Path | None, cache: Path) -> Path:
    """A venv with the suite's test requirements (made once) and this importwatch; returns its python."""
    venv = cache / "venvs" / name
    python = venv / "bin" / "python"
    stamp = venv / "fidelity-stamp"
    wanted = json.dumps([suite.requirement, suite.deps, sys.version])
    if not (stamp.exists() and stamp.read_text() == wanted):
        log(f"making the venv for {name}")
        shutil.rmtree(venv, ignore_errors=True)
        if subprocess.run([sys.executable, "-m", "venv", str(venv)]).returncode != 0:
            raise SetupError(f"could not make a venv at {venv}")
        source = unpack(sdist, cache / "build" / name) if sdist is not None else None
        if suite.deps:
            pip(python, "install", *(str(source) + d[1:] if d.startswith(".") else d for d in suite.deps))
        shutil.rmtree(cache / "build" / name, ignore_errors=True)
        if suite.check and subprocess.run([str(python), "-c", suite.check]).returncode != 0:
            raise SetupError(f"{name} is installed without what its suite needs: {suite.check!r} failed")
        stamp.write_text(wanted)
    # Editable, so that every run measures this checkout as it is now.
    pip(python, "install", "--no-deps", "-e", str(ROOT))
    return python


def command(mode: str, python: Path, suite: Suite, xml: Path) -> list[str]:
    if suite.regrtest:  # its workers are children: traced as any child is
        regrtest = ["-m", "test", "-j2", "--timeout", "600", f"--junit-xml={xml}", *suite.tests]
        return [str(python), *(["-m", "importwatch"] if mode == "runner" else []), *regrtest]
    # Each mode runs in a fresh copy of the sources, so pytest's cache cannot carry over.
    pytest_args = [*(["--pyargs"] if suite.wheel else []), *suite.tests, "-q", f"--junitxml={xml}"]
    if mode == "plugin":
        return [str(python), "-m", "pytest", "-p", "importwatch", *pytest_args]
    if mode == "runner":
        return [str(python), "-m", "importwatch", "-m", "pytest", *pytest_args]
    return [str(python), "-m", "pytest", *pytest_args]


def clean_environment(mode: str, stderr: str | None = None) -> dict[str, str]:
    """This environment without what would change how a suite runs, plus the mode's switch and, for
    a traced mode, STDERR as IMPORTWATCH_STDERR (the runner and the plugin read it too)."""
    env = {
        key: value
        for key, value in os.environ.items()
        if not key.startswith(("IMPORTWATCH", "PYTEST_", "PYTHON", "VIRTUAL_ENV"))
    }
    if mode == "env":
        env["IMPORTWATCH"] = "1"
    if stderr is not None and mode != "plain":
        env["IMPORTWATCH_STDERR"] = stderr
    return env


def read_outcomes(xml: Path) -> dict[str, tuple[str, str]]:
    """Test id -> (outcome, message) from pytest's JUnit XML."""
    outcomes: dict[str, tuple[str, str]] = {}
    for case in ET.parse(xml).iter("testcase"):
        test_id = f"{case.get('classname', '')}::{case.get('name', '')}"
        outcome, message = "passed", ""
        for child in case:
            if child.tag in ("failure", "error", "skipped"):
                outcome = {"failure": "failed", "error": "error", "skipped": "skipped"}[child.tag]
                if child.tag == "skipped" and child.get("type") == "pytest.xfail":
                    outcome = "xfailed"
                message = (child.get("message") or child.text or "").strip().splitlines()[:1]
                message = message[0][:160] if message else ""
                if outcome in ("failed", "error"):
                    break
        # A test id seen twice (a teardown error after a pass) keeps its worse outcome.
        if test_id in outcomes and outcomes[test_id][0] in ("failed", "error"):
            continue
        outcomes[test_id] = (outcome, message)
    return outcomes


def run_mode(
    mode: str,
    name: str,
    suite: Suite,
    sdist: Path | None,
    python: Path,
    work: Path,
    limit: float,
    stderr: str | None = None,
) -> Run:
    place = work / name / mode
    if sdist is not None:
        source = unpack(sdist, place / "src")
    else:  # the installed tests, run from an empty folder: nothing there shadows the package
        source = place / "src"
        shutil.rmtree(source, ignore_errors=True)
        source.mkdir(parents=True)
    xml = place / "junit.xml"
    argv = command(mode, python, suite, xml)
    log(f"{name}: {mode}: {' '.join(argv[1:])}")
    with open(place / "output.txt", "wb") as output:
        started = time.monotonic()
        child = subprocess.Popen(
            argv, cwd=source, env=clean_environment(mode, stderr), stdin=subprocess.DEVNULL,
            stdout=output, stderr=subprocess.STDOUT, start_new_session=True,
        )  # fmt: skip
        note = ""
        try:
            status = child.wait(timeout=limit)
        except subprocess.TimeoutExpired:
            os.killpg(child.pid, signal.SIGKILL)
            status = child.wait()
            note = f"timed out after {limit:.0f} s"
        wall = time.monotonic() - started
    if not xml.exists():
        return Run({}, wall, status, note or f"no JUnit XML (exit status {status})")
    return Run(read_outcomes(xml), wall, status, note)


def compare(plain: Run, other: Run) -> list[tuple[str, str, str, str]]:
    """(test id, plain outcome, other outcome, other's message) for each test whose outcome differs."""
    differences = []
    for test_id in sorted(set(plain.outcomes) | set(other.outcomes)):
        before = plain.outcomes.get(test_id, ("absent", ""))
        after = other.outcomes.get(test_id, ("absent", ""))
        if before[0] != after[0]:
            differences.append((test_id, before[0], after[0], after[1] or before[1]))
    return differences


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "suites", nargs="*", metavar="SUITE", help=f"any of {', '.join(SUITES)} (default: all)"
    )
    parser.add_argument("--modes", default=",".join(MODES), help=f"comma-separated, from {','.join(MODES)}")
    default_cache = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "importwatch-fidelity"
    parser.add_argument("--cache", type=Path, default=default_cache, help="sdists, venvs, last outputs")
    parser.add_argument(
        "--stderr",
        choices=("all", "stalls", "none"),
        help="IMPORTWATCH_STDERR for the traced modes (stalls: the quiet mode; default: importwatch's own)",
    )
    parser.add_argument("--limit", type=float, default=5400.0, help="seconds one suite may run in one mode")
    options = parser.parse_args()
    unknown = [s for s in options.suites if s not in SUITES]
    modes = [m for m in options.modes.split(",") if m]
    if unknown or not modes or any(m not in MODES for m in modes):
        parser.error(f"unknown suite or mode: {', '.join(unknown) or options.modes}")
    if "plain" not in modes:
        modes.insert(0, "plain")
    cache = options.cache.resolve()
    work = cache / "work"
    rows = []
    failed = False
    for name in options.suites or list(SUITES):
        suite = SUITES[name]
        try:
            sdist = fetch(name, suite, cache)
            python = prepare(name, suite, sdist, cache)
        except SetupError as error:
            log(f"{name}: {error}")
            return SETUP_FAILED
        runs = {
            mode: run_mode(mode, name, suite, sdist, python, work, options.limit, options.stderr)
            for mode in modes
            if not (suite.regrtest and mode == "plugin")
        }
        plain = runs["plain"]
        cells = []
        lines = []
        for mode in runs:
            run = runs[mode]
            if run.note:
                failed = True
                cells.append(f"{mode}: {run.note}, {run.wall:.1f} s")
                continue
            if mode == "plain":
                cells.append(f"plain: {len(run.outcomes)} tests, {run.wall:.1f} s")
                if not any(outcome == "passed" for outcome, _ in run.outcomes.values()):
                    # A suite that fails to collect under plain python compares nothing.
                    failed = True
                    cells[-1] += f", none passed: see {work / name / 'plain' / 'output.txt'}"
                continue
            differences = compare(plain, run)
            failed = failed or bool(differences)
            cells.append(f"{mode}: {len(differences)} differ, {run.wall:.1f} s")
            lines += [f"  {mode}: {test_id}: {before} plain, {after} here: {message}"
                      for test_id, before, after, message in differences]  # fmt: skip
        rows.append(f"{name}: " + "; ".join(cells))
        print("\n".join([rows[-1], *lines]), flush=True)
    print("summary:")
    for row in rows:
        print(f"  {row}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
