"""bisect finds the smallest `python -c "import ..."` that still hangs or crashes; no child is left."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

from cbuild import FIXTURES, compile_extension, compile_shared
from helpers import clean_env

pytestmark = [pytest.mark.timeout(60), pytest.mark.slow]

BISECT_FIXTURES = FIXTURES / "bisect"
BISECT = [sys.executable, "-m", "importwatch", "bisect"]
# Short enough that a hanging try costs under a second.
TIMEOUT = "0.5"
UNRELATED = 30


@pytest.fixture(scope="module")
def natives(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The misbehaving extensions, each in its own folder, and the library that exports the flag."""
    out = tmp_path_factory.mktemp("bisect-natives")
    source = BISECT_FIXTURES / "misbehave.c"
    needs_flag = ["-DFIXTURE_NEEDS=fixture_flag", "-ldl"]
    compile_shared(
        BISECT_FIXTURES / "exporter.c", out / "libexporter.so", extra=["-DFIXTURE_EXPORT=fixture_flag"]
    )
    compile_extension(source, out / "hang", "hangs")
    compile_extension(source, out / "abort", "aborts", extra=["-DFIXTURE_ABORT"])
    compile_extension(source, out / "hang_after_a", "b", extra=needs_flag)
    compile_extension(source, out / "crash_after_a", "b", extra=[*needs_flag, "-DFIXTURE_CRASH"])
    return out


@pytest.fixture
def marker() -> str:
    """A string in the environment of every process a test starts; none may be left at its end."""
    value = f"bisect-test-{uuid.uuid4().hex}"
    yield value
    deadline = time.monotonic() + 2  # SIGKILLed processes may take a moment to be reaped
    while _survivors(value) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert _survivors(value) == []


def _survivors(marker: str) -> list[int]:
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        try:
            with open(f"/proc/{entry}/environ", "rb") as file:
                if marker.encode() in file.read():
                    found.append(int(entry))
        except OSError:
            continue
    return found


