"""A module body that retries a refused connection for ever: named as a retry loop, its address and the
refusals, not as "sleeping on a timer", by the runner, IMPORTWATCH=1 and inspect.

The loop comes in three clothes: socket.create_connection, urllib's urlopen of a URL, and a
distributed job's own loop connecting to MASTER_ADDR:MASTER_PORT. The port is one the test bound and
let go, so nothing listens there and each try is refused at once.
"""

from __future__ import annotations

import os
import re
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from helpers import Running, clean_env, traced

pytestmark = [pytest.mark.slow, pytest.mark.timeout(90)]
# The in-process line comes with a stall's first report, once two refusals were seen at the
# heartbeat's looks: a threshold of 3 s leaves a 1 s loop room for two tries on a loaded machine.

PYSPY = shutil.which("py-spy", path=str(Path(sys.executable).parent)) or shutil.which("py-spy")
# The in-process view reads the exception each thread handles (sys._current_exceptions).
NEEDS_310 = pytest.mark.skipif(sys.version_info < (3, 10), reason="sys._current_exceptions is 3.10+")
BODIES = {
    "create_connection": (
        "import socket\nimport time\n\nPORT = {port}\nwhile True:\n    try:\n"
        '        socket.create_connection(("127.0.0.1", PORT))\n        break\n'
        "    except ConnectionRefusedError:\n        time.sleep(1)\n"
    ),
    "urlopen": (
        "import time\nimport urllib.error\nimport urllib.request\n\nwhile True:\n    try:\n"
        '        urllib.request.urlopen("http://127.0.0.1:{port}/health", timeout=5)\n        break\n'
        "    except urllib.error.URLError:\n        time.sleep(1)\n"
    ),
    "master_port": (
        "import os\nimport socket\nimport time\n\n"
        'store = (os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]))\n'
        "while True:\n    sock = socket.socket()\n    try:\n        sock.connect(store)\n        break\n"
        "    except OSError:\n        sock.close()\n        time.sleep(1)\n"
    ),
}
# The line of the connecting call in each body, as inspect names it.
CALLS = {
    "create_connection": "socket.create_connection at retrying.py:7",
    "urlopen": "urllib.request.urlopen at retrying.py:7",
    "master_port": "sock.connect at retrying.py:9",
}


@pytest.fixture
def closed_port() -> int:
    """A loopback port nothing listens on: bound, then let go."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def _write(tmp_path: Path, body: str, port: int) -> dict[str, str]:
    (tmp_path / "retrying.py").write_text(BODIES[body].format(port=port))
    return {"PYTHONPATH": str(tmp_path), "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port)}


def _retry_line(run: Running, port: int) -> str:
    run.wait_for(f"retrying a connection to 127.0.0.1:{port}", 40)
    return next(line for line in run.stderr.splitlines() if "retrying a connection" in line)


def _assert_named(line: str, port: int) -> None:
    found = re.search(rf"MainThread is retrying a connection to 127\.0\.0\.1:{port}, refused (\d+) times; "
                      r"nothing listens there$", line)  # fmt: skip
    assert found, line
    assert int(found.group(1)) >= 2, line


@NEEDS_310
def test_runner_names_the_retry_loop_its_address_and_refusals(tmp_path: Path, closed_port: int) -> None:
    env = clean_env(**_write(tmp_path, "create_connection", closed_port))
    run = Running(traced("--timeout", "3", "-c", "import retrying"), tmp_path, env, cwd=tmp_path)
    try:
        line = _retry_line(run, closed_port)
    finally:
        run.kill()
    assert "context: " in line
    _assert_named(line, closed_port)


@NEEDS_310
@pytest.mark.parametrize("body", sorted(BODIES))
def test_importwatch_1_names_the_retry_loop_in_each_clothing(
    tmp_path: Path, closed_port: int, body: str
) -> None:
    env = clean_env(IMPORTWATCH="1", IMPORTWATCH_TIMEOUT="3", **_write(tmp_path, body, closed_port))
    run = Running([sys.executable, "-c", "import retrying"], tmp_path, env, cwd=tmp_path)
    try:
        line = _retry_line(run, closed_port)
    finally:
        run.kill()
    _assert_named(line, closed_port)


@NEEDS_310
def test_one_refusal_then_a_long_sleep_is_no_retry_loop(tmp_path: Path, closed_port: int) -> None:
    (tmp_path / "once.py").write_text(
        "import socket\nimport time\n\ntry:\n"
        f'    socket.create_connection(("127.0.0.1", {closed_port}))\n'
        "except ConnectionRefusedError:\n    time.sleep(60)\n"
    )
    env = clean_env(IMPORTWATCH="1", IMPORTWATCH_TIMEOUT="1", PYTHONPATH=str(tmp_path))
    run = Running([sys.executable, "-c", "import once"], tmp_path, env, cwd=tmp_path)
    try:
        run.wait_for("STALL still stuck", 30)
    finally:
        run.kill()
    assert "retrying" not in run.stderr, run.stderr


def _helpers(tmp_path: Path, name: str) -> str:
    """A PATH holding only the stack reader NAME, or skip when it is not installed."""
    found = PYSPY if name == "py-spy" else shutil.which(name)
    if found is None:
        pytest.skip(f"{name} is not installed")
    folder = tmp_path / f"bin-{name}"
    folder.mkdir()
    (folder / name).symlink_to(found)
    return str(folder)


# py-spy reads the frame's line and locals; gdb the frame without its line, placed at the file's one
# retry loop since the thread's syscall is a sleep.
@pytest.mark.parametrize(
    ("helper", "body"),
    [
        ("py-spy", "create_connection"),
        ("py-spy", "master_port"),
        ("gdb", "create_connection"),
        ("gdb", "master_port"),
    ],
)
def test_inspect_names_the_retry_loop_from_one_look(
    tmp_path: Path, closed_port: int, helper: str, body: str
) -> None:
    path = _helpers(tmp_path, helper)
    env = clean_env(**_write(tmp_path, body, closed_port))
    process = subprocess.Popen(
        [sys.executable, "-c", "import retrying"], env=env, cwd=tmp_path,
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True,
    )  # fmt: skip
    try:
        time.sleep(1.5)  # refused at least once, asleep in the loop
        done = subprocess.run(
            [sys.executable, "-m", "importwatch", "inspect", str(process.pid)],
            capture_output=True, text=True, timeout=60, env=clean_env(PATH=path), stdin=subprocess.DEVNULL,
        )  # fmt: skip
    finally:
        os.killpg(process.pid, 9)
        process.wait()
    assert f"read with {helper}" in done.stdout, done.stdout
    verdict = next((line for line in done.stdout.splitlines() if "hangs in import retrying" in line), "")
    assert (
        f"sleeping between tries of a loop retrying a connection to 127.0.0.1:{closed_port} ({CALLS[body]}) "
        "when it fails; nothing listens there; one look cannot count the refusals"
    ) in verdict, done.stdout


# Each try's frame holds a Token whose finalizer prints: in plain python it is freed before the next
# try. After 25 tries the program listens itself and connects.
_TOKEN = """
import gc
import socket
import time


