"""The summary's fast reading of import lines (fastread.py) says what reading every line as an event says.

`importwatch report LOG` runs as a user runs it; the reference is the same log read
the general way (events.read.read_line, then Timeline.add for every line), in this process.
The logs are crafted at every edge of the fast path: lines it must leave to the
general path (escapes, ranks, failures, natives with spaces, modules named like
other kinds, numbers out of range, nesting too deep, ends without their start, a
pid's second run, midnight, overlong and non-UTF-8 lines, JSON in other shapes).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from importwatch.events import SIGNAL
from importwatch.events.read import BadLine
from importwatch.tools.report import command as report_module
from importwatch.tools.report.logread import Skipped, read_events
from importwatch.tools.report.timeline import Timeline
from test_report_logs import _bench

pytestmark = pytest.mark.slow  # every test here starts processes


def _general_summary(path: Path, pid: int | None = None) -> str:
    """The summary of PATH with every line read as an event: the path the summary took before fastread.py."""
    skipped = Skipped()
    digests: dict = {}
    timeline = Timeline(keep=False, on_end=report_module._digest_into(digests))
    for event in read_events(str(path), skipped):
        if pid is not None and event.pid != pid and event.kind != SIGNAL:
            continue
        try:
            timeline.add(event)
        except BadLine as error:
            skipped.add(skipped.number, str(error))
    processes = timeline.finish()
    if pid is not None:
        processes = [process for process in processes if process.pid == pid]
    return report_module.summary(processes, digests, skipped)


def _report(path: Path, *args: str) -> str:
    done = subprocess.run(
        [sys.executable, "-m", "importwatch", "report", *args, str(path)], capture_output=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    assert b"Traceback" not in done.stderr
    return done.stdout.decode("ascii")


def _same(path: Path, pids: tuple[int, ...] = ()) -> str:
    shown = _report(path)
    assert shown == _general_summary(path)
    for pid in pids:
        assert _report(path, "--pid", str(pid)) == _general_summary(path, pid)
    return shown


def _text_log() -> list[str]:
    lines = [
        "[importwatch 7 23:59:58.100] start python 3.11.7 /venv/bin/python argv=['job.py'] cwd=/job",
        "[importwatch 7 23:59:58.101] > alpha",
        "[importwatch 7 23:59:58.102]   > beta",
        "[importwatch 7 23:59:58.103 loader-1] > gamma",
        "[importwatch 7 23:59:58.104]     > dlopen /x/_beta.so (beta)",
        "[importwatch 7 23:59:58.105]       > beta._inner",
        "[importwatch 7 23:59:58.106]       < beta._inner 0.800 ms",
        "[importwatch 7 23:59:58.107]     < dlopen /x/_beta.so 2.500 ms",
        "[importwatch 7 23:59:58.108]     > dlopen /x/with space.so (beta)",
        "[importwatch 7 23:59:58.109]     < dlopen /x/with space.so 0.400 ms",
        "[importwatch 7 23:59:58.110]     > dlopen /x/cuda.so (beta) needs libcudart.so.11.0",
        "[importwatch 7 23:59:58.111]     < dlopen /x/cuda.so 1.000 ms failed OSError: nope",
        "[importwatch 7 23:59:58.112]   < beta 9.000 ms",
        "[importwatch 7 23:59:58.113]   > optional_dep",
        "[importwatch 7 23:59:58.114]   < optional_dep 0.100 ms failed ModuleNotFoundError: No module named 'x'",
        "[importwatch 7 23:59:58.115]   > esc\\x1b[2Jape",
        "[importwatch 7 23:59:58.116]   < esc\\x1b[2Jape 0.200 ms",
        "[importwatch 7 23:59:58.117]   > caf\u00e9",
        "[importwatch 7 23:59:58.118]   < caf\u00e9 0.300 ms failed ImportError: \x1b]0;owned\x07",
        "[importwatch 7 23:59:58.119]   > phase",
        "[importwatch 7 23:59:58.120]   < phase 0.100 ms",
        "[importwatch 7 23:59:58.121]   > dlopen",
        "[importwatch 7 23:59:58.122]   < dlopen 0.100 ms",
        "[importwatch 7 23:59:58.123]   > phase load weights",
        "[importwatch 7 23:59:58.124]   < phase load weights 0.500 ms",
        "[importwatch 7 23:59:58.125]   > step socket.connect host:443",
        "[importwatch 7 23:59:58.126]   < step socket.connect 0.300 ms",
        "[importwatch 7 23:59:58.127]   checkpoint ready",
        "[importwatch 7 23:59:58.128]   > spaced 1.0 ms",
        "[importwatch 7 23:59:58.129]   < no_duration",
        "[importwatch 7 23:59:58.130]   < huge 999999999999999 ms",
        "[importwatch 7 23:59:58.131]   > lost_inner",
        "[importwatch 7 23:59:59.999] < alpha 20.000 ms",
        "[importwatch 7 00:00:00.001] > after_midnight",
        "[importwatch 7 00:00:00.002] < after_midnight 0.500 ms ",
        "[importwatch 7 00:00:00.003] < after_midnight 0.500 ms\r",
        "[importwatch 7 00:00:00.004 loader-1] < gamma 30.000 ms",
        "[importwatch 7 00:00:00.005 loader-1] < never_started 3.000 ms",
        "[importwatch 7 00:00:00.006] ! _ext.so needs libcudart.so.11.0 (CUDA 11)",
        "[importwatch 7 00:00:00.007] > tail_import",
        "[importwatch 7 00:00:00.008] < tail_import 0.100 ms",
        "[importwatch 9 r3 00:00:00.010] > ranked",
        "[importwatch 9 r3 00:00:00.011]   > ranked.child",
        "[importwatch 9 r3 00:00:00.012]   < ranked.child 0.100 ms",
        "[importwatch 9 r4 00:00:00.013] < ranked 1.000 ms",
        "[importwatch 9 r3 00:00:00.013] > ranked.again",
        "[importwatch 9 r3 00:00:00.013] < ranked.again 0.100 ms",
        "[importwatch 99999999999 00:00:00.014] > pid_too_big",
        "[importwatch 9 r99999999999 00:00:00.015] > rank_too_big",
        "[importwatch 7 00:00:00.020] start python 3.11.7 /venv/bin/python argv=['again.py'] cwd=/job",
        "[importwatch 7 00:00:00.021] > second_run",
        "[importwatch 7 00:00:00.022] < second_run 0.700 ms",
        "[importwatch 7 00:00:00.023] > second_run_hangs",
        "[importwatch 11 00:00:00.030] > deep0",
    ]
    lines += [f"[importwatch 11 00:00:00.031] {'  ' * n}> deep{n}" for n in range(1, 300)]
    lines += [
        "[importwatch 12 00:00:01.000] > killed.here",
        "[importwatch 12 00:00:01.001]   > killed.here.inner",
        "[importwatch 13 00:00:01.500] outside: died during import: process 12 was killed by SIGKILL",
        "[importwatch 14 00:00:02.000] signal SIGTERM to child 7 (pool terminate)",
        "Timeout (0:00:30)!",
        "Thread 0x00007f00 (most recent call first):",
        "[importwatch 15 00:00:03.000] > " + "x" * (1 << 20),
        "[importwatch 15 00:00:03.001] > fine_after_overlong",
    ]
    return lines


@pytest.mark.timeout(120)
def test_a_crafted_text_log_gives_the_general_paths_summary(tmp_path):
    log = tmp_path / "crafted.log"
    data = "\n".join(_text_log()).encode("utf-8") + b"\n[importwatch 15 00:00:03.002] > bad\xff\xfebytes\n"
    log.write_bytes(data)
    shown = _same(log, pids=(7, 9, 11, 15))
    # The fast path saw what matters: the escapes, the bad lines, the run, the rank.
    assert "esc\\x1b[2Jape" in shown and "caf\\xe9" in shown and "\x1b" not in shown
    assert "pid 7 (run 2)" in shown and "pid 9 rank 3" in shown
    assert "could not be read and were skipped" in shown


def _json_log() -> list[str]:
    def line(time: float, kind: str, text: str, pid: int = 21, **fields) -> str:
        record = {"time": time, "pid": pid, "thread": fields.pop("thread", "MainThread")}
        if "rank" in fields:
            record["rank"] = fields.pop("rank")
        record["kind"] = kind
        record.update(fields)
        record["text"] = text
        return json.dumps(record)

    return [
        line(1800000000.0, "start", "start python 3.11.7 /venv/bin/python argv=['job.py'] cwd=/job"),
        line(1800000000.001, "import", "> a", name="a", parent=None),
        line(1800000000.002, "import", "  > a.b", name="a.b", parent="a"),
        line(1800000000.003, "import_end", "  < a.b 0.500 ms", name="a.b", parent="a", ms=0.5),
        line(1800000000.004, "import", "  > a.c", name="a.c", parent="a", thread="worker"),
        line(1800000000.005, "import_end", "  < a.c 1 ms", name="a.c", parent="a", ms=1, thread="worker"),
        line(1800000000.006, "import", "  > opt", name="opt", parent="a"),
        line(
            1800000000.007,
            "import_end",
            "  < opt failed",
            name="opt",
            parent="a",
            ms=0.1,
            error="ImportError: x",
        ),
        line(1800000000.008, "import", "  > \x1b[2J", name="\x1b[2J", parent="a"),
        line(1800000000.009, "import_end", "  < \x1b[2J 0.1 ms", name="\x1b[2J", parent="a", ms=5.0),
        line(1800000000.010, "import", '  > q"uote', name='q"uote', parent="a"),
        line(1800000000.011, "import_end", '  < q"uote', name='q"uote', parent="a", ms=0.1),
        line(1800000000.012, "import", "  > tiny", name="tiny", parent="a"),
        line(1800000000.013, "import_end", "  < tiny", name="tiny", parent="a", ms=1e-05),
        line(1800000000.014, "import", "  > huge", name="huge", parent="a"),
        line(1800000000.015, "import_end", "  < huge", name="huge", parent="a", ms=99999999999999.5),
        line(1800000000.016, "import", "  > no_ms", name="no_ms", parent="a"),
        line(1800000000.017, "import_end", "  < no_ms", name="no_ms", parent="a"),
        line(1800000000.018, "import", "  > nested_parent", name="nested_parent", parent=[[1]]),
        line(1800000000.019, "import_end", "  < orphan", name="orphan", parent="a", ms=2.0),
        line(1800000000.020, "import", "  > bad_time", name="bad_time", parent="a").replace(
            "1800000000.02", "999999999999.5"
        ),
        line(1800000000.021, "import", "  > ranked", name="ranked", parent=None, pid=22, rank=1),
        line(1800000000.022, "import_end", "  < ranked", name="ranked", parent=None, ms=0.3, pid=22, rank=1),
        line(1800000000.023, "import", "  > lead0", name="lead0", parent=None).replace(
            '"pid": 21', '"pid": 021'
        ),
        line(1800000000.024, "import", "  > empty_thread", name="empty_thread", parent=None, thread=""),
        json.dumps(
            {"pid": 21, "time": 1800000000.025, "thread": "MainThread", "kind": "import", "name": "keys"}
        ),
        line(1800000000.0251, "native", "> dlopen /x/a.so (a)", path="/x/a.so", owner="a"),
        line(1800000000.0252, "import", "> a.init", name="a.init", parent="a"),
        line(1800000000.0253, "import_end", "< a.init", name="a.init", parent="a", ms=0.25),
        line(1800000000.0254, "native_end", "< dlopen /x/a.so", path="/x/a.so", owner="a", ms=3.5),
        line(1800000000.0255, "native", "> dlopen /x/c.so", path="/x/c.so", owner="a", needs=["CUDA 11"]),
        line(
            1800000000.0256, "native_end", "< dlopen", path="/x/c.so", owner="a", ms=1.5, mapped=["/x/d.so"]
        ),
        line(1800000000.0257, "native", "> dlopen /x/e.so", path="/x/e.so", owner=7),
        line(1800000000.0258, "native_end", "< dlopen /x/e.so", path="/x/e.so", owner="a", ms=0.5),
        line(1800000000.0259, "import", "> by_path", path="by_path"),
        line(1800000000.0260, "native_end", "< dlopen /x/f.so", path="/x/f.so", ms=0.5),
        line(1800000000.026, "import", "  > hang", name="hang", parent="a"),
        "[importwatch 23 08:00:00.000] > text_in_a_json_log",
        line(1800000000.027, "import", "> after_text", name="after_text", parent=None, pid=23),
        line(1800000000.028, "start", "start python 3.11.7 /venv/bin/python argv=['again.py'] cwd=/job"),
        line(1800000000.029, "import", "> second_run", name="second_run", parent=None),
    ]


@pytest.mark.timeout(120)
def test_a_crafted_jsonl_log_gives_the_general_paths_summary(tmp_path):
    log = tmp_path / "crafted.jsonl"
    log.write_text("\n".join(_json_log()) + "\n", encoding="ascii")
    shown = _same(log, pids=(21, 22, 23))
    assert "\\x1b[2J" in shown and "\x1b" not in shown
    assert "pid 21 (run 2)" in shown and "pid 22 rank 1" in shown


@pytest.mark.timeout(300)
@pytest.mark.parametrize("suffix", [".log", ".jsonl"])
def test_a_generated_log_gives_the_general_paths_summary(tmp_path, suffix):
    """Thousands of processes, threads, natives, verdicts, hangs with their dumps (the benchmark's log)."""
    log = tmp_path / f"big{suffix}"
    _bench().generate(str(log), 3, json_lines=suffix == ".jsonl", seed=5)
    _same(log, pids=(1003,))
