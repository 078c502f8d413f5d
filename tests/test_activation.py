"""IMPORTWATCH=1 switches tracing on at interpreter start from a real install; off costs nothing."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
import venv
from pathlib import Path

import pytest

from helpers import ROOT, clean_env

BUILT = importlib.util.find_spec("importwatch.tracing._speedups") is not None

pytestmark = pytest.mark.timeout(300)

CHECK = (
    "import sys; print('importwatch' in sys.modules, sorted(m for m in sys.modules if 'importwatch' in m))"
)


def _python(env_dir: Path) -> str:
    return str(env_dir / "bin" / "python")


def _pip(env_dir: Path, *args: str) -> None:
    subprocess.run(
        [_python(env_dir), "-m", "pip", "install", "-q", "--disable-pip-version-check", *args],
        check=True, env=clean_env(),
    )  # fmt: skip


@pytest.fixture(scope="session")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """importwatch built as a wheel once per session, with the hatchling of the test environment."""
    out = tmp_path_factory.mktemp("wheel")
    try:
        import hatchling  # noqa: F401
    except ImportError:
        pytest.skip("hatchling is needed to build the wheel (pip install hatchling)")
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w", str(out), str(ROOT)],
        check=True, env=clean_env(),
    )  # fmt: skip
    return next(out.glob("importwatch-*.whl"))


@pytest.fixture(scope="session")
def installed(tmp_path_factory: pytest.TempPathFactory, wheel: Path) -> Path:
    """A fresh virtual environment with the wheel installed the regular way."""
    env_dir = tmp_path_factory.mktemp("venv-regular")
    venv.create(env_dir, with_pip=True)
    _pip(env_dir, "--no-deps", "--no-index", str(wheel))
    return env_dir


@pytest.fixture(scope="session")
def editable(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A fresh virtual environment with the checkout installed in editable mode."""
    env_dir = tmp_path_factory.mktemp("venv-editable")
    venv.create(env_dir, with_pip=True, system_site_packages=False)
    try:
        _pip(env_dir, "--no-deps", "-e", str(ROOT))
    except subprocess.CalledProcessError:
        pytest.skip("editable install needs hatchling from the package index, which is not reachable")
    return env_dir


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["installed", "editable"])
def test_variable_switches_tracing_on_in_a_fresh_venv(kind: str, request: pytest.FixtureRequest) -> None:
    env_dir = request.getfixturevalue(kind)
    on = subprocess.run(
        [_python(env_dir), "-c", "import json"],
        capture_output=True,
        text=True,
        env=clean_env(IMPORTWATCH="1"),
    )
    assert on.returncode == 0
    assert on.stderr.count("start python") == 1  # once, though site may process the .pth twice
    assert "> json" in on.stderr and "< json" in on.stderr


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["installed", "editable"])
@pytest.mark.parametrize("value", [None, "", "0", "false", "no", "off", "OFF", "False", " No "])
def test_off_means_not_even_imported(kind: str, value: str | None, request: pytest.FixtureRequest) -> None:
    env_dir = request.getfixturevalue(kind)
    env = clean_env() if value is None else clean_env(IMPORTWATCH=value)
    off = subprocess.run([_python(env_dir), "-c", CHECK], capture_output=True, text=True, env=env)
    assert off.stdout == "False []\n" and off.stderr == ""


@pytest.mark.slow
@pytest.mark.parametrize("flag", ["-I", "-E"])
def test_isolated_and_ignore_environment_keep_it_off(installed: Path, flag: str) -> None:
    env = clean_env(IMPORTWATCH="1", IMPORTWATCH_LOG="/dev/null")
    off = subprocess.run([_python(installed), flag, "-c", CHECK], capture_output=True, text=True, env=env)
    assert off.stdout == "False []\n" and off.stderr == ""


