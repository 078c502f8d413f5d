"""What tracing adds to each native load: C extension modules imported, timed inside each process.

    python benchmarks/bench_native.py [--rounds 21] [--modules 200]

Builds MODULES tiny C extension modules (each its own file, as a package of a scientific stack
ships them: scipy has hundreds) with the system C compiler and this interpreter's headers, then
times `import ext0 ... extN` with time.perf_counter around those statements alone, in fresh
processes, the modes in alternating order, round after round:

    plain     python
    stalls    IMPORTWATCH=1 IMPORTWATCH_STDERR=stalls   (no log, no watcher)
    log       IMPORTWATCH=1 with a log: every line on stderr (a file) and in the log

each once as the process starts (no ctypes) and once after `import ctypes` (which numpy and torch
import early): with ctypes, what a load mapped besides its own file is read from the dynamic loader's
own list; without it, from /proc/self/maps, which a load that brings a new library reads again. The
figure is the median over rounds of (mode - plain) within a round, per load: our part of the load
(its ELF read, its chain step, its two lines, the look at what it mapped) and the import around it
(an import's own cost: bench_inside.py). Standard library only; a C compiler is needed.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import sysconfig
import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from bench_inside import _run
from bench_overhead import measured_env

_SOURCE = """#include <Python.h>
static struct PyModuleDef def = {PyModuleDef_HEAD_INIT, "%(name)s", NULL, -1, NULL};
PyMODINIT_FUNC PyInit_%(name)s(void) { return PyModule_Create(&def); }
"""

_TIMED = (
    "import os, time\n"
    "if os.environ.get('BENCH_CTYPES'): import ctypes\n"
    "code = compile(open({program!r}).read(), 'loads', 'exec')\n"
    "t = time.perf_counter(); c = time.process_time(); exec(code)\n"
    "print(time.perf_counter() - t, time.process_time() - c)\n"
)


def build(folder: Path, count: int) -> Path:
    """COUNT extension modules ext0..extN in FOLDER, and the program that imports them; returns it."""
    compiler = shutil.which("cc") or shutil.which("gcc") or shutil.which("clang")
    if compiler is None:
        raise SystemExit("bench_native: no C compiler (cc) on this machine")
    include = sysconfig.get_paths()["include"]
    suffix = sysconfig.get_config_var("EXT_SUFFIX") or ".so"

    def one(index: int) -> None:
        name = f"ext{index}"
        source = folder / f"{name}.c"
        source.write_text(_SOURCE % {"name": name})
        out = folder / f"{name}{suffix}"
        command = [compiler, "-shared", "-fPIC", "-O1", f"-I{include}", str(source), "-o", str(out)]
        done = subprocess.run(command, capture_output=True, text=True)
        if done.returncode != 0:
            raise SystemExit(f"bench_native: cannot compile {source.name}: {done.stderr.strip()[:200]}")
        source.unlink()

    with ThreadPoolExecutor(max_workers=os.cpu_count() or 2) as pool:
        list(pool.map(one, range(count)))
    program = folder / "loads.py"
    program.write_text("".join(f"import ext{index}\n" for index in range(count)))
    return program


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=21, help="rounds of every mode (default 21)")
    parser.add_argument("--modules", type=int, default=200, help="extension modules (default 200)")
    options = parser.parse_args()
    python = sys.executable
    base = measured_env()
    with tempfile.TemporaryDirectory() as scratch:
        folder = Path(scratch)
        (folder / "ext").mkdir()
        program = build(folder / "ext", options.modules)
        timed = _TIMED.format(program=str(program))
        base["PYTHONPATH"] = str(program.parent)
        log = str(folder / "trace.log")
        stderr = folder / "stderr.txt"
        modes = {
            "plain": base,
            "stalls": dict(base, IMPORTWATCH="1", IMPORTWATCH_STDERR="stalls"),
            "log": dict(base, IMPORTWATCH="1", IMPORTWATCH_LOG=log),
        }
        hot_path = "pure-Python hook" if base.get("IMPORTWATCH_PURE", "") not in ("", "0") else "C hook"
        count = options.modules
        print(f"python {sys.version.split()[0]}, {hot_path}: {count} native loads, {options.rounds} rounds")
        for with_ctypes in (False, True):
            runs: dict[str, list[float]] = {name: [] for name in modes}
            for index in range(options.rounds):
                for name in list(modes) if index % 2 else list(reversed(modes)):
                    env = dict(modes[name], BENCH_CTYPES="1" if with_ctypes else "")
                    runs[name].append(_run(python, ["-c", timed], env, stderr)[0])  # wall
            plain = runs["plain"]
            print(f"  {'after import ctypes' if with_ctypes else 'no ctypes'}:")
            middle = statistics.median(plain)
            print(f"    plain   {middle * 1e3:8.2f} ms, {middle / count * 1e6:.1f} us per load")
            for name in ("stalls", "log"):
                added = statistics.median(b - a for a, b in zip(plain, runs[name]))
                print(f"    {name:7s} {added / count * 1e6:+8.1f} us per load over plain")
    return 0


if __name__ == "__main__":
    sys.exit(main())
