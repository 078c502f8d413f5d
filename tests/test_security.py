"""Safe on shared machines: the log file, secrets in what is written, helper programs, doctor's
children, and what SIGTERM or SIGHUP leave behind."""

from __future__ import annotations

import os
import shutil
import stat
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from conftest import clean_env, importwatch

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


def test_a_log_folder_given_as_another_users_symlink_is_not_entered(tmp_path: Path, other_user: int) -> None:
    """A symlink to a folder is a log folder only when it is ours (or root's)."""
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (tmp_path / "logs").symlink_to(elsewhere)
    os.lchown(tmp_path / "logs", other_user, other_user)
    done = importwatch("--log", "logs", "-c", "pass", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert list(elsewhere.iterdir()) == []
    (warning,) = warnings_in(done.stderr)
    assert warning.endswith(SYMLINK_WARNING)

    os.lchown(tmp_path / "logs", os.geteuid(), os.getegid())  # our own link to a folder: followed
    done = importwatch("--log", "logs", "-c", "pass", cwd=tmp_path)
    assert warnings_in(done.stderr) == []
    assert [path.name.startswith("importwatch-") for path in elsewhere.iterdir()] == [True]


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
def test_a_fifo_without_reader_at_the_log_path_never_blocks(tmp_path: Path) -> None:
    os.mkfifo(tmp_path / "job.log")
    done = importwatch("--log", "job.log", "-c", "print('ran')", cwd=tmp_path, timeout=30)
    assert done.returncode == 0, done.stderr
    assert done.stdout == "ran\n"
    (warning,) = warnings_in(done.stderr)
    assert warning.endswith("cannot open log file job.log: it is a FIFO or a socket; logging to stderr only")


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


def test_a_device_at_the_log_path_is_refused(tmp_path: Path) -> None:
    done = importwatch("--log", os.devnull, "-c", "print('ran')", cwd=tmp_path)
    assert done.stdout == "ran\n"
    (warning,) = warnings_in(done.stderr)
    assert warning.endswith("it is a device; logging to stderr only")


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


def test_our_own_existing_log_is_appended_to(tmp_path: Path) -> None:
    log = tmp_path / "job.log"
    log.write_text("earlier\n")
    importwatch("--log", str(log), "-c", "pass", cwd=tmp_path)
    lines = log.read_text().splitlines()
    assert lines[0] == "earlier" and " start python " in lines[1]