@pytest.mark.slow
def test_the_pth_runs_before_the_other_pth_files(installed: Path) -> None:
    # Another package's .pth files that import a module, named as setuptools names its own.
    site = Path(
        subprocess.run(
            [_python(installed), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
            capture_output=True, text=True, check=True, env=clean_env(),
        ).stdout.strip()
    )  # fmt: skip
    added = {
        site / "early_a.py": "",
        site / "early_b.py": "",
        site / "__editable__.early-1.0.pth": "import early_a\n",
        site / "distutils-precedence.pth": "import early_b\n",
    }
    kept = {path: path.read_bytes() for path in added if path.exists()}
    try:
        for path, text in added.items():
            path.write_text(text)
        on = subprocess.run(
            [_python(installed), "-c", "pass"], capture_output=True, text=True, env=clean_env(IMPORTWATCH="1")
        )
    finally:
        for path in added:
            if path in kept:
                path.write_bytes(kept[path])
            else:
                path.unlink()
    assert on.returncode == 0
    assert "> early_a" in on.stderr and "> early_b" in on.stderr, on.stderr


@pytest.mark.slow
def test_a_missing_package_is_said_once_and_the_program_runs(installed: Path) -> None:
    site = Path(
        subprocess.run(
            [_python(installed), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
            capture_output=True, text=True, check=True, env=clean_env(),
        ).stdout.strip()
    )  # fmt: skip
    package = site / "importwatch"
    package.rename(site / "importwatch.away")
    try:
        result = subprocess.run(
            [_python(installed), "-c", "print('ran')"],
            capture_output=True,
            text=True,
            env=clean_env(IMPORTWATCH="1"),
        )
    finally:
        (site / "importwatch.away").rename(package)
    assert result.returncode == 0 and result.stdout == "ran\n"
    assert result.stderr.count("tracing is off") == 1 and len(result.stderr.splitlines()) == 1, result.stderr


@pytest.mark.slow
def test_children_inherit_the_variable_and_carry_their_pid(installed: Path) -> None:
    code = (
        "import subprocess, sys, os\n"
        "print(os.getpid(), flush=True)\n"
        "subprocess.run([sys.executable, '-c', 'import os; print(os.getpid())'])\n"
    )
    result = subprocess.run(
        [_python(installed), "-c", code], capture_output=True, text=True, env=clean_env(IMPORTWATCH="1")
    )
    parent, child = result.stdout.split()
    assert f"[importwatch {parent} " in result.stderr and f"[importwatch {child} " in result.stderr
    assert parent != child


@pytest.mark.slow
def test_activation_error_is_one_line_and_the_program_runs(installed: Path, tmp_path: Path) -> None:
    # A log path in a directory that does not exist: said once, tracing goes on to stderr.
    env = clean_env(IMPORTWATCH="1", IMPORTWATCH_LOG=str(tmp_path / "no" / "such" / "dir" / "x.log"))
    result = subprocess.run(
        [_python(installed), "-c", "print('ran')"], capture_output=True, text=True, env=env
    )
    assert result.returncode == 0 and result.stdout == "ran\n"
    assert result.stderr.count("cannot open log file") == 1


def test_pth_is_a_single_guarded_line() -> None:
    lines = (ROOT / "src" / "importwatch.pth").read_text().splitlines()
    assert len(lines) == 1 and lines[0].startswith("import os, sys;")
    assert os.environ.get("IMPORTWATCH_NEVER_SET_IN_TESTS") is None


@pytest.mark.slow
def test_blocking_steps_are_imported_only_when_a_module_they_wrap_arrives() -> None:
    """tracing/blocking.py costs the most of our modules at start-up: it waits for its targets."""
    code = (
        "import sys; print('importwatch.tracing.blocking' in sys.modules)\n"
        "import multiprocessing.popen_fork as popen_fork\n"
        "print('importwatch.tracing.blocking' in sys.modules)\n"
        "print(hasattr(popen_fork.Popen._send_signal, '__importwatch_original__'))\n"
    )
    env = clean_env(IMPORTWATCH="1")
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=30)
    assert done.returncode == 0 and done.stdout == "False\nTrue\nTrue\n", done.stderr
    # Our own import is not the program's: it gets no line.
    assert "> multiprocessing.popen_fork" in done.stderr and "> importwatch" not in done.stderr


def test_every_module_blocking_steps_wrap_brings_them_in() -> None:
    from importwatch.tracing import session
    from importwatch.tracing.blocking import BlockingSteps
    from importwatch.tracing.hook import Tracer
    from importwatch.tracing.sink import Sink

    assert set(BlockingSteps(Tracer(Sink(2)))._targets) == set(session.BLOCKING_TARGETS)


@pytest.mark.slow
@pytest.mark.parametrize(
    "pure",
    [pytest.param("0", marks=pytest.mark.skipif(not BUILT, reason="the C accelerator is not built")), "1"],
    ids=["C", "pure"],
)
def test_the_facts_modules_are_imported_on_the_first_native_load_and_write_no_line(pure: str) -> None:
    """Library names, ELF, CUDA and mapped objects: needed by native loads only, not by every interpreter
    start. With the C accelerator, no load needs elf.py: the accelerator reads the file itself."""
    facts = [
        "importwatch.facts.libnames",
        "importwatch.facts.elf",
        "importwatch.facts.cuda",
        "importwatch.facts.mapped",
    ]
    code = (
        f"import sys; facts = {facts!r}\n"
        "print([name in sys.modules for name in facts])\n"
        "import _ctypes\n"  # an extension module: a native load
        "print([name in sys.modules for name in facts])\n"
    )
    env = clean_env(IMPORTWATCH="1", IMPORTWATCH_PURE=pure)
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=30)
    assert done.returncode == 0, done.stderr
    elf = pure == "1"
    assert done.stdout == f"[False, False, False, False]\n[True, {elf}, False, True]\n", done.stderr
    assert "> dlopen " in done.stderr and "> importwatch" not in done.stderr


