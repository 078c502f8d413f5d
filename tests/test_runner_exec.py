"""The runner execs the program's python: frames, warnings, start-up modules, flags and children as plain python's.

Side by side: plain python, `python -m importwatch` and IMPORTWATCH=1. Where python
cannot trace through the .pth (-I, -S), the runner runs the program in its own process.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from helpers import ROOT, clean_env, deep_import_chain, venv_with_importwatch
from test_side_by_side import RUNNER, _ours_removed, three_ways

pytestmark = [pytest.mark.timeout(180), pytest.mark.slow]  # every test here starts processes

QUIET = ("--no-watcher", "--stderr", "none")
# From 3.10 the runner's interpreter execs from importwatch's .pth line, as site starts.
EXECS_AT_SITE = pytest.mark.skipif(
    sys.version_info < (3, 10), reason="3.9 has no sys.orig_argv: its runner execs after site"
)


# -- frames below the program ------------------------------------------------------------------
STACKLEVEL = """\
import logging, warnings
logging.basicConfig(format="%(filename)s:%(lineno)d %(funcName)s %(message)s")
warnings.warn("blame my importer's importer", stacklevel=3)
logging.warning("logged", stacklevel=3)
"""


def test_a_warning_and_a_log_record_with_stacklevel_3_in_a_module_body_blame_what_plain_blames(
    tmp_path: Path,
) -> None:
    (tmp_path / "mod.py").write_text(STACKLEVEL)
    (tmp_path / "main.py").write_text("import mod\n")
    runs = three_ways(["main.py"], tmp_path, runner_options=QUIET, IMPORTWATCH_STDERR="none")
    plain = runs["plain"]
    # Nothing below the script's frame: sys:1 (<sys>:0 on 3.13), never a file of ours.
    assert plain.stderr.startswith(("sys:1: UserWarning", "<sys>:0: UserWarning")), plain.stderr
    for name in ("runner", "IMPORTWATCH=1"):
        assert (runs[name].returncode, _ours_removed(runs[name].stderr)) == (0, plain.stderr), name


STACK = """\
import sys, traceback

def depth(n=0):
    try:
        return depth(n + 1)
    except RecursionError:
        return n

sys.setrecursionlimit(400)
print([frame.filename for frame in traceback.extract_stack()], depth())
"""


def test_the_program_s_stack_and_recursion_depth_are_plain_python_s(tmp_path: Path) -> None:
    """In the script's body: no frame of runpy's or ours below it, the same recursion left."""
    (tmp_path / "main.py").write_text(STACK)
    runs = three_ways(["main.py"], tmp_path, runner_options=QUIET, IMPORTWATCH_STDERR="none")
    plain = runs["plain"]
    assert plain.returncode == 0 and "main.py" in plain.stdout, plain.stderr
    for name in ("runner", "IMPORTWATCH=1"):
        assert (runs[name].returncode, runs[name].stdout) == (0, plain.stdout), (name, runs[name].stderr)


def test_nested_imports_reach_as_deep_under_the_runner_as_under_importwatch_1(tmp_path: Path) -> None:
    """Inside imports the tracer's one frame per import costs both alike; the runner adds nothing."""
    # the stack inside a module body, importlib's frames and all
    deep_import_chain(tmp_path, tail="import mod\n")
    (tmp_path / "mod.py").write_text("import traceback\nprint(len(traceback.extract_stack()))\n")
    runs = three_ways(["main.py"], tmp_path, runner_options=QUIET, IMPORTWATCH_STDERR="none")
    assert runs["plain"].returncode == 0 and int(runs["plain"].stdout.split()[1]) > 10
    assert runs["runner"].returncode == 0, runs["runner"].stderr
    assert runs["runner"].stdout == runs["IMPORTWATCH=1"].stdout


# -- what python loads before the program -------------------------------------------------------
def _importtime_modules(text: str) -> set[str]:
    return {
        line.rsplit("|", 1)[1].split()[0] for line in text.splitlines() if line.startswith("import time:")
    }


