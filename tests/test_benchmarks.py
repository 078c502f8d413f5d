"""The kernel benchmark runs end to end in its quickest mode and gives every figure it promises."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from helpers import ROOT, clean_env

BENCH = ROOT / "benchmarks" / "bench_kernel.py"
TARGETS = {
    "per_import_all_lines",
    "per_import_quiet",
    "torch_cpu_ratio_log",
    "startup_added_ms",
    "syscalls_per_import_all_lines",
    "torch_extra_mmap_munmap",
    "frames_added_per_import",
}
TRACED = ("runner log", "runner stalls", "env log", "env stalls")


def run_script(script: str, *args: str, timeout: float, **env: str) -> subprocess.CompletedProcess:
    """benchmarks/SCRIPT ARGS, run as a user would, with our variables out of its environment (and ENV in)."""
    return subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / script), *args],
        env=clean_env(**env), capture_output=True, text=True, timeout=timeout,
    )  # fmt: skip


def bench(tmp_path: Path, *args: str, **env: str) -> subprocess.CompletedProcess:
    """bench_kernel.py's JSON, its venvs and trees cached under TMP_PATH."""
    return run_script(BENCH.name, "--cache", str(tmp_path / "cache"), "--json", *args, timeout=150, **env)


@pytest.mark.slow
@pytest.mark.timeout(180)
def test_quickest_run_gives_every_figure_in_json(tmp_path):
    done = bench(
        tmp_path, "--current", "--quick", "--rounds", "1", "--startup-rounds", "1",
        "--modules", "20", "--depth", "5", "--workloads", "tree,chain",
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert "Traceback" not in done.stderr
    (result,) = json.loads(done.stdout)["pythons"].values()
    has_strace = shutil.which("strace") is not None
    for name, imports in (("tree", 20 + 1 + 1), ("chain", 5)):
        work = result["workloads"][name]
        # Plus what the venv's other .pth files import at start-up (setuptools' _distutils_hack):
        # tracing starts in site, before them, under the runner as under IMPORTWATCH=1.
        assert imports <= work["imports"] <= imports + 2
        for mode in TRACED:
            row = work["modes"][mode]
            assert {"ratio_wall", "ratio_cpu", "added_sys_ms", "added_minflt", "majflt"} <= set(row)
            assert {"wall_us", "cpu_us", "user_us", "sys_us", "minflt"} <= set(work["per_import"][mode])
        if has_strace:
            # Each line is written at least once (stderr and log get one write each today).
            assert work["syscalls_per_import"]["runner log"]["write"] >= 1.0
            assert work["syscalls"]["plain"]["kinds"]["mmap"] > 0
    assert result["startup"]["added_ms"] is not None
    assert result["startup"]["unwatched_added_ms"] is not None
    assert result["startup"]["native_module"] and result["startup"]["native_added_ms"] is not None
    assert result["frames"]["plain"]["frames_per_import"] > 0
    assert result["frames"]["plain"]["deepest_nesting"] > 50
    targets = result["targets"]
    assert set(targets) == TARGETS
    measured = TARGETS - {"torch_cpu_ratio_log", "torch_extra_mmap_munmap"}
    if not has_strace:
        measured.discard("syscalls_per_import_all_lines")
    assert all(targets[key] is not None for key in measured), targets
    assert targets["frames_added_per_import"] >= 0


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_missing_strace_and_python_are_reported_and_skipped(tmp_path):
    home = tmp_path / "home"  # no ~/.pyenv here
    home.mkdir()
    (tmp_path / "bin").mkdir()  # a PATH without strace
    # A version that neither this interpreter nor the checkout's .venv (used when it matches) has.
    taken = {
        f"{sys.version_info[0]}.{sys.version_info[1]}",
        *(p.name[6:] for p in (ROOT / ".venv" / "lib").glob("python3.*")),
    }
    missing = next(v for v in ("3.9", "3.10", "3.12", "3.13") if v not in taken)
    done = bench(tmp_path, "--versions", missing, HOME=str(home), PATH=str(tmp_path / "bin"))
    assert done.returncode == 0, done.stderr
    assert "Traceback" not in done.stderr
    (result,) = json.loads(done.stdout)["pythons"].values()
    assert "no ~/.pyenv/versions/" in result["error"]
    done = bench(
        tmp_path, "--current", "--quick", "--rounds", "1", "--startup-rounds", "1", "--workloads", "chain",
        "--depth", "3", PATH=str(tmp_path / "bin"),
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    (result,) = json.loads(done.stdout)["pythons"].values()
    assert "system calls: strace is not installed" in result["skipped"]
    assert result["workloads"]["chain"]["syscalls"] is None
    assert result["targets"]["frames_added_per_import"] is not None


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_the_imports_alone_are_timed_in_every_mode(tmp_path):
    # bench_inside.py: no figure is judged here (timings are benchmarks, never tests), only that every
    # mode ran and printed its row.
    done = run_script("bench_inside.py", "--rounds", "1", "--modules", "20", "--log", "--runner", timeout=100)
    assert done.returncode == 0, done.stderr
    assert "22 imports, 1 rounds" in done.stdout  # 20 modules, their package, bench_all
    for mode in ("plain", "loaded", "stalls", "log", "log, stderr piped", "runner stalls", "runner log"):
        assert re.search(
            rf"^  {mode} +[\d.]+ ms; over plain, per import: +[-+][\d.]+ us wall", done.stdout, re.M
        ), done.stdout
    # --top-level: the same imports made by the program's own top level, each a thread's first step.
    done = run_script("bench_inside.py", "--rounds", "1", "--modules", "20", "--top-level", timeout=100)
    assert done.returncode == 0, done.stderr
    assert "21 imports at top level, 1 rounds" in done.stdout  # 20 modules and their package
    assert re.search(r"^  stalls +[\d.]+ ms; over plain, per import: +[-+][\d.]+ us wall", done.stdout, re.M)


@pytest.mark.slow
@pytest.mark.timeout(120)
@pytest.mark.skipif(shutil.which("cc") is None and shutil.which("gcc") is None, reason="no C compiler")
def test_native_loads_are_timed_in_every_mode_with_and_without_ctypes():
    # bench_native.py builds its extension modules, then times their imports: no figure is judged,
    # only that every mode ran, before and after ctypes, and printed its row.
    done = run_script("bench_native.py", "--rounds", "1", "--modules", "4", timeout=110)
    assert done.returncode == 0, done.stderr
    assert "4 native loads, 1 rounds" in done.stdout
    for heading in ("no ctypes:", "after import ctypes:"):
        section = done.stdout.split(heading, 1)[1]
        assert re.search(r"^    plain +[\d.]+ ms, [\d.]+ us per load", section, re.M), done.stdout
        for mode in ("stalls", "log"):
            assert re.search(rf"^    {mode} +[-+][\d.]+ us per load over plain", section, re.M), done.stdout


@pytest.mark.timeout(60)
def test_the_write_floor_is_timed_for_each_target():
    # bench_write_floor.py: no figure is judged, only that each target was timed and printed.
    done = run_script("bench_write_floor.py", "--writes", "2000", timeout=50)
    assert done.returncode == 0, done.stderr
    for row in (r"a file, appended +[\d.]+ us", r"/dev/null +[\d.]+ us", r"import's four .*: [\d.]+ us",
                r"a pipe whose reader waits for each line: [\d.]+ us per write"):  # fmt: skip
        assert re.search(row, done.stdout), done.stdout


@pytest.mark.slow
@pytest.mark.timeout(180)
@pytest.mark.skipif(shutil.which("cc") is None and shutil.which("gcc") is None, reason="no C compiler")
def test_the_parts_of_a_line_s_cost_are_each_timed(tmp_path):
    # bench_line_parts.py builds a copy of the C accelerator whose writes do nothing (it refuses to go on
    # if that copy wrote an import line); no figure is judged, only that every mode and part was printed.
    done = run_script("bench_line_parts.py", "--rounds", "1", "--modules", "20", timeout=170)
    assert done.returncode == 0, done.stderr
    assert "22 imports, 1 rounds" in done.stdout
    for row in ("stalls", "lines, unwritten", "lines, /dev/null", "lines, files"):
        assert re.search(rf"^  {row} +[-+][\d.]+ us per import", done.stdout, re.M), done.stdout
    for part in ("the hook", "making the two lines", "four writes to /dev/null", "four writes to files"):
        assert re.search(rf"^  {part} +-?[\d.]+ us", done.stdout, re.M), done.stdout