def bisect(*args: str, cwd: Path, marker: str) -> subprocess.CompletedProcess:
    env = clean_env(BISECT_TEST_MARKER=marker)
    return subprocess.run([*BISECT, *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=50)


def result_of(done: subprocess.CompletedProcess) -> dict:
    assert done.stdout.count("\n") == 1, done.stdout + done.stderr
    return json.loads(done.stdout)


def unrelated_modules(folder: Path, count: int = UNRELATED) -> list[str]:
    """COUNT harmless modules: plain ones, some importing the standard library, some packages."""
    names = []
    for index in range(count):
        name = f"m{index:02d}"
        if index % 7 == 3:
            package = folder / name
            package.mkdir()
            (package / "__init__.py").write_text(f"from {name} import sub\n")
            (package / "sub.py").write_text("VALUE = 1\n")
        elif index % 5 == 2:
            (folder / f"{name}.py").write_text("import json\nimport textwrap\n")
        else:
            (folder / f"{name}.py").write_text(f"NAME = {name!r}\n")
        names.append(name)
    return names


def pair_job(folder: Path, natives: Path, variant: str) -> Path:
    """job.py: unrelated imports, then `a` (exports a symbol), more of them, then `b`, which misbehaves
    only when that symbol is there."""
    names = unrelated_modules(folder)
    shutil.copy(BISECT_FIXTURES / "exporter.py", folder / "a.py")
    shutil.copy(natives / "libexporter.so", folder / "libexporter.so")
    for so in (natives / variant).iterdir():
        shutil.copy(so, folder / so.name)
    # A module only the program can import, as it extends sys.path first: tries must do without.
    (folder / "extra").mkdir()
    (folder / "extra" / "hidden.py").write_text("")
    half = len(names) // 2
    order = [*names[:3], "hidden", *names[3:half], "a", *names[half:], "b"]
    script = folder / "job.py"
    script.write_text(
        "import os, sys\n"
        "sys.path.append(os.path.join(os.path.dirname(os.path.abspath(__file__)), 'extra'))\n"
        + "".join(f"import {name}\n" for name in order)
        + "print('done')\n"
    )
    return script


def test_extension_that_hangs_alone_is_found_in_two_tries(natives: Path, tmp_path: Path, marker: str) -> None:
    unrelated_modules(tmp_path, 3)
    shutil.copy(next((natives / "hang").iterdir()), tmp_path)
    # A child of the program, in its process group: it must die with the try.
    (tmp_path / "spawner.py").write_text(
        "import subprocess, sys\nsubprocess.Popen([sys.executable, '-c', 'import time; time.sleep(120)'])\n"
    )
    (tmp_path / "job.py").write_text("import m00, m01, spawner, m02\nimport hangs\n")
    began = time.monotonic()
    done = bisect("--timeout", TIMEOUT, "--json", "job.py", cwd=tmp_path, marker=marker)
    assert done.returncode == 1, done.stderr
    result = result_of(done)
    assert result["result"] == "hang"
    assert result["culprit"] == "hangs" and result["chain"] == ["hangs"] and result["failed"] is False
    assert result["native"].startswith(str(tmp_path / "hangs."))
    assert result["imports"] == ["hangs"] and result["alone"] is True
    assert result["code"] == "import hangs"
    assert result["pythonpath"] == str(tmp_path)
    # The program, the culprit alone, and REPEATS - 1 more tries of it alone that confirm it.
    assert result["tries"] == 4 and result["confirmed"] is True and result["flaky"] is None
    assert time.monotonic() - began < 12
    # One progress line per try.
    assert done.stderr.count("importwatch bisect: try ") == 4


def test_innermost_python_module_that_hangs_alone_wins(tmp_path: Path, marker: str) -> None:
    unrelated_modules(tmp_path, 3)
    (tmp_path / "slowpkg").mkdir()
    (tmp_path / "slowpkg" / "__init__.py").write_text("import m01\nfrom slowpkg import inner\n")
    # The GIL is free here: the child's watchdog writes a full stall report.
    (tmp_path / "slowpkg" / "inner.py").write_text("import time\nwhile True:\n    time.sleep(1)\n")
    done = bisect(
        "--timeout", TIMEOUT, "--json", "-c", "import m00; import slowpkg", cwd=tmp_path, marker=marker
    )
    assert done.returncode == 1, done.stderr
    result = result_of(done)
    assert result["chain"] == ["slowpkg", "slowpkg.inner"]
    assert result["imports"] == ["slowpkg.inner"] and result["alone"] is True
    # The child's heartbeat reports; on a loaded machine faulthandler's timer may beat it to it.
    assert "stall report" in result["detail"] or "faulthandler" in result["detail"]
    assert result["native"] is None and result["pythonpath"] is None
    assert result["tries"] == 4 and result["confirmed"] is True


def test_hang_that_needs_an_earlier_import_is_reduced_to_the_pair(
    natives: Path, tmp_path: Path, marker: str
) -> None:
    script = pair_job(tmp_path, natives, "hang_after_a")
    done = bisect("--timeout", TIMEOUT, "--json", str(script), cwd=tmp_path, marker=marker)
    assert done.returncode == 1, done.stderr
    result = result_of(done)
    assert result["result"] == "hang" and result["culprit"] == "b"
    assert result["imports"] == ["a", "b"]
    assert result["code"] == "import a; import b"
    assert result["alone"] is False and result["minimal"] is True and result["stopped"] is None
    assert result["native"].startswith(str(tmp_path / "b."))
    # More than 30 earlier imports: bisection takes a logarithmic number of tries, not one per import.
    assert result["tries"] <= 20, done.stderr
    assert f"PYTHONPATH={tmp_path}" in result["reproducer"]


def test_crash_in_a_constructor_is_minimised_the_same_way(natives: Path, tmp_path: Path, marker: str) -> None:
    script = pair_job(tmp_path, natives, "crash_after_a")
    done = bisect("--timeout", TIMEOUT, "--jobs", "3", str(script), cwd=tmp_path, marker=marker)
    assert done.returncode == 1, done.stderr
    lines = done.stdout.splitlines()
    assert lines[0].startswith("importwatch bisect: crash in b, ")
    assert "  how:        died by SIGSEGV" in lines
    assert "  needs:      a imported first; `import b` alone is fine" in lines
    reproduce = next(line for line in lines if line.startswith("  reproduce:  "))
    assert reproduce.endswith("-c 'import a; import b'")
    tries = int(lines[0].split(", ")[1].split()[0])
    assert tries <= 25
    # The reproducer is ready to run: pasted into a shell, it crashes the same way.
    ran = subprocess.run(
        reproduce.split("  reproduce:  ")[1], shell=True, env=clean_env(), capture_output=True
    )
    assert ran.returncode in (-11, 128 + 11)


def test_abort_alone_is_a_crash(natives: Path, tmp_path: Path, marker: str) -> None:
    unrelated_modules(tmp_path, 2)
    shutil.copy(next((natives / "abort").iterdir()), tmp_path)
    done = bisect("--json", "-c", "import m00; import aborts; import m01", cwd=tmp_path, marker=marker)
    assert done.returncode == 1, done.stderr
    result = result_of(done)
    assert result["result"] == "crash" and result["detail"] == "died by SIGABRT"
    assert result["imports"] == ["aborts"] and result["tries"] == 4


def test_failed_import_that_ends_the_program_is_a_crash(tmp_path: Path, marker: str) -> None:
    (tmp_path / "app.py").write_text("import json\nimport no_such_module_here\n")
    done = bisect("--json", "-c", "import app", cwd=tmp_path, marker=marker)
    assert done.returncode == 1, done.stderr
    result = result_of(done)
    assert result["result"] == "crash"
    assert result["chain"] == ["app", "no_such_module_here"] and result["failed"] is True
    assert "ModuleNotFoundError" in result["detail"]
    assert result["imports"] == ["no_such_module_here"]


def test_program_that_does_not_hang_exits_0_at_once(tmp_path: Path, marker: str) -> None:
    unrelated_modules(tmp_path, 8)
    (tmp_path / "app.py").write_text("".join(f"import m{i:02d}\n" for i in range(8)) + "print('ran')\n")
    began = time.monotonic()
    done = bisect("--timeout", "5", "-m", "app", "--timeout", "x", cwd=tmp_path, marker=marker)
    assert done.returncode == 0, done.stderr
    assert time.monotonic() - began < 5
    assert done.stdout.startswith("importwatch bisect: no hang")
    assert "; 1 try, " in done.stdout, done.stdout  # one try, said so


def test_max_tries_stops_the_search_and_reports_the_best_so_far(
    natives: Path, tmp_path: Path, marker: str
) -> None:
    script = pair_job(tmp_path, natives, "crash_after_a")
    done = bisect("--max-tries", "5", "--json", str(script), cwd=tmp_path, marker=marker)
    assert done.returncode == 1, done.stderr
    result = result_of(done)
    assert result["tries"] == 5
    assert result["stopped"] == "--max-tries 5 reached" and result["minimal"] is False
    # Not minimal, but it reproduces: it still ends with b, with a among what comes before.
    assert result["imports"][-1] == "b" and "a" in result["imports"]


@pytest.mark.parametrize(
    ("args", "message"),
    [
        ([], "no program given"),
        (["--jobs", "0", "job.py"], "--jobs: expected a whole number >= 1, got '0'"),
        (["--timeout", "0", "-c", "pass"], "--timeout: bisect needs a number of seconds > 0"),
        (["--timeout=soon", "-c", "pass"], "--timeout: expected a number of seconds"),
        (["--max-tries"], "--max-tries needs a value"),
        (["--frobnicate", "job.py"], "unknown option '--frobnicate'"),
        (["-c"], "argument expected for the -c option"),
        (["missing.py"], "can't open file"),
    ],
)
def test_bad_usage_is_one_line_and_status_2(
    args: list[str], message: str, tmp_path: Path, marker: str
) -> None:
    (tmp_path / "job.py").write_text("")
    done = bisect(*args, cwd=tmp_path, marker=marker)
    assert done.returncode == 2
    assert done.stderr.startswith("importwatch: error: ") and done.stderr.count("\n") == 1, done.stderr
    assert message in done.stderr
