"""The watcher's feed as a ring in shared memory (tracing/ring.py): no system call per line, every line kept.

The program appends each text line to memory the watcher maps and reads when it
looks, instead of writing it to a pipe: a traced import costs no write beyond the
lines asked for on stderr and in the log, on the C hook and on its pure-Python
twin alike, and the ring holds the very bytes the log got.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time

import pytest

from helpers import clean_env, importwatch
from importwatch.tracing import ring
from importwatch.tracing.accelerator import ACCELERATOR

C = {"IMPORTWATCH_PURE": "0"}
PURE = {"IMPORTWATCH_PURE": "1"}
PATHS = [pytest.param(C, id="C"), pytest.param(PURE, id="pure")]
if ACCELERATOR is None:
    PATHS[0] = pytest.param(C, id="C", marks=pytest.mark.skip(reason="the C accelerator is not built here"))

MODULES = 300

# The program's own count of its write(2) calls (/proc/self/io, every thread of it) around its imports.
_COUNT_WRITES = """
import sys
def writes():
    with open('/proc/self/io') as io:
        return int(next(line for line in io if line.startswith('syscw:')).split()[1])
before = writes()
for number in range({modules}):
    __import__(f'mod{{number}}')
after = writes()
sys.stdout.write(f'{{after - before}}\\n')
"""

# The program's ring, as the watcher would read it, next to its log.
_DUMP_RING = """
import json, csv, email.parser
from importwatch.tracing import ring, session
feed = session._active.sink.feed
head = feed.ring.heads[0]
data = feed.ring.view[ring.HEADER : ring.HEADER + head].tobytes()
open('ring.bin', 'wb').write(data)
"""


def _modules(folder) -> None:
    for number in range(MODULES):
        (folder / f"mod{number}.py").write_text(f"VALUE = {number}\n")


@pytest.mark.slow
@pytest.mark.timeout(120)
@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize(
    "how", [pytest.param(("--stderr", "stalls"), id="quiet"), pytest.param(("--log", "run.log"), id="log")]
)
def test_an_import_writes_nothing_to_the_watcher(tmp_path, path, how):
    """With the watcher on: no write at all per import when quiet, and with a log the two lines to stderr
    and the two to the log, nothing for the watcher (it wrote two more per import into a pipe before)."""
    _modules(tmp_path)
    (tmp_path / "main.py").write_text(_COUNT_WRITES.format(modules=MODULES))
    env = clean_env(PYTHONDONTWRITEBYTECODE="1", **path)  # no .pyc written, by either run
    plain = subprocess.run([sys.executable, "main.py"], cwd=tmp_path, env=env, capture_output=True, text=True)
    done = importwatch(*how, "main.py", cwd=tmp_path, env=env)
    assert plain.returncode == done.returncode == 0, done.stderr
    assert "watcher" not in done.stderr  # it started: no word of a watcher that could not
    added = int(done.stdout) - int(plain.stdout)
    lines_asked = 0 if how[0] == "--stderr" else 4  # per import: start and end, to stderr and to the log
    # A few writes of the heartbeat's own (a thread's first line) may fall inside the window.
    assert lines_asked * MODULES <= added <= lines_asked * MODULES + 10, added


@pytest.mark.slow
@pytest.mark.timeout(120)
@pytest.mark.parametrize("path", PATHS)
def test_the_ring_holds_the_lines_the_log_got(tmp_path, path):
    """The feed's bytes are the text log's, line for line (the C hook appends as Ring.put does), plus the
    watcher's own `#` lines."""
    (tmp_path / "main.py").write_text(_DUMP_RING)
    done = importwatch("--log", "run.log", "main.py", cwd=tmp_path, env=clean_env(**path))
    assert done.returncode == 0, done.stderr
    fed = (tmp_path / "ring.bin").read_bytes().decode("ascii").splitlines()
    logged = (tmp_path / "run.log").read_text("ascii").splitlines()
    assert any(line.startswith("#thread importwatch-heartbeat ") for line in fed)
    imports = [line for line in fed if "> email.parser" in line or "< email.parser " in line]
    assert len(imports) == 2
    # The log's lines from the watcher's start (after the banner) to the dump, in order: the ring got each.
    program = [line for line in fed if not line.startswith("#")]
    first = logged.index(program[0])
    assert first <= 3 and program == logged[first : first + len(program)]
    assert len(program) > 50


