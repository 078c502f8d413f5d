"""What one write(2) of a line costs here: the floor under any figure per import with every line written.

    python benchmarks/bench_write_floor.py [--writes 200000] [--folder DIR]

importwatch writes each line with one write(2) per channel, at once (the contract: the last
line written names the culprit of a hang), so an import with every line on stderr and in a log
costs four writes, whatever else it saves. This times N os.write calls of one 70-byte line
appended to a file in DIR (a temporary folder by default; give the folder a log would live in)
and to /dev/null, in CPU time of this process (user and system, from getrusage), less an empty
loop of the same length, and prints microseconds per write and for the four of an import.
Python's own share of each call (about 0.1 us) is left in.

Then a pipe whose reader waits for each line, as a job's stderr often is (a launcher, a container
runtime, `| tee`): lines come apart, each after some work of the program's (as an import's lines
do), so each one finds the reader asleep and the kernel wakes it, in the writer's time. That is
timed around each write (wall time, nearly all of it the kernel's), for a tenth of the writes.
Standard library only.
"""

from __future__ import annotations

import argparse
import os
import resource
import subprocess
import sys
import tempfile
import time

LINE = b"[importwatch 12345 12:34:56.789]     > package.module_name_of_some_length\n"[:69] + b"\n"
# The program's work between two lines to the pipe: some tens of microseconds, as between an import's.
_WORK = 2000
# The reader: another process that reads what comes, as it comes.
_READER = "import os\nwhile os.read(0, 65536):\n    pass\n"


def cpu() -> tuple[float, float]:
    """(user + system, system) CPU seconds of this process so far, to the microsecond."""
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime, usage.ru_stime


def per_write(fd: int, count: int) -> tuple[float, float]:
    """(CPU seconds, system seconds) per os.write of LINE to FD, less the loop's own CPU."""
    write, line = os.write, LINE
    start = cpu()
    for _ in range(count):
        write(fd, line)
    end = cpu()
    for _ in range(count):
        pass
    loop = cpu()[0] - end[0]
    return (end[0] - start[0] - loop) / count, (end[1] - start[1]) / count


def per_write_to_waiting_reader(count: int) -> float:
    """Seconds per os.write of LINE to a pipe whose reader waits for it, timed around the write alone."""
    reader = subprocess.Popen([sys.executable, "-c", _READER], stdin=subprocess.PIPE)
    assert reader.stdin is not None
    fd, write, line, clock = reader.stdin.fileno(), os.write, LINE, time.perf_counter
    spent = 0.0
    try:
        for _ in range(count):
            for _ in range(_WORK):
                pass
            start = clock()
            write(fd, line)
            spent += clock() - start
    finally:
        reader.stdin.close()
        reader.wait()
    return spent / count


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--writes", type=int, default=200_000, help="writes per target (default 200000)")
    parser.add_argument(
        "--folder", default=None, help="where the file is written (default: a temporary folder)"
    )
    args = parser.parse_args()
    if args.writes <= 0:
        raise SystemExit("bench_write_floor: --writes must be positive")
    with tempfile.TemporaryDirectory(dir=args.folder) as folder:
        path = os.path.join(folder, "floor.log")
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_EXCL, 0o600)
        try:
            to_file = per_write(fd, args.writes)
        finally:
            os.close(fd)
    fd = os.open(os.devnull, os.O_WRONLY)
    try:
        to_null = per_write(fd, args.writes)
    finally:
        os.close(fd)
    print(f"one {len(LINE)}-byte line, {args.writes} writes each, CPU per write (of it system):")
    for name, (spent, system) in (("a file, appended", to_file), ("/dev/null", to_null)):
        print(f"  {name:18} {spent * 1e6:5.2f} us ({system * 1e6:.2f} us)")
    print(f"  an import's four (two lines, stderr and a log, both files): {4 * to_file[0] * 1e6:.2f} us")
    to_pipe = per_write_to_waiting_reader(max(1, args.writes // 10))
    print(
        f"  a pipe whose reader waits for each line: {to_pipe * 1e6:.2f} us per write (wall, around the write)"
    )


if __name__ == "__main__":
    main()
