"""Where an import's cost with every line goes: the hook, making the two lines, and writing them.

    python benchmarks/bench_line_parts.py [--rounds 21] [--modules 4000]

Times `import bench_all` (bench_overhead.py's tree) inside each process, as bench_inside.py does, in
alternating rounds of five modes, all under `IMPORTWATCH=1` with the C accelerator:

    plain               python -c CODE
    stalls              IMPORTWATCH_STDERR=stalls: the hook alone, no line made
    lines, unwritten    every line on stderr and in a log, made in full and handed to write(2), from a
                        copy of the package whose C accelerator is compiled here with write(2) made a
                        stand-in that writes nothing (`-include` of a header that defines it away)
    lines, /dev/null    every line, stderr and the log both /dev/null: four system calls that do nothing
    lines, files        every line, stderr and the log both files (bench_inside.py's `log`)

and prints the parts, per import, from the medians of each mode's difference with plain within a
round: the hook; making two lines (unwritten less stalls); their four writes to /dev/null, and to
files, each less unwritten. The last is what the contract (each line flushed to stderr and to the
log as it happens) costs inside a running import, where the kernel's code and data meet cold
caches; bench_write_floor.py times the same write in a tight loop. The stand-in build is checked: its
log must hold no import line. Linux, a C compiler and Python's headers; standard library only.
"""

from __future__ import annotations

import argparse
import os
import shlex
import shutil
import statistics
import subprocess
import sys
import sysconfig
import tempfile
from pathlib import Path

from bench_inside import _TIMED, _run
from bench_overhead import make_tree, measured_env

ROOT = Path(__file__).resolve().parent.parent
# Included before _speedups.c's own text: Python.h first (as that file has it), then unistd.h's
# declaration of write, which the macro after it leaves alone; every later call is the stand-in.
_NO_WRITE = """\
#include <Python.h>
#include <unistd.h>
#define write(fd, data, size) ((void)(fd), (void)(data), (ssize_t)(size))
"""


def build_without_writes(folder: Path) -> Path:
    """A copy of the importwatch package in FOLDER whose C accelerator writes nothing; FOLDER for PYTHONPATH."""
    package = ROOT / "src" / "importwatch"
    shutil.copytree(package, folder / "importwatch", ignore=shutil.ignore_patterns("*.so", "__pycache__"))
    header = folder / "no_write.h"
    header.write_text(_NO_WRITE)
    config = sysconfig.get_config_vars()
    source = folder / "importwatch" / "tracing" / "_speedups.c"
    target = source.with_name("_speedups" + (config.get("EXT_SUFFIX") or ".so"))
    cc = shlex.split(config.get("CC") or "cc")
    flags = shlex.split(config.get("CFLAGS") or "") + shlex.split(config.get("CCSHARED") or "")
    obj = folder / "_speedups.o"
    include = sysconfig.get_paths()["include"]
    subprocess.run(
        [*cc, *flags, "-include", str(header), "-I", include, "-c", str(source), "-o", str(obj)], check=True
    )
    subprocess.run(
        [*shlex.split(config.get("LDSHARED") or f"{cc[0]} -shared"), str(obj), "-o", str(target)], check=True
    )
    return folder


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=21, help="rounds of every mode (default 21)")
    parser.add_argument("--modules", type=int, default=4000, help="modules in the tree (default 4000)")
    options = parser.parse_args()
    python = sys.executable
    base = measured_env()
    base["IMPORTWATCH"] = "1"
    base["IMPORTWATCH_PURE"] = "0"
    with tempfile.TemporaryDirectory() as scratch:
        folder = Path(scratch)
        tree = folder / "tree"
        tree.mkdir()
        make_tree(tree, options.modules)
        imports = sum(1 for _ in tree.glob("bench_pkg*/mod*.py")) + len(list(tree.glob("bench_pkg*"))) + 1
        unwritten = build_without_writes(folder / "no_write")
        log, stderr = folder / "trace.log", folder / "stderr.txt"
        every_line = dict(base, PYTHONPATH=str(tree), IMPORTWATCH_LOG=str(log))
        modes = {
            "plain": ({k: v for k, v in every_line.items() if not k.startswith("IMPORTWATCH")}, stderr),
            "stalls": (dict(base, PYTHONPATH=str(tree), IMPORTWATCH_STDERR="stalls"), stderr),
            "lines, unwritten": (dict(every_line, PYTHONPATH=f"{unwritten}{os.pathsep}{tree}"), stderr),
            "lines, /dev/null": (dict(every_line, IMPORTWATCH_LOG=os.devnull), Path(os.devnull)),
            "lines, files": (every_line, stderr),
        }
        _run(python, ["-c", _TIMED], modes["plain"][0], stderr)  # bytecode caches written first
        runs: dict[str, list[tuple[float, float]]] = {name: [] for name in modes}
        for index in range(options.rounds):
            for name in list(modes) if index % 2 else list(reversed(modes)):
                env, stderr_to = modes[name]
                log.unlink(missing_ok=True)
                runs[name].append(_run(python, ["-c", _TIMED], env, stderr_to))
                if name == "lines, unwritten" and " > bench_pkg" in log.read_text(errors="replace"):
                    raise SystemExit("bench_line_parts: the stand-in build wrote import lines")
    added = {
        name: statistics.median(w - pw for (w, _), (pw, _) in zip(results, runs["plain"])) / imports * 1e6
        for name, results in runs.items()
    }
    print(
        f"python {sys.version.split()[0]}: {imports} imports, {options.rounds} rounds, timed inside each process"
    )
    for name in modes:
        print(f"  {name:17s} {added[name]:+6.2f} us per import over plain (wall)")
    made = added["lines, unwritten"]
    print("parts, per import:")
    print(f"  the hook                    {added['stalls']:5.2f} us")
    print(f"  making the two lines        {made - added['stalls']:5.2f} us")
    for name, what in (("lines, /dev/null", "to /dev/null"), ("lines, files", "to files    ")):
        writes = added[name] - made
        print(f"  four writes {what}    {writes:5.2f} us ({writes / 4:.2f} each)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