def test_the_modules_runpy_would_have_loaded_are_in_the_runner_s_importtime_tree(tmp_path: Path) -> None:
    code = "import json, email.parser, http.client"
    plain = subprocess.run(
        [sys.executable, "-X", "importtime", "-c", code],
        cwd=tmp_path, capture_output=True, text=True, env=clean_env(), timeout=60,
    )  # fmt: skip
    start = subprocess.run(
        [sys.executable, "-X", "importtime", "-c", "pass"],
        cwd=tmp_path, capture_output=True, text=True, env=clean_env(), timeout=60,
    )  # fmt: skip
    expected = _importtime_modules(plain.stderr) - _importtime_modules(start.stderr)
    assert {"collections", "functools", "operator", "itertools", "keyword", "reprlib"} <= expected
    log = tmp_path / "run.log"
    done = subprocess.run(
        [*RUNNER, *QUIET, "--log", str(log), "-c", code],
        cwd=tmp_path, capture_output=True, text=True, env=clean_env(), timeout=60,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    report = subprocess.run(
        [*RUNNER, "report", str(log), "--format", "importtime"],
        cwd=tmp_path, capture_output=True, text=True, env=clean_env(), timeout=60,
    )  # fmt: skip
    assert sorted(expected - _importtime_modules(report.stdout)) == []


# -- the environment, and the children ----------------------------------------------------------
ENVIRONMENT = """\
import os, subprocess, sys
ours = sorted(name for name in os.environ if name.startswith("IMPORTWATCH"))
seen = subprocess.run(["env"], capture_output=True, text=True).stdout.splitlines()  # the C environment
child = subprocess.run([sys.executable, "-c", "print('child ran')"], capture_output=True, text=True)
print(ours, os.environ["IMPORTWATCH_TIMEOUT"], os.environ["IMPORTWATCH_STDERR"])
print(sorted(line.split("=")[0] for line in seen if line.startswith("IMPORTWATCH")))
print(child.stdout.strip(), child.stderr.count("] start python"), "argv=['-c'" in child.stderr)
"""


def test_the_program_and_its_children_see_the_runner_s_settings_and_never_its_private_variable(
    tmp_path: Path,
) -> None:
    """As the runner always gave them: IMPORTWATCH=1 and its settings (a user's own IMPORTWATCH_TIMEOUT
    given as it merged), so that children trace themselves; the exec's own variable is gone."""
    (tmp_path / "main.py").write_text(ENVIRONMENT)
    done = subprocess.run(
        [*RUNNER, "--no-watcher", "--stderr", "all", "main.py"],
        cwd=tmp_path, capture_output=True, text=True, env=clean_env(IMPORTWATCH_TIMEOUT="7"), timeout=60,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    variables = sorted([
        "IMPORTWATCH", "IMPORTWATCH_DUMP_ON_SIGUSR1", "IMPORTWATCH_EXIT_ON_STALL", "IMPORTWATCH_LOG",
        "IMPORTWATCH_STDERR", "IMPORTWATCH_TIMEOUT",
        *(["IMPORTWATCH_PURE"] if "IMPORTWATCH_PURE" in os.environ else []),  # the suite's choice, passed on
    ])  # fmt: skip
    python_side, c_side, child = done.stdout.splitlines()
    assert python_side == f"{variables} 7.0 all"
    assert c_side == str(variables)
    # The child is traced as IMPORTWATCH=1 traces any python (its start line shows its whole command
    # line), not as the runner's program.
    # (Python 3.9 has no sys.orig_argv: its start line shows argv as the program will see it.)
    assert child == "child ran 1 False" or (sys.version_info < (3, 10) and child == "child ran 1 True")
    assert "argv=['main.py']" in done.stderr


# -- the interpreter's flags ---------------------------------------------------------------------
FLAGS = "import sys; print(bool(sys.flags.dont_write_bytecode), sys.flags.optimize, sys.warnoptions, sys._xoptions.get('importtime')); import json"


def test_the_interpreter_s_flags_reach_the_program(tmp_path: Path) -> None:
    flags = ["-B", "-O", "-W", "error", "-X", "importtime"]
    plain = subprocess.run(
        [sys.executable, *flags, "-c", FLAGS],
        cwd=tmp_path, capture_output=True, text=True, env=clean_env(), timeout=60,
    )  # fmt: skip
    traced = subprocess.run(
        [sys.executable, *flags, "-m", "importwatch", *QUIET, "-c", FLAGS],
        cwd=tmp_path, capture_output=True, text=True, env=clean_env(), timeout=60,
    )  # fmt: skip
    assert plain.stdout == "True 1 ['error'] True\n", plain.stderr
    assert (traced.returncode, traced.stdout) == (0, plain.stdout), traced.stderr
    # -X importtime: the program's process times its own imports (after those of the runner's start).
    assert "import time:" in traced.stderr and traced.stderr.rstrip().endswith("| json")


EVERY_FLAG = "import sys; print(sys.flags); print(sys.warnoptions); print(sys._xoptions)"


def test_every_flag_and_x_option_reaches_the_program_as_python_gives_them(tmp_path: Path) -> None:
    """Not only CPython's short list of -X options (subprocess's): an option of the program's own, and
    the ones that list leaves out, which change what the program does (int_max_str_digits)."""
    flags = ["-B", "-OO", "-b", "-s", "-W", "error", "-W", "ignore::UserWarning", "-X", "dev", "-X", "foo=1"]
    flags += ["-X", "utf8", "-X", "no_debug_ranges", "-X", "int_max_str_digits=5000", "-X", "bar"]
    if sys.version_info >= (3, 11):
        flags.append("-P")
    env = clean_env(PYTHONWARNINGS="ignore::DeprecationWarning")
    plain = subprocess.run(
        [sys.executable, *flags, "-c", EVERY_FLAG],
        cwd=tmp_path, capture_output=True, text=True, env=env, timeout=60,
    )  # fmt: skip
    traced = subprocess.run(
        [sys.executable, *flags, "-m", "importwatch", *QUIET, "-c", EVERY_FLAG],
        cwd=tmp_path, capture_output=True, text=True, env=env, timeout=60,
    )  # fmt: skip
    assert "'foo': '1'" in plain.stdout and "int_max_str_digits=5000" in plain.stdout, plain.stderr
    assert (traced.returncode, traced.stdout) == (0, plain.stdout), traced.stderr


SKIPPED_LINE = "this first line is not python (python -x skips it)\nimport sys, _imp\nprint(sys.argv, sys._getframe().f_lineno, _imp.check_hash_based_pycs)\n"


@pytest.mark.skipif(sys.version_info < (3, 10), reason="-x is known only from sys.orig_argv, 3.10 on")
@pytest.mark.parametrize("isolated", [False, True], ids=["exec", "in-process"])
def test_x_and_hash_checks_reach_the_program(tmp_path: Path, isolated: bool) -> None:
    """No sys.flags field says -x or --check-hash-based-pycs: the runner passes them on all the same, and
    under -I, where it runs the program itself, drops the script's first line as python does."""
    (tmp_path / "script.py").write_text(SKIPPED_LINE)
    flags = ["--check-hash-based-pycs", "never", *(["-I"] if isolated else []), "-x"]
    plain = subprocess.run(
        [sys.executable, *flags, "script.py", "a"],
        cwd=tmp_path, capture_output=True, text=True, env=clean_env(), timeout=60,
    )  # fmt: skip
    traced = subprocess.run(
        [sys.executable, *flags, "-m", "importwatch", *QUIET, "script.py", "a"],
        cwd=tmp_path, capture_output=True, text=True, env=clean_env(), timeout=60,
    )  # fmt: skip
    assert plain.stdout == "['script.py', 'a'] 3 never\n", plain.stderr
    assert (traced.returncode, traced.stdout) == (0, plain.stdout), traced.stderr


def _the_runner_s_own_imports(tmp_path: Path) -> set[str]:
    """What the runner's interpreter, the one the exec replaces, imports: its own -X importtime tree (the
    option reaches the exec'd python too, and each interpreter prints its own header first)."""
    traced = subprocess.run(
        [sys.executable, "-X", "importtime", "-m", "importwatch", *QUIET, "-c", "pass"],
        cwd=tmp_path, capture_output=True, text=True, env=clean_env(), timeout=60,
    )  # fmt: skip
    assert traced.returncode == 0, traced.stderr
    headers = [found.start() for found in re.finditer(r"^import time: self", traced.stderr, re.MULTILINE)]
    assert len(headers) == 2, traced.stderr
    runners = traced.stderr[headers[0] : headers[1]]
    return set(re.findall(r"^import time:.*\|\s+(\S+)$", runners, re.MULTILINE))  # at any depth


def test_the_runner_s_start_imports_neither_subprocess_nor_the_tracing_it_execs_into(tmp_path: Path) -> None:
    """The runner's own interpreter, which the exec replaces, stays light: subprocess (with signal,
    enum, selectors, threading) is not imported to learn the interpreter's flags, nor the tracing
    that only the exec'd python runs (the hook, the sink, the lines' format, the C accelerator), nor
    __future__. Each was milliseconds of every run's start."""
    imported = _the_runner_s_own_imports(tmp_path)
    assert "importwatch.cli" in imported  # the runner's start is in what -X importtime printed
    tracing = {f"importwatch.tracing.{name}" for name in ("hook", "sink", "pthlines", "_speedups")}
    assert not imported & {"subprocess", "selectors", "__future__", "importwatch.events", *tracing}


SITECUSTOMIZE = """\
import os, sys
sys.stderr.write(f"sitecustomize ran in {os.getpid()}\\n")
os.environ["SET_BY_SITECUSTOMIZE"] = "yes"
"""


@EXECS_AT_SITE
def test_site_s_own_customising_runs_once_under_the_runner_as_under_plain_python(tmp_path: Path) -> None:
    """The runner's interpreter execs the program's python from importwatch's .pth line, as site starts:
    a sitecustomize runs once, in the program's process, as under plain python, and what it puts in
    os.environ is the program's alone, not passed on by the exec."""
    (tmp_path / "custom").mkdir()
    (tmp_path / "custom" / "sitecustomize.py").write_text(SITECUSTOMIZE)
    (tmp_path / "main.py").write_text("import os; print(os.environ.get('SET_BY_SITECUSTOMIZE'))\n")
    runs = three_ways(
        ["main.py"],
        tmp_path,
        runner_options=QUIET,
        PYTHONPATH=str(tmp_path / "custom"),
        IMPORTWATCH_STDERR="none",
    )
    for name, run in runs.items():
        assert (run.returncode, run.stdout) == (0, "yes\n"), (name, run.stderr)
        assert run.stderr.count("sitecustomize ran") == 1, (name, run.stderr)


@EXECS_AT_SITE
def test_the_runner_s_interpreter_execs_before_runpy_or_anything_after_site_s_pth_files(
    tmp_path: Path,
) -> None:
    """python -m imports runpy (with importlib.util, contextlib, collections) to run a module: milliseconds
    the runner's own interpreter, which the exec replaces, no longer spends."""
    imported = _the_runner_s_own_imports(tmp_path)
    assert "importwatch.cli" in imported
    assert not imported & {"runpy", "sitecustomize", "importlib.util"}, sorted(imported)


# A .pth that sorts after importwatch's: each run leaves a line in the file PTH_RUNS names.
COUNTING_PTH = "import os; open(os.environ['PTH_RUNS'], 'a').write('ran\\n')\n"


@EXECS_AT_SITE
def test_a_pth_after_ours_in_a_venv_runs_under_the_runner_as_often_as_under_plain_python(
    tmp_path: Path,
) -> None:
    """In a venv, site reads site-packages' .pth files twice: in site.venv(), whose first pass comes
    before site.getsitepackages() names the venv, and again in site.main(). The runner's interpreter
    execs from importwatch's .pth line in that first pass: a .pth after ours runs in the program's
    process alone, as often as under plain python, never once more in an interpreter about to go."""
    env_dir = tmp_path / "venv"
    pth = venv_with_importwatch(env_dir) / "zz-count.pth"
    pth.write_text(COUNTING_PTH)
    python = str(env_dir / "bin" / "python")
    ways = {
        "plain": ([python, "-c", "pass"], {}),
        "runner": ([python, "-m", "importwatch", *QUIET, "-c", "pass"], {}),
        "IMPORTWATCH=1": ([python, "-c", "pass"], {"IMPORTWATCH": "1", "IMPORTWATCH_STDERR": "none"}),
        # Tracing on in the runner's interpreter too: it must exec before activating, and say nothing.
        "runner, IMPORTWATCH=1": (
            [python, "-m", "importwatch", "--no-watcher", "-c", "pass"],
            {"IMPORTWATCH": "1"},
        ),
    }
    counts = {}
    for name, (command, extra) in ways.items():
        runs = tmp_path / f"runs-{len(counts)}"
        env = clean_env(PTH_RUNS=str(runs), **extra)
        done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=60)
        assert done.returncode == 0, (name, done.stderr)
        counts[name] = runs.read_text().count("ran") if runs.exists() else 0
    lines = done.stderr  # the last way's: the runner with IMPORTWATCH=1
    assert lines.count("] start python ") == 1 and "'-m', 'importwatch'" not in lines, lines
    assert counts["plain"] >= 1 and set(counts.values()) == {counts["plain"]}, counts


# -- where the exec cannot trace: the program runs in the runner's process -----------------------
@pytest.mark.parametrize("flag", ["-I", "-S"])
def test_under_a_flag_that_stops_the_pth_the_runner_traces_in_its_own_process(
    tmp_path: Path, flag: str
) -> None:
    code = "import sys, json; print(sys.flags.isolated, sys.flags.no_site, sys.argv)"
    env = clean_env(PYTHONPATH=str(ROOT / "src")) if flag == "-S" else clean_env()  # -S: no site-packages
    plain = subprocess.run(
        [sys.executable, flag, "-c", code, "x"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
    )
    traced = subprocess.run(
        [sys.executable, flag, "-m", "importwatch", "--no-watcher", "-c", code, "x"],
        cwd=tmp_path, capture_output=True, text=True, env=env, timeout=60,
    )  # fmt: skip
    assert plain.returncode == 0 and "['-c', 'x']" in plain.stdout, plain.stderr
    assert (traced.returncode, traced.stdout) == (0, plain.stdout), traced.stderr
    assert "] start python" in traced.stderr and "] > json\n" in traced.stderr