@pytest.mark.slow
def test_torch_facts_arrive_with_import_torch_and_write_no_line() -> None:
    """The torch line before `import torch` needs facts/cuda.py, imported then, without a line of its own."""
    pytest.importorskip("torch")
    code = "import sys; print('importwatch.facts.cuda' in sys.modules); import torch; print('ok')"
    env = clean_env(IMPORTWATCH="1")
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and done.stdout == "False\nok\n", done.stderr
    assert "(from its files, before import)" in done.stderr and "> importwatch" not in done.stderr


def test_sites_probe_of_a_missing_sitecustomize_is_not_logged_but_a_real_one_is(tmp_path: Path) -> None:
    def run(**env: str) -> subprocess.CompletedProcess:
        return subprocess.run(
            [sys.executable, "-c", "print('ran')"], capture_output=True, text=True, timeout=60,
            env=clean_env(IMPORTWATCH="1", **env), cwd=tmp_path,
        )  # fmt: skip

    plain = subprocess.run(
        [sys.executable, "-c", "print('ran')"], capture_output=True, text=True, env=clean_env(), cwd=tmp_path
    )
    # None there: the interpreter's own optional probe is every start, not news.
    quiet = run()
    assert quiet.stdout == plain.stdout == "ran\n"
    assert "start python" in quiet.stderr and "customize" not in quiet.stderr, quiet.stderr
    # One there: its import is logged, with what it imports, whether it works or fails otherwise.
    (tmp_path / "site").mkdir()
    (tmp_path / "site" / "sitecustomize.py").write_text("import colorsys\n")
    shown = run(PYTHONPATH=str(tmp_path / "site"))
    assert "] > sitecustomize\n" in shown.stderr and "]   > colorsys\n" in shown.stderr, shown.stderr
    assert "] < sitecustomize " in shown.stderr
    (tmp_path / "site" / "sitecustomize.py").write_text("import no_such_module_here\n")
    broken = run(PYTHONPATH=str(tmp_path / "site"))
    assert (
        "] < sitecustomize " in broken.stderr
        and "failed ModuleNotFoundError: No module named 'no_such_module_here'" in broken.stderr
    ), broken.stderr


SUBINTERPRETER = """
try:
    import _interpreters as interpreters  # 3.13
except ImportError:
    import _xxsubinterpreters as interpreters  # 3.9 to 3.12
interp = interpreters.create()
interpreters.run_string(interp, "import sys, json; print(sorted(m for m in sys.modules if m.startswith('importwatch')))")
interpreters.destroy(interp)
"""


def test_a_subinterpreter_is_left_alone(tmp_path: Path) -> None:
    # Its site runs our .pth as the main interpreter's did: importwatch is the process's, started once.
    # (Before 3.12 a traced subinterpreter's heartbeat could abort the process as the subinterpreter ended.)
    for command, env in (
        ([sys.executable, "-c", SUBINTERPRETER], clean_env(IMPORTWATCH="1")),
        ([sys.executable, "-m", "importwatch", "-c", SUBINTERPRETER], clean_env()),
    ):
        run = subprocess.run(command, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=60)
        assert (run.returncode, run.stdout) == (0, "[]\n"), run.stderr
        assert run.stderr.count("] start python ") == 1 and "] ! " not in run.stderr, run.stderr
