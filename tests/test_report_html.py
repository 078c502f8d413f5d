"""`importwatch report LOG --format html`: logs of real runs made into one self-contained page, read back
as text and drawn in a real headless browser (Debian's chromium) where one is installed."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from cbuild import FIXTURES
from test_report import hung_program, report_ok, run_until_stalled, trace

pytestmark = pytest.mark.slow  # every test here starts processes

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
ROW = 9  # integers per step in the page's data (page.py)
UNFINISHED, FAILED, STALLED = 1, 2, 4
KINDS = {0: "import", 1: "native", 2: "phase", 3: "step"}
# Module names a log may carry: they must reach the page as text, never as markup or script.
HOSTILE = [
    "x</script><script>alert(1)</script>",
    "q\"uo'te&amp;<b>bold",
    "caf\u00e9_\u2028\u65e5",
    "@@data@@",
    "y]]></style><!--",
]
HOSTILE_CODE = (
    f"for name in {HOSTILE!r}:\n"
    "    try:\n"
    "        __import__(name)\n"
    "    except ImportError:\n"
    "        pass\n"
    "import json\n"
)


def render(log: Path, out: Path, *args: str) -> str:
    """`report LOG --format html -o OUT` as a user runs it; the page's text."""
    assert report_ok(log, "--format", "html", "-o", out, *args) == ""
    page = out.read_text(encoding="utf-8")
    assert page.isascii()
    return page


def data_of(page: str) -> dict:
    """The page's JSON blob."""
    found = re.search(r'<script type="application/json" id="data">(.*?)</script>', page, re.S)
    assert found, "no data blob"
    return json.loads(found.group(1))


def steps(data: dict) -> list[dict]:
    """Every step of the blob, decoded: process, thread, name, kind, depth, begin, duration, flags, error."""
    found = []
    strings = data["strings"]
    for process in data["processes"]:
        for thread in process["threads"]:
            rows, begin = thread["rows"], 0
            assert len(rows) % ROW == 0
            for at in range(0, len(rows), ROW):
                delta, length, depth, kind, name, flags, error, measured, own = rows[at : at + ROW]
                begin += delta
                assert delta >= 0 and length >= 0 and 0 <= own <= measured
                found.append(
                    {
                        "process": process["name"],
                        "thread": thread["name"],
                        "name": strings[name],
                        "kind": KINDS[kind],
                        "depth": depth,
                        "begin": begin,
                        "length": length,
                        "measured": measured,
                        "flags": flags,
                        "error": strings[error] if error >= 0 else None,
                    }
                )
    return found


def assert_self_contained(page: str) -> None:
    """Nothing that loads from elsewhere: no address, no src, no stylesheet link; one script of ours."""
    assert "http://" not in page and "https://" not in page
    assert not re.search(r"\ssrc\s*=", page, re.I)
    assert re.findall(r"<link\b[^>]*>", page) == ['<link rel="icon" href="data:,">']
    assert re.findall(r"<script\b[^>]*>", page) == ['<script type="application/json" id="data">', "<script>"]
    assert page.count("</script>") == 2 and page.count("</style>") == 1
    assert "default-src 'none'" in page  # the page's policy forbids any load, whatever it contains


# -- the page as text ------------------------------------------------------------------------------
@pytest.mark.timeout(90)
def test_a_hung_import_is_the_headline_and_its_chain_is_marked(tmp_path):
    log = tmp_path / "hung.log"
    pid = run_until_stalled(hung_program(tmp_path / "prog", native=False), log, "STALL", watcher=True)
    page = render(log, tmp_path / "page.html")
    assert_self_contained(page)
    top = page.split('<section id="top">')[1].split("</section>")[0]
    assert "Died during import" in top and f"pid {pid}" in top
    assert "thread <b>MainThread</b>: <b>hangpkg</b> &gt; <b>hangpkg.slow</b>" in top
    assert "killed by SIGKILL" in top  # how it ended, in the watcher's words
    found = steps(data_of(page))
    by_name = {step["name"]: step for step in found}
    assert {"hangpkg", "hangpkg.slow", "json"} <= set(by_name)
    for name in ("hangpkg", "hangpkg.slow"):
        assert by_name[name]["flags"] & (UNFINISHED | STALLED) == UNFINISHED | STALLED, name
    assert by_name["hangpkg.slow"]["depth"] == 1 and by_name["json"]["depth"] == 2
    assert not by_name["json"]["flags"]
    # Nested steps lie inside their parents.
    parent = by_name["hangpkg.slow"]
    child = by_name["json"]
    assert (
        parent["begin"] <= child["begin"]
        and child["begin"] + child["length"] <= parent["begin"] + parent["length"]
    )
    data = data_of(page)
    assert [mark[1] for mark in data["processes"][0]["marks"]][:1] == ["stall"]


