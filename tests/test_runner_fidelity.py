"""The runner runs a program as python does, side by side: scripts from pipes, broken sources, excepthooks, globals, the cwd, bytecode."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from helpers import clean_env
from test_side_by_side import _ours_removed, three_ways

pytestmark = [pytest.mark.timeout(180), pytest.mark.slow]  # every test here starts processes


# -- a script read from a pipe ------------------------------------------------------------------
def test_a_script_given_as_dev_stdin_runs_as_python_runs_it(tmp_path: Path) -> None:
    runs = three_ways(["/dev/stdin", "arg"], tmp_path, stdin="import sys\nprint('ran', sys.argv[1:])\n")
    for name, run in runs.items():
        assert (run.returncode, run.stdout) == (0, "ran ['arg']\n"), (name, run.stderr)


def test_a_script_from_process_substitution_runs_as_python_runs_it(tmp_path: Path) -> None:
    """`python <(...)`: the script is a pipe's /dev/fd path; looking for a zip must not read it."""
    for command in (
        f"{sys.executable} <(echo 'print(40 + 2)')",
        f"{sys.executable} -m importwatch <(echo 'print(40 + 2)')",
    ):
        done = subprocess.run(
            ["bash", "-c", command], cwd=tmp_path, capture_output=True, text=True, env=clean_env(), timeout=60
        )
        assert (done.returncode, done.stdout) == (0, "42\n"), (command, done.stderr)


# -- what python prints when the excepthook fails --------------------------------------------------
HOOKS = {
    "None": "import sys\nsys.excepthook = None\n",
    "raises": "import sys\ndef hook(*args):\n    raise RuntimeError('hook')\nsys.excepthook = hook\n",
    "deleted": "import sys\ndel sys.excepthook\n",
    "exits": "import sys\ndef hook(*args):\n    raise SystemExit(7)\nsys.excepthook = hook\n",
}


@pytest.mark.parametrize("hook", sorted(HOOKS))
def test_an_uncaught_exception_with_a_failing_excepthook_prints_what_python_prints(
    tmp_path: Path, hook: str
) -> None:
    (tmp_path / "main.py").write_text(HOOKS[hook] + "raise ValueError('boom')\n")
    runs = three_ways(["main.py"], tmp_path)
    plain = runs["plain"]
    assert plain.returncode in (1, 7) and ("boom" in plain.stderr or hook == "exits")
    for name in ("runner", "IMPORTWATCH=1"):
        run = runs[name]
        assert (run.returncode, _ours_removed(run.stderr)) == (plain.returncode, plain.stderr), name


# -- a source python cannot read ---------------------------------------------------------------------
SOURCES = {
    "nul": b"print('hi')\nx = 1\x00\n",
    "bad utf-8": b"print('\xff')\n",
    "bogus coding": b"# coding: bogus\nprint(1)\n",
}


@pytest.mark.parametrize("source", sorted(SOURCES))
def test_a_script_python_cannot_read_fails_with_python_s_own_message(tmp_path: Path, source: str) -> None:
    (tmp_path / "broken.py").write_bytes(SOURCES[source])
    runs = three_ways(["broken.py"], tmp_path)
    plain = runs["plain"]
    runs_before_the_nul = source == "nul" and sys.version_info < (3, 11)  # 3.9, 3.10 read up to a NUL
    assert runs_before_the_nul or (plain.returncode == 1 and "SyntaxError" in plain.stderr)
    expected = (plain.returncode, plain.stdout, plain.stderr)
    for name in ("runner", "IMPORTWATCH=1"):
        run = runs[name]
        assert (run.returncode, run.stdout, _ours_removed(run.stderr)) == expected, name


@pytest.mark.parametrize(
    "args", [["main.py"], ["-c", "print(list(globals()))"], ["-"]], ids=["script", "code", "stdin"]
)
def test_globals_come_in_python_s_order(tmp_path: Path, args: list[str]) -> None:
    (tmp_path / "main.py").write_text("print(list(globals()))\n")
    runs = three_ways(args, tmp_path, stdin="print(list(globals()))\n")
    assert "__builtins__" in runs["plain"].stdout
    assert runs["runner"].stdout == runs["IMPORTWATCH=1"].stdout == runs["plain"].stdout


# -- the working folder shadows none of our own imports -----------------------------------------
def test_a_json_py_in_the_working_folder_does_not_break_doctor(tmp_path: Path) -> None:
    (tmp_path / "json.py").write_text("raise SystemExit('the json.py of the working folder was imported')\n")
    done = subprocess.run(
        [sys.executable, "-m", "importwatch", "doctor", "--json", "--no-cuda", "--import", "email"],
        cwd=tmp_path, capture_output=True, text=True, env=clean_env(), timeout=150,
    )  # fmt: skip
    assert "working folder was imported" not in done.stderr + done.stdout
    assert "Traceback" not in done.stderr and done.stdout.lstrip().startswith("{"), done.stderr


def test_the_runner_s_own_imports_skip_the_working_folder_and_the_program_keeps_its_path0(
    tmp_path: Path,
) -> None:
    # fcntl is imported by the watcher's launch; python -m puts the working folder first on sys.path.
    (tmp_path / "fcntl.py").write_text(
        "raise SystemExit('the fcntl.py of the working folder was imported')\n"
    )
    (tmp_path / "mod.py").write_text("import sys\nprint(sys.path[0] == __import__('os').getcwd())\n")
    runs = three_ways(["-m", "mod"], tmp_path)
    for name, run in runs.items():
        assert (run.returncode, run.stdout) == (0, "True\n"), (name, run.stderr)


# -- bytecode ---------------------------------------------------------------------------------------
def _pycache_files(root: Path) -> set[Path]:
    return {path for path in root.rglob("*.pyc")}


@pytest.mark.parametrize("how", ["-B", "PYTHONDONTWRITEBYTECODE"])
def test_with_bytecode_off_the_watcher_writes_no_pyc_into_our_source_tree(tmp_path: Path, how: str) -> None:
    """A fresh copy of importwatch's source, run from where python finds it: nothing may write .pyc there."""
    import shutil

    import importwatch

    source = tmp_path / "src"
    shutil.copytree(
        Path(importwatch.__file__).parent,
        source / "importwatch",
        ignore=shutil.ignore_patterns("__pycache__"),
    )
    flags = ["-B"] if how == "-B" else []
    env = clean_env(PYTHONPATH=str(source), **({"PYTHONDONTWRITEBYTECODE": "1"} if how != "-B" else {}))
    done = subprocess.run(
        [sys.executable, *flags, "-m", "importwatch", "--watcher", "--timeout", "0.5", "-c", "import time; time.sleep(1.5)"],
        cwd=tmp_path, capture_output=True, text=True, env=env, timeout=60,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    time.sleep(0.5)  # the watcher leaves just after the program
    assert "no watcher process" not in done.stderr
    assert sorted(_pycache_files(source)) == []
    assert not os.path.exists(source / "importwatch" / "watcher" / "__pycache__")
