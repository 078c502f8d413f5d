"""Phase markers: checkpoint() and phase() when traced, their stall reports, and doing nothing when off."""

from __future__ import annotations

import ast
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from helpers import clean_env, importwatch
from importwatch.events.read import parse_line

# Variables that would change what a traced child does; every test starts without them.


def run_traced(
    tmp_path: Path, source: str, *options: str, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess:
    script = tmp_path / "job.py"
    script.write_text(textwrap.dedent(source))
    return importwatch(*options, str(script), cwd=tmp_path, env=env or clean_env(), timeout=30)


def read_events(path: Path) -> list:
    return [event for event in map(parse_line, path.read_text().splitlines()) if event is not None]


def of_kinds(events: list, *kinds: str) -> list[tuple[str, str, int]]:
    return [(event.kind, event.name, event.depth) for event in events if event.kind in kinds]


@pytest.mark.slow
@pytest.mark.timeout(30)
def test_checkpoints_and_phases_are_logged_nested_with_their_durations(tmp_path: Path) -> None:
    (tmp_path / "config_module.py").write_text("VALUE = 1\n")
    log = tmp_path / "job.log"
    result = run_traced(
        tmp_path,
        """
        import importwatch

        importwatch.checkpoint("arguments parsed")
        with importwatch.phase("load config"):
            import config_module
            importwatch.checkpoint("config loaded")

        @importwatch.phase("build model")
        def build():
            return 42

        print(build())
        try:
            with importwatch.phase("bad phase"):
                raise ValueError("no such layer")
        except ValueError:
            pass
        """,
        "--log",
        str(log),
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout == "42\n"
    # Only our module's import: the decorator imports functools where it is not loaded yet (3.13).
    events = [event for event in read_events(log) if event.kind != "import" or event.name == "config_module"]
    assert of_kinds(events, "checkpoint", "phase", "phase_end", "import") == [
        ("checkpoint", "arguments parsed", 0),
        ("phase", "load config", 0),
        ("import", "config_module", 1),
        ("checkpoint", "config loaded", 1),
        ("phase_end", "load config", 0),
        ("phase", "build model", 0),
        ("phase_end", "build model", 0),
        ("phase", "bad phase", 0),
        ("phase_end", "bad phase", 0),
    ]
    ends = [event for event in events if event.kind == "phase_end"]
    assert all(event.ms is not None and event.ms >= 0 for event in ends)
    assert [event.error for event in ends] == [None, None, "ValueError: no such layer"]
    # The same lines go to stderr.
    assert "checkpoint arguments parsed" in result.stderr


@pytest.mark.slow
@pytest.mark.timeout(30)
def test_a_phase_past_its_own_timeout_gets_a_stall_report_naming_it(tmp_path: Path) -> None:
    log = tmp_path / "job.log"
    result = run_traced(
        tmp_path,
        """
        import time
        import importwatch

        time.sleep(1.0)  # nothing in flight: the watchdog sleeps for long, and the phase must wake it
        with importwatch.phase("load weights", timeout=0.5):
            time.sleep(2.5)
        print("loaded")
        """,
        "--timeout",
        "30",
        "--log",
        str(log),
    )
    assert result.returncode == 0, result.stderr
    events = read_events(log)
    stalls = [event for event in events if event.kind == "stall"]
    assert stalls, result.stderr  # then again after twice the timeout, while it lasts
    assert "in flight: MainThread: phase load weights (" in stalls[0].text
    seconds = float(stalls[0].text.split()[1])
    # On time: the phase's threshold, not the watchdog's 30 s (a loaded machine may be a second late).
    assert 0.5 <= seconds < 2.0
    context = [event.text for event in events if event.kind == "stall_context"]
    assert any(
        "phase load weights has run" in line and "past its timeout of 0.5 s" in line for line in context
    )
    assert "Stacks of the program's threads" in log.read_text()  # the stacks follow the report
    kinds = [event.kind for event in events]
    assert kinds.index("stall") < kinds.index("resumed") < kinds.index("phase_end")


@pytest.mark.slow
@pytest.mark.timeout(30)
def test_a_phase_without_timeout_counts_from_its_last_sign_of_life(tmp_path: Path) -> None:
    log = tmp_path / "job.log"
    result = run_traced(
        tmp_path,
        """
        import time
        import importwatch

        with importwatch.phase("train"):
            for epoch in range(5):
                time.sleep(0.3)
                importwatch.checkpoint(f"epoch {epoch}")
            time.sleep(1.2)
        with importwatch.phase("known to be long", timeout=0):
            time.sleep(1.2)
        """,
        "--timeout",
        "0.8",
        "--log",
        str(log),
    )
    assert result.returncode == 0, result.stderr
    events = read_events(log)
    stalls = [event for event in events if event.kind == "stall"]
    # 1.5 s of epochs, each within 0.8 s of the last: quiet. Then 1.2 s without one: one report.
    # A phase with timeout=0 is never reported.
    assert len(stalls) == 1, result.stderr
    assert "phase train" in stalls[0].text
    checkpoints = [event.name for event in events if event.kind == "checkpoint"]
    assert checkpoints == [f"epoch {n}" for n in range(5)]
    assert [event.kind for event in events].index("stall") > [event.name for event in events].index("epoch 4")


@pytest.mark.slow
@pytest.mark.timeout(30)
def test_with_tracing_off_the_api_writes_nothing_and_imports_nothing_else(tmp_path: Path) -> None:
    script = tmp_path / "job.py"
    script.write_text(
        textwrap.dedent(
            """
            import sys
            before = set(sys.modules)
            import importwatch
            imported = set(sys.modules) - before

            importwatch.checkpoint("start")
            with importwatch.phase("load", timeout=1):
                importwatch.checkpoint("inside")

            @importwatch.phase("step")
            def step():
                return "ran"

            print(step())
            print(sorted(imported))
            """
        )
    )
    result = subprocess.run(
        [sys.executable, str(script)], env=clean_env(), capture_output=True, text=True, timeout=30
    )
    assert result.returncode == 0, result.stderr
    assert result.stderr == ""
    # The API and nothing that is not importwatch's own: no standard module the program would then
    # find loaded already (tracing/ is the folder phases.py sits in, whose __init__ is a docstring).
    ran, imported = result.stdout.splitlines()
    assert ran == "ran"
    names = ast.literal_eval(imported)
    assert {"importwatch", "importwatch.tracing", "importwatch.tracing.phases"} <= set(names)
    assert [name for name in names if name.split(".")[0] != "importwatch"] == []


@pytest.mark.slow
@pytest.mark.timeout(30)
def test_a_function_decorated_before_install_is_traced_once_installed(tmp_path: Path) -> None:
    script = tmp_path / "job.py"
    script.write_text(
        textwrap.dedent(
            """
            import importwatch

            @importwatch.phase("warm up")
            def warm_up():
                importwatch.checkpoint("warm")

            warm_up()                   # off: nothing
            importwatch.install(log="on.log")
            warm_up()                   # on: a phase and a checkpoint
            importwatch.uninstall()
            warm_up()                   # off again: nothing
            """
        )
    )
    result = subprocess.run(
        [sys.executable, str(script)],
        cwd=tmp_path,
        env=clean_env(),
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert result.returncode == 0, result.stderr
    events = read_events(tmp_path / "on.log")
    assert of_kinds(events, "phase", "phase_end", "checkpoint") == [
        ("phase", "warm up", 0),
        ("checkpoint", "warm", 1),
        ("phase_end", "warm up", 0),
    ]


def test_a_bad_phase_timeout_is_refused_even_when_off() -> None:
    import importwatch

    with pytest.raises(ValueError, match="timeout must be a number of seconds >= 0"):
        importwatch.phase("x", timeout=-1)
    with pytest.raises(ValueError):
        importwatch.phase("x", timeout=float("nan"))


@pytest.mark.slow
@pytest.mark.timeout(30)
def test_rank_is_in_the_prefix_the_json_records_and_the_log_name(tmp_path: Path) -> None:
    source = """
        import importwatch
        with importwatch.phase("setup"):
            importwatch.checkpoint("ready")
        """
    result = run_traced(tmp_path, source, "--log", "job-{rank}.log", env=clean_env(RANK="3"))
    assert result.returncode == 0, result.stderr
    events = read_events(tmp_path / "job-3.log")
    assert events and all(event.rank == 3 for event in events)
    assert f"[importwatch {events[0].pid} r3 " in (tmp_path / "job-3.log").read_text()

    result = run_traced(tmp_path, source, "--log", "job-{rank}.jsonl", env=clean_env(LOCAL_RANK="1"))
    assert result.returncode == 0, result.stderr
    records = read_events(tmp_path / "job-1.jsonl")
    assert of_kinds(records, "phase", "checkpoint", "phase_end") == [
        ("phase", "setup", 0),
        ("checkpoint", "ready", 1),
        ("phase_end", "setup", 0),
    ]
    assert all(record.rank == 1 for record in records)

    result = run_traced(tmp_path, source, "--log", "job-{rank}.log")
    assert result.returncode == 0, result.stderr
    events = read_events(tmp_path / "job-norank.log")
    assert events and all(event.rank is None for event in events)


def test_the_parser_reads_phase_step_and_checkpoint_lines_and_old_lines_alike() -> None:
    lines = {
        "[importwatch 7 r2 09:41:03.120] > phase load model": ("phase", "load model", 2, 0),
        "[importwatch 7 09:41:03.120 Thread-1]   < phase load model 12.500 ms": (
            "phase_end",
            "load model",
            None,
            1,
        ),
        "[importwatch 7 09:41:03.120] > step torch.cuda._lazy_init (first CUDA initialisation)": (
            "step",
            "torch.cuda._lazy_init",
            None,
            0,
        ),
        "[importwatch 7 r0 09:41:03.120] < step torch.cuda._lazy_init 0.1 ms failed AssertionError: x": (
            "step_end",
            "torch.cuda._lazy_init",
            0,
            0,
        ),
        "[importwatch 7 09:41:03.120]     checkpoint config loaded": ("checkpoint", "config loaded", None, 2),
        "[importwatch 7 09:41:03.120] fork child of 6": ("fork", "", None, 0),
        # Only the kinds nested in a thread's steps have a depth; a stall report's lines are indented by their head.
        "[importwatch 7 09:41:03.120]   context: MASTER_ADDR is not set": ("stall_context", "", None, 0),
        # Modules called phase or step stay imports.
        "[importwatch 7 09:41:03.120] > phase": ("import", "phase", None, 0),
        "[importwatch 7 09:41:03.120] < phase 1.000 ms": ("import_end", "phase", None, 0),
        "[importwatch 7 09:41:03.120]   < step 1.000 ms failed ImportError: x": (
            "import_end",
            "step",
            None,
            1,
        ),
        "[importwatch 7 09:41:03.120] > json": ("import", "json", None, 0),
    }
    for line, expected in lines.items():
        event = parse_line(line)
        assert event is not None, line
        assert (event.kind, event.name, event.rank, event.depth) == expected, line
    end = parse_line("[importwatch 7 09:41:03.120] < phase a 5 ms b 12.500 ms failed KeyError: 'x 3 ms'")
    assert (end.name, end.ms, end.error) == ("a 5 ms b", 12.5, "KeyError: 'x 3 ms'")
