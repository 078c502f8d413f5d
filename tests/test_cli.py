"""Bad input gets one clear line and exit 2; bad variables get one warning and the program runs."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from helpers import clean_env, importwatch

pytestmark = [pytest.mark.timeout(60), pytest.mark.slow]


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--bogus", "x.py"], "unknown option '--bogus'"),
        ([], "no program given"),
        (["--timeout"], "--timeout needs a value"),
        (["--timeout", "abc", "x.py"], "--timeout: expected a number of seconds, got 'abc'"),
        (["--timeout=-1", "x.py"], "--timeout: expected 0 (off) or 0.1 to 604800 seconds (7 days), got '-1'"),
        (["--timeout", "nan", "x.py"], "--timeout: expected 0 (off) or 0.1 to 604800 seconds"),
        (["-m"], "argument expected for the -m option"),
        (["-c"], "argument expected for the -c option"),
        (["missing_script.py"], "can't open file"),
        (["--log="], "--log needs a path"),
    ],
)
def test_bad_usage_is_one_line_and_status_2(tmp_path: Path, args: list[str], message: str) -> None:
    result = importwatch(*args, cwd=tmp_path)
    assert result.returncode == 2
    assert result.stderr.count("\n") == 1, result.stderr
    assert result.stderr.startswith("importwatch: error: ") and message in result.stderr
    assert "Traceback" not in result.stderr


def test_a_log_in_a_missing_folder_stops_the_runner_and_warns_once_under_importwatch_1(
    tmp_path: Path,
) -> None:
    program = "print('the program ran')"
    log = "missing/job.log"
    plain = subprocess.run(
        [sys.executable, "-c", program], capture_output=True, text=True, env=clean_env(), cwd=tmp_path
    )
    # The runner: one line and status 2, before the program runs (every event would be lost).
    runner = importwatch("--stderr", "stalls", "--log", log, "-c", program, cwd=tmp_path)
    assert runner.returncode == 2 and runner.stdout == ""
    assert runner.stderr == (
        f"importwatch: error: --log: no folder missing for the log file {log} (importwatch does not create it)\n"
    )
    # A folder that exists still works, {pid} and all.
    (tmp_path / "logs").mkdir()
    fine = importwatch("--stderr", "stalls", "--log", "logs/{pid}.log", "-c", program, cwd=tmp_path)
    assert fine.returncode == 0 and fine.stdout == plain.stdout and "cannot open" not in fine.stderr
    assert len(list((tmp_path / "logs").glob("*.log"))) == 1
    # IMPORTWATCH=1 (production): the program runs as under plain python; importwatch says so once,
    # on stderr even with --stderr stalls, since it is its own failure.
    env = clean_env(IMPORTWATCH="1", IMPORTWATCH_STDERR="stalls", IMPORTWATCH_LOG=log)
    always = subprocess.run(
        [sys.executable, "-c", program], capture_output=True, text=True, env=env, cwd=tmp_path
    )
    assert always.returncode == plain.returncode == 0 and always.stdout == plain.stdout
    assert always.stderr.count(f"cannot open log file {log}") == 1, always.stderr
    assert not (tmp_path / "missing").exists()


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--timeout", "5", "doctor"], "doctor is a subcommand and comes first, before its options: "
         "importwatch doctor --timeout 5 (no file doctor here to run as a script)"),
        (["--stderr=none", "report", "job.log"], "report is a subcommand and comes first, before its "
         "options: importwatch report --stderr=none job.log (no file report here to run as a script)"),
        (["--timout", "5", "job.py"], "unknown option '--timout'; did you mean --timeout?"),
        (["--exit-on-stal", "job.py"], "unknown option '--exit-on-stal'; did you mean --exit-on-stall?"),
        (["doctor", "--timout", "5"], "unrecognized arguments: --timout 5; did you mean --timeout?"),
        (["bisect", "--timout", "5", "job.py"], "unknown option '--timout'; did you mean --timeout?"),
    ],
)  # fmt: skip
def test_a_subcommand_after_options_or_an_option_typo_says_what_to_type(
    tmp_path: Path, args: list[str], message: str
) -> None:
    result = importwatch(*args, cwd=tmp_path)
    assert (result.returncode, result.stdout) == (2, "")
    assert result.stderr == f"importwatch: error: {message}\n"


def test_a_typo_far_from_every_option_gets_no_guess(tmp_path: Path) -> None:
    result = importwatch("--bogus", "job.py", cwd=tmp_path)
    assert result.stderr == "importwatch: error: unknown option '--bogus'\n"


def test_the_runner_imports_the_guessing_only_on_the_error_path(tmp_path: Path) -> None:
    code = "import sys; print([name for name in ('difflib', 'shlex') if name in sys.modules])"
    plain = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=clean_env())
    traced = importwatch("--stderr", "none", "-c", code, cwd=tmp_path)
    assert traced.stdout == plain.stdout == "[]\n"


def test_console_script_reports_bad_usage_too(tmp_path: Path) -> None:
    script = Path(sys.executable).with_name("importwatch")
    result = subprocess.run([str(script), "--bogus"], capture_output=True, text=True, env=clean_env())
    assert result.returncode == 2 and result.stderr.startswith("importwatch: error: unknown option")


def test_help_and_version(tmp_path: Path) -> None:
    assert "usage: importwatch" in importwatch("--help").stdout
    assert importwatch("--version").stdout.startswith("importwatch ")


def test_script_named_like_a_subcommand_runs_as_dot_slash(tmp_path: Path) -> None:
    (tmp_path / "doctor").write_text("print('the script ran')\n")
    result = importwatch("./doctor", cwd=tmp_path)
    assert result.returncode == 0 and result.stdout == "the script ran\n"


@pytest.mark.parametrize(
    ("name", "value", "warning"),
    [
        (
            "IMPORTWATCH_TIMEOUT",
            "soon",
            "IMPORTWATCH_TIMEOUT: expected a number of seconds, got 'soon'; using 30",
        ),
        ("IMPORTWATCH_EXIT_ON_STALL", "maybe", "IMPORTWATCH_EXIT_ON_STALL: expected 1 or 0, got 'maybe'"),
    ],
)
def test_bad_variable_warns_once_and_runs(name: str, value: str, warning: str) -> None:
    result = importwatch("-c", "print('ran')", env=clean_env(**{name: value}))
    assert result.returncode == 0 and result.stdout == "ran\n"
    assert result.stderr.count(warning) == 1


def test_bad_variable_in_env_mode_warns_once_and_runs() -> None:
    env = clean_env(IMPORTWATCH="1", IMPORTWATCH_TIMEOUT="-5")
    result = subprocess.run([sys.executable, "-c", "print('ran')"], capture_output=True, text=True, env=env)
    assert result.returncode == 0 and result.stdout == "ran\n"
    assert result.stderr.count("IMPORTWATCH_TIMEOUT: expected 0 (off) or 0.1 to 604800 seconds") == 1


def test_options_win_over_variables(tmp_path: Path) -> None:
    (tmp_path / "nap.py").write_text("import time\ntime.sleep(1.3)\n")
    env = clean_env(IMPORTWATCH_TIMEOUT="0", PYTHONPATH=str(tmp_path))
    result = importwatch("--timeout", "0.5", "-c", "import nap", env=env)
    assert "STALL" in result.stderr


def test_help_lists_every_option_variable_and_expansion() -> None:
    """Taken from the code, not from a copy: the options the parser knows, the variables config reads."""
    import re

    from importwatch import cli, config

    text = importwatch("--help").stdout
    source = Path(cli.__file__).read_text()
    options = set(re.findall(r"\"(--[a-z][a-z-]+)\"", source)) | {"-m", "-c", "-h"}
    options |= {*config.VALUE_OPTIONS, *config.FLAG_OPTIONS}  # the settings' options, which cli.py reads
    assert {"--timeout", "--log", "--stderr", "--watcher", "--no-watcher"} <= options
    variables = {value for name, value in vars(config).items() if name.startswith("ENV_")}
    variables |= set(re.findall(r"\"(IMPORTWATCH[A-Z_]*)\"", Path(config.__file__).read_text()))
    assert {"IMPORTWATCH", "IMPORTWATCH_TIMEOUT", "IMPORTWATCH_STDERR"} <= variables
    variables.discard(config.ENV_RUNNER)  # private: how the runner's exec hands its settings over
    expansions = set(re.findall(r"\"(\{[a-z]+\})\"", Path(config.__file__).read_text()))
    assert {"{pid}", "{rank}"} <= expansions
    words = set(re.findall(r"[-\w{}]+", text))
    missing = sorted(item for item in options | variables | expansions if item not in words)
    assert not missing, f"--help does not mention {missing}"
