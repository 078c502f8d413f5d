"""Tracing overhead as the kernel sees it: time, CPU user/sys, system calls, page faults, frames.

    python benchmarks/bench_kernel.py [--versions 3.9,3.11] [--workloads tree,chain,torch]
                                      [--rounds 5] [--quick] [--json] [--current]

For each Python from 3.9 to 3.13 found under ~/.pyenv/versions (or only this interpreter
with --current), each workload runs plain and in four traced modes:

    plain            python -c CODE
    runner log       python -m importwatch --log FILE -c CODE   (every line on stderr and in FILE)
    runner stalls    python -m importwatch --stderr stalls -c CODE   (no log)
    env log          IMPORTWATCH=1 IMPORTWATCH_LOG=FILE python -c CODE
    env stalls       IMPORTWATCH=1 IMPORTWATCH_STDERR=stalls python -c CODE

stderr always goes to a file. Workloads: a generated tree of small modules, a chain of modules
each importing the next, and `import torch` (where that interpreter can import it). Each is
timed in alternating rounds (wall, and user/system CPU and page faults from os.wait4's rusage),
then run once per mode under `strace -ff` to count the program's system calls by kind. Beside
them: start-up (`IMPORTWATCH=1 python -c pass` against plain, with the watcher and without, and
`python -c "import math"`, a first native load, the same way) and a frame probe (Python frames
between one nested module body and the next, and the deepest nested import that works under the
default recursion limit). docs/performance.md says what each figure
means. The traced modes use the C accelerator of the per-import hook where it is built;
`IMPORTWATCH_PURE=1 python benchmarks/bench_kernel.py ...` measures its pure-Python twin.
Interpreters other than this checkout's .venv get a venv of their own, made once in the
cache folder, with this checkout installed editable. Standard library only.
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from pathlib import Path
from typing import NamedTuple

from bench_overhead import median_interval
from kernel_report import MODES, PROBE_LIMIT, table, targets
from kernel_workloads import PROBE_DEPTH, Workload, generated, native_module, workloads, write_probe

ROOT = Path(__file__).resolve().parent.parent
VERSIONS = ("3.9", "3.10", "3.11", "3.12", "3.13")
WORKLOADS = ("tree", "chain", "torch")
LIMIT_S = 900.0  # one process; a run past it is reported as failed, never waited on forever
# Start lines of imports in the text log; native loads ("> dlopen PATH") and steps ("> step .pth
# FILE:LINE", site running a .pth line) are not imports.
_IMPORT_LINE = re.compile(r"^\[importwatch [^\]]*\] +> (?!dlopen |step |phase )", re.MULTILINE)
_SYSCALL = re.compile(r"^([a-z_0-9]+)\(")
_RETURN = re.compile(r"= (\d+)$")


class Failed(Exception):
    """A figure could not be measured; the message says why in one line."""


def log(message: str) -> None:
    print(f"bench_kernel: {message}", file=sys.stderr, flush=True)


# -- interpreters ---------------------------------------------------------------------------


def interpreter_version(python: str) -> str:
    done = subprocess.run(
        [python, "-c", "import sys; print('%d.%d' % sys.version_info[:2])"],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    if done.returncode != 0:
        raise Failed(f"{python} does not run")
    return done.stdout.strip()


def has_importwatch(python: str) -> bool:
    probe = "import importwatch, importlib.util as u; assert u.find_spec('_importwatch_boot')"
    return subprocess.run([python, "-c", probe], capture_output=True, timeout=60).returncode == 0


def find_pyenv(version: str) -> str | None:
    """The newest ~/.pyenv/versions/VERSION.*/bin/python3, or None."""
    found = glob.glob(str(Path.home() / ".pyenv" / "versions" / f"{version}.*" / "bin" / "python3"))
    found = [f for f in found if re.search(rf"/{re.escape(version)}\.\d+/bin/", f)]
    found.sort(key=lambda path: int(re.search(r"\.(\d+)/bin/", path).group(1)))
    return found[-1] if found else None


def venv_python(version: str, cache: Path) -> str:
    """A python VERSION with this checkout installed: this checkout's .venv, else a cached venv."""
    own = ROOT / ".venv" / "bin" / "python"
    if own.exists() and interpreter_version(str(own)) == version and has_importwatch(str(own)):
        return str(own)
    base = find_pyenv(version)
    if base is None:
        raise Failed(f"no ~/.pyenv/versions/{version}.*/bin/python3")
    venv = cache / "venvs" / version
    python = venv / "bin" / "python"
    stamp = venv / "bench-stamp"
    wanted = json.dumps([base, str(ROOT), (ROOT / "pyproject.toml").read_text()])
    if stamp.exists() and stamp.read_text() == wanted and has_importwatch(str(python)):
        return str(python)
    log(f"making a venv for {version} in {venv} (once)")
    shutil.rmtree(venv, ignore_errors=True)
    if subprocess.run([base, "-m", "venv", str(venv)], capture_output=True).returncode != 0:
        raise Failed(f"could not make a venv with {base}")
    pip = [str(python), "-m", "pip", "-q", "--disable-pip-version-check", "install", "--no-deps", "-e"]
    done = subprocess.run([*pip, str(ROOT)], capture_output=True, text=True)
    if done.returncode != 0 or not has_importwatch(str(python)):
        last = (done.stderr.strip().splitlines() or ["importwatch not importable"])[-1]
        raise Failed(f"could not install importwatch into {venv}: {last}")
    stamp.write_text(wanted)
    return str(python)


