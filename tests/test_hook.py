"""Every import that misses sys.modules is seen, and every module loads exactly as without the hook."""

from __future__ import annotations

import json
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from helpers import clean_env, importwatch

pytestmark = [pytest.mark.timeout(60), pytest.mark.slow]


def _layout(root: Path, files: dict[str, str]) -> Path:
    for name, source in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(source)
    return root


def _started(stderr: str) -> list[str]:
    """Module names of the import start lines, in order."""
    names = []
    for line in stderr.splitlines():
        if line.startswith("[importwatch ") and "] " in line:
            body = line.split("] ", 1)[1].lstrip()
            if body.startswith("> ") and not body.startswith("> dlopen "):
                names.append(body[2:])
    return names


def test_finder_inserted_ahead_of_ours_is_still_seen(tmp_path: Path) -> None:
    code = """
import sys, importlib.abc, importlib.machinery
class Virtual(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def find_spec(self, name, path=None, target=None):
        if name.startswith("virtual_"):
            return importlib.machinery.ModuleSpec(name, self)
    def create_module(self, spec):
        return None
    def exec_module(self, module):
        module.answer = 42
sys.meta_path.insert(0, Virtual())
import virtual_one
from virtual_two import answer
print(type(sys.meta_path[0]).__name__, type(virtual_one.__loader__).__name__, answer)
"""
    result = importwatch("-c", code)
    assert result.stdout == "Virtual Virtual 42\n", result.stderr
    started = _started(result.stderr)
    assert "virtual_one" in started and "virtual_two" in started


def test_import_module_from_import_c_and_submodules_are_seen(tmp_path: Path) -> None:
    root = _layout(tmp_path, {"pkg/__init__.py": "", "pkg/sub.py": "X = 1\n", "pkg/other.py": ""})
    code = (
        "import importlib, datetime\n"
        "importlib.import_module('pkg.other')\n"
        "from pkg import sub\n"
        "datetime.datetime.strptime('2020', '%Y')\n"  # the C code imports _strptime
        "importlib.import_module('pkg.other')\n"  # already loaded: no event
    )
    result = importwatch("-c", code, env=clean_env(PYTHONPATH=str(root)))
    assert result.returncode == 0, result.stderr
    started = _started(result.stderr)
    for name in ("pkg", "pkg.other", "pkg.sub", "_strptime"):
        assert started.count(name) == 1, (name, started)


def test_failed_import_is_logged_and_its_traceback_unchanged(tmp_path: Path) -> None:
    root = _layout(tmp_path, {"broken.py": "import missing_dependency\n"})
    code = "import broken"
    plain = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=clean_env(PYTHONPATH=str(root))
    )
    traced = importwatch("-c", code, env=clean_env(PYTHONPATH=str(root)))
    assert traced.returncode == plain.returncode == 1
    ours = [line for line in traced.stderr.splitlines(True) if line.startswith("[importwatch ")]
    assert "".join(line for line in traced.stderr.splitlines(True) if line not in ours) == plain.stderr
    text = "".join(ours)
    assert "< missing_dependency " in text
    assert "failed ModuleNotFoundError: No module named 'missing_dependency'" in text
    assert "< broken " in text and "failed ModuleNotFoundError" in text


SPECIAL = """
import sys, json, importlib, importlib.util, zipimport
facts = {}
import nspkg.inner
facts["namespace"] = [type(nspkg.__loader__).__name__, nspkg.__spec__.origin, list(nspkg.__path__)]
facts["inner_loader"] = type(nspkg.inner.__loader__).__name__
import zipped
facts["zip"] = [type(zipped.__loader__).__name__, type(zipped.__spec__.loader).__name__, zipped.VALUE]
import _json, sys as again
facts["builtin"] = [type(_json.__spec__.loader).__name__ if _json.__spec__.loader else None]
import zipimport as z
facts["frozen_or_builtin"] = z.__spec__.origin
spec = importlib.util.find_spec("lazy_target")
loader = importlib.util.LazyLoader(spec.loader)
spec.loader = loader
module = importlib.util.module_from_spec(spec)
sys.modules["lazy_target"] = module
loader.exec_module(module)
facts["lazy_before"] = [type(module).__name__, "lazy_target_loaded" in sys.modules]
facts["lazy_value"] = module.VALUE
facts["lazy_after"] = [type(module).__name__, "lazy_target_loaded" in sys.modules]
import plain_mod
facts["plain"] = [type(plain_mod.__loader__).__name__, plain_mod.__spec__.loader is plain_mod.__loader__,
                  plain_mod.__loader__.get_source("plain_mod")]
print(json.dumps(facts, sort_keys=True))
"""


