"""`importwatch report` on a generated log of about 100 MB: time and peak memory against a plain line loop.

    python benchmarks/bench_report.py [--mb 100] [--format summary] [--jsonl] [--json] [--floor] [--keep DIR]

The log mixes what real logs hold: many processes (some forked mid-import, some
hung at the end), several threads each, nested imports with their ends, native
loads with their verdicts, stall reports and their dumps. `report` runs in a child
process; its peak RSS is that child's (resource.getrusage of the children). The
plain loop is `for line in file: count += 1` over the same file, in a child too,
text mode (it decodes, as report must). Wall and CPU time are both given: on a
shared machine the CPU time is the steadier. --floor times what any reading costs:
report's chunked reader alone, and with its line pattern matched on every line.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import subprocess
import sys
import tempfile
import time

TARGET_RSS_MB = 200
TARGET_RATIO = 2.0
_MODULES = [f"pkg{a}.mod{b}" for a in range(40) for b in range(25)]
_LOOP = "import sys\ncount = 0\nwith open(sys.argv[1], encoding='utf-8', errors='replace') as file:\n"
_LOOP += "    for line in file:\n        count += 1\nprint(count)\n"


# What any reading of the log costs, in one process, CPU seconds (best of 3): the plain loop, report's
# chunked reader alone, and that reader with the summary's line pattern matched on every line.
_FLOOR = """
import sys, time
from importwatch.tools.report.fastread import JSON_LINE, TEXT_LINE
from importwatch.tools.report.logread import chunks, open_log
path, pattern = sys.argv[1], JSON_LINE if sys.argv[2] == "jsonl" else TEXT_LINE
def loop():
    with open(path, encoding="utf-8", errors="replace") as file:
        for line in file:
            pass
def read():
    with open_log(path) as file:
        for lines in chunks(file, path):
            pass
def match():
    with open_log(path) as file:
        for lines in chunks(file, path):
            for found in map(pattern, lines):
                if found is not None:
                    found.groups()
def timed(step):
    began = time.process_time()
    step()
    return time.process_time() - began