# -- running -----------------------------------------------------------------------------------


class Run(NamedTuple):
    """One process: wall, user and system CPU seconds, minor and major page faults."""

    wall: float
    user: float
    system: float
    minflt: int
    majflt: int


def command(python: str, mode: str, code: str, logfile: Path) -> tuple[list[str], dict[str, str]]:
    """The argv and the environment additions of MODE."""
    if mode == "runner log":
        return [python, "-m", "importwatch", "--log", str(logfile), "-c", code], {}
    if mode == "runner stalls":
        return [python, "-m", "importwatch", "--stderr", "stalls", "-c", code], {}
    if mode == "env log":
        return [python, "-c", code], {"IMPORTWATCH": "1", "IMPORTWATCH_LOG": str(logfile)}
    if mode == "env stalls":
        return [python, "-c", code], {"IMPORTWATCH": "1", "IMPORTWATCH_STDERR": "stalls"}
    return [python, "-c", code], {}


def base_env(path: str) -> dict[str, str]:
    """This environment without our variables (but IMPORTWATCH_PURE, the hot path measured) or a venv's,
    bytecode caches written as installed."""
    env = {
        k: v
        for k, v in os.environ.items()
        if (k == "IMPORTWATCH_PURE" or not k.startswith(("IMPORTWATCH", "PYTHON", "VIRTUAL_ENV")))
        and k not in ("RANK", "LOCAL_RANK", "WORLD_SIZE")
    }
    if path:
        env["PYTHONPATH"] = path
    return env


def run_once(argv: list[str], env: dict[str, str], workdir: Path) -> Run:
    """Run ARGV to completion, stderr to a file; its own rusage from os.wait4."""
    with open(workdir / "stderr.txt", "wb") as stderr:
        began = time.perf_counter()
        child = subprocess.Popen(
            argv, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=stderr
        )
        # A blocking wait4, so that the benchmark itself takes no CPU from the run; a timer ends a hang.
        guard = threading.Timer(LIMIT_S, child.kill)
        guard.start()
        _, status, usage = os.wait4(child.pid, 0)
        wall = time.perf_counter() - began
        guard.cancel()
    child.returncode = code = os.waitstatus_to_exitcode(status)  # reaped here, not by Popen
    if code != 0:
        last = (workdir / "stderr.txt").read_text(errors="replace").strip().splitlines()[-1:] or [""]
        raise Failed(f"{' '.join(argv[1:])[:80]} exited with status {code}: {last[0][:120]}")
    return Run(wall, usage.ru_utime, usage.ru_stime, usage.ru_minflt, usage.ru_majflt)


