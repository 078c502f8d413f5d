"""The offline tools do no harm (issue 26, items 10-15): files they write, secrets they show,
commands they print, and answers they give, each checked by running the tool as a user does."""

from __future__ import annotations

import json
import os
import signal
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest

from helpers import clean_env, importwatch

pytestmark = [pytest.mark.timeout(120), pytest.mark.slow]  # every test here starts processes

SECRETS = ("hunter2", "hunter3", "hunter4", "bearerx", "credy", "hubauth", "ibpass")
SECRET_ARGS = (
    "--db-url",
    "postgresql://admin:hunter2@db/prod",
    "--pass",
    "hunter3",
    "-phunter4",
    "--auth",
    "Bearer bearerx",
    "--cred",
    "credy",
    "--monkey",
    "banana",
)
SECRET_ENV = {"TORCH_HUB_AUTH": "hubauth", "NCCL_IB_PASS": "ibpass"}


def assert_no_secret(text: str) -> None:
    for secret in SECRETS:
        assert secret not in text, text


def logged_job(folder: Path, log: str = "job.log") -> Path:
    (folder / "job.py").write_text("import json\n")
    done = importwatch("--log", log, "job.py", cwd=folder)
    assert done.returncode == 0, done.stderr
    return folder / log


# -- 10. report -o writes with the care a log gets ------------------------------------------------
def test_report_output_through_a_symlink_is_refused_and_its_target_untouched(tmp_path: Path) -> None:
    log = logged_job(tmp_path)
    victim = tmp_path / "victim"
    victim.write_text("precious\n")
    (tmp_path / "out.txt").symlink_to(victim)
    done = importwatch("report", str(log), "-o", str(tmp_path / "out.txt"))
    assert done.returncode == 2
    assert done.stderr.count("\n") == 1 and "symbolic link" in done.stderr, done.stderr
    assert victim.read_text() == "precious\n"


def test_report_output_over_its_own_log_is_refused_and_the_log_kept(tmp_path: Path) -> None:
    log = logged_job(tmp_path)
    before = log.read_bytes()
    for same in (log, tmp_path / "hard-link"):
        if same != log:
            os.link(log, same)
        done = importwatch("report", str(log), "-o", str(same))
        assert done.returncode == 2 and "file being read" in done.stderr, done.stderr
        assert log.read_bytes() == before


def test_report_output_to_a_fifo_does_not_block(tmp_path: Path) -> None:
    log = logged_job(tmp_path)
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    done = importwatch("report", str(log), "-o", str(fifo), timeout=20)
    assert done.returncode == 2 and "not a regular file" in done.stderr, done.stderr


