"""Per-import cost timed inside each process: the imports alone, without start-up and exit.

    python benchmarks/bench_inside.py [--rounds 51] [--modules 4000] [--log] [--runner] [--top-level]

Each process times `import bench_all` (a generated tree of small modules, as
bench_kernel.py makes it) with time.perf_counter and time.process_time around that one
statement, and prints both. The modes run in alternating order, round after round:

    plain     python -c CODE
    loaded    the same, after importing importwatch's start-up modules: nothing traced
    stalls    IMPORTWATCH=1 IMPORTWATCH_STDERR=stalls python -c CODE   (no log, no watcher)
    log       IMPORTWATCH=1 IMPORTWATCH_LOG=FILE (with --log): every line on stderr, a file, and in the log
    log, stderr piped   the same with stderr a pipe we read as lines come (with --log): each line
              wakes the reader, which the kernel makes the writer pay for (any program's flushed
              line costs that: docs/performance.md)
    runner stalls, runner log (with --runner; the log too with --log)
              python -m importwatch --stderr stalls -c CODE (its watcher on, as by default),
              python -m importwatch --log FILE -c CODE: the runner's start-up, two interpreters,
              stays out of the figure as the others' does

With --top-level the same imports are made at the program's top level (bench_all.py's lines run
by exec in __main__, compiled before the clock starts), as a script's own imports are: each is
then a thread's first step, which also looks at our descriptors (one fstat each) and asks
whether the watchdog must cover it (docs/performance.md). Nested imports never pay that.

`IMPORTWATCH_PURE=1 python benchmarks/bench_inside.py ...` times the pure-Python twin of the C hook.

Each figure is the median over rounds of (mode - plain) within a round, per import. A
process's start-up and exit, and their noise, stay out of it; "loaded" shows what merely
having importwatch's modules in the process costs the imports (a larger heap), and what the
machine's noise is. Why time and instruction counts differ here (cache misses and branch
mispredictions, not instructions): docs/performance.md. Standard library only.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from bench_overhead import make_tree, measured_env

_TIMED = (
    "import time; t = time.perf_counter(); c = time.process_time(); import bench_all; "
    "print(time.perf_counter() - t, time.process_time() - c)"
)


def _timed_at_top_level(tree: Path) -> str:
    """_TIMED with bench_all.py's imports run in __main__ itself, each with nothing in flight."""
    return (
        f"import time; code = compile(open({str(tree / 'bench_all.py')!r}).read(), 'bench_all', 'exec'); "
        "t = time.perf_counter(); c = time.process_time(); exec(code); "
        "print(time.perf_counter() - t, time.process_time() - c)"
    )


def _start_up_modules(python: str) -> list[str]:
    """importwatch's modules that IMPORTWATCH=1 loads at start (the C module left to the import of the rest)."""
    env = dict(os.environ, IMPORTWATCH="1", IMPORTWATCH_STDERR="none", IMPORTWATCH_TIMEOUT="0")
    code = "import sys; print(' '.join(m for m in sys.modules if m.startswith('importwatch')))"
    found = subprocess.run([python, "-c", code], env=env, capture_output=True, text=True, check=True).stdout
    return [name for name in found.split() if not name.endswith("._speedups")]


def _run(python: str, args: list[str], env: dict[str, str], stderr: Path | None) -> tuple[float, float]:
    """The figures of one process, its stderr to the file STDERR (made afresh), or to a pipe read as it comes."""
    if stderr is None:
        done = subprocess.run([python, *args], env=env, capture_output=True, text=True, check=True)
    else:
        with open(stderr, "wb") as sink:
            done = subprocess.run(
                [python, *args], env=env, stdout=subprocess.PIPE, stderr=sink, text=True, check=True
            )
    wall, cpu = done.stdout.split()[-2:]
    return float(wall), float(cpu)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=51, help="rounds of every mode (default 51)")
    parser.add_argument("--modules", type=int, default=4000, help="modules in the tree (default 4000)")
    parser.add_argument("--log", action="store_true", help="also time every line on stderr and in a log")
    parser.add_argument(
        "--runner", action="store_true", help="also time the same under python -m importwatch"
    )
    parser.add_argument(
        "--top-level", action="store_true", help="make the imports at the program's top level, not nested"
    )
    options = parser.parse_args()
    python = sys.executable
    base = measured_env()
    with tempfile.TemporaryDirectory() as scratch:
        folder = Path(scratch)
        make_tree(folder, options.modules)
        packages = list(folder.glob("bench_pkg*"))  # each imported too, as is bench_all
        modules = sum(len(list(package.glob("mod*.py"))) for package in packages) + len(packages)
        imports = modules if options.top_level else modules + 1  # bench_all itself, when it is imported
        timed = _timed_at_top_level(folder) if options.top_level else _TIMED
        base["PYTHONPATH"] = str(folder)
        loaded = "".join(f"import {name}; " for name in _start_up_modules(python))
        log = str(folder / "trace.log")
        stderr = folder / "stderr.txt"
        modes = {
            "plain": (base, ["-c", timed], stderr),
            "loaded": (base, ["-c", loaded + timed], stderr),
            "stalls": (dict(base, IMPORTWATCH="1", IMPORTWATCH_STDERR="stalls"), ["-c", timed], stderr),
        }
        if options.log:
            logged = dict(base, IMPORTWATCH="1", IMPORTWATCH_LOG=log)
            modes["log"] = (logged, ["-c", timed], stderr)
            modes["log, stderr piped"] = (logged, ["-c", timed], None)
        if options.runner:
            modes["runner stalls"] = (base, ["-m", "importwatch", "--stderr", "stalls", "-c", timed], stderr)
            if options.log:
                modes["runner log"] = (base, ["-m", "importwatch", "--log", log, "-c", timed], stderr)
        _run(python, ["-c", timed], base, stderr)  # bytecode caches written first: compiling is not tracing
        runs: dict[str, list[tuple[float, float]]] = {name: [] for name in modes}
        for index in range(options.rounds):
            order = list(modes) if index % 2 else list(reversed(modes))
            for name in order:
                env, args, stderr_to = modes[name]
                runs[name].append(_run(python, args, env, stderr_to))
    print(
        f"python {sys.version.split()[0]}{', pure-Python hook' if base.get('IMPORTWATCH_PURE') == '1' else ''}: "
        f"{imports} imports{' at top level' if options.top_level else ''}, "
        f"{options.rounds} rounds, timed inside each process"
    )
    for name, results in runs.items():
        wall = statistics.median(w for w, _ in results) * 1000
        added = [(w - pw, c - pc) for (w, c), (pw, pc) in zip(results, runs["plain"])]
        per_wall = statistics.median(a for a, _ in added) / imports * 1e6
        per_cpu = statistics.median(b for _, b in added) / imports * 1e6
        print(
            f"  {name:17s} {wall:7.1f} ms; over plain, per import: {per_wall:+6.2f} us wall, {per_cpu:+6.2f} us CPU"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