def test_special_modules_behave_as_without_the_hook(tmp_path: Path) -> None:
    root = _layout(
        tmp_path / "site",
        {
            "nspkg/inner.py": "",
            "lazy_target.py": "import sys\nsys.modules['lazy_target_loaded'] = sys\nVALUE = 7\n",
            "plain_mod.py": "X = 1\n",
        },
    )
    with zipfile.ZipFile(tmp_path / "bundle.zip", "w") as archive:
        archive.writestr("zipped.py", "VALUE = 'from zip'\n")
    path = f"{root}:{tmp_path / 'bundle.zip'}"
    plain = subprocess.run(
        [sys.executable, "-c", SPECIAL], capture_output=True, text=True, env=clean_env(PYTHONPATH=path)
    )
    traced = importwatch("-c", SPECIAL, env=clean_env(PYTHONPATH=path))
    assert plain.returncode == 0, plain.stderr
    assert json.loads(traced.stdout) == json.loads(plain.stdout)
    started = _started(traced.stderr)
    assert "nspkg" in started and "zipped" in started and "plain_mod" in started


def test_non_ascii_module_names_are_escaped(tmp_path: Path) -> None:
    root = _layout(tmp_path, {"caf\u00e9.py": "X = 1\n"})
    result = importwatch(
        "-c", "import caf\u00e9", env=clean_env(PYTHONPATH=str(root), PYTHONIOENCODING="utf-8")
    )
    assert result.returncode == 0, result.stderr
    ours = [line for line in result.stderr.splitlines() if line.startswith("[importwatch ")]
    assert all(line.isascii() for line in ours)
    assert any("> caf\\xe9" in line for line in ours)


def test_log_lines_are_timestamped_with_pid_and_flushed_to_the_file(tmp_path: Path) -> None:
    log = tmp_path / "out-{pid}.log"
    result = importwatch("--log", str(log), "-c", "import json")
    files = list(tmp_path.glob("out-*.log"))
    assert len(files) == 1 and files[0].name != "out-{pid}.log"
    text = files[0].read_text()
    pid = files[0].name[4:-4]
    lines = text.splitlines()
    assert lines and all(line.startswith(f"[importwatch {pid} ") for line in lines)
    assert "> json" in text and "< json " in text
    assert text == "".join(
        line + "\n" for line in result.stderr.splitlines() if line.startswith("[importwatch ")
    )


def test_log_directory_gets_one_file_per_process(tmp_path: Path) -> None:
    importwatch("--log", str(tmp_path), "-c", "import json")
    assert len(list(tmp_path.glob("importwatch-*.log"))) == 1


def test_unwritable_log_is_said_once_and_the_program_runs(tmp_path: Path) -> None:
    # Under IMPORTWATCH=1 (the runner refuses such a --log before the program runs: see test_cli.py).
    result = subprocess.run(
        [sys.executable, "-c", "import json; print('ran')"], capture_output=True, text=True, timeout=60,
        env=clean_env(IMPORTWATCH="1", IMPORTWATCH_LOG="/proc/nonexistent/x.log"),
    )  # fmt: skip
    assert result.returncode == 0 and result.stdout == "ran\n"
    assert result.stderr.count("cannot open log file /proc/nonexistent/x.log") == 1
    assert "> json" in result.stderr


def test_full_disk_is_said_once_and_the_program_runs(tmp_path: Path) -> None:
    import resource

    def full_at_4_kib() -> None:  # a log must be a regular file: /dev/full, a device, is refused
        resource.setrlimit(resource.RLIMIT_FSIZE, (4096, 4096))

    log = tmp_path / "job.log"
    code = "import json, email.parser; print('ran')"
    result = importwatch("--log", str(log), "-c", code, preexec_fn=full_at_4_kib)
    assert result.returncode == 0 and result.stdout == "ran\n"
    assert result.stderr.count(f"cannot write log file {log}") == 1


def test_banner_names_process_and_environment(tmp_path: Path) -> None:
    env = clean_env(CUDA_VISIBLE_DEVICES="0", MASTER_ADDR="10.0.0.1", NCCL_DEBUG="INFO")
    result = importwatch("-c", "pass", "arg", env=env)
    first, second = [line for line in result.stderr.splitlines() if line.startswith("[importwatch ")][:2]
    assert "start python" in first and "argv=['-c', 'pass', 'arg']" in first and "cwd=" in first
    assert "CUDA_VISIBLE_DEVICES=0" in second and "MASTER_ADDR=10.0.0.1" in second
    assert "NCCL_DEBUG=INFO" in second


def test_threads_other_than_main_are_named(tmp_path: Path) -> None:
    code = "import threading\nt = threading.Thread(target=__import__, args=('json',), name='worker')\n"
    code += "t.start(); t.join()"
    result = importwatch("-c", code)
    assert any(" worker] > json" in line for line in result.stderr.splitlines())