@pytest.mark.parametrize("accelerated", [True, False], ids=["C mapping", "mmap"])
def test_a_reader_a_ring_behind_loses_the_oldest_bytes_and_counts_them(accelerated):
    if accelerated and ACCELERATOR is None:
        pytest.skip("the C accelerator is not built here")
    fd, writer = ring.create(ACCELERATOR if accelerated else None)
    try:
        reader = ring.RingReader(fd)
    finally:
        os.close(fd)
    writer.put(b"first line\n")
    assert reader.read() == (b"first line\n", 0)
    assert reader.read() == (b"", 0)
    lines = [b"%06d " % number + b"x" * 93 + b"\n" for number in range(15_000)]  # 1.5 MB: a ring and a half
    for line in lines:
        writer.put(line)
    data, lost = reader.read()
    written = sum(map(len, lines))
    assert len(data) == ring.SIZE and lost == written - ring.SIZE
    # What is left starts inside a line and ends with the last one, whole.
    assert data.endswith(lines[-1]) and b"".join(lines).endswith(data)
    # Across the ring's end: a line split in two comes back whole.
    filler = b"z" * (ring.SIZE - writer.heads[0] % ring.SIZE - 50)
    writer.put(filler)
    assert reader.read() == (filler, 0)
    writer.put(b"y" * 150 + b"\n")
    assert reader.read() == (b"y" * 150 + b"\n", 0)
    assert writer.heads[0] % ring.SIZE == 101
    writer.close()


# The watcher as watcher_launch starts it (its boot line, minus the path it puts first).
_WATCHER = "import sys; from importwatch.watcher.loop import main; sys.exit(main())"


@pytest.mark.slow
@pytest.mark.timeout(60)
def test_the_watcher_times_a_step_from_its_line_s_stamp_not_from_its_reading():
    # The ring is read ten times a second, and a watcher slow to start reads its first lines later
    # still: timed from its reading, a step looked younger to the watcher than to the program's own
    # watchdog, whose --exit-on-stall then ended the job before the outside view was out. Here the
    # watcher starts with a start line ten seconds old in the ring and a 4 s threshold: the stall is
    # due at once, and its report says how long the step has really been in flight.
    target = subprocess.Popen(["sleep", "60"])
    fd, writer = ring.create(None)
    feed, feed_end = os.pipe()
    try:
        written = time.time() - 10.0
        stamp = time.strftime("%H:%M:%S", time.localtime(written)) + f".{int(written % 1 * 1000):03d}"
        writer.put(f"[importwatch {target.pid} {stamp}] > slowimp\n".encode())
        plumbing = ["--pid", str(target.pid), "--feed", str(feed), "--ring", str(fd)]
        began = time.monotonic()
        watcher = subprocess.Popen(
            [sys.executable, "-c", _WATCHER, *plumbing, "--", "--timeout", "4", "--stderr", "all"],
            pass_fds=(fd, feed),
            env=clean_env(),
            stderr=subprocess.PIPE,
            text=True,
        )
        os.close(fd)  # the watcher's now, as after watcher_launch's fork
        os.close(feed)
        line = watcher.stderr.readline()
        took = time.monotonic() - began
        os.close(feed_end)  # the program's end: the watcher says the program ended, and leaves
        watcher.communicate(timeout=30)
    finally:
        target.kill()
        target.wait()
        writer.close()
    assert "outside:" in line and "slowimp" in line, line
    assert re.search(r"\b1\d\.\d s\b", line), line  # in flight for ten seconds and more, not four
    assert took < 3.5, f"the report came {took:.1f} s after the watcher started: {line}"
