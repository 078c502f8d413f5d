"""Shared fixtures: the hang fixtures compiled once per session, and programs started in the background.

Plain helper functions live in helpers.py and the C builds in cbuild.py; tests import them from there.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from cbuild import FIXTURES, compile_extension, compile_shared
from helpers import Running, clean_env


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
