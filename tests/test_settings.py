"""One settings merge: every entry point reads the IMPORTWATCH_* variables the same way, install() included."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from helpers import clean_env

pytestmark = pytest.mark.slow  # every test here starts processes

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


LIMITS = "expected 0 (off) or 0.1 to 604800 seconds (7 days)"


@pytest.mark.parametrize(
    ("call", "message"),
    [
        ("install(timeout=-5)", f"install(timeout=...): {LIMITS}, got -5"),
        ("install(timeout=0.001)", f"install(timeout=...): {LIMITS}, got 0.001"),
        ("install(timeout='5')", "install(timeout=...): expected a number of seconds, got '5'"),
        ("install(log='')", "install(log=...): expected a path, got ''"),
        ("install(exit_on_stall='no')", "install(exit_on_stall=...): expected True or False, got 'no'"),
    ],
)
def test_a_bad_install_argument_is_a_value_error_naming_it(call: str, message: str, tmp_path: Path) -> None:
    """A programming error: install() raises before anything is switched on, whatever the variables say."""
    code = (
        "import importwatch\n"
        "from importwatch.tracing import session\n"
        f"try:\n    importwatch.{call}\nexcept ValueError as error:\n    print(error)\n"
        "print(session.active())\n"
    )
    env = clean_env(IMPORTWATCH_TIMEOUT="5")
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=30)
    assert (done.returncode, done.stdout, done.stderr) == (0, f"{message}\nNone\n", "")


@pytest.mark.timeout(60)
@pytest.mark.parametrize("value", ["-5", "0.001"])
@pytest.mark.parametrize("entry", ["install", "pytest plugin"])
def test_a_bad_variable_is_said_once_naming_it_and_the_default_used(
    entry: str, value: str, tmp_path: Path
) -> None:
    (tmp_path / "probe.py").write_text(PROBE)
    (tmp_path / "test_probe.py").write_text("def test_probe():\n    import probe\n")
    out = tmp_path / "settings.json"
    env = clean_env(PYTHONPATH=str(tmp_path), PROBE_OUT=str(out), IMPORTWATCH_TIMEOUT=value)
    done = _run_entry(entry, tmp_path, env, timeout=50)
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stderr.count(f"IMPORTWATCH_TIMEOUT: {LIMITS}, got '{value}'; using 30") == 1, done.stderr
    assert json.loads(out.read_text())["timeout"] == 30.0


ENV_DUMP = """\
import json, os
with open(os.environ["ENV_OUT"], "a") as out:
    out.write(json.dumps({k: v for k, v in os.environ.items() if k.startswith("IMPORTWATCH")}) + "\\n")
"""


@pytest.mark.timeout(90)
def test_bisect_tries_get_our_settings_only_as_it_passes_them(tmp_path: Path) -> None:
    """No IMPORTWATCH_* variable of bisect's own environment reaches a try but through the options."""
    from importwatch import config

    (tmp_path / "envdump.py").write_text(ENV_DUMP)
    (tmp_path / "stuck.py").write_text("import envdump\nimport time\nwhile True:\n    time.sleep(1)\n")
    (tmp_path / "job.py").write_text("import json\nimport stuck\n")
    out = tmp_path / "env.jsonl"
    parent_log = tmp_path / "parent.log"
    ours = {
        "IMPORTWATCH_WATCHER": "0",
        "IMPORTWATCH_STDERR": "stalls",
        "IMPORTWATCH_DUMP_ON_SIGUSR1": "1",
        "IMPORTWATCH_LOG": str(parent_log),
        "IMPORTWATCH_SOMETHING_NEWER": "x",
    }
    env = clean_env(ENV_OUT=str(out), **ours)
    command = [sys.executable, "-m", "importwatch", "bisect", "--timeout", "0.5", "--json", "job.py"]
    done = subprocess.run(command, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=80)
    assert done.returncode == 1, done.stderr
    seen = [json.loads(line) for line in out.read_text().splitlines()]
    assert len(seen) >= 2  # the program, then `import stuck` alone
    for variables in seen:
        # What the runner of each try hands on, from the options bisect gave it: the parent's
        # settings merged once, the try's own log, --exit-on-stall.
        assert variables.keys() == config.to_env(config.Settings()).keys(), variables
        assert variables["IMPORTWATCH_STDERR"] == "stalls"
        assert variables["IMPORTWATCH_DUMP_ON_SIGUSR1"] == "1"
        assert variables["IMPORTWATCH_EXIT_ON_STALL"] == "1"
        assert variables["IMPORTWATCH_LOG"] != str(parent_log)
    assert not parent_log.exists()