def test_report_output_is_created_0600_whatever_the_umask(tmp_path: Path) -> None:
    log = logged_job(tmp_path)
    out = tmp_path / "summary.txt"
    done = subprocess.run(
        ["sh", "-c", f'umask 000 && exec "$0" -m importwatch report {log} -o {out}', sys.executable],
        capture_output=True,
        text=True,
        env=clean_env(),
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    assert stat.S_IMODE(out.stat().st_mode) == 0o600
    assert "import" in out.read_text()


# -- 15. report on a full disk, and a step that never ended ----------------------------------------
@pytest.mark.skipif(not os.path.exists("/dev/full"), reason="needs /dev/full")
def test_report_to_a_full_disk_says_one_line_and_fails(tmp_path: Path) -> None:
    log = logged_job(tmp_path)
    with open("/dev/full", "w") as full:
        done = subprocess.run(
            [sys.executable, "-m", "importwatch", "report", str(log)],
            stdout=full,
            stderr=subprocess.PIPE,
            text=True,
            env=clean_env(),
            timeout=60,
        )
    assert done.returncode != 0
    assert done.stderr.count("\n") == 1 and "No space left" in done.stderr, done.stderr
    assert "Traceback" not in done.stderr


def test_report_summary_names_a_step_whose_end_never_came(tmp_path: Path) -> None:
    log = tmp_path / "crafted.log"
    log.write_text(
        "[importwatch 500 10:00:00.000] start python 3.11.7 /usr/bin/python argv=['job.py'] cwd=/tmp\n"
        "[importwatch 500 10:00:00.001] > outer\n"
        "[importwatch 500 10:00:00.002]   > stuck\n"
        "[importwatch 500 10:00:05.000] < outer 4999.000 ms\n"
    )
    done = importwatch("report", str(log))
    assert done.returncode == 0, done.stderr
    assert "stuck [unfinished]" in done.stdout  # the table
    assert "every import, native load and phase that started, ended" not in done.stdout
    assert "never ended" in done.stdout and ": stuck" in done.stdout, done.stdout


# -- 11. secrets ----------------------------------------------------------------------------------
@pytest.mark.parametrize("log", ["job.log", "job.jsonl"])
def test_secrets_are_masked_on_the_start_line_in_the_log_and_in_report(tmp_path: Path, log: str) -> None:
    (tmp_path / "job.py").write_text("import json\n")
    env = clean_env(NCCL_DEBUG="INFO", **SECRET_ENV)
    done = importwatch("--log", log, "job.py", *SECRET_ARGS, cwd=tmp_path, env=env)
    assert done.returncode == 0, done.stderr
    assert "postgresql://admin:***@db/prod" in done.stderr
    assert "TORCH_HUB_AUTH=***" in done.stderr and "NCCL_IB_PASS=***" in done.stderr
    assert "'--monkey', 'banana'" in done.stderr  # a harmless word is shown
    assert_no_secret(done.stderr + (tmp_path / log).read_text())
    for form in ("summary", "tree", "chrome", "html"):
        shown = importwatch("report", "-f", form, log, cwd=tmp_path)
        assert shown.returncode == 0, shown.stderr
        assert_no_secret(shown.stdout + shown.stderr)


def test_report_masks_an_old_log_written_before_the_rule(tmp_path: Path) -> None:
    argv = ["job.py", *SECRET_ARGS]
    (tmp_path / "old.log").write_text(
        f"[importwatch 500 10:00:00.000] start python 3.11.7 /usr/bin/python argv={argv!r} cwd=/tmp\n"
        "[importwatch 500 10:00:00.001] > json\n[importwatch 500 10:00:00.002] < json 1.000 ms\n"
    )
    (tmp_path / "old.jsonl").write_text(
        json.dumps({"kind": "start", "pid": 500, "time": 1.0, "thread": "MainThread", "python": "3.11.7",
                    "executable": "/usr/bin/python", "argv": argv, "cwd": "/tmp"}) + "\n"
    )  # fmt: skip
    for log in ("old.log", "old.jsonl"):
        shown = importwatch("report", log, cwd=tmp_path)
        assert shown.returncode == 0, shown.stderr
        assert_no_secret(shown.stdout)
    assert "--monkey" in importwatch("report", "old.log", cwd=tmp_path).stdout


def test_bisect_masks_every_secret_in_its_try_labels(tmp_path: Path) -> None:
    (tmp_path / "job.py").write_text("import json\n")
    done = importwatch("bisect", "--timeout", "5", "job.py", *SECRET_ARGS, cwd=tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "try " in done.stderr
    assert_no_secret(done.stdout + done.stderr)


@pytest.fixture
def sleeper(tmp_path: Path):
    """sleeper(ARGS, ENV) starts `python -c CODE ARGS` without importwatch; killed after the test."""
    started: list[subprocess.Popen] = []

    def _start(code: str, *args: str, env: dict[str, str] | None = None) -> subprocess.Popen:
        process = subprocess.Popen(
            [sys.executable, "-c", code, *args],
            env=clean_env(**(env or {})),
            cwd=tmp_path,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
        )
        started.append(process)
        time.sleep(0.5)  # past its start-up
        return process

    yield _start
    for process in started:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
        process.wait(timeout=30)


def inspect(pid: int, *args: str) -> subprocess.CompletedProcess:
    return importwatch("inspect", str(pid), *args, stdin=subprocess.DEVNULL, timeout=120)


def test_inspect_masks_secrets_on_the_process_line_and_in_its_rerun_commands(sleeper) -> None:
    process = sleeper("import time; time.sleep(60)", *SECRET_ARGS, env=SECRET_ENV)
    for extra in ((), ("--json",)):
        done = inspect(process.pid, *extra)
        assert done.returncode in (0, 1), done.stderr
        assert "--monkey banana" in done.stdout or '"banana"' in done.stdout
        assert_no_secret(done.stdout + done.stderr)


# -- 12. a printed command runs as printed --------------------------------------------------------
def words_of(command: str) -> list[str]:
    """The argv bash gives the command line COMMAND (its first word included), without running it."""
    done = subprocess.run(
        ["bash", "-c", f"show() {{ printf '%s\\0' \"$@\"; }}; show {command}"],
        capture_output=True,
        timeout=10,
    )
    assert done.returncode == 0, done.stderr
    return [os.fsdecode(word) for word in done.stdout.split(b"\0")[:-1]]


def test_inspect_rerun_command_gives_the_same_argv_through_bash(sleeper) -> None:
    code = "import time\ntime.sleep(60)  # caf\u00e9 'quoted' \\ $HOME `x`"
    process = sleeper(code, "tab\there", "")
    with open(f"/proc/{process.pid}/cmdline", "rb") as file:
        cmdline = [os.fsdecode(word) for word in file.read().split(b"\0")[:-1]]
    done = inspect(process.pid)
    assert done.returncode in (0, 1), done.stderr
    rerun = [line.strip() for line in done.stdout.splitlines() if "IMPORTWATCH=1 " in line]
    assert rerun, done.stdout
    printed = rerun[0].split("IMPORTWATCH=1 ", 1)[1]
    assert printed.isascii()
    assert words_of(printed) == cmdline
    module = [line.strip() for line in done.stdout.splitlines() if " -m importwatch " in line]
    assert module, done.stdout
    words = words_of(module[0].split(" && ", 1)[-1])
    assert words == [cmdline[0], "-m", "importwatch", *cmdline[1:]]


# -- 13, 14. bisect's answers ---------------------------------------------------------------------
def bisect(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    return importwatch("bisect", "--timeout", "0.5", "--json", *args, cwd=cwd, timeout=110)


def test_bisect_calls_a_hang_of_every_second_run_flaky_and_blames_no_innocent(tmp_path: Path) -> None:
    for index in range(10):
        (tmp_path / f"pre{index}.py").write_text("")
    # Hangs in every second process that imports it: a counter file toggled per run.
    (tmp_path / "flaky.py").write_text(
        "import os, time\n"
        "path = os.path.join(os.path.dirname(os.path.abspath(__file__)), 'runs')\n"
        "count = int(open(path).read() or 0) + 1 if os.path.exists(path) else 1\n"
        "open(path, 'w').write(str(count))\n"
        "if count % 2:\n"
        "    time.sleep(1000)\n"
    )
    (tmp_path / "job.py").write_text(
        "".join(f"import pre{index}\n" for index in range(10)) + "import flaky\n"
    )
    done = bisect("job.py", cwd=tmp_path)
    assert done.returncode == 1, done.stdout + done.stderr
    result = json.loads(done.stdout)
    assert result["culprit"] == "flaky"
    assert result["imports"] == ["flaky"], result
    assert result["flaky"] is not None and 0 < result["flaky"]["reproduced"] < result["flaky"]["tries"]
    assert result["confirmed"] is False
    (tmp_path / "runs").unlink()  # the program's own run hangs again
    text = importwatch("bisect", "--timeout", "0.5", "job.py", cwd=tmp_path, timeout=110)
    assert "flaky" in text.stdout and "pre9 imported first" not in text.stdout, text.stdout


def test_bisect_confirms_a_hang_that_comes_every_time(tmp_path: Path) -> None:
    (tmp_path / "stuck.py").write_text("import time\ntime.sleep(1000)\n")
    (tmp_path / "job.py").write_text("import json\nimport stuck\n")
    result = json.loads(bisect("job.py", cwd=tmp_path).stdout)
    assert result["imports"] == ["stuck"] and result["alone"] is True
    assert result["confirmed"] is True and result["flaky"] is None


def test_bisect_tries_a_module_whose_name_is_no_identifier_by_name(tmp_path: Path) -> None:
    (tmp_path / "my-plugin.py").write_text("import time\ntime.sleep(1000)\n")
    (tmp_path / "job.py").write_text("import importlib\nimportlib.import_module('my-plugin')\n")
    done = bisect("job.py", cwd=tmp_path)
    assert done.returncode == 1, done.stdout + done.stderr
    result = json.loads(done.stdout)
    assert result["result"] == "hang" and result["culprit"] == "my-plugin"
    assert result["imports"] == ["my-plugin"] and result["alone"] is True, result
    assert "SyntaxError" not in done.stderr
    # The reproducer runs as printed, and hangs in my-plugin, not in a SyntaxError.
    words = words_of(result["reproducer"].split(" && ", 1)[1])
    assert words == [f"PYTHONPATH={tmp_path}", *result["command"]]
    words = words[1:]
    with pytest.raises(subprocess.TimeoutExpired):  # it hangs, as the program did
        subprocess.run(words, cwd=tmp_path, capture_output=True, timeout=2, env=clean_env())


def test_masking_rule_cases() -> None:
    """The rule itself, for the cases the tests above cannot show one by one."""
    from importwatch.tracing.banner import mask_argv, mask_environment

    assert mask_argv(["--keys-file", "k.pem", "--key", "v", "--api-key", "z", "--author", "me"]) == [
        "--keys-file", "k.pem", "--key", "***", "--api-key", "***", "--author", "me",
    ]  # fmt: skip
    assert mask_argv(["-H", "Authorization: Bearer abc.def"]) == ["-H", "Authorization: Bearer ***"]
    assert mask_argv(["-c", "connect('mysql://u:pw@h/db')"]) == ["-c", "connect('mysql://u:***@h/db')"]
    assert mask_environment({"MASTER_ADDR": "redis://:pw@h:1", "NCCL_IB_HCA": "mlx5"}) == {
        "MASTER_ADDR": "redis://:***@h:1",
        "NCCL_IB_HCA": "mlx5",
    }


def test_quoting_survives_bash() -> None:
    from importwatch.tools.commands import join

    words = ["a b", "it's", "new\nline", "caf\u00e9", "", "$HOME", "back\\slash", "\x01", "-c"]
    assert words_of(join(words)) == words
