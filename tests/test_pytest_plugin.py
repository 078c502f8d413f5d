"""`pytest -p importwatch` names the import that hangs a test suite's collection."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from helpers import clean_env

pytestmark = [pytest.mark.timeout(120), pytest.mark.slow]


def _pytest(suite: Path, *args: str, **env: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", *args, str(suite)],
        capture_output=True, text=True, env=clean_env(**env), cwd=suite, timeout=90,
    )  # fmt: skip


def test_collection_hang_in_an_extension_is_named(built: Path, tmp_path: Path) -> None:
    suite = tmp_path / "suite"
    suite.mkdir()
    (suite / "test_uses_kernels.py").write_text("import hangext\n\ndef test_never_runs():\n    pass\n")
    so = next(built.glob("hangext*.so"))
    result = _pytest(
        suite, "-p", "importwatch",
        PYTHONPATH=str(built), IMPORTWATCH_TIMEOUT="1", IMPORTWATCH_EXIT_ON_STALL="1",
    )  # fmt: skip
    assert result.returncode == 1
    assert "> hangext" in result.stderr and f"> dlopen {so} (hangext)" in result.stderr
    assert "Timeout" in result.stderr and f"dlopen {so} for hangext" in result.stderr


def test_collection_hang_in_python_is_reported_with_the_chain(tmp_path: Path) -> None:
    suite = tmp_path / "suite"
    suite.mkdir()
    (suite / "slow_helper.py").write_text("import time\ntime.sleep(600)\n")
    (suite / "test_slow.py").write_text("import slow_helper\n\ndef test_never_runs():\n    pass\n")
    result = _pytest(suite, "-p", "importwatch", IMPORTWATCH_TIMEOUT="1", IMPORTWATCH_EXIT_ON_STALL="1")
    assert result.returncode == 1
    stall = next(line for line in result.stderr.splitlines() if "STALL" in line)
    assert "test_slow" in stall and "slow_helper (loading" in stall


def test_plugin_is_quiet_unless_asked_for_and_coexists_with_pytest_timeout(tmp_path: Path) -> None:
    suite = tmp_path / "suite"
    suite.mkdir()
    (suite / "test_ok.py").write_text("import json\n\ndef test_ok():\n    assert json.loads('1') == 1\n")
    plain = _pytest(suite, "--timeout", "30")  # pytest-timeout loads by itself
    assert plain.returncode == 0 and "[importwatch " not in plain.stderr
    traced = _pytest(suite, "-p", "importwatch", "--timeout", "30")
    assert traced.returncode == 0, traced.stdout + traced.stderr
    assert "> test_ok" in traced.stderr and "1 passed" in traced.stdout