def timed(python: str, work: Workload, rounds: int, workdir: Path) -> tuple[dict[str, list[Run]], int, int]:
    """Every mode, ROUNDS alternating rounds after one warm-up each; also the imports and lines."""
    env = base_env(work.path)
    logfile = workdir / "trace.log"
    arms = {mode: command(python, mode, work.code, logfile) for mode in MODES}
    imports = lines = 0
    for mode, (argv, extra) in arms.items():  # warm the page cache and write the bytecode caches
        logfile.unlink(missing_ok=True)
        run_once(argv, dict(env, **extra), workdir)
        if mode == "runner log":
            text = logfile.read_text(errors="replace")
            imports, lines = len(_IMPORT_LINE.findall(text)), text.count("\n")
    if imports == 0 and work.code != "pass":
        raise Failed("the traced run logged no import")
    runs: dict[str, list[Run]] = {mode: [] for mode in MODES}
    for index in range(rounds):
        order = list(arms.items())
        if index % 2:
            order.reverse()  # no mode always runs right after another
        for mode, (argv, extra) in order:
            logfile.unlink(missing_ok=True)
            runs[mode].append(run_once(argv, dict(env, **extra), workdir))
    logfile.unlink(missing_ok=True)
    return runs, imports, lines


def strace_counts(python: str, work: Workload, mode: str, workdir: Path) -> dict[str, object]:
    """System calls of one run under `strace -ff`: the program's (all its threads) by kind, and its helpers' total."""
    argv, extra = command(python, mode, work.code, workdir / "trace.log")
    traces = workdir / "strace"
    shutil.rmtree(traces, ignore_errors=True)
    traces.mkdir()
    (workdir / "trace.log").unlink(missing_ok=True)
    run_once(
        ["strace", "-ff", "-qq", "-o", str(traces / "t"), "--", *argv],
        dict(base_env(work.path), **extra),
        workdir,
    )
    per_task: dict[int, Counter] = {}
    parent: dict[int, tuple[int, bool]] = {}  # child task -> (the task that made it, is a thread)
    started: set[int] = set()  # tasks whose trace begins with an execve
    for path in traces.iterdir():
        task = int(path.name.rsplit(".", 1)[1])
        kinds: Counter = Counter()
        with open(path, errors="replace") as trace:
            if trace.readline().startswith("execve("):
                started.add(task)
            trace.seek(0)
            for line in trace:
                match = _SYSCALL.match(line)
                if match is None:  # "<... resumed>", signals, exits
                    continue
                name = match.group(1)
                kinds[name] += 1
                if name in ("clone", "clone3", "fork", "vfork"):
                    made = _RETURN.search(line.rstrip())
                    if made and int(made.group(1)) > 0:
                        parent[int(made.group(1))] = (task, "CLONE_THREAD" in line)
        per_task[task] = kinds
    roots = [task for task in per_task if task not in parent]
    if len(roots) > 1:
        # A clone cut short by the program's exit (`= ?`: a thread of ours still starting the watcher
        # when the program ended) names no child, which then looks like a root of its own: the
        # program is the root strace started, whose trace begins with the command's execve.
        roots = [task for task in roots if task in started]
    if len(roots) != 1:
        raise Failed(f"strace wrote {len(per_task)} traces with {len(roots)} roots")

    def process_of(task: int) -> int:
        while task in parent and parent[task][1]:
            task = parent[task][0]
        return task

    program: Counter = Counter()
    helpers = 0
    for task, kinds in per_task.items():
        if process_of(task) == roots[0]:
            program.update(kinds)
        else:
            helpers += sum(kinds.values())
    return {"total": sum(program.values()), "kinds": dict(program), "helper_processes_total": helpers}


