"""One settings merge: every entry point reads the IMPORTWATCH_* variables the same way, install() included."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from helpers import clean_env

# What the probe writes: the settings of the traced process it is imported in. The log and
# --exit-on-stall are left out: bisect and doctor set both for their children, on purpose.
PROBE = """\
import json, os
from importwatch.tracing import session

settings = session.active().settings
fields = ("timeout", "watcher", "stderr", "dump_on_sigusr1")
with open(os.environ["PROBE_OUT"], "w") as out:
    json.dump({name: getattr(settings, name) for name in fields}, out)
"""

VARIABLES = {
    "IMPORTWATCH_TIMEOUT": "7.5",
    "IMPORTWATCH_WATCHER": "1",
    "IMPORTWATCH_STDERR": "stalls",
    "IMPORTWATCH_DUMP_ON_SIGUSR1": "1",
}
EXPECTED = {"timeout": 7.5, "watcher": True, "stderr": "stalls", "dump_on_sigusr1": True}

# Each entry point as a user starts it; the program (or test, or checked import) imports the probe.
ENTRY_POINTS = {
    "install": ["-c", "import importwatch; importwatch.install(); import probe"],
    "runner": ["-m", "importwatch", "-c", "import probe"],
    "pytest plugin": ["-m", "pytest", "-p", "importwatch", "-p", "no:cacheprovider", "-q", "test_probe.py"],
    "bisect": ["-m", "importwatch", "bisect", "-c", "import probe"],
    "doctor": ["-m", "importwatch", "doctor", "--import", "probe", "--packages", ".", "--no-cuda"],
}


def _run_entry(entry: str, folder: Path, env: dict[str, str], timeout: float) -> subprocess.CompletedProcess:
    """Run ENTRY (a key of ENTRY_POINTS) in FOLDER with ENV, as a user would."""
    return subprocess.run(
        [sys.executable, *ENTRY_POINTS[entry]],
        cwd=folder,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


@pytest.mark.timeout(120)
@pytest.mark.parametrize("entry", list(ENTRY_POINTS))
def test_every_entry_point_merges_the_variables_alike(entry: str, tmp_path: Path) -> None:
    (tmp_path / "probe.py").write_text(PROBE)
    (tmp_path / "test_probe.py").write_text("def test_probe():\n    import probe\n")
    out = tmp_path / "settings.json"
    env = clean_env(PYTHONPATH=str(tmp_path), PROBE_OUT=str(out), **VARIABLES)
    done = _run_entry(entry, tmp_path, env, timeout=100)
    assert out.exists(), f"the probe did not run under {entry}: {done.stdout}{done.stderr}"
    assert json.loads(out.read_text()) == EXPECTED
    assert done.returncode == 0, done.stdout + done.stderr


@pytest.mark.timeout(60)
def test_install_honours_the_watcher_variable(tmp_path: Path) -> None:
    """A program that calls install() under IMPORTWATCH_WATCHER=1 gets a watcher: it speaks on a stall."""
    (tmp_path / "slowmod.py").write_text("import time\ntime.sleep(3)\n")
    code = "import importwatch; importwatch.install(timeout=1); import slowmod; print('done')"
    env = clean_env(PYTHONPATH=str(tmp_path), IMPORTWATCH_WATCHER="1")
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=50)
    assert done.returncode == 0 and done.stdout == "done\n", done.stderr
    assert "STALL" in done.stderr
    outside = [line for line in done.stderr.splitlines() if "] outside: " in line]
    assert any("MainThread" in line and "sleeping" in line for line in outside), done.stderr


@pytest.mark.timeout(60)
@pytest.mark.parametrize("entry", ["bisect", "doctor"])
def test_a_tool_warns_once_of_a_bad_variable_and_uses_the_default(entry: str, tmp_path: Path) -> None:
    (tmp_path / "probe.py").write_text(PROBE)
    out = tmp_path / "settings.json"
    env = clean_env(PYTHONPATH=str(tmp_path), PROBE_OUT=str(out), IMPORTWATCH_TIMEOUT="soon")
    done = _run_entry(entry, tmp_path, env, timeout=50)
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stderr.count("IMPORTWATCH_TIMEOUT: expected a number of seconds, got 'soon'; using 30") == 1
    assert json.loads(out.read_text())["timeout"] == 30.0


@pytest.mark.parametrize("entry", ["bisect", "doctor"])
def test_a_tool_that_needs_the_watchdog_refuses_a_zero_option(entry: str, tmp_path: Path) -> None:
    command = [sys.executable, *ENTRY_POINTS[entry]]
    command.insert(4, "--timeout=0")
    done = subprocess.run(command, cwd=tmp_path, env=clean_env(), capture_output=True, text=True, timeout=50)
    assert done.returncode == 2
    assert done.stderr == f"importwatch: error: --timeout: {entry} needs a number of seconds > 0, got '0'\n"