@pytest.mark.timeout(60)
def test_a_hung_native_load_is_told_apart_from_imports(tmp_path):
    # A stored real log: hangpkg.slow imports hangpkg._kernels, whose .so hangs in its constructor.
    page = render(FIXTURES / "logs" / "hung-dlopen.txt", tmp_path / "page.html")
    top = page.split('<section id="top">')[1].split("</section>")[0]
    assert '<span class="tag">Stuck</span>' in top
    assert "Where: loading the shared object <code>/tmp/importwatch-demo/native/hangpkg/_kernels." in top
    found = steps(data_of(page))
    natives = [step for step in found if step["kind"] == "native"]
    assert {Path(step["name"]).name.split(".")[0] for step in natives} == {"_json", "_kernels"}
    hung = next(step for step in natives if "_kernels" in step["name"])
    assert hung["flags"] & UNFINISHED and hung["depth"] == 3
    assert not next(step for step in natives if "_json" in step["name"])["flags"]


@pytest.mark.timeout(60)
@pytest.mark.parametrize("suffix", [".log", ".jsonl"])
def test_hostile_names_reach_the_page_as_text(tmp_path, suffix):
    log = tmp_path / f"hostile{suffix}"
    assert trace(log, "-c", HOSTILE_CODE, cwd=tmp_path).returncode == 0
    page = render(log, tmp_path / "page.html")
    assert_self_contained(page)
    assert "<script>alert" not in page and "<b>bold" not in page and "]]></style>" not in page
    names = {step["name"]: step for step in steps(data_of(page))}
    # The log writes what is not printable ASCII escaped; the page shows the log's text.
    for name in HOSTILE:
        shown = name.encode("ascii", "backslashreplace").decode("ascii")
        assert shown in names, shown
        assert names[shown]["flags"] & FAILED and names[shown]["error"].startswith("ModuleNotFoundError")
    assert "json" in names


def test_a_clean_run_says_no_stall_and_pid_picks_one_process(tmp_path):
    mixed = FIXTURES / "logs" / "mixed.txt"
    page = render(mixed, tmp_path / "all.html")
    data = data_of(page)
    assert len(data["processes"]) == 2
    one = data_of(render(mixed, tmp_path / "one.html", "--pid", data["processes"][1]["name"].split()[1]))
    assert [process["name"] for process in one["processes"]] == [data["processes"][1]["name"]]


