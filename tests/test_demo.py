"""The demo's prerequisites: without a C compiler or the Python headers it says which, in one line."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from helpers import ROOT, clean_env

pytestmark = pytest.mark.slow  # every test here starts processes

DEMO = ROOT / "demo" / "stuck_job.py"
MISSING = 3  # the demo's exit status when a prerequisite is missing


def run_demo(env: dict[str, str]) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, str(DEMO)], capture_output=True, text=True, env=env, timeout=120,
        stdin=subprocess.DEVNULL,
    )  # fmt: skip


def assert_one_line(done: subprocess.CompletedProcess, starts: str) -> None:
    assert done.returncode == MISSING, done.stdout + done.stderr
    assert done.stdout == "", done.stdout
    lines = done.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith(starts), done.stderr
    assert "Traceback" not in done.stderr


@pytest.mark.timeout(120)
def test_without_a_compiler_on_path_the_demo_says_so_in_one_line(tmp_path: Path) -> None:
    env = clean_env(PATH=str(tmp_path))  # an empty folder: no cc, gcc or clang
    env.pop("CC", None)
    assert_one_line(run_demo(env), "demo: no C compiler found: no cc, gcc or clang on PATH")


@pytest.mark.timeout(120)
def test_a_cc_that_does_not_exist_is_named(tmp_path: Path) -> None:
    done = run_demo(clean_env(CC=str(tmp_path / "nosuch-cc")))
    assert_one_line(done, "demo: no C compiler found: CC=")
    assert "nosuch-cc" in done.stderr


@pytest.mark.timeout(120)
def test_a_compiler_that_cannot_find_python_h_is_python_h_missing(tmp_path: Path) -> None:
    """A real compiler run without the include folders, as where the headers are not installed."""
    real = shutil.which("cc") or shutil.which("gcc")
    if real is None:
        pytest.skip("no C compiler")
    wrapper = tmp_path / "cc-without-headers"
    wrapper.write_text(
        f"#!{sys.executable}\nimport os, sys\n"
        f"os.execv({real!r}, [{real!r}] + [a for a in sys.argv[1:] if not a.startswith('-I')])\n"
    )
    wrapper.chmod(0o755)
    done = run_demo(clean_env(CC=str(wrapper)))
    assert_one_line(done, "demo: Python.h missing: the C compiler")
