"""A module body blocked resolving a name: the host, the nameserver and the wait are named.

No network is needed: the test runs the program in its own mount namespace (unshare -m) with a
resolv.conf bound over /etc/resolv.conf that names a loopback address where a UDP socket of the
test listens on port 53 and never answers. That needs root (or the right capabilities); elsewhere
the tests skip and say why.
"""

from __future__ import annotations

import os
import random
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from helpers import Running, clean_env

pytestmark = [pytest.mark.slow, pytest.mark.timeout(180)]

PYSPY = shutil.which("py-spy", path=str(Path(sys.executable).parent)) or shutil.which("py-spy")
HOST = "db.internal.example"
# The lookup comes from the module body in two clothes: getaddrinfo itself, and a connection by name.
BODIES = {
    "getaddrinfo": f"import socket\nsocket.getaddrinfo({HOST!r}, 5432)\n",
    "create_connection": f"import socket\nsocket.create_connection(({HOST!r}, 5432), timeout=120)\n",
}


@pytest.fixture
def silent_nameserver(tmp_path: Path):
    """(resolv.conf naming it, its address): a nameserver on a loopback address that never answers."""
    unshare = shutil.which("unshare")
    if unshare is None or os.geteuid() != 0:
        pytest.skip("needs root and unshare to bind a resolv.conf over /etc/resolv.conf in a mount namespace")
    probe = subprocess.run(
        [unshare, "-m", "sh", "-c", "mount --bind /dev/null /etc/resolv.conf"], capture_output=True, text=True
    )
    if probe.returncode != 0:
        pytest.skip(f"cannot bind-mount over /etc/resolv.conf here: {probe.stderr.strip()}")
    address = f"127.{random.randint(1, 254)}.{random.randint(1, 254)}.{random.randint(2, 254)}"
    server = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    try:
        server.bind((address, 53))
    except OSError as error:
        server.close()
        pytest.skip(f"cannot listen on {address}:53: {error}")
    conf = tmp_path / "resolv.conf"
    conf.write_text(f"nameserver {address}\noptions timeout:60 attempts:1\n")
    yield conf, address
    server.close()


def _command(conf: Path, *argv: str) -> list[str]:
    script = f'mount --bind {conf} /etc/resolv.conf && exec "$@"'
    return ["unshare", "-m", "sh", "-c", script, "sh", *argv]


@pytest.mark.parametrize("body", sorted(BODIES))
def test_stall_in_a_lookup_names_host_and_nameserver(silent_nameserver, tmp_path: Path, body: str) -> None:
    conf, address = silent_nameserver
    (tmp_path / "resolving.py").write_text(BODIES[body])
    env = clean_env(IMPORTWATCH="1", IMPORTWATCH_TIMEOUT="1", PYTHONPATH=str(tmp_path))
    run = Running(_command(conf, sys.executable, "-c", "import resolving"), tmp_path, env)
    try:
        run.wait_for("DNS lookup", 60)
    finally:
        run.kill()
    line = next(text for text in run.stderr.splitlines() if "DNS lookup" in text)
    assert f"MainThread waits in a DNS lookup of {HOST} (nameserver {address} from /etc/resolv.conf" in line
    assert ", no answer for 1." in line, line


@pytest.mark.skipif(PYSPY is None, reason="py-spy is not installed")
def test_inspect_names_the_lookup_its_host_and_nameserver(silent_nameserver, tmp_path: Path) -> None:
    conf, address = silent_nameserver
    (tmp_path / "resolving.py").write_text(BODIES["getaddrinfo"])
    process = subprocess.Popen(
        _command(conf, sys.executable, "-c", "import resolving"), env=clean_env(PYTHONPATH=str(tmp_path)),
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True,
    )  # fmt: skip
    try:
        pid = _python_child(process.pid)
        env = clean_env(PATH=f"{Path(PYSPY).parent}:{os.environ.get('PATH', '')}")
        done = subprocess.run(
            [sys.executable, "-m", "importwatch", "inspect", str(pid)],
            capture_output=True, text=True, timeout=120, env=env, stdin=subprocess.DEVNULL,
        )  # fmt: skip
    finally:
        os.killpg(process.pid, 9)
        process.wait()
    assert (
        f"DNS lookup of {HOST} (nameserver {address} from /etc/resolv.conf, no answer for" in done.stdout
    ), done.stdout
    assert f"-> {address}:53 (DNS lookup (nameserver {address} from /etc/resolv.conf" in done.stdout


def _python_child(pid: int) -> int:
    """The pid once the program waits on a socket to port 53 (sh execs python in place)."""
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            links = [os.readlink(f"/proc/{pid}/fd/{fd}") for fd in os.listdir(f"/proc/{pid}/fd")]
        except OSError:
            links = []
        if any(link.startswith("socket:") for link in links):
            time.sleep(0.5)
            return pid
        time.sleep(0.1)
    pytest.fail("the program never opened its socket to the nameserver")
