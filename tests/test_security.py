"""Safe on shared machines: the log file, secrets in what is written, helper programs, doctor's
children, and what SIGTERM or SIGHUP leave behind."""

from __future__ import annotations

import json
import os
import shutil
import signal
import stat
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from helpers import clean_env, importwatch

pytestmark = pytest.mark.timeout(90)

PRECIOUS = "only root may write here\n"
SYMLINK_WARNING = "it is a symbolic link; logging to stderr only"


def run_shell(script: str, cwd: Path, **env: str) -> subprocess.CompletedProcess:
    """SCRIPT under sh: `$$` is the pid that an `exec`ed python keeps, so a test can aim at it."""
    return subprocess.run(
        ["sh", "-c", script], cwd=cwd, env=clean_env(PYTHON=sys.executable, **env),
        capture_output=True, text=True, timeout=60, stdin=subprocess.DEVNULL,
    )  # fmt: skip


def warnings_in(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if "] ! " in line]


def _read(path: str) -> bytes:
    try:
        with open(path, "rb") as file:
            return file.read()
    except OSError:
        return b""


def _marked(token: str) -> list[int]:
    """Live processes whose environment carries TOKEN (zombies have none left to read)."""
    own = os.getpid()
    return [
        int(entry)
        for entry in os.listdir("/proc")
        if entry.isdigit() and int(entry) != own and token.encode() in _read(f"/proc/{entry}/environ")
    ]


