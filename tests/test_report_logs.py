"""importwatch report on logs it cannot trust or hold whole, and on logs whose process was ended."""

from __future__ import annotations

import importlib.util
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from cbuild import FIXTURES, compile_extension, compile_shared, stand_in_torch
from helpers import ROOT, clean_env
from importwatch.events import VERDICT, WARNING
from importwatch.events.read import read_line
from test_report import hung_program, report, run_until_stalled, wait_in_log

pytestmark = pytest.mark.slow  # every test here starts processes

FORMATS = ("summary", "tree", "importtime", "chrome", "html")
# Bytes no report may print raw: a terminal would act on them (ESC, BEL, CSI, backspace, ...).
CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]")
EVIL = "\x1b]0;owned\x07\x1b[2J\x9b31m"


def _bench():
    """benchmarks/bench_report.py, whose generator writes a realistic log of any size."""
    spec = importlib.util.spec_from_file_location("bench_report", ROOT / "benchmarks" / "bench_report.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _json(pid: int, time: float, kind: str, text: str, **fields) -> str:
    return json.dumps(
        {"time": time, "pid": pid, "thread": "MainThread", "kind": kind, **fields, "text": text}
    )


def _all_formats_clean(log: Path) -> dict[str, subprocess.CompletedProcess]:
    """Every format reads LOG: exit 0, no traceback, no control character printed."""
    results = {}
    for form in FORMATS:
        done = subprocess.run(
            [sys.executable, "-m", "importwatch", "report", "-f", form, str(log)],
            capture_output=True,
            timeout=120,
        )
        out, err = done.stdout.decode("utf-8"), done.stderr.decode("utf-8")
        assert done.returncode == 0, (form, err)
        assert "Traceback" not in err, (form, err)
        assert not CONTROL.search(out) and not CONTROL.search(err), (form, CONTROL.findall(out + err)[:5])
        assert out.isascii() and err.isascii(), form
        results[form] = subprocess.CompletedProcess(done.args, 0, out, err)
    return results


# -- hostile logs ---------------------------------------------------------------------------------
@pytest.mark.timeout(120)
def test_a_crafted_jsonl_log_is_summarised_with_its_bad_lines_counted(tmp_path):
    good = [
        _json(7, 1_800_000_000.0, "start", "start python 3.11.7 /venv/bin/python argv=['job.py'] cwd=/job"),
        _json(7, 1_800_000_000.1, "import", "> json", name="json"),
        _json(7, 1_800_000_000.2, "import_end", "< json 100.000 ms", name="json", ms=100.0),
        _json(7, 1_800_000_000.3, "import", "> " + EVIL, name=EVIL),
        _json(7, 1_800_000_000.4, "import_end", "< x 100.000 ms", name=EVIL, ms=100.0),
        _json(7, 1_800_000_000.5, "verdict", "! " + EVIL, verdict=EVIL),
    ]
    bad = [
        '{"a": ' * 100_000 + "1" + "}" * 100_000,  # nesting: RecursionError
        '{"time": NaN, "pid": 7, "kind": "import", "name": "a", "text": "> a"}',
        '{"time": 1e300, "pid": 7, "kind": "import", "name": "b", "text": "> b"}',
        '{"time": 1800000001, "pid": 7, "kind": "import_end", "name": "json", "ms": 1e300, "text": "<"}',
        '{"time": 1800000001, "pid": 7, "kind": "import_end", "name": "json", "ms": Infinity, "text": "<"}',
        '{"time": 1800000001, "pid": 7, "kind": "import", "name": ["a", "list"], "text": "> a"}',
        '{"time": 1800000001, "pid": true, "kind": "import", "name": "c", "text": "> c"}',
        '{"time": 1800000001, "pid": ' + "9" * 5000 + ', "kind": "import", "name": "d", "text": "> d"}',
        '{"time": "noon", "pid": 7, "kind": "import", "name": "e", "text": "> e"}',
        '{"time": 1800000001, "pid": 7, "kind": "import", "name": "f", "text": "> f"} trailing',
        '{"time": 1800000001, "pid": 7, "kind": "import", "rank": -1, "name": "g", "text": "> g"}',
        '{"time": 1800000001, "pid": 7, "kind": "import", "name": "' + "h" * (3 << 20) + '"}',  # overlong
        "[importwatch 7 10:00:00.000] < json " + "9" * 400 + " ms",  # inf ms: OverflowError
        "[importwatch " + "9" * 5000 + " 10:00:00.000] > i",
    ]
    data = "\n".join(good[:3] + bad[:7] + good[3:] + bad[7:]).encode() + b"\n"
    data += b"\xff\xfe\x00binary junk\x80\x81\n" + b"x" * (5 << 20)  # and an overlong last line
    log = tmp_path / "crafted.jsonl"
    log.write_bytes(data)
    results = _all_formats_clean(log)
    out = results["summary"].stdout
    assert (
        f"{len(bad) + 2} lines could not be read and were skipped (the first, line 4: JSON nested too deeply)"
        in out
    )
    assert "pid 7: python 3.11.7 /venv/bin/python argv=['job.py'] cwd=/job" in out
    # The escape sequences arrive escaped, as the writer itself escapes them.
    escaped = "\\x1b]0;owned\\x07\\x1b[2J\\x9b31m"
    assert f"! {escaped}" in out and f"  {escaped}\n" in out
    for form in ("tree", "importtime", "chrome", "html"):
        assert f"{len(bad) + 2} lines could not be read" in results[form].stderr, form
    assert escaped in results["tree"].stdout and escaped in results["importtime"].stdout
    names = {e["name"] for e in json.loads(results["chrome"].stdout)["traceEvents"] if e["ph"] == "X"}
    assert {"json", escaped} <= names


@pytest.mark.timeout(120)
def test_a_crafted_text_log_is_read_escaped_in_every_format(tmp_path):
    start = "[importwatch 9 10:00:00.000] start python 3.11.7 /venv/bin/python argv=['job.py', '"
    lines = [
        start + EVIL + "'] cwd=/home/" + EVIL,
        "[importwatch 9 10:00:00.001] > pkg" + EVIL,
        "[importwatch 9 10:00:00.002 worker" + EVIL + "]   > dlopen /lib/" + EVIL + ".so (pkg)",
        "[importwatch 9 10:00:00.003] STALL 30.0 s; in flight: MainThread: pkg" + EVIL,
        "[importwatch 9 10:00:00.004] ! " + EVIL,
    ]
    # Nesting no import chain reaches (each level takes frames of the interpreter's 1000):
    # read as bad lines, not a RecursionError in the tree, importtime and chrome formats.
    lines += [f"[importwatch 9 10:00:01.000]   > deep{n}" for n in range(20_000)]
    # Ends without a start (a fork child's inherited imports) adopt what came before: nesting again.
    lines += [f"[importwatch 10 10:00:02.000] < orphan{n} 0.000 ms" for n in range(5_000)]
    log = tmp_path / "crafted.log"
    log.write_text("\n".join(lines) + "\n", encoding="utf-8")
    results = _all_formats_clean(log)
    escaped = "\\x1b]0;owned\\x07\\x1b[2J\\x9b31m"
    out = results["summary"].stdout
    assert f"argv=['job.py', '{escaped}'] cwd=/home/{escaped}" in out
    assert f"still in flight when the log ends: pkg{escaped} > deep0 > deep1 > " in out
    assert f"! {escaped}" in out and f"MainThread: pkg{escaped}" in out
    # Line 261 is deep255: with pkg below them, 256 starts are in flight on MainThread.
    skipped = 20_000 - 255 + 5_000 - 256
    assert (
        f"{skipped} lines could not be read and were skipped (the first, line 261: nested deeper than 256"
        in out
    )
    assert f"/lib/{escaped}.so" in results["tree"].stdout


def test_a_log_of_only_bad_lines_is_one_line_and_exit_2(tmp_path):
    log = tmp_path / "bad.jsonl"
    log.write_text('{"time": NaN, "pid": 1, "kind": "import", "text": "> a"}\n' + '{"a": [' * 50_000 + "\n")
    done = report(log)
    assert done.returncode == 2 and done.stdout == ""
    assert done.stderr.count("\n") == 1 and done.stderr.startswith("importwatch: error: "), done.stderr
    assert "not an importwatch log" in done.stderr
    assert "2 lines could not be read and were skipped (the first, line 1: NaN in a JSON line)" in done.stderr


@pytest.mark.timeout(30)
def test_a_fifo_is_refused_without_waiting_for_a_writer(tmp_path):
    fifo = tmp_path / "job.log"
    os.mkfifo(fifo)
    done = report(fifo)
    assert (
        done.returncode == 2
        and done.stderr == f"importwatch: error: cannot read {fifo}: not a regular file\n"
    )


# -- huge logs ------------------------------------------------------------------------------------
def _peak_rss_mb(*args: str) -> float:
    """Peak RSS of `importwatch report ARGS` in a fresh child, in MB (its own, not the test's)."""
    code = (
        "import resource, subprocess, sys\n"
        "done = subprocess.run(sys.argv[1:], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)\n"
        "assert done.returncode == 0, done.stderr\n"
        "print(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024)\n"
    )
    command = [sys.executable, "-m", "importwatch", "report", *args]
    done = subprocess.run([sys.executable, "-c", code, *command], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    return float(done.stdout)


@pytest.mark.timeout(300)
@pytest.mark.parametrize("suffix", [".log", ".jsonl"])
def test_the_summary_streams_its_memory_does_not_grow_with_the_log(tmp_path, suffix):
    bench = _bench()
    small, large = tmp_path / f"small{suffix}", tmp_path / f"large{suffix}"
    bench.generate(str(small), 2, suffix == ".jsonl")
    bench.generate(str(large), 40, suffix == ".jsonl")
    # Whole trees in memory took 8.6 times the file: over 300 MB more for the large log. Streamed,
    # what grows is a few KB per process for its tallies (the large log has 20 times the processes).
    growth = _peak_rss_mb(str(large)) - _peak_rss_mb(str(small))
    assert growth < 30, f"the summary's peak RSS grew by {growth:.0f} MB for 38 MB more log"


# -- how a process ended -----------------------------------------------------------------------------
@pytest.mark.timeout(60)
@pytest.mark.parametrize("suffix", [".log", ".jsonl"])
def test_a_kill_9_is_the_summarys_headline(tmp_path, suffix):
    log = tmp_path / f"hung{suffix}"
    pid = run_until_stalled(hung_program(tmp_path / "prog", native=False), log, "STALL", watcher=True)
    done = report(log)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[0].startswith(f"pid {pid}: died during import: process {pid} was killed by SIGKILL"), lines[
        0
    ]
    assert re.search(
        r"with in flight: MainThread: hangpkg \([\d.]+ s\) > hangpkg.slow \([\d.]+ s\)$", lines[0]
    )
    assert lines[1].startswith("  python ")
    assert "  in flight when the process died: hangpkg > hangpkg.slow" in lines
    assert "it hung there or was stopped there" not in done.stdout


@pytest.mark.timeout(60)
@pytest.mark.parametrize("suffix", [".log", ".jsonl"])
def test_a_kill_in_the_middle_of_a_line_still_reads_as_a_death(tmp_path, suffix):
    # faulthandler writes a dump in pieces: a job killed amid one leaves its last line unended.
    # Played here by the hung import itself, which writes part of a line to the log and waits.
    log = tmp_path / f"hung{suffix}"
    torn = '  File "/site/pkg/_ops.py", line 1'
    (tmp_path / "tornpkg.py").write_text(
        f"import time\nwith open({str(log)!r}, 'a') as log:\n    log.write({torn!r})\ntime.sleep(1000)\n"
    )
    (tmp_path / "main.py").write_text("import tornpkg\n")
    command = [
        sys.executable,
        "-m",
        "importwatch",
        "--timeout",
        "60",
        "--log",
        str(log),
        "--watcher",
        "main.py",
    ]
    process = subprocess.Popen(command, cwd=tmp_path, env=clean_env(), stderr=subprocess.DEVNULL)
    try:
        wait_in_log(log, torn)
    finally:
        process.kill()
        process.wait()
    wait_in_log(log, "died during import")
    # The watcher's death line starts a line of its own...
    lines = log.read_text().splitlines()
    assert torn in lines, lines[-3:]
    died = lines[lines.index(torn) + 1]
    assert re.match(r'(\[importwatch |\{"time": ).*died during import', died), died
    # ... and report finds a line of ours glued to a torn one all the same (a log another program
    # wrote into, or one an older importwatch wrote).
    glued = tmp_path / f"glued{suffix}"
    glued.write_text(log.read_text().replace(torn + "\n", torn))
    for each in (log, glued):
        done = report(each)
        assert done.returncode == 0, done.stderr
        # (How it died, SIGKILL or "exit status gone", depends on whether this test reaped it first.)
        assert done.stdout.startswith(f"pid {process.pid}: died during import: process {process.pid} ")
        assert "  in flight when the process died: tornpkg\n" in done.stdout
        assert "could not be read" not in done.stderr


@pytest.mark.timeout(60)
def test_the_death_line_starts_its_own_line_in_a_stderr_file_too(tmp_path):
    # A batch job's stderr is a file, and without --log the dumps go there; the program's own last
    # line may be unended too (a progress bar). The job is killed and not yet reaped, so the death
    # line goes to stderr as well.
    progress = "loading shards: 50%"
    (tmp_path / "shards.py").write_text(
        f"import sys, time\nsys.stderr.write({progress!r})\nsys.stderr.flush()\ntime.sleep(1000)\n"
    )
    (tmp_path / "main.py").write_text("import shards\n")
    err = tmp_path / "job.err"
    command = [sys.executable, "-m", "importwatch", "--timeout", "60", "--watcher", "main.py"]
    with open(err, "wb") as stderr:
        process = subprocess.Popen(command, cwd=tmp_path, env=clean_env(), stderr=stderr)
    try:
        wait_in_log(err, progress)
        process.kill()
        wait_in_log(err, "died during import")
    finally:
        process.kill()
        process.wait()
    lines = err.read_text().splitlines()
    assert progress in lines, lines[-3:]
    died = lines[lines.index(progress) + 1]
    assert died.startswith("[importwatch ") and "died during import" in died, died
    assert report(err).stdout.startswith(f"pid {process.pid}: died during import: process {process.pid} ")


@pytest.mark.timeout(90)
@pytest.mark.parametrize("suffix", [".log", ".jsonl"])
def test_pool_workers_terminated_mid_import_read_as_terminated_not_hung(tmp_path, suffix):
    (tmp_path / "slowinit.py").write_text("import time\ntime.sleep(120)\n")
    log = tmp_path / f"pool{suffix}"
    (tmp_path / "job.py").write_text(
        "import multiprocessing, time\n"
        "def init():\n"
        "    import slowinit\n"
        "if __name__ == '__main__':\n"
        "    with multiprocessing.get_context('fork').Pool(2, initializer=init) as pool:\n"
        "        deadline = time.monotonic() + 30\n"  # until both workers are inside the import
        f"        while open({str(log)!r}).read().count('> slowinit') < 2 and time.monotonic() < deadline:\n"
        "            time.sleep(0.05)\n"
        "    print('left the pool')\n"
    )
    env = clean_env(IMPORTWATCH="1", IMPORTWATCH_LOG=str(log))
    job = subprocess.run(
        [sys.executable, "job.py"], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=60
    )
    assert job.returncode == 0 and job.stdout == "left the pool\n", job.stderr
    done = report(log)
    assert done.returncode == 0, done.stderr
    blocks = done.stdout.split("\n\n")
    assert len(blocks) == 3, done.stdout
    parent, workers = blocks[0], blocks[1:]
    assert parent.startswith("pid ") and "nothing in flight when the log ends" in parent
    parent_pid = int(parent.split()[1].rstrip(":"))
    for worker in workers:
        lines = worker.splitlines()
        assert lines[0].endswith(
            f": ended by a signal during import: SIGTERM from pid {parent_pid} (multiprocessing), "
            "with in flight: MainThread: slowinit"
        ), lines[0]
        assert "  in flight when a signal ended the process: slowinit" in lines
        assert "hung" not in worker and "still in flight when the log ends" not in worker


@pytest.mark.timeout(60)
def test_an_exit_on_stall_is_the_headline(tmp_path):
    log = tmp_path / "hung.log"
    script = hung_program(tmp_path / "prog", native=False)
    command = [sys.executable, "-m", "importwatch", "--timeout", "0.5", "--exit-on-stall", "--no-watcher"]
    ran = subprocess.run(
        [*command, "--log", str(log), str(script)],
        cwd=script.parent,
        env=clean_env(),
        capture_output=True,
        timeout=30,
    )
    assert ran.returncode == 1
    out = report(log).stdout
    assert out.split("\n", 1)[0].endswith(
        ": ended during import: exiting with status 1 (--exit-on-stall), with in flight: "
        "MainThread: hangpkg > hangpkg.slow"
    ), out
    assert "  in flight when --exit-on-stall ended the process: hangpkg > hangpkg.slow\n" in out


@pytest.mark.timeout(60)
def test_a_chain_cut_by_the_logs_end_is_still_read_as_a_hang(tmp_path):
    log = tmp_path / "hung.log"
    pid = run_until_stalled(hung_program(tmp_path / "prog", native=False), log, "STALL", watcher=False)
    out = report(log).stdout
    assert out.startswith(f"pid {pid}: python ")
    assert "still in flight when the log ends: hangpkg > hangpkg.slow\n" in out
    assert "it hung there or was stopped there" in out and "died" not in out


# -- verdicts, text and JSON alike -----------------------------------------------------------------
@pytest.mark.timeout(120)
def test_text_and_jsonl_logs_of_the_same_run_give_the_same_summary_verdicts_included(tmp_path):
    cuda = FIXTURES / "cuda"
    runtime = compile_shared(
        cuda / "cudart_standin.c", tmp_path / "cuda-11.0" / "libcudart.so.11.0", soname="libcudart.so.11.0"
    )
    compile_extension(cuda / "kernels.c", tmp_path / "site", "fastkern._kernels", libs=[runtime])
    stand_in_torch(tmp_path / "torch-site", "2.3.1+cu121", "12.1")
    env = clean_env(PYTHONPATH=f"{tmp_path / 'site'}{os.pathsep}{tmp_path / 'torch-site'}")
    # json first, so that both logs hold the same imports (a JSON log's writer imports it first).
    code = "import json, torch, fastkern._kernels"
    summaries = []
    for log in (tmp_path / "run.log", tmp_path / "run.jsonl"):
        command = [sys.executable, "-m", "importwatch", "--no-watcher", "--log", str(log), "-c", code]
        ran = subprocess.run(command, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=60)
        assert ran.returncode == 0, ran.stderr
        done = report(log)
        assert done.returncode == 0, done.stderr
        summaries.append(done.stdout)
    text, jsonl = summaries
    verdict = "needs libcudart.so.11.0 (CUDA 11) but torch 2.3.1 is built for CUDA 12.1"
    assert verdict in text and verdict in jsonl
    assert _statements(text) == _statements(jsonl)


@pytest.mark.timeout(120)
def test_verdicts_read_back_as_verdicts_apart_from_importwatchs_warnings_text_and_json_alike(tmp_path):
    cuda = FIXTURES / "cuda"
    runtime = compile_shared(
        cuda / "cudart_standin.c", tmp_path / "cuda-11.0" / "libcudart.so.11.0", soname="libcudart.so.11.0"
    )
    compile_extension(cuda / "kernels.c", tmp_path / "site", "fastkern._kernels", libs=[runtime])
    stand_in_torch(tmp_path / "torch-site", "2.3.1+cu121", "12.1")
    verdict = "needs libcudart.so.11.0 (CUDA 11) but torch 2.3.1 is built for CUDA 12.1"
    warning = "IMPORTWATCH_TIMEOUT: expected a number of seconds, got 'soon'; using 30"
    summaries = []
    for log in (tmp_path / "run.log", tmp_path / "run.jsonl"):
        # A bad setting in IMPORTWATCH=1 mode is importwatch's own warning; the program runs on.
        env = clean_env(
            PYTHONPATH=f"{tmp_path / 'site'}{os.pathsep}{tmp_path / 'torch-site'}",
            IMPORTWATCH="1",
            IMPORTWATCH_LOG=str(log),
            IMPORTWATCH_TIMEOUT="soon",
        )
        code = "import json, torch, fastkern._kernels"
        ran = subprocess.run(
            [sys.executable, "-c", code], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=60
        )
        assert ran.returncode == 0, ran.stderr
        kinds = {}
        for line in log.read_text().splitlines():
            event = read_line(line)
            if event is not None and event.kind in (VERDICT, WARNING):
                kinds[event.kind] = event.data()
        assert verdict in kinds[VERDICT]["verdict"] and kinds[WARNING] == {"message": warning}, kinds
        done = report(log)
        assert done.returncode == 0, done.stderr
        out = done.stdout
        verdicts, _, warnings = out.partition("  verdicts:\n")[2].partition("  importwatch's warnings:\n")
        assert verdict in verdicts and warning not in verdicts, out
        assert f"! importwatch: {warning}" in warnings and verdict not in warnings, out
        summaries.append(out)
    assert _statements(summaries[0]) == _statements(summaries[1])


def _statements(summary: str) -> list[str]:
    """The summary without what differs between two runs: numbers (pids, clocks, times), the counts,
    the rows of the timed tables, and where faulthandler's dumps go (`dumps=LOG` on the start line:
    only a text log takes them)."""
    return [
        re.sub(r"\d+", "N", re.sub(r" dumps=\S+$", "", line))
        for line in summary.splitlines()
        if not (re.match(r"^ {4} *\d", line) and "!" not in line) and "from first to last line" not in line
    ]


@pytest.mark.timeout(90)
def test_bisect_reports_the_verdict_its_json_lines_tries_logged(tmp_path):
    cuda = FIXTURES / "cuda"
    runtime = compile_shared(
        cuda / "cudart_standin.c", tmp_path / "cuda-11.0" / "libcudart.so.11.0", soname="libcudart.so.11.0"
    )
    # Its constructor blocks in dlopen, as an extension built for another CUDA can.
    compile_extension(FIXTURES / "hang" / "blocking_ext.c", tmp_path, "fastkern._kernels", libs=[runtime])
    stand_in_torch(tmp_path, "2.3.1+cu121", "12.1")
    (tmp_path / "job.py").write_text("import json\nimport fastkern._kernels\n")
    done = subprocess.run(
        [sys.executable, "-m", "importwatch", "bisect", "--timeout", "0.5", "--json", "job.py"],
        cwd=tmp_path,
        env=clean_env(),
        capture_output=True,
        text=True,
        timeout=80,
    )
    assert done.returncode == 1, done.stderr
    result = json.loads(done.stdout)
    assert result["result"] == "hang" and result["culprit"] == "fastkern._kernels"
    verdict = "needs libcudart.so.11.0 (CUDA 11) but torch 2.3.1 is built for CUDA 12.1"
    assert any(verdict in text for text in result["verdicts"]), result