def startup(python: str, rounds: int, workdir: Path) -> dict[str, object]:
    """`IMPORTWATCH=1 IMPORTWATCH_WATCHER=1 python -c pass` against plain, and `IMPORTWATCH=1` alone
    (the watcher off, its default): medians in ms. Beside them, a program whose one line loads an
    extension module, as nearly every program's first lines do: what a first native load adds too."""
    env = base_env("")
    module = native_module(python)
    native = f"import {module}" if module else "pass"
    arms = {
        "plain": (env, "pass"),
        "traced": (dict(env, IMPORTWATCH="1", IMPORTWATCH_WATCHER="1"), "pass"),
        "unwatched": (dict(env, IMPORTWATCH="1", IMPORTWATCH_WATCHER="0"), "pass"),
        "plain native": (env, native),
        "native": (dict(env, IMPORTWATCH="1", IMPORTWATCH_WATCHER="0"), native),
    }
    for arm, code in arms.values():
        run_once([python, "-c", code], arm, workdir)
    runs: dict[str, list[Run]] = {name: [] for name in arms}
    for index in range(rounds):
        for name in list(arms)[:: -1 if index % 2 else 1]:
            arm, code = arms[name]
            runs[name].append(run_once([python, "-c", code], arm, workdir))

    def added(name: str, measure, base: str = "plain") -> float:
        return statistics.median(measure(t) - measure(p) for t, p in zip(runs[name], runs[base])) * 1e3

    return {
        "plain_ms": statistics.median(r.wall for r in runs["plain"]) * 1e3,
        "traced_ms": statistics.median(r.wall for r in runs["traced"]) * 1e3,
        "added_ms": added("traced", lambda r: r.wall),
        "added_cpu_ms": added("traced", cpu),
        "unwatched_added_ms": added("unwatched", lambda r: r.wall),
        "unwatched_added_cpu_ms": added("unwatched", cpu),
        "native_module": module,
        "native_added_ms": added("native", lambda r: r.wall, "plain native"),
        "native_added_cpu_ms": added("native", cpu, "plain native"),
        "rounds": rounds,
    }


def frames(python: str, cache: Path, workdir: Path) -> dict[str, dict[str, object]]:
    """Per mode: Python frames from one nested module body to the next, and the deepest nesting that works."""
    folder = generated(cache, f"probe-{PROBE_DEPTH}", write_probe)
    code = (
        "import builtins, sys\n"
        f"sys.setrecursionlimit({PROBE_LIMIT})\n"
        "try:\n    import probe_0\n    stop = 'none'\n"
        "except BaseException as error:\n    stop = type(error).__name__\n"
        "print(builtins.IW_PROBE_DEPTH, getattr(builtins, 'IW_PROBE_FRAMES', -1), stop)\n"
    )
    found = {}
    for mode in MODES:
        argv, extra = command(python, mode, code, workdir / "trace.log")
        (workdir / "trace.log").unlink(missing_ok=True)
        done = subprocess.run(
            argv, env=dict(base_env(str(folder)), **extra), stdin=subprocess.DEVNULL,
            capture_output=True, text=True, timeout=LIMIT_S,
        )  # fmt: skip
        fields = done.stdout.split()
        if done.returncode != 0 or len(fields) != 3:
            raise Failed(f"the frame probe failed in mode {mode} (status {done.returncode})")
        depth, per_import, stop = int(fields[0]), int(fields[1]), fields[2]
        found[mode] = {"frames_per_import": per_import, "deepest_nesting": depth + 1, "stopped_by": stop}
    return found


# -- figures ----------------------------------------------------------------------------------


def cpu(run: Run) -> float:
    return run.user + run.system


def summarise_timed(runs: dict[str, list[Run]]) -> dict[str, dict[str, float]]:
    """Per mode: medians, and for traced modes the medians of per-round ratios and differences to plain."""
    plain = runs["plain"]
    figures = {}
    for mode, arm in runs.items():
        row = {
            "wall_ms": statistics.median(r.wall for r in arm) * 1e3,
            "user_ms": statistics.median(r.user for r in arm) * 1e3,
            "sys_ms": statistics.median(r.system for r in arm) * 1e3,
            "minflt": statistics.median(r.minflt for r in arm),
            "majflt": statistics.median(r.majflt for r in arm),
            "fastest_wall_ms": min(r.wall for r in arm) * 1e3,
        }
        if mode != "plain":
            pairs = list(zip(arm, plain))
            wall_ratios = [t.wall / p.wall for t, p in pairs]
            row.update(
                ratio_wall=statistics.median(wall_ratios),
                ratio_wall_interval=list(median_interval(wall_ratios)),
                ratio_cpu=statistics.median(cpu(t) / cpu(p) for t, p in pairs),
                added_wall_ms=statistics.median(t.wall - p.wall for t, p in pairs) * 1e3,
                added_cpu_ms=statistics.median(cpu(t) - cpu(p) for t, p in pairs) * 1e3,
                added_user_ms=statistics.median(t.user - p.user for t, p in pairs) * 1e3,
                added_sys_ms=statistics.median(t.system - p.system for t, p in pairs) * 1e3,
                added_minflt=statistics.median(t.minflt - p.minflt for t, p in pairs),
                added_majflt=statistics.median(t.majflt - p.majflt for t, p in pairs),
            )
        figures[mode] = row
    return figures


