"""Tracing overhead as instructions executed, counted by valgrind: a figure that machine noise cannot move.

    python benchmarks/bench_instructions.py [--code "import torch"] [--timeout-off] [--quiet] [--per-import N]

Runs CODE once plain and once traced (IMPORTWATCH=1, every event written to a log
file, stderr to a file; the C hook where built, its pure-Python twin under
IMPORTWATCH_PURE=1) under `valgrind --tool=callgrind`, and prints the user-space
instructions of each and their ratio. On a shared machine the timed benchmark
(bench_overhead.py) needs hundreds of pairs; this count repeats to within a few
millions in five billions. It leaves out what instructions do not show: the kernel's
side of system calls (the writes), cache misses, and waiting. Each run takes about a
minute for `import torch` (valgrind runs code some fifty times slower).
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

_COLLECTED = re.compile(r"Collected : (\d+)")


def count(code: str, env: dict[str, str], workdir: Path) -> int:
    """User-space instructions of `python -c CODE` under ENV, as callgrind counts them."""
    command = ["valgrind", "--tool=callgrind", "--callgrind-out-file=/dev/null", sys.executable, "-c", code]
    with open(workdir / "stderr.txt", "wb") as stderr:
        subprocess.run(command, env=env, stdout=subprocess.DEVNULL, stderr=stderr, check=True)
    match = _COLLECTED.search((workdir / "stderr.txt").read_text(errors="replace"))
    if match is None:
        raise SystemExit("bench_instructions: valgrind printed no instruction count")
    return int(match.group(1))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--code", default="import torch", help='what to run (default: "import torch")')
    parser.add_argument("--timeout-off", action="store_true", help="trace with IMPORTWATCH_TIMEOUT=0")
    parser.add_argument("--quiet", action="store_true", help="trace with --stderr stalls and no log")
    parser.add_argument(
        "--per-import",
        type=int,
        metavar="N",
        help="CODE makes N imports: also count `pass` both ways, and print the instructions added per import",
    )
    args = parser.parse_args()
    if shutil.which("valgrind") is None:
        raise SystemExit("bench_instructions: valgrind is not installed")
    # Our variables left out, but IMPORTWATCH_PURE=1: the pure-Python twin of the C hook measured.
    base = {k: v for k, v in os.environ.items() if not k.startswith("IMPORTWATCH")}
    pure = os.environ.get("IMPORTWATCH_PURE")
    base.pop("PYTHONDONTWRITEBYTECODE", None)  # bytecode caches written, as in an installation
    base["PYTHONHASHSEED"] = "0"  # the same dictionaries in every run
    with tempfile.TemporaryDirectory() as tmp:
        workdir = Path(tmp)
        traced = dict(base, IMPORTWATCH="1", IMPORTWATCH_LOG=str(workdir / "trace.log"))
        if args.quiet:
            traced["IMPORTWATCH_STDERR"] = "stalls"
            del traced["IMPORTWATCH_LOG"]
        if pure is not None:
            traced["IMPORTWATCH_PURE"] = pure
        if args.timeout_off:
            traced["IMPORTWATCH_TIMEOUT"] = "0"
        for env in (base, traced):  # write the bytecode caches first: compiling is not tracing
            subprocess.run([sys.executable, "-c", args.code], env=env, capture_output=True, check=True)
        plain_count = count(args.code, base, workdir)
        traced_count = count(args.code, traced, workdir)
        if args.per_import:  # start-up, counted apart, is left out
            start_up = count("pass", traced, workdir) - count("pass", base, workdir)
    print(f"python {sys.version.split()[0]}: {args.code!r}")
    print(f"  plain  {plain_count / 1e6:10.1f} M instructions")
    print(f"  traced {traced_count / 1e6:10.1f} M instructions")
    extra = traced_count - plain_count
    print(f"  +{extra / 1e6:.1f} M, traced/plain {traced_count / plain_count:.4f}")
    if args.per_import:
        each = (extra - start_up) / args.per_import
        print(
            f"  start-up +{start_up / 1e6:.1f} M; each of the {args.per_import} imports +{each:,.0f} instructions"
        )


if __name__ == "__main__":
    main()
