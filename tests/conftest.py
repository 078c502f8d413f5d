"""Shared fixtures: the hang fixtures compiled once per session, and programs started in the background.

Plain helper functions live in helpers.py and the C builds in cbuild.py; tests import them from there.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from cbuild import FIXTURES, compile_extension, compile_shared
from helpers import Running, clean_env

_CHECKOUT_SRC = Path(__file__).resolve().parent.parent / "src"
# Run as the tests run their children: where importwatch comes from, and whether IMPORTWATCH=1 works.
_PROBE = "import sys, importwatch; print(importwatch.__file__); print('importwatch.tracing.session' in sys.modules)"
NOT_INSTALLED = "importwatch is not installed in this environment: run  pip install -e '.[test]'"


def pytest_configure(config: pytest.Config) -> None:
    """Most tests run importwatch as a user would: without an install of this checkout they would fail
    with bare assertion errors, so say how to install, once, before any test runs (about 60 ms)."""
    env = clean_env(IMPORTWATCH="1", IMPORTWATCH_STDERR="none")
    try:
        done = subprocess.run(
            [sys.executable, "-c", _PROBE], env=env, cwd="/", capture_output=True, text=True, timeout=60
        )
        where, activated = done.stdout.split()
    except (subprocess.SubprocessError, ValueError):
        where, activated = "", "False"
    if where and not Path(where).resolve().is_relative_to(_CHECKOUT_SRC):
        message = (
            f"the importwatch installed here is {where}, not this checkout's: run  pip install -e '.[test]'"
        )
        pytest.exit(message, returncode=pytest.ExitCode.USAGE_ERROR)
    if activated != "True":
        pytest.exit(NOT_INSTALLED, returncode=pytest.ExitCode.USAGE_ERROR)


# -- compiled fixtures ---------------------------------------------------------------
@pytest.fixture(scope="session")
def built(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A folder on which the hang fixtures are compiled once per session."""
    out = tmp_path_factory.mktemp("built")
    hang = FIXTURES / "hang"
    compile_extension(hang / "blocking_ext.c", out, "hangext")
    compile_extension(hang / "blocking_ext.c", out, "fastkern._kernels")
    compile_extension(hang / "crashing_ext.c", out, "crashext")
    compile_shared(hang / "blocking_lib.c", out / "libblocking.so")
    return out


@pytest.fixture
def in_session():
    """in_session(COMMAND, **popen) starts COMMAND in a session of its own (stdin, stdout and stderr on
    /dev/null unless given); at the end of the test the whole session is killed, a hung child too."""
    started: list[subprocess.Popen] = []

    def _start(command: list[str], **popen) -> subprocess.Popen:
        for stream in ("stdin", "stdout", "stderr"):
            popen.setdefault(stream, subprocess.DEVNULL)
        started.append(subprocess.Popen(command, start_new_session=True, **popen))
        return started[-1]

    yield _start
    for process in started:
        try:
            os.killpg(process.pid, signal.SIGKILL)
        except OSError:
            pass  # every process of the session has ended
        process.wait(timeout=30)


@pytest.fixture
def start(tmp_path: Path):
    """start(command, **env) runs COMMAND in the background; it is killed at the end of the test."""
    running: list[Running] = []

    def _start(command: list[str], cwd: Path | None = None, **extra: str) -> Running:
        proc = Running(command, tmp_path, clean_env(**extra), cwd=cwd)
        running.append(proc)
        return proc

    yield _start
    for proc in running:
        proc.kill()