print(*(round(min(timed(step) for _ in range(3)), 3) for step in (loop, read, match)))
"""


def _clock(seconds: float) -> str:
    whole = int(seconds)
    return time.strftime("%H:%M:%S", time.gmtime(whole)) + f".{int((seconds - whole) * 1000):03d}"


def _process_lines(rng: random.Random, pid: int, start: float, json_lines: bool) -> list[str]:
    """One process's lines: a banner, a few threads' nested imports and loads, maybe a hang."""
    lines: list[str] = []
    now = start

    def emit(thread: str, kind: str, body: str, fields: dict | None = None) -> None:
        if json_lines:
            record = {"time": now, "pid": pid, "thread": thread, "kind": kind, **(fields or {}), "text": body}
            lines.append(json.dumps(record))
        else:
            where = "" if thread == "MainThread" else f" {thread}"
            lines.append(f"[importwatch {pid} {_clock(now)}{where}] {body}")

    emit(
        "MainThread",
        "start",
        f"start python 3.11.7 /venv/bin/python argv=['job.py', '--rank', '{pid % 8}'] cwd=/job",
    )
    emit("MainThread", "env", "env CUDA_VISIBLE_DEVICES=0 LD_LIBRARY_PATH=/usr/local/cuda/lib64")
    threads = ["MainThread"] + [f"loader-{n}" for n in range(rng.randint(0, 3))]
    hung = rng.random() < 0.05
    for thread in threads:
        # (name or path, start, kind, the start's JSON fields: the end's repeat them, as the writer's do)
        stack: list[tuple[str, float, str, dict]] = []
        for _ in range(rng.randint(150, 450)):
            now += rng.random() * 0.002
            if stack and (len(stack) > 6 or rng.random() < 0.5):
                name, began, kind, fields = stack.pop()
                ms = (now - began) * 1000.0
                indent = "  " * len(stack)
                if kind == "native":
                    emit(thread, "native_end", f"{indent}< dlopen {name} {ms:.3f} ms", {**fields, "ms": ms})
                else:
                    emit(thread, "import_end", f"{indent}< {name} {ms:.3f} ms", {**fields, "ms": ms})
                continue
            indent = "  " * len(stack)
            if stack and rng.random() < 0.08:
                path = (
                    f"/venv/lib/python3.11/site-packages/{stack[-1][0].replace('.', '/')}/_ext.cpython-311.so"
                )
                fields = {"path": path, "owner": stack[-1][0]}
                emit(thread, "native", f"{indent}> dlopen {path} ({stack[-1][0]})", fields)
                if rng.random() < 0.1:
                    emit(
                        thread,
                        "verdict",
                        f"{indent}! _ext.so needs libcudart.so.11.0 (CUDA 11)",
                        {"path": path, "verdict": "_ext.so needs libcudart.so.11.0 (CUDA 11)"},
                    )
                stack.append((path, now, "native", fields))
            else:
                name = rng.choice(_MODULES)
                fields = {"name": name, "parent": stack[-1][0] if stack else None}
                emit(thread, "import", f"{indent}> {name}", fields)
                stack.append((name, now, "import", fields))
        if not hung:
            while stack:
                now += 0.0001
                name, began, kind, fields = stack.pop()
                ms = (now - began) * 1000.0
                word = "dlopen " if kind == "native" else ""
                emit(
                    thread,
                    f"{kind}_end",
                    f"{'  ' * len(stack)}< {word}{name} {ms:.3f} ms",
                    {**fields, "ms": ms},
                )
    if hung:
        emit("watchdog", "stall", "STALL 30.0 s without progress; in flight: MainThread: pkg1.mod1 (30.0 s)")
        if not json_lines:
            lines.extend(["Timeout (0:00:30)!", "Thread 0x00007f00 (most recent call first):"])
            lines.extend(f'  File "/venv/pkg{n}.py", line {n} in <module>' for n in range(12))
    return lines


def generate(path: str, megabytes: float, json_lines: bool = False, seed: int = 1) -> int:
    """Write a log of about MEGABYTES at PATH; return its number of lines."""
    rng = random.Random(seed)
    goal = int(megabytes * 1e6)
    size = count = 0
    pid = 1000
    start = 1_800_000_000.0
    with open(path, "w", encoding="ascii") as file:
        while size < goal:
            # A few processes at a time, their lines interleaved in blocks as in a shared log.
            batch = [_process_lines(rng, pid + n, start + n * 0.01, json_lines) for n in range(4)]
            pid += 4
            start += 5.0
            cursors = [0] * len(batch)
            while any(cursor < len(lines) for cursor, lines in zip(cursors, batch)):
                which = rng.randrange(len(batch))
                lines = batch[which]
                block = lines[cursors[which] : cursors[which] + rng.randint(1, 20)]
                cursors[which] += len(block)
                text = "\n".join(block) + "\n" if block else ""
                file.write(text)
                size += len(text)
                count += len(block)
    return count


def _child(command: list[str]) -> tuple[float, float, float, subprocess.CompletedProcess]:
    """Run COMMAND in a fresh child; (wall seconds, CPU seconds, peak RSS in MB, result). One at a time.

    The CPU time (user and system) is the steadier figure on a shared machine, where
    other jobs stretch the wall time of a long run more than that of a short one.
    """
    runner = (
        "import resource, subprocess, sys, time\n"
        "start = time.perf_counter()\n"
        "done = subprocess.run(sys.argv[1:], stdout=subprocess.PIPE, stderr=subprocess.PIPE)\n"
        "wall = time.perf_counter() - start\n"
        "usage = resource.getrusage(resource.RUSAGE_CHILDREN)\n"
        "peak, cpu = usage.ru_maxrss / 1024, usage.ru_utime + usage.ru_stime\n"
        "sys.stderr.buffer.write(done.stderr)\n"
        "print(f'{wall} {cpu} {peak} {done.returncode} {len(done.stdout)}')\n"
    )
    done = subprocess.run([sys.executable, "-c", runner, *command], capture_output=True, text=True)
    wall, cpu, peak, code, _ = done.stdout.split()
    result = subprocess.CompletedProcess(command, int(code), "", done.stderr)
    return float(wall), float(cpu), float(peak), result


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--mb", type=float, default=100.0, help="size of the generated log (default 100)")
    parser.add_argument("--format", default="summary", help="report's --format (default summary)")
    parser.add_argument("--jsonl", action="store_true", help="a JSON Lines log instead of text")
    parser.add_argument("--rounds", type=int, default=3, help="runs of each, the best kept (default 3)")
    parser.add_argument("--keep", metavar="DIR", help="write the log into DIR and keep it")
    parser.add_argument("--json", action="store_true", help="print the figures as one JSON object")
    parser.add_argument(
        "--floor",
        action="store_true",
        help="also time, in one process, report's reader alone and with its line pattern on every line",
    )
    options = parser.parse_args()
    folder = options.keep or tempfile.mkdtemp(prefix="bench-report-")
    path = os.path.join(folder, "big.jsonl" if options.jsonl else "big.log")
    began = time.perf_counter()
    lines = generate(path, options.mb, options.jsonl)
    made = time.perf_counter() - began
    size = os.path.getsize(path) / 1e6
    report = [sys.executable, "-m", "importwatch", "report", "--format", options.format, path]
    loop = [sys.executable, "-c", _LOOP, path]
    runs = {"report": [], "loop": []}
    for _ in range(options.rounds):  # alternating, so that machine noise falls on both
        for name, command in (("loop", loop), ("report", report)):
            wall, cpu, peak, done = _child(command)
            if done.returncode != 0:
                sys.stderr.write(done.stderr)
                return 1
            runs[name].append((wall, cpu, peak))
    report_s = min(wall for wall, _, _ in runs["report"])
    loop_s = min(wall for wall, _, _ in runs["loop"])
    report_cpu = min(cpu for _, cpu, _ in runs["report"])
    loop_cpu = min(cpu for _, cpu, _ in runs["loop"])
    rss = max(peak for _, _, peak in runs["report"])
    figures = {
        "log_mb": round(size, 1),
        "lines": lines,
        "format": options.format,
        "jsonl": options.jsonl,
        "report_s": round(report_s, 2),
        "loop_s": round(loop_s, 2),
        "ratio": round(report_s / loop_s, 2),
        "report_cpu_s": round(report_cpu, 2),
        "loop_cpu_s": round(loop_cpu, 2),
        "cpu_ratio": round(report_cpu / loop_cpu, 2),
        "report_peak_rss_mb": round(rss, 1),
        "loop_peak_rss_mb": round(max(peak for _, _, peak in runs["loop"]), 1),
        "generate_s": round(made, 1),
    }
    if options.floor:
        done = subprocess.run(
            [sys.executable, "-c", _FLOOR, path, "jsonl" if options.jsonl else "text"],
            capture_output=True,
            text=True,
            check=True,
        )
        loop, read, match = map(float, done.stdout.split())
        figures["floor_cpu_s"] = {"plain_loop": loop, "chunked_read": read, "read_and_match": match}
    if not options.keep:
        os.unlink(path)
        os.rmdir(folder)
    if options.json:
        print(json.dumps(figures))
        return 0
    print(f"log: {figures['log_mb']} MB, {lines} lines ({'JSON Lines' if options.jsonl else 'text'})")
    print(
        f"report --format {options.format}: {report_s:.2f} s, peak RSS {rss:.0f} MB (target < {TARGET_RSS_MB})"
    )
    print(f"plain line loop: {loop_s:.2f} s; report / loop = {figures['ratio']} (target <= {TARGET_RATIO})")
    print(
        f"CPU time (user + system): report {report_cpu:.2f} s, loop {loop_cpu:.2f} s;"
        f" report / loop = {figures['cpu_ratio']}"
    )
    if options.floor:
        floor = figures["floor_cpu_s"]
        print(
            f"floor, CPU in one process: plain loop {floor['plain_loop']:.2f} s, report's chunked reader"
            f" {floor['chunked_read']:.2f} s, reader and line pattern {floor['read_and_match']:.2f} s"
            f" ({floor['read_and_match'] / floor['plain_loop']:.1f} times the loop)"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