class Token:
    def __init__(self, number):
        self.number = number

    def __del__(self):
        print("freed", self.number, flush=True)
"""
# The loop: ATTEMPT defined before it, PAUSE in its except clause.
_LOOP = """
port = {port}
for number in range(1, 26):
    if number == 25:
        server = socket.create_server(("127.0.0.1", port))
    try:
        attempt(number, port).close()
        break
    except ConnectionRefusedError:
        {pause}
print("connected after", number, flush=True)
"""
_LOOPS = {
    # Through create_connection, sleeping 50 ms in the loop's except clause.
    "create_connection": (
        """
def attempt(number, port):
    token = Token(number)
    print("try", number, flush=True)
    return socket.create_connection(("127.0.0.1", port))
""",
        "time.sleep(0.05)",
    ),
    # The refusal handled inside a function still running (it sleeps in its `except ... as error:`,
    # then re-raises): reading that frame's locals from the heartbeat made a snapshot of them on the
    # frame (3.10 to 3.12), which outlived the function's own `error`, `token` and `sock` and, once the
    # exception carried the frame away, tied them in a cycle with it. With the collector off, as a
    # program may keep it, each token was then freed only at exit.
    "inside a function": (
        """
gc.disable()


def attempt(number, port):
    token = Token(number)
    print("try", number, flush=True)
    sock = socket.socket()
    try:
        sock.connect(("127.0.0.1", port))
    except ConnectionRefusedError as error:
        sock.close()
        time.sleep(0.05)
        raise
    return sock
""",
        "pass",
    ),
}


@NEEDS_310
@pytest.mark.parametrize("loop", sorted(_LOOPS))
def test_watching_a_retry_loop_keeps_none_of_its_objects_alive(
    tmp_path: Path, closed_port: int, loop: str
) -> None:
    attempt, pause = _LOOPS[loop]
    (tmp_path / "fast.py").write_text(_TOKEN + attempt + _LOOP.format(port=closed_port, pause=pause))
    (tmp_path / "main.py").write_text("import fast\n")
    expected = "".join(f"try {n}\nfreed {n}\n" for n in range(1, 26)) + "connected after 25\n"
    commands = {
        "plain": ([sys.executable, "main.py"], clean_env()),
        "runner": ([*traced("--timeout", "0.4", "--no-watcher", "main.py")], clean_env()),
        "IMPORTWATCH=1": ([sys.executable, "main.py"], clean_env(IMPORTWATCH="1", IMPORTWATCH_TIMEOUT="0.4")),
    }
    for name, (command, env) in commands.items():
        done = subprocess.run(command, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=60)
        assert (done.returncode, done.stdout) == (0, expected), (name, done.stdout, done.stderr)
        if name != "plain":
            # The second loop's address is in no local (a tuple made in the call): it is not named.
            assert "is retrying a connection" in done.stderr, (name, done.stderr)
            if loop == "create_connection":
                assert "is retrying a connection to 127.0.0.1" in done.stderr, (name, done.stderr)