def _wait_for(condition, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(0.05)
    return condition()


@pytest.fixture
def victim(tmp_path: Path) -> Path:
    """A file the traced program must never write to."""
    path = tmp_path / "victim.txt"
    path.write_text(PRECIOUS)
    path.chmod(0o600)
    return path


@pytest.fixture
def other_user() -> Iterator[int]:
    """A second, unprivileged user for this test only: its uid; removed afterwards."""
    if os.geteuid() != 0:
        pytest.skip("needs root to create a second user")
    if shutil.which("useradd") is None or shutil.which("userdel") is None:
        pytest.skip("needs useradd and userdel")
    name = f"iw{uuid.uuid4().hex[:10]}"
    subprocess.run(["useradd", "--no-create-home", "--shell", "/bin/false", name], check=True)
    try:
        yield int(subprocess.run(["id", "-u", name], capture_output=True, text=True, check=True).stdout)
    finally:
        subprocess.run(["userdel", name], check=False)


# -- 1. symlinks at the log path -----------------------------------------------------------------
@pytest.mark.slow
@pytest.mark.parametrize(
    ("log_option", "planted"),
    [
        ("logs/job.log", "logs/job.log"),
        ("logs", "logs/importwatch-$$.log"),  # --log DIR: one file per process
        ("logs/run-{pid}.log", "logs/run-$$.log"),
        ("logs/run-{pid}.jsonl", "logs/run-$$.jsonl"),
    ],
)
def test_symlink_at_the_log_path_is_never_followed(
    tmp_path: Path, victim: Path, log_option: str, planted: str
) -> None:
    (tmp_path / "logs").mkdir()
    done = run_shell(
        f'ln -s {victim} {planted} && exec "$PYTHON" -m importwatch --log "{log_option}" '
        "-c 'import json; print(\"ran\")'",
        cwd=tmp_path,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout == "ran\n"  # the program runs on without the log
    assert victim.read_text() == PRECIOUS
    (warning,) = warnings_in(done.stderr)
    assert warning.endswith(SYMLINK_WARNING)
    assert "> json" in done.stderr  # stderr still has every line


@pytest.mark.slow
@pytest.mark.parametrize("log_option", ["shared/logs", "shared/logs/job.log", "shared/logs/run-{pid}.jsonl"])
def test_a_folder_symlink_another_user_put_in_a_shared_folder_is_not_followed(
    tmp_path: Path, other_user: int, log_option: str
) -> None:
    """The kernel's protected_symlinks rule, kept where that setting is off: the link is followed
    only by its owner or the shared folder's."""
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o1777)  # a sticky, world-writable folder such as /tmp
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (shared / "logs").symlink_to(elsewhere)
    os.lchown(shared / "logs", other_user, other_user)
    done = importwatch("--log", log_option, "-c", "print('ran')", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert done.stdout == "ran\n"
    assert list(elsewhere.iterdir()) == []
    (warning,) = warnings_in(done.stderr)
    assert warning.endswith(
        f"{shared / 'logs'} is a symbolic link another user put in a shared folder; logging to stderr only"
    )

    os.lchown(shared / "logs", os.geteuid(), os.getegid())  # our own link: followed
    done = importwatch("--log", log_option, "-c", "print('ran')", cwd=tmp_path)
    assert warnings_in(done.stderr) == []
    assert len(list(elsewhere.iterdir())) == 1


@pytest.mark.slow
def test_the_watcher_writes_to_the_programs_descriptor_never_reopening_the_path(
    tmp_path: Path, victim: Path
) -> None:
    """The program swaps its log for a symlink at once; the watcher's report still lands in the log."""
    (tmp_path / "slow.py").write_text("import time\ntime.sleep(3)\n")
    (tmp_path / "job.py").write_text(
        "import os, sys\n"
        "os.rename('job.log', 'moved.log')\n"
        f"os.symlink({str(victim)!r}, 'job.log')\n"
        "import slow\n"
    )
    done = importwatch("--timeout", "1", "--log", "job.log", "job.py", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert victim.read_text() == PRECIOUS
    moved = (tmp_path / "moved.log").read_text()
    assert "outside: waiting" in moved


# -- 2. FIFOs, devices, other users' files, the mode ------------------------------------------
@pytest.mark.slow
def test_a_fifo_without_reader_at_the_log_path_never_blocks(tmp_path: Path) -> None:
    os.mkfifo(tmp_path / "job.log")
    done = importwatch("--log", "job.log", "-c", "print('ran')", cwd=tmp_path, timeout=30)
    assert done.returncode == 0, done.stderr
    assert done.stdout == "ran\n"
    (warning,) = warnings_in(done.stderr)
    assert warning.endswith("cannot open log file job.log: it is a FIFO or a socket; logging to stderr only")


@pytest.mark.slow
def test_a_fifo_with_a_reader_at_the_log_path_is_refused(tmp_path: Path) -> None:
    """A reader that stops reading would block the program once the pipe fills: not a log."""
    os.mkfifo(tmp_path / "job.log")
    reader = os.open(tmp_path / "job.log", os.O_RDONLY | os.O_NONBLOCK)
    try:
        done = importwatch("--log", "job.log", "-c", "print('ran')", cwd=tmp_path, timeout=30)
        assert os.read(reader, 1 << 16) == b""  # nothing was written to the pipe
    finally:
        os.close(reader)
    assert done.stdout == "ran\n"
    (warning,) = warnings_in(done.stderr)
    assert warning.endswith("cannot use log file job.log: it is a FIFO; logging to stderr only")


@pytest.mark.slow
def test_a_device_at_the_log_path_is_refused(tmp_path: Path) -> None:
    done = importwatch("--log", os.devnull, "-c", "print('ran')", cwd=tmp_path)
    assert done.stdout == "ran\n"
    (warning,) = warnings_in(done.stderr)
    assert warning.endswith("it is a device; logging to stderr only")


@pytest.mark.slow
@pytest.mark.parametrize("name", ["job.log", "job.jsonl"])
def test_a_log_file_owned_by_another_user_is_refused(tmp_path: Path, other_user: int, name: str) -> None:
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o1777)  # a sticky, world-writable folder such as /tmp
    planted = shared / name
    planted.write_text(PRECIOUS)
    os.chown(planted, other_user, other_user)
    done = importwatch("--log", str(planted), "-c", "print('ran')", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert done.stdout == "ran\n"
    assert planted.read_text() == PRECIOUS
    (warning,) = warnings_in(done.stderr)
    assert warning.endswith(f"it belongs to another user (uid {other_user}); logging to stderr only")


@pytest.mark.slow
@pytest.mark.parametrize("name", ["job.log", "job.jsonl", "logs"])
def test_a_new_log_is_created_0600_even_under_a_permissive_umask(tmp_path: Path, name: str) -> None:
    if name == "logs":
        (tmp_path / "logs").mkdir()
    done = subprocess.run(
        [sys.executable, "-m", "importwatch", "--log", name, "-c", "import colorsys"],
        cwd=tmp_path, env=clean_env(), capture_output=True, text=True, timeout=60, umask=0,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    (log,) = (tmp_path / "logs").iterdir() if name == "logs" else [tmp_path / name]
    assert stat.S_IMODE(log.stat().st_mode) == 0o600
    assert "> colorsys" in log.read_text()


@pytest.mark.slow
def test_our_own_existing_log_is_appended_to(tmp_path: Path) -> None:
    log = tmp_path / "job.log"
    log.write_text("earlier\n")
    importwatch("--log", str(log), "-c", "pass", cwd=tmp_path)
    lines = log.read_text().splitlines()
    assert lines[0] == "earlier" and " start python " in lines[1]


# -- 3. secrets -------------------------------------------------------------------------------------
SECRETS = ["hunter2", "s3cr3t-key", "tok-123", "pw-456", "hub-789", "ib-000", "db-pass"]
SECRET_ARGS = [
    "--password", "hunter2", "--api-key=s3cr3t-key", "--token", "tok-123", "-passwd", "pw-456",
    "db.password=db-pass", "--verbose",
]  # fmt: skip
SECRET_ENV = {"TORCH_HUB_TOKEN": "hub-789", "NCCL_IB_PASSWORD": "ib-000", "CUDA_VISIBLE_DEVICES": "0"}
MASKED_ARGV = [
    "--password", "***", "--api-key=***", "--token", "***", "-passwd", "***", "db.password=***", "--verbose",
]  # fmt: skip


def assert_no_secret(text: str) -> None:
    for secret in SECRETS:
        assert secret not in text, f"{secret!r} leaked:\n{text}"


@pytest.mark.slow
@pytest.mark.parametrize("name", ["job.log", "job.jsonl"])
def test_secrets_are_masked_in_the_start_and_env_lines_and_in_reports(tmp_path: Path, name: str) -> None:
    (tmp_path / "job.py").write_text("import sys\nprint(sys.argv[1:])\n")
    done = importwatch("--log", name, "job.py", *SECRET_ARGS, cwd=tmp_path, env=clean_env(**SECRET_ENV))
    assert done.returncode == 0, done.stderr
    assert done.stdout == f"{SECRET_ARGS}\n"  # the program itself gets them as they are
    assert_no_secret(done.stderr)
    assert f"argv={['job.py', *MASKED_ARGV]!r}" in done.stderr
    assert "env CUDA_VISIBLE_DEVICES=0 NCCL_IB_PASSWORD=*** TORCH_HUB_TOKEN=***" in done.stderr
    log = (tmp_path / name).read_text()
    assert_no_secret(log)
    if name.endswith(".jsonl"):
        records = [json.loads(line) for line in log.splitlines()]
        start = next(record for record in records if record["kind"] == "start")
        assert start["argv"] == ["job.py", *MASKED_ARGV]
        env = next(record for record in records if record["kind"] == "env")
        assert env["env"] == {
            "CUDA_VISIBLE_DEVICES": "0",
            "NCCL_IB_PASSWORD": "***",
            "TORCH_HUB_TOKEN": "***",
        }
    for fmt in ("summary", "tree", "chrome"):
        shown = importwatch("report", "--format", fmt, name, cwd=tmp_path)
        assert shown.returncode == 0, shown.stderr
        assert_no_secret(shown.stdout + shown.stderr)


@pytest.mark.slow
def test_secrets_are_masked_with_importwatch_on_in_the_environment(tmp_path: Path) -> None:
    (tmp_path / "job.py").write_text("import sys\nprint(sys.argv[1:])\n")
    env = clean_env(IMPORTWATCH="1", IMPORTWATCH_LOG="job.log", **SECRET_ENV)
    done = subprocess.run(
        [sys.executable, "job.py", *SECRET_ARGS], cwd=tmp_path, env=env, capture_output=True, text=True,
        timeout=60,
    )  # fmt: skip
    assert done.stdout == f"{SECRET_ARGS}\n"
    assert " start python " in done.stderr
    assert_no_secret(done.stderr)
    assert_no_secret((tmp_path / "job.log").read_text())


@pytest.mark.slow
def test_the_watcher_masks_secrets_in_other_processes_command_lines(tmp_path: Path) -> None:
    """A stall report names the process at the other end of a pipe, by its command line."""
    # The report shortens a long command line; a short argv[0] keeps the masked part in view
    # wherever the test's interpreter lives.
    (tmp_path / "py").symlink_to(sys.executable)
    (tmp_path / "pipes.py").write_text(
        "import subprocess\n"
        "child = subprocess.Popen(['./py', '-c', 'import time; time.sleep(4)', '--password',"
        " 'hunter2'], stdout=subprocess.PIPE)\n"
        "child.stdout.read()\n"
        "child.wait()\n"
    )
    done = importwatch("--timeout", "1", "-c", "import pipes", cwd=tmp_path, env=clean_env(PYTHONPATH="."))
    assert done.returncode == 0, done.stderr
    assert "time.sleep(4) --password ***" in done.stderr
    assert_no_secret(done.stderr)


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_inspect_masks_secrets_in_the_command_line_it_reports(tmp_path: Path) -> None:
    sleeper = subprocess.Popen(
        [sys.executable, "-c", "import sys, time; print('up', flush=True); time.sleep(120)", *SECRET_ARGS],
        stdout=subprocess.PIPE, stdin=subprocess.DEVNULL, start_new_session=True,
    )  # fmt: skip
    try:
        assert sleeper.stdout is not None and sleeper.stdout.readline() == b"up\n"
        text = importwatch("inspect", "--no-native", str(sleeper.pid), cwd=tmp_path)
        as_json = importwatch("inspect", "--no-native", "--json", str(sleeper.pid), cwd=tmp_path)
    finally:
        sleeper.kill()
        sleeper.wait()
    for done in (text, as_json):
        assert done.returncode in (0, 1), done.stdout + done.stderr
        assert_no_secret(done.stdout + done.stderr)
    assert json.loads(as_json.stdout)["cmdline"][-len(MASKED_ARGV) :] == MASKED_ARGV


@pytest.mark.slow
def test_doctor_masks_secrets_in_its_environment_dump(tmp_path: Path) -> None:
    env = clean_env(**SECRET_ENV)
    for extra in ([], ["--json"]):
        done = importwatch("doctor", "--import", "json", "--no-cuda", *extra, cwd=tmp_path, env=env)
        assert done.returncode == 0, done.stdout + done.stderr
        assert "TORCH_HUB_TOKEN" in done.stdout
        assert_no_secret(done.stdout + done.stderr)


@pytest.mark.slow
def test_bisect_masks_secrets_in_the_command_it_prints(tmp_path: Path) -> None:
    (tmp_path / "job.py").write_text("import json\n")
    done = importwatch("bisect", "--timeout", "5", "job.py", *SECRET_ARGS, cwd=tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "python job.py --password '***'" in done.stderr
    assert_no_secret(done.stdout + done.stderr)


@pytest.mark.parametrize(
    ("argv", "shown"),
    [
        (["--token", "--verbose"], ["--token", "--verbose"]),  # no value to hide: the next is an option
        (["--max-tokens=512", "--lr", "3"], ["--max-tokens=***", "--lr", "3"]),
        (["-c", "api_key='x'; run()", "key=v"], ["-c", "api_key=***", "key=***"]),
        (["keygen.py", "--out", "id"], ["keygen.py", "--out", "id"]),  # a name alone is no secret
        (["--Password", "p", "--"], ["--Password", "***", "--"]),
    ],
)
def test_the_masking_rule(argv: list[str], shown: list[str]) -> None:
    from importwatch.tracing.banner import mask_argv

    assert mask_argv(argv) == shown


# -- 4. helper programs --------------------------------------------------------------------------------
@pytest.fixture
def planted_helpers(tmp_path: Path) -> Path:
    """gdb, pystack and py-spy stand-ins in TMP_PATH and TMP_PATH/bin; the file each touches if run."""
    marker = tmp_path / "planted-helper-ran"
    for folder in (tmp_path, tmp_path / "bin"):
        folder.mkdir(exist_ok=True)
        for tool in ("gdb", "pystack", "py-spy"):
            (folder / tool).write_text(f"#!/bin/sh\ntouch {marker}\necho 'Thread 1 (LWP 1):'\n")
            (folder / tool).chmod(0o755)
    return marker


@pytest.mark.slow
@pytest.mark.parametrize("search", [":/usr/bin:/bin", ".:/usr/bin:/bin", "bin:/usr/bin:/bin"])
def test_helpers_are_never_run_from_the_working_directory(
    tmp_path: Path, planted_helpers: Path, search: str
) -> None:
    """A `gdb` planted in the working directory must not run, whatever PATH says about it."""
    (tmp_path / "waits.py").write_text("import time\ntime.sleep(4)\n")
    env = clean_env(PATH=search, PYTHONPATH=str(tmp_path))
    done = importwatch("--timeout", "1", "-c", "import waits", cwd=tmp_path, env=env)
    assert done.returncode == 0, done.stderr
    assert "outside: waiting" in done.stderr
    assert "outside: native stacks" in done.stderr or "outside: no native stacks" in done.stderr
    assert not planted_helpers.exists()


@pytest.mark.slow
def test_inspect_never_runs_helpers_from_the_working_directory(tmp_path: Path, planted_helpers: Path) -> None:
    sleeper = subprocess.Popen(
        [sys.executable, "-c", "import time; print('up', flush=True); time.sleep(120)"],
        stdout=subprocess.PIPE, stdin=subprocess.DEVNULL, start_new_session=True,
    )  # fmt: skip
    try:
        assert sleeper.stdout is not None and sleeper.stdout.readline() == b"up\n"
        done = importwatch("inspect", str(sleeper.pid), cwd=tmp_path, env=clean_env(PATH=":/usr/bin:/bin"))
    finally:
        sleeper.kill()
        sleeper.wait()
    assert done.returncode in (0, 1), done.stdout + done.stderr
    assert not planted_helpers.exists()


@pytest.mark.slow
def test_the_watcher_runs_from_the_root_folder(tmp_path: Path, start) -> None:
    (tmp_path / "waits.py").write_text("import time\ntime.sleep(30)\n")
    token = uuid.uuid4().hex
    running = start(
        [sys.executable, "-m", "importwatch", "-c", "import waits"], cwd=tmp_path,
        PYTHONPATH=str(tmp_path), WATCHER_TEST_MARKER=token,
    )  # fmt: skip
    running.wait_for("> waits", timeout=30)

    def watchers() -> list[int]:
        return [pid for pid in _marked(token) if b"importwatch.watcher" in _read(f"/proc/{pid}/cmdline")]

    assert _wait_for(lambda: len(watchers()) == 1, 10)
    assert os.readlink(f"/proc/{watchers()[0]}/cwd") == "/"


# -- 6. doctor's children ------------------------------------------------------------------------------
@pytest.mark.slow
def test_doctor_never_runs_modules_from_the_working_directory(tmp_path: Path) -> None:
    marker = tmp_path / "shadow-ran"
    for name in ("json", "onlyhere"):
        (tmp_path / f"{name}.py").write_text(f"open({str(marker)!r}, 'a').write({name!r} + '\\n')\n")
    console = Path(sys.executable).parent / "importwatch"  # `python -m` would put this folder first itself
    done = subprocess.run(
        [str(console), "doctor", "--import", "json", "onlyhere", "--no-cuda", "--timeout", "20", "--json"],
        cwd=tmp_path, env=clean_env(), capture_output=True, text=True, timeout=80,
    )  # fmt: skip
    assert not marker.exists(), marker.read_text()
    checks = {check["module"]: check for check in json.loads(done.stdout)["imports"]}
    assert checks["json"]["status"] == "ok"
    assert checks["onlyhere"]["status"] == "failed"
    assert "No module named 'onlyhere'" in checks["onlyhere"]["error"]


@pytest.mark.slow
def test_doctor_still_imports_from_a_relative_pythonpath(tmp_path: Path) -> None:
    """The children run elsewhere; a PYTHONPATH entry relative to here keeps meaning here."""
    (tmp_path / "lib").mkdir()
    (tmp_path / "lib" / "mine.py").write_text("")
    done = importwatch(
        "doctor", "--import", "mine", "--no-cuda", "--json", cwd=tmp_path, env=clean_env(PYTHONPATH="lib")
    )
    assert json.loads(done.stdout)["imports"][0]["status"] == "ok", done.stdout


# -- 7. SIGTERM and SIGHUP clean up as SIGINT does -------------------------------------------------------
_TERMINATING = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


def _default_signals() -> None:
    """As a command typed at a terminal gets them: a run under nohup, or in a shell's background
    job, inherits SIGHUP or SIGINT ignored, and an ignored signal rightly stays ignored. None is
    blocked either: the test's own thread may have had one blocked when it forked."""
    for signum in _TERMINATING:
        signal.signal(signum, signal.SIG_DFL)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, _TERMINATING)


def _why_still_running(process: subprocess.Popen) -> str:
    """What a command that outlived its signal was doing: its signal masks, its kernel wait, then its
    Python stacks (it runs with -X faulthandler: SIGABRT dumps them), so that a failure says where."""
    pid = process.pid
    status = _read(f"/proc/{pid}/status").decode("ascii", "replace").splitlines()
    masks = [line for line in status if line.startswith(("State", "Threads", "Sig", "ShdPnd"))]
    kernel = _read(f"/proc/{pid}/stack").decode("ascii", "replace")
    wchan = _read(f"/proc/{pid}/wchan").decode("ascii", "replace")
    stats = (_read(f"/proc/{p}/stat").decode("ascii", "replace") for p in os.listdir("/proc") if p.isdigit())
    children = [line for line in stats if line.rpartition(")")[2].split()[1:2] == [str(pid)]]
    process.send_signal(signal.SIGABRT)
    try:
        _, err = process.communicate(timeout=10)
    except subprocess.TimeoutExpired:
        err = "(no stacks: it did not end on SIGABRT either)"
    for child in children:  # its try leads a group of its own, which the caller's clean-up misses
        try:
            os.killpg(int(child.split()[0]), signal.SIGKILL)
        except OSError:
            pass
    return "\n".join([*masks, f"wchan: {wchan}", kernel, "its children:", *children, err])


@pytest.mark.slow
@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM, signal.SIGHUP], ids=lambda s: s.name)
@pytest.mark.parametrize("command", ["bisect", "doctor"])
def test_a_signal_kills_the_try_in_flight_and_removes_the_temporary_folder(
    tmp_path: Path, command: str, signum: signal.Signals
) -> None:
    started = tmp_path / "started"
    (tmp_path / "hangs.py").write_text(
        "import subprocess, sys, time\n"
        "subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(600)'])\n"  # in the try's group
        f"open({str(started)!r}, 'w').close()\n"
        "time.sleep(600)\n"
    )
    (tmp_path / "job.py").write_text("import hangs\n")
    temporary = tmp_path / "tmp"
    temporary.mkdir()
    token = uuid.uuid4().hex
    env = clean_env(TMPDIR=str(temporary), PYTHONPATH=str(tmp_path), SIGNAL_TEST_MARKER=token)
    if command == "bisect":
        args = ["bisect", "--timeout", "60", "job.py"]
    else:
        args = ["doctor", "--import", "hangs", "--no-cuda", "--timeout", "60"]
    process = subprocess.Popen(
        [sys.executable, "-X", "faulthandler", "-m", "importwatch", *args], cwd=tmp_path, env=env,
        stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        start_new_session=True, preexec_fn=_default_signals,
    )  # fmt: skip
    try:
        assert _wait_for(started.exists, 40), "the try did not start"
        assert any(b"importwatch.watcher" in _read(f"/proc/{pid}/cmdline") for pid in _marked(token))
        process.send_signal(signum)
        try:
            _, err = process.communicate(timeout=30)
        except subprocess.TimeoutExpired:
            pytest.fail(f"still running 30 s after {signum.name}:\n{_why_still_running(process)}")
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()
    how = "interrupted" if signum == signal.SIGINT else f"terminated by {signum.name}"
    assert err.splitlines()[-1] == f"importwatch {command}: {how}", err
    assert process.returncode == 128 + signum
    # The try, the child it started and its watcher are gone, and so is the temporary folder.
    assert _wait_for(lambda: _marked(token) == [], 10), [_read(f"/proc/{p}/cmdline") for p in _marked(token)]
    assert list(temporary.iterdir()) == []