def per_import(work: dict, baseline: dict) -> dict[str, dict[str, float]]:
    """Per traced mode: what it adds per import, beyond what it adds to `python -c pass` (its start-up)."""
    imports = work["imports"] - baseline["imports"]
    figures = {}
    for mode in MODES[1:]:
        ours, start = work["modes"][mode], baseline["modes"][mode]
        figures[mode] = {
            f"{what}_us": (ours[f"added_{what}_ms"] - start[f"added_{what}_ms"]) / imports * 1e3
            for what in ("wall", "cpu", "user", "sys")
        }
        figures[mode]["minflt"] = (ours["added_minflt"] - start["added_minflt"]) / imports
    return figures


STAT_CALLS = ("fstat", "newfstatat", "statx", "stat", "lstat", "fstat64", "fstatat64")


def syscalls_per_import(work: dict, baseline: dict, mode: str) -> dict[str, float]:
    """System calls MODE adds per import beyond its start-up, by kind (kinds that differ, largest first)."""
    imports = work["imports"] - baseline["imports"]

    def added(figures: dict, kind: str) -> int:
        calls = figures["syscalls"]
        if kind == "total":
            return calls[mode]["total"] - calls["plain"]["total"]
        kinds = STAT_CALLS if kind == "stat (all kinds)" else (kind,)
        return sum(calls[mode]["kinds"].get(k, 0) - calls["plain"]["kinds"].get(k, 0) for k in kinds)

    names = {
        k for figures in (work, baseline) for m in (mode, "plain") for k in figures["syscalls"][m]["kinds"]
    }
    extra = {
        k: (added(work, k) - added(baseline, k)) / imports for k in [*names, "stat (all kinds)", "total"]
    }
    return dict(sorted(((k, v) for k, v in extra.items() if v), key=lambda kv: -abs(kv[1])))


def measure_workload(
    python: str, work: Workload, rounds: int, workdir: Path, skipped: list[str]
) -> dict[str, object]:
    """Timed rounds of every mode, then one run of each under strace (None where strace cannot run)."""
    log(f"{python}: {work.name}: {rounds} rounds of {len(MODES)} modes")
    runs, imports, lines = timed(python, work, rounds, workdir)
    figures: dict[str, object] = {
        "imports": imports,
        "lines_logged_per_import": lines / imports if imports else None,
        "rounds": rounds,
        "modes": summarise_timed(runs),
        "syscalls": None,
    }
    if shutil.which("strace") is not None:
        log(f"{python}: {work.name}: strace, {len(MODES)} modes")
        try:
            figures["syscalls"] = {mode: strace_counts(python, work, mode, workdir) for mode in MODES}
        except Failed as error:  # ptrace refused, say: the timings stand
            skipped.append(f"{work.name}: system calls: {error}")
    return figures