@pytest.mark.timeout(60)
def test_min_ms_leaves_out_fast_steps_but_not_their_slow_descendants(tmp_path):
    log = tmp_path / "run.log"
    assert trace(log, "-c", "import json, email.parser, csv", cwd=tmp_path).returncode == 0
    full = steps(data_of(render(log, tmp_path / "full.html")))
    # --min-ms weighs the duration each line measured, not the bar's length on the page's time axis:
    # a bar placed by its stamp is clipped to nest inside its parent's, shorter by up to a stamp's
    # millisecond (CI saw json.scanner measure 1.634 ms and draw 1.330 ms).
    threshold = sorted(step["measured"] for step in full)[len(full) * 3 // 4] / 1000.0
    kept = steps(data_of(render(log, tmp_path / "kept.html", "--min-ms", str(threshold))))
    assert 0 < len(kept) < len(full)
    for step, after in zip(kept, [*kept[1:], None]):
        # A fast step stays only on the way to a slow one: the next step is then inside it.
        assert step["measured"] >= threshold * 1000 - 1 or (after and after["depth"] > step["depth"]), step
    assert "No stall" in render(log, tmp_path / "kept.html")


@pytest.mark.torch
@pytest.mark.timeout(120)
def test_torch_start_up_page(tmp_path):
    if sys.version_info[:2] != (3, 11):
        pytest.skip("the torch build here is for Python 3.11")
    pytest.importorskip("torch")
    log = tmp_path / "torch.log"
    assert trace(log, "-c", "import torch", cwd=tmp_path).returncode == 0
    page = render(log, tmp_path / "torch.html")
    assert_self_contained(page)
    found = steps(data_of(page))
    assert sum(step["kind"] == "import" for step in found) > 500
    assert any(
        step["kind"] == "native" and step["name"].endswith("/torch/_C.cpython-311-x86_64-linux-gnu.so")
        for step in found
    )
    assert "torch 2." in page and len(page) < 2_000_000


# -- in a real browser -----------------------------------------------------------------------------
needs_chromium = pytest.mark.skipif(
    not Path(CHROMIUM).exists(), reason="no chromium here (apt-get install chromium) to draw the page in"
)


def browse(page: Path, profile: Path, *how: str) -> subprocess.CompletedProcess:
    """Chromium, headless, offline, on PAGE: what --dump-dom prints, and its log with the console's lines."""
    command = [
        CHROMIUM,
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-quic",
        "--no-first-run",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        "--hide-scrollbars",
        f"--user-data-dir={profile}",
        "--enable-logging=stderr",
        "--v=0",
        "--window-size=1400,1000",
        *how,
        page.as_uri(),
    ]
    return subprocess.run(command, capture_output=True, text=True, timeout=90)


def console_lines(done: subprocess.CompletedProcess) -> list[str]:
    return [line for line in done.stderr.splitlines() if ":CONSOLE" in line or "Uncaught" in line]


@pytest.fixture
def hung_page(tmp_path) -> Path:
    log = tmp_path / "hung.log"
    run_until_stalled(hung_program(tmp_path / "prog", native=True), log, "Timeout (", watcher=True)
    page = tmp_path / "page.html"
    render(log, page)
    return page


@needs_chromium
@pytest.mark.timeout(180)
def test_the_page_draws_in_chromium_without_a_console_message(hung_page, tmp_path):
    done = browse(hung_page, tmp_path / "profile", "--dump-dom")
    assert done.returncode == 0, done.stderr[-2000:]
    root = re.search(r"<html[^>]*>", done.stdout).group(0)
    assert "data-error" not in root, root
    total = int(re.search(r'data-steps="(\d+)"', root).group(1))
    assert int(re.search(r'data-drawn="(\d+)"', root).group(1)) == total > 10
    assert f"{total} steps in 1 process" in done.stdout  # the script filled in its status line
    assert not console_lines(done), console_lines(done)
    shot = tmp_path / "page.png"
    done = browse(hung_page, tmp_path / "profile", f"--screenshot={shot}")
    assert shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and shot.stat().st_size > 10_000
    assert not console_lines(done), console_lines(done)


@needs_chromium
@pytest.mark.timeout(180)
def test_hovering_and_clicking_a_bar_shows_the_step(hung_page, tmp_path):
    # A user's pointer, played by a script added to a copy of the page (its policy taken out for it):
    # over the outermost bar, then a click on the native load four levels down.
    page = hung_page.read_text(encoding="utf-8")
    page = re.sub(r'<meta http-equiv="Content-Security-Policy"[^>]*>', "", page)
    pointer = """<script>
    var canvas = document.querySelector("canvas"), box = canvas.getBoundingClientRect();
    function at(type, x, y) {
      canvas.dispatchEvent(new MouseEvent(type, {clientX: box.left + x, clientY: box.top + y, bubbles: true}));
    }
    at("mousemove", box.width * 0.6, 26 + 20 + 8);
    document.documentElement.setAttribute("data-tip", document.querySelector(".tip").textContent);
    at("click", box.width * 0.6, 26 + 20 + 3 * 17 + 8);
    </script></body>"""
    played = tmp_path / "played.html"
    played.write_text(page.replace("</body>", pointer), encoding="utf-8")
    done = browse(played, tmp_path / "profile", "--dump-dom")
    tip = re.search(r'data-tip="([^"]*)"', done.stdout).group(1)
    assert tip.startswith("hangpkg   (import)") and "thread:   MainThread" in tip
    assert "state:    never ended" in tip
    details = re.search(r'<pre class="details">(.*?)</pre>', done.stdout, re.S).group(1)
    assert details.startswith("dlopen _kernels.") and "(native load)" in details
    assert "path:     " + str(tmp_path / "prog" / "hangpkg" / "_kernels.") in details
    assert "inside:   hangpkg &gt; hangpkg.slow &gt; hangpkg._kernels" in details
    assert re.search(r"start:    \d\d:\d\d:\d\d\.\d{3}", details)
    assert not console_lines(done), console_lines(done)
