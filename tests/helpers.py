"""Plain helpers the tests share: run importwatch as a user does, in a subprocess, with a clean environment."""

from __future__ import annotations

import importlib.util
import os
import shutil
import signal
import subprocess
import sys
import time
import venv
from pathlib import Path

import pytest

from cbuild import FIXTURES

ROOT = FIXTURES.parent

# -- running importwatch ----------------------------------------------------------------
# What the developer's own environment may hold that would change what a traced process does:
# our variables, a distributed job's (a rank prefixes every line), and where torch builds extensions.
_NOT_PASSED_ON = (
    "IMPORTWATCH",
    "RANK",
    "LOCAL_RANK",
    "WORLD_SIZE",
    "MASTER_ADDR",
    "MASTER_PORT",
    "TORCH_EXTENSIONS_DIR",
)


# Passed on all the same: which per-import hook the suite tests (IMPORTWATCH_PURE=1 runs it on the
# pure-Python twin of the C accelerator).
_PASSED_ON = ("IMPORTWATCH_PURE",)


# A program whose finder hangs at the import of `hangs`, holding importlib's global lock (find_spec
# runs under it): the heartbeat must import nothing at a report. BODY is the rest of the program.
HUNG_FINDER = """\
import sys, time
class Slow:
    def find_spec(self, name, path=None, target=None):
        if name == "hangs":
            time.sleep(30)
        return None
sys.meta_path.insert(0, Slow())
{body}
"""


def clean_env(**extra: str) -> dict[str, str]:
    """The environment minus what would change a traced process (see _NOT_PASSED_ON), plus EXTRA."""
    env = {k: v for k, v in os.environ.items() if k in _PASSED_ON or not k.startswith(_NOT_PASSED_ON)}
    env.pop("PYTHONPATH", None)
    env.update(extra)
    return env


def importwatch(*args: str, **kwargs) -> subprocess.CompletedProcess:
    """Run `python -m importwatch ARGS` to completion, text output captured."""
    kwargs.setdefault("env", clean_env())
    kwargs.setdefault("capture_output", True)
    kwargs.setdefault("text", True)
    kwargs.setdefault("timeout", 60)
    return subprocess.run([sys.executable, "-m", "importwatch", *args], **kwargs)


class Running:
    """A process started in the background whose stderr goes to a file we can poll."""

    def __init__(self, command: list[str], tmp_path: Path, env: dict[str, str], cwd: Path | None = None):
        self.stderr_path = tmp_path / f"stderr-{time.monotonic_ns()}.txt"
        self._stderr = open(self.stderr_path, "wb")  # noqa: SIM115  (closed in finish)
        self.started = time.monotonic()
        self.process = subprocess.Popen(
            command, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=self._stderr,
            env=env, cwd=cwd, start_new_session=True,
        )  # fmt: skip

    @property
    def stderr(self) -> str:
        return self.stderr_path.read_text(errors="replace")

    def wait_for(self, text: str, timeout: float) -> float:
        """Seconds from start until TEXT appeared on stderr; fails after TIMEOUT."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if text in self.stderr:
                return time.monotonic() - self.started
            if self.process.poll() is not None and text not in self.stderr:
                break
            time.sleep(0.02)
        pytest.fail(f"{text!r} did not appear within {timeout} s; stderr:\n{self.stderr}")

    def wait_after(self, marker: str, text: str, timeout: float = 10) -> None:
        """Wait until TEXT appears on stderr after MARKER's first appearance; fails after TIMEOUT.

        faulthandler writes its dump in small pieces, the program's main thread last: read at once
        after its first line, the dump may be cut anywhere (CI caught a test reading half of one)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if text in self.stderr.partition(marker)[2]:
                return
            time.sleep(0.02)
        pytest.fail(f"{text!r} did not follow {marker!r} within {timeout} s; stderr:\n{self.stderr}")

    def kill(self) -> int:
        if self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGKILL)
        return self.finish()

    def finish(self, timeout: float = 30) -> int:
        try:
            code = self.process.wait(timeout)
        finally:
            self._stderr.close()
            if self.process.stdout:
                self.process.stdout.close()
        return code


def traced(*args: str) -> list[str]:
    """The command line of `python -m importwatch ARGS`."""
    return [sys.executable, "-m", "importwatch", *args]


def watchers_of(pid: int) -> list[int]:
    """Live watcher processes (not zombies) whose command line names PID."""
    found = []
    needle = f"\0--pid\0{pid}\0".encode()
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            command = Path(f"/proc/{name}/cmdline").read_bytes()
        except OSError:
            continue
        if b"importwatch.watcher" in command and needle in command:
            found.append(int(name))
    return found


def torch_dir() -> Path | None:
    """The folder of the torch package the running interpreter would import, without importing it."""
    spec = importlib.util.find_spec("torch")
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(next(iter(spec.submodule_search_locations)))


def deep_import_chain(folder: Path, tail: str = "") -> None:
    """FOLDER/main.py imports a chain of 300 modules (chain/n0 ... n299) under a recursion limit of 250,
    records in sys.deepest how deep it got, then runs TAIL and prints sys.deepest."""
    chain = folder / "chain"
    chain.mkdir()
    for level in range(300):
        (chain / f"n{level}.py").write_text(f"import sys\nsys.deepest = {level}\nimport n{level + 1}\n")
    (folder / "main.py").write_text(
        "import sys\nsys.path.insert(0, 'chain')\nsys.deepest = -1\nsys.setrecursionlimit(250)\n"
        "try:\n    import n0\nexcept RecursionError:\n    pass\n" + tail + "print(sys.deepest)\n"
    )


def venv_with_importwatch(env_dir: Path) -> Path:
    """A venv made at ENV_DIR (no pip) with importwatch installed the way an editable install does it:
    00-importwatch.pth and _importwatch_boot.py in site-packages, the checkout's src folder on a path
    line of a .pth that sorts later. Returns its site-packages."""
    venv.create(env_dir, with_pip=False, system_site_packages=False)
    site = venv_site(env_dir)
    shutil.copy(ROOT / "src" / "importwatch.pth", site / "00-importwatch.pth")
    shutil.copy(ROOT / "src" / "_importwatch_boot.py", site / "_importwatch_boot.py")
    (site / "_editable_impl_importwatch.pth").write_text(f"{ROOT / 'src'}\n")
    return site


def venv_site(env_dir: Path) -> Path:
    """The site-packages of the venv at ENV_DIR."""
    return next((env_dir / "lib").glob("python3*/site-packages"))
