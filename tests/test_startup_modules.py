"""Before the program's first line importwatch loads nothing plain python has not, and the program's tree is -X importtime's.

Three ways in, each against plain python: the runner (`python -m importwatch`, which
execs the program's python: runpy's imports are not there before the program's), IMPORTWATCH=1, and
`pytest -p importwatch` (against plain pytest). A program records sys.modules at
its first line and after its imports; our log's modules (`report --format
importtime`) must hold every module the program's imports brought under plain python.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from helpers import clean_env

pytestmark = [pytest.mark.timeout(300), pytest.mark.slow]  # every test here starts processes

OURS = ("importwatch", "_importwatch_boot")
# What the program prints: sys.modules at its first line, then after its imports.
RECORD_FIRST = "import sys as _s; _first = sorted(_s.modules)\n"
RECORD_AFTER = "print(' '.join(_first)); print(' '.join(sorted(_s.modules)))\n"

STDLIB = "import json, email.parser, http.client\n"
PACKAGE = "import shapes.solid\nfrom shapes.flat import square\n"
TORCH = "import torch\n"


def _ours(name: str) -> bool:
    return name in OURS or name.startswith("importwatch.")


def _package(folder: Path) -> None:
    """shapes, with submodules and a subpackage, some importing each other and the stdlib."""
    (folder / "shapes" / "flat").mkdir(parents=True)
    (folder / "shapes" / "__init__.py").write_text("from shapes import base\n")
    (folder / "shapes" / "base.py").write_text("import fractions\nUNIT = fractions.Fraction(1)\n")
    (folder / "shapes" / "solid.py").write_text("from shapes.flat import square\nimport decimal\n")
    (folder / "shapes" / "flat" / "__init__.py").write_text("")
    (folder / "shapes" / "flat" / "square.py").write_text("from .. import base\nimport textwrap\n")


def _program(folder: Path, imports: str) -> Path:
    if imports == PACKAGE:
        _package(folder)
    script = folder / "program.py"
    script.write_text(RECORD_FIRST + imports + RECORD_AFTER)
    return script


def _sets(stdout: str) -> tuple[set[str], set[str]]:
    first, after = stdout.splitlines()[-2:]
    return set(first.split()), set(after.split())


def _run(command: list[str], cwd: Path, **env: str) -> subprocess.CompletedProcess:
    done = subprocess.run(command, cwd=cwd, capture_output=True, text=True, env=clean_env(**env), timeout=240)
    assert done.returncode == 0, done.stderr[-3000:]
    return done


def _logged(log: Path, cwd: Path) -> set[str]:
    """The modules of our log, as `report --format importtime` gives them."""
    text = _run(
        [sys.executable, "-m", "importwatch", "report", str(log), "--format", "importtime"], cwd
    ).stdout
    return {
        line.rsplit("|", 1)[1].split()[0] for line in text.splitlines()[1:] if line.startswith("import time:")
    }


def _pytest_suite(folder: Path, imports: str) -> Path:
    """A test module whose import (at collection) does IMPORTS and records sys.modules around them."""
    suite = folder / "suite"
    suite.mkdir()
    if imports == PACKAGE:
        _package(suite)
    out = suite / "modules.txt"
    (suite / "test_imports.py").write_text(
        "import sys as _s\n_first = sorted(_s.modules)\n" + imports
        + f"open({str(out)!r}, 'w').write(' '.join(_first) + '\\n' + ' '.join(sorted(_s.modules)) + '\\n')\n"
        "def test_nothing():\n    pass\n"
    )  # fmt: skip
    return suite


def _importtime(stderr: str) -> set[str]:
    """The modules `-X importtime` lists (sys.modules also holds entries no import made: torch._C's)."""
    return {
        line.rsplit("|", 1)[1].split()[0] for line in stderr.splitlines() if line.startswith("import time:")
    }


def _way(way: str, folder: Path, imports: str) -> tuple[set[str], set[str], set[str]]:
    """Under WAY ("plain", "runner", "IMPORTWATCH=1"): sys.modules at the first line, after, and the
    modules imported (plain: -X importtime's; traced: our log's)."""
    script = _program(folder, imports)
    log = folder / f"{way.replace('=', '')}.log"
    command = [sys.executable, "-X", "importtime", str(script)]
    env: dict[str, str] = {}
    if way == "runner":
        command = [sys.executable, "-m", "importwatch", "--no-watcher", "--stderr", "none", "--log", str(log), str(script)]  # fmt: skip
    elif way == "IMPORTWATCH=1":
        env = {"IMPORTWATCH": "1", "IMPORTWATCH_STDERR": "none", "IMPORTWATCH_LOG": str(log)}
    done = _run(command, folder, **env)
    first, after = _sets(done.stdout)
    return first, after, (_logged(log, folder) if way != "plain" else _importtime(done.stderr))


def _under_pytest(folder: Path, imports: str, plugin: bool) -> tuple[set[str], set[str], set[str]]:
    suite = _pytest_suite(folder, imports)
    log = folder / "pytest.log"
    env = {"IMPORTWATCH_STDERR": "none", "IMPORTWATCH_LOG": str(log)} if plugin else {}
    # --capture=sys: -X importtime writes to descriptor 2, which pytest would otherwise capture.
    python = [sys.executable, "-X", "importtime"] if not plugin else [sys.executable]
    args = ["-p", "importwatch"] if plugin else []
    done = _run(
        [*python, "-m", "pytest", "-q", "--capture=sys", "-p", "no:cacheprovider", *args, str(suite)],
        suite,
        **env,
    )
    first, after = _sets((suite / "modules.txt").read_text())
    return first, after, (_logged(log, suite) if plugin else _importtime(done.stderr))


PROGRAMS = [
    pytest.param(STDLIB, id="stdlib"),
    pytest.param(PACKAGE, id="package"),
    pytest.param(TORCH, id="torch", marks=pytest.mark.torch),
]


def _skip_without_torch(imports: str) -> None:
    if imports == TORCH:
        if sys.version_info[:2] != (3, 11):
            pytest.skip("the torch build here is for Python 3.11")
        pytest.importorskip("torch")


@pytest.mark.parametrize("imports", PROGRAMS)
@pytest.mark.parametrize("way", ["runner", "IMPORTWATCH=1"])
def test_every_module_the_program_imports_is_in_our_importtime_tree(
    tmp_path: Path, way: str, imports: str
) -> None:
    _skip_without_torch(imports)
    (tmp_path / "plain").mkdir()
    (tmp_path / "traced").mkdir()
    plain_first, plain_after, imported = _way("plain", tmp_path / "plain", imports)
    expected = (plain_after - plain_first) & imported
    _, _, logged = _way(way, tmp_path / "traced", imports)
    assert expected, "the program imports nothing new: the check would be empty"
    assert sorted(expected - logged) == []


@pytest.mark.parametrize("imports", PROGRAMS)
def test_every_module_a_test_module_imports_is_in_the_plugin_s_importtime_tree(
    tmp_path: Path, imports: str
) -> None:
    _skip_without_torch(imports)
    (tmp_path / "plain").mkdir()
    (tmp_path / "traced").mkdir()
    plain_first, plain_after, imported = _under_pytest(tmp_path / "plain", imports, plugin=False)
    _, _, logged = _under_pytest(tmp_path / "traced", imports, plugin=True)
    expected = (plain_after - plain_first) & imported
    assert expected
    assert sorted(expected - logged) == []


@pytest.mark.parametrize("way", ["runner", "IMPORTWATCH=1"])
def test_sys_modules_at_the_program_s_first_line_is_plain_python_s(tmp_path: Path, way: str) -> None:
    (tmp_path / "plain").mkdir()
    (tmp_path / "traced").mkdir()
    plain_first, _, _ = _way("plain", tmp_path / "plain", STDLIB)
    traced_first, _, _ = _way(way, tmp_path / "traced", STDLIB)
    traced_first = {name for name in traced_first if not _ours(name)}
    assert sorted(traced_first - plain_first) == []
    assert sorted(plain_first - traced_first) == []


def test_sys_modules_at_a_test_module_s_first_line_is_plain_pytest_s(tmp_path: Path) -> None:
    (tmp_path / "plain").mkdir()
    (tmp_path / "traced").mkdir()
    plain_first, _, _ = _under_pytest(tmp_path / "plain", STDLIB, plugin=False)
    traced_first, _, _ = _under_pytest(tmp_path / "traced", STDLIB, plugin=True)
    traced_first = {name for name in traced_first if not _ours(name)}
    assert sorted(traced_first - plain_first) == []
    assert sorted(plain_first - traced_first) == []


def test_a_module_importwatch_loaded_at_start_is_the_same_object_when_the_program_imports_it(
    tmp_path: Path,
) -> None:
    """Handed back, not loaded twice: atexit's registrations and faulthandler's state stay one."""
    code = (
        "import atexit, faulthandler, errno\n"
        "atexit.register(print, 'bye')\n"
        "print(faulthandler.is_enabled(), errno.ENOENT)\n"
    )
    log = tmp_path / "run.log"
    done = _run(
        [
            sys.executable,
            "-m",
            "importwatch",
            "--no-watcher",
            "--stderr",
            "none",
            "--log",
            str(log),
            "-c",
            code,
        ],
        tmp_path,
    )
    plain = _run([sys.executable, "-c", code], tmp_path)
    assert done.stdout.splitlines()[-1] == "bye" == plain.stdout.splitlines()[-1]
    assert {"atexit", "faulthandler", "errno"} <= _logged(log, tmp_path)
