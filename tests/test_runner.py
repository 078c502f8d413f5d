"""The runner behaves exactly like python: argv, sys.path[0], __main__, stdin, stdout, exit status, tracebacks."""

from __future__ import annotations

import signal
import subprocess
import sys
from pathlib import Path

import pytest

from helpers import clean_env

pytestmark = [pytest.mark.timeout(60), pytest.mark.slow]

PROBE = """\
import os, sys
print("argv", sys.argv)
print("name", __name__)
print("file", globals().get("__file__"))
print("spec", __spec__ and __spec__.name)
print("loader", type(__loader__).__name__ if __loader__ is not None else None)
print("package", __package__)
print("path0", sys.path[0])
print("cwd", os.getcwd())
print("main is module", sys.modules["__main__"].__dict__ is globals())
print("stdin", repr(sys.stdin.read()))
code = int(sys.argv[-1]) if sys.argv[-1].isdigit() else 0
sys.exit(code)
"""

RUNNERS = {
    "python -m importwatch": [sys.executable, "-m", "importwatch"],
    "console script": [str(Path(sys.executable).with_name("importwatch"))],
}


def _run(command: list[str], cwd: Path, stdin: str = "") -> subprocess.CompletedProcess:
    return subprocess.run(
        command, cwd=cwd, input=stdin, capture_output=True, text=True, env=clean_env(), timeout=60
    )


def _ours_removed(stderr: str) -> str:
    return "".join(line for line in stderr.splitlines(True) if not line.startswith("[importwatch "))


@pytest.fixture
def project(tmp_path: Path) -> Path:
    (tmp_path / "app").mkdir()
    (tmp_path / "app" / "probe.py").write_text(PROBE)
    (tmp_path / "app" / "pkg").mkdir()
    (tmp_path / "app" / "pkg" / "__init__.py").write_text("")
    (tmp_path / "app" / "pkg" / "__main__.py").write_text(PROBE)
    (tmp_path / "app" / "pkg" / "tool.py").write_text(PROBE)
    (tmp_path / "app" / "boom.py").write_text("def f():\n    raise ValueError('boom')\n\nf()\n")
    (tmp_path / "app" / "interrupt.py").write_text("raise KeyboardInterrupt\n")
    return tmp_path / "app"


@pytest.mark.parametrize("runner", RUNNERS)
@pytest.mark.parametrize(
    "target",
    [
        ["probe.py", "--log", "job.log", "--timeout", "7", "3"],
        ["./probe.py", "a b", "0"],
        ["-m", "pkg.tool", "--help", "5"],
        ["-m", "pkg", "x"],
        ["-c", PROBE, "-c", "--timeout", "2"],
        [".", "4"],  # a directory with __main__.py
    ],
    ids=["script", "dot-script", "module", "package", "code", "directory"],
)
def test_side_by_side_with_plain_python(project: Path, runner: str, target: list[str]) -> None:
    if target[0] == ".":
        target = ["pkg", *target[1:]]
    plain = _run([sys.executable, *target], project, stdin="some input\n")
    traced = _run([*RUNNERS[runner], *target], project, stdin="some input\n")
    assert traced.stdout == plain.stdout
    assert traced.returncode == plain.returncode
    assert _ours_removed(traced.stderr) == plain.stderr
    assert "[importwatch " in traced.stderr


@pytest.mark.parametrize("runner", RUNNERS)
def test_uncaught_exception_traceback_and_status(project: Path, runner: str) -> None:
    plain = _run([sys.executable, "boom.py"], project)
    traced = _run([*RUNNERS[runner], "boom.py"], project)
    assert plain.returncode == traced.returncode == 1
    assert _ours_removed(traced.stderr) == plain.stderr
    assert "importwatch" not in _ours_removed(traced.stderr)


def test_uncaught_exception_in_module_mode_keeps_runpy_frames(project: Path) -> None:
    (project / "pkg" / "bad.py").write_text("1/0\n")
    plain = _run([sys.executable, "-m", "pkg.bad"], project)
    traced = _run([sys.executable, "-m", "importwatch", "-m", "pkg.bad"], project)
    assert plain.returncode == traced.returncode == 1
    assert _ours_removed(traced.stderr) == plain.stderr


def test_keyboard_interrupt_exits_as_python_does(project: Path) -> None:
    plain = _run([sys.executable, "interrupt.py"], project)
    traced = _run([sys.executable, "-m", "importwatch", "interrupt.py"], project)
    assert plain.returncode == traced.returncode == -signal.SIGINT
    assert _ours_removed(traced.stderr) == plain.stderr


def test_system_exit_with_a_message(project: Path) -> None:
    (project / "bye.py").write_text("import sys\nsys.exit('bye now')\n")
    plain = _run([sys.executable, "bye.py"], project)
    traced = _run([sys.executable, "-m", "importwatch", "bye.py"], project)
    assert plain.returncode == traced.returncode == 1
    assert _ours_removed(traced.stderr) == plain.stderr == "bye now\n"


def test_syntax_error_in_script(project: Path) -> None:
    (project / "broken.py").write_text("def (:\n")
    plain = _run([sys.executable, "broken.py"], project)
    traced = _run([sys.executable, "-m", "importwatch", "broken.py"], project)
    assert plain.returncode == traced.returncode == 1
    assert _ours_removed(traced.stderr) == plain.stderr


def test_missing_module_behaves_as_python(project: Path) -> None:
    plain = _run([sys.executable, "-m", "no_such_module"], project)
    traced = _run([sys.executable, "-m", "importwatch", "-m", "no_such_module"], project)
    assert plain.returncode == traced.returncode == 1
    assert _ours_removed(traced.stderr) == plain.stderr


def test_pickling_classes_defined_in_main(project: Path) -> None:
    (project / "pick.py").write_text(
        "import pickle\nclass Point:\n    pass\nprint(type(pickle.loads(pickle.dumps(Point()))).__name__)\n"
    )
    traced = _run([sys.executable, "-m", "importwatch", "pick.py"], project)
    assert traced.stdout == "Point\n" and traced.returncode == 0


def test_target_options_are_not_ours(project: Path) -> None:
    traced = _run(
        [sys.executable, "-m", "importwatch", "probe.py", "--timeout", "x", "--log", "/nope"], project
    )
    assert "argv ['probe.py', '--timeout', 'x', '--log', '/nope']" in traced.stdout
    assert traced.returncode == 0