def measure(python: str, options, cache: Path, workdir: Path) -> dict[str, object]:
    """Every figure for one interpreter; a figure that fails says why and the others go on."""
    result: dict[str, object] = {"executable": python, "workloads": {}, "skipped": []}
    skipped: list[str] = result["skipped"]
    if shutil.which("strace") is None:
        skipped.append("system calls: strace is not installed")
    try:
        # What each mode adds to `python -c pass`: subtracted, so that per-import figures leave start-up out.
        baseline = measure_workload(
            python, Workload("start", "pass", ""), options.startup_rounds, workdir, skipped
        )
    except Failed as error:
        skipped.append(f"start-up baseline: {error}")
        baseline = None
    result["baseline"] = baseline
    for work in workloads(options.workloads, cache, options.modules, options.depth):
        if (
            work.name == "torch"
            and subprocess.run([python, "-c", "import torch"], capture_output=True).returncode
        ):
            skipped.append("torch: not importable by this interpreter")
            continue
        try:
            rounds = options.torch_rounds if work.name == "torch" else options.rounds
            figures = measure_workload(python, work, rounds, workdir, skipped)
        except Failed as error:
            skipped.append(f"{work.name}: {error}")
            continue
        if baseline is not None:
            figures["per_import"] = per_import(figures, baseline)
            if figures["syscalls"] and baseline["syscalls"]:
                figures["syscalls_per_import"] = {
                    m: syscalls_per_import(figures, baseline, m) for m in MODES[1:]
                }
        result["workloads"][work.name] = figures
    log(f"{python}: start-up, {options.startup_rounds} rounds")
    try:
        result["startup"] = startup(python, options.startup_rounds, workdir)
    except Failed as error:
        result["startup"] = None
        skipped.append(f"start-up: {error}")
    log(f"{python}: frame probe")
    try:
        result["frames"] = frames(python, cache, workdir)
    except (Failed, subprocess.TimeoutExpired) as error:
        result["frames"] = None
        skipped.append(f"frame probe: {error}")
    result["targets"] = targets(result)
    return result


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--versions", default=",".join(VERSIONS), help="comma-separated, from 3.9 to 3.13")
    parser.add_argument(
        "--current", action="store_true", help="only this interpreter (it must have importwatch)"
    )
    parser.add_argument("--workloads", default=None, help=f"comma-separated, from {','.join(WORKLOADS)}")
    parser.add_argument("--rounds", type=int, default=None, help="timed rounds per workload (default 5)")
    parser.add_argument(
        "--torch-rounds", type=int, default=None, help="timed rounds of import torch (default 5)"
    )
    parser.add_argument("--startup-rounds", type=int, default=None, help="pairs for start-up (default 11)")
    parser.add_argument("--modules", type=int, default=None, help="modules in the tree (default 4000)")
    parser.add_argument("--depth", type=int, default=None, help="modules in the chain (default 100)")
    parser.add_argument(
        "--quick", action="store_true", help="1 round, 200 modules, a chain of 20, no torch unless named"
    )
    parser.add_argument("--json", action="store_true", help="print the figures as JSON instead of tables")
    default_cache = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "importwatch-bench"
    parser.add_argument("--cache", type=Path, default=default_cache, help="generated trees and venvs")
    options = parser.parse_args()
    quick = options.quick

    def pick(value, normal, fast):
        return value if value is not None else (fast if quick else normal)

    options.rounds = pick(options.rounds, 5, 1)
    options.torch_rounds = pick(options.torch_rounds, 5, 1)
    options.startup_rounds = pick(options.startup_rounds, 11, 3)
    options.modules = pick(options.modules, 4000, 200)
    options.depth = pick(options.depth, 100, 20)
    named = options.workloads.split(",") if options.workloads else list(WORKLOADS[:2] if quick else WORKLOADS)
    options.workloads = [w for w in named if w]
    versions = [v for v in options.versions.split(",") if v]
    bad = [w for w in options.workloads if w not in WORKLOADS] + [v for v in versions if v not in VERSIONS]
    if (
        bad
        or min(options.rounds, options.torch_rounds, options.startup_rounds, options.modules, options.depth)
        < 1
    ):
        parser.error(f"unknown workload or version, or a count below 1: {', '.join(bad) or 'a count'}")
    cache = options.cache.resolve()
    cache.mkdir(parents=True, exist_ok=True)
    results: dict[str, object] = {
        "cpus": os.cpu_count(),
        "load_before": [round(x, 2) for x in os.getloadavg()],
        "strace": shutil.which("strace") is not None,
        "options": {k: v for k, v in vars(options).items() if k != "cache"},
        "pythons": {},
    }
    with tempfile.TemporaryDirectory() as tmp:
        workdir = Path(tmp)
        if options.current:
            targets_to_run = [(None, sys.executable)]
        else:
            targets_to_run = [(version, None) for version in versions]
        for version, python in targets_to_run:
            try:
                if python is None:
                    python = venv_python(version, cache)
                elif not has_importwatch(python):
                    raise Failed(f"{python} cannot import importwatch")
                version = interpreter_version(python)
                results["pythons"][version] = measure(python, options, cache, workdir)
            except (Failed, OSError, subprocess.SubprocessError) as error:
                log(f"python {version}: skipped: {error}")
                results["pythons"][version or sys.version.split()[0]] = {"error": str(error)}
    results["load_after"] = [round(x, 2) for x in os.getloadavg()]
    print(json.dumps(results, indent=1) if options.json else table(results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
