"""A .pth whose import line blocks hangs Python in site, before the program: named by file and line.

The venv is made here (python -m venv, no pip) with importwatch installed the way an editable
install does it: 00-importwatch.pth and _importwatch_boot.py in site-packages, the checkout's src
folder on a path line of a .pth that sorts later.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from helpers import Running, clean_env, venv_site, venv_with_importwatch

pytestmark = [pytest.mark.slow, pytest.mark.timeout(180)]

PYSPY = shutil.which("py-spy", path=str(Path(sys.executable).parent)) or shutil.which("py-spy")


@pytest.fixture(scope="module")
def env_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    env_dir = tmp_path_factory.mktemp("venv-pth")
    venv_with_importwatch(env_dir)
    return env_dir


def _python(env_dir: Path) -> str:
    return str(env_dir / "bin" / "python")


@pytest.fixture
def hanging_pth(env_dir: Path, tmp_path: Path):
    """hanging_pth(LINE) adds zz-hang.pth to the venv, its LINE third (a comment and a path first)."""
    added: list[Path] = []

    def _add(line: str) -> Path:
        modules = tmp_path / "mods"
        modules.mkdir(exist_ok=True)
        # It leaves a mark once it runs, so a test can wait for the hang itself.
        mark = tmp_path / "hangmod-runs"
        (modules / "hangmod.py").write_text(
            f"import time\nopen({str(mark)!r}, 'w').close()\ntime.sleep(120)\n"
        )
        pth = venv_site(env_dir) / "zz-hang.pth"
        pth.write_text(f"# a comment\n{modules}\n{line}\n")
        added.append(pth)
        return pth

    yield _add
    for path in added:
        path.unlink()


@pytest.mark.parametrize("line", ["import hangmod", "import time; time.sleep(120)"])
def test_a_stall_in_a_pth_line_names_the_file_and_line(
    env_dir: Path, hanging_pth, tmp_path: Path, line: str
) -> None:
    pth = hanging_pth(line)
    env = clean_env(IMPORTWATCH="1", IMPORTWATCH_TIMEOUT="1")
    run = Running([_python(env_dir), "-c", "print('never')"], tmp_path, env)
    try:
        run.wait_for("STALL", 60)
        run.wait_for("context: site runs line", 30)
    finally:
        run.kill()
    stall = next(text for text in run.stderr.splitlines() if "STALL" in text)
    assert f"step .pth {pth}:3" in stall, run.stderr
    assert f"> step .pth {pth}:3" in run.stderr
    if line == "import hangmod":
        assert stall.endswith(("1.0 s)", "1.1 s)")) and "> hangmod" in stall, stall
    assert "python -m importwatch cannot start past it" in run.stderr


def test_a_pth_line_that_returns_is_a_step_that_ends(env_dir: Path, hanging_pth) -> None:
    pth = hanging_pth("import json")
    plain = subprocess.run(
        [_python(env_dir), "-c", "print('ran')"], capture_output=True, text=True, env=clean_env()
    )
    traced = subprocess.run(
        [_python(env_dir), "-c", "print('ran')"],
        capture_output=True,
        text=True,
        env=clean_env(IMPORTWATCH="1"),
    )
    assert plain.stdout == traced.stdout == "ran\n" and traced.returncode == plain.returncode == 0
    lines = traced.stderr.splitlines()
    start = next(i for i, text in enumerate(lines) if text.endswith(f"> step .pth {pth}:3"))
    assert lines[start + 1].endswith("  > json"), lines[start:]
    assert any(text.split("] ", 1)[1].startswith("< step .pth ") for text in lines[start + 2 :])


@pytest.mark.parametrize("pure", ["0", "1"], ids=["C", "pure"])
def test_a_pth_line_that_calls_exec_itself_is_one_step(env_dir: Path, hanging_pth, pure: str) -> None:
    """coverage's a1_coverage.pth runs its code through exec(...): that exec is the line's, not site's,
    so it is no step of its own (it was one, nested in the line's, naming the same file and line)."""
    pth = hanging_pth("import sys; exec('import json'); json.dumps(1)")  # its name where plain puts it
    command = [_python(env_dir), "-c", "print('ran')"]
    plain = subprocess.run(command, capture_output=True, text=True, env=clean_env())
    traced = subprocess.run(
        command, capture_output=True, text=True, env=clean_env(IMPORTWATCH="1", IMPORTWATCH_PURE=pure)
    )
    for run in (plain, traced):
        assert (run.returncode, run.stdout) == (0, "ran\n"), run.stderr
        assert "Error processing line" not in run.stderr, run.stderr
    lines = [text.split("] ", 1)[1] for text in traced.stderr.splitlines() if "] " in text]
    start = lines.index(f"> step .pth {pth}:3")
    assert lines[start + 1] == "  > json", lines[start:]
    assert sum(text.strip().startswith("> step .pth ") for text in lines) == sum(
        text.strip().startswith("< step .pth ") for text in lines
    )
    # (site reads a venv's .pth files twice: a step each time, never one inside another)
    assert all(text == f"> step .pth {pth}:3" for text in lines if text.strip() == f"> step .pth {pth}:3")


@pytest.mark.parametrize("pure", ["0", "1"], ids=["C", "pure"])
def test_a_pth_line_that_fails_prints_site_s_traceback_as_plain_python(
    env_dir: Path, hanging_pth, pure: str
) -> None:
    # site prints a failing line's traceback and reads on; the line runs in site's frame and sees its locals.
    pth = hanging_pth("import sys; print(sorted(locals())); raise ValueError('bad line')")
    command = [_python(env_dir), "-c", "print('ran')"]
    plain = subprocess.run(command, capture_output=True, text=True, env=clean_env(), timeout=60)
    assert plain.returncode == 0 and plain.stdout.endswith("ran\n") and "sitedir" in plain.stdout, plain
    traced = subprocess.run(
        command,
        capture_output=True,
        text=True,
        env=clean_env(IMPORTWATCH="1", IMPORTWATCH_PURE=pure),
        timeout=60,
    )
    assert (traced.returncode, traced.stdout) == (0, plain.stdout), traced.stderr
    site_says = [line for line in traced.stderr.splitlines() if not line.startswith("[importwatch")]
    ours = [line for line in site_says if "importwatch" in line]
    if pure == "0":  # no frame of ours: site's report, word for word
        assert site_says == plain.stderr.splitlines(), traced.stderr
    else:  # the pure-Python twin's one frame in each (site may read the file twice: docs/limits.md)
        assert len(ours) == plain.stderr.count("Traceback") > 0, traced.stderr
        assert all("pthlines.py" in line for line in ours), traced.stderr
        ours_too = ("exec(source", "pthlines.py")  # its frame: the file, the line, 3.13's carets under it
        rest = [line for line in site_says if not any(word in line for word in ours_too)]
        rest = [line for line in rest if not line.strip() or line.strip(" ~^")]
        assert rest == plain.stderr.splitlines(), traced.stderr
    assert any(line.endswith(f"> step .pth {pth}:3") for line in traced.stderr.splitlines()), traced.stderr
    assert "< step .pth " in traced.stderr and "failed ValueError: bad line" in traced.stderr


@pytest.mark.skipif(PYSPY is None, reason="py-spy is not installed")
def test_inspect_says_site_runs_that_pth_line(env_dir: Path, hanging_pth, tmp_path: Path) -> None:
    pth = hanging_pth("import hangmod")
    process = subprocess.Popen(
        [_python(env_dir), "-c", "print('never')"], env=clean_env(), stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL, start_new_session=True,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 30
        while not (tmp_path / "hangmod-runs").exists() and time.monotonic() < deadline:
            time.sleep(0.1)
        env = clean_env(PATH=f"{Path(PYSPY).parent}:{os.environ.get('PATH', '')}")
        done = subprocess.run(
            [sys.executable, "-m", "importwatch", "inspect", str(process.pid)],
            capture_output=True, text=True, timeout=120, env=env, stdin=subprocess.DEVNULL,
        )  # fmt: skip
    finally:
        process.kill()
        process.wait()
    assert f"in site, before the program starts: running line 3 of {pth}" in done.stdout, done.stdout
    assert "could not ask" not in done.stdout, done.stdout


def test_inspect_runs_none_of_the_targets_pth_code(env_dir: Path, tmp_path: Path) -> None:
    marks = tmp_path / "marks"
    marks.mkdir()
    pth = venv_site(env_dir) / "zz-mark.pth"
    # Every interpreter that runs this line leaves a file named by its pid.
    pth.write_text(f"import os; open(os.path.join({str(marks)!r}, str(os.getpid())), 'w').close()\n")
    process = subprocess.Popen(
        [_python(env_dir), "-c", "import time; time.sleep(120)"], env=clean_env(),
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 30
        while not (marks / str(process.pid)).exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        done = subprocess.run(
            [sys.executable, "-m", "importwatch", "inspect", str(process.pid), "--json"],
            capture_output=True, text=True, timeout=120, env=clean_env(), stdin=subprocess.DEVNULL,
        )  # fmt: skip
    finally:
        process.kill()
        process.wait()
        pth.unlink()
    assert sorted(os.listdir(marks)) == [str(process.pid)], done.stdout
    # Its search path was still learnt, .pth path lines included: importwatch is found there.
    assert "install" not in json.loads(done.stdout)["rerun"], done.stdout
