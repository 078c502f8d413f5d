"""The README's samples of the demo's output still have the shape of what the demo really prints.

A sample is a fenced block of README.md whose first line is the demo's own command line
(`$ PYTHONPATH=.../site-packages python -m importwatch ...`). The test runs the demo (with
--doctor for doctor's sample), reduces both texts to their shape (numbers, addresses, temporary and
installation paths, facts about this machine) and checks that every sample line but `...` appears
in the real output, in order: the watcher's `outside:` lines come from another process, so they
keep their order among themselves only.
"""

from __future__ import annotations

import re
import subprocess
import sys

import pytest

from helpers import ROOT, clean_env

DEMO = ROOT / "demo" / "stuck_job.py"
COMMAND = "$ PYTHONPATH=.../site-packages python -m importwatch "

# doctor's facts about the machine (paths, kernel, driver, CUDA runtimes): only their label is shape.
MACHINE_FACTS = re.compile(r"^(python|platform|CUDA|driver|visible|environment) +\S.*$")
# The watcher's observations are samples of a running process: what is seen is shape up to the
# first colon (a state, a thread, a section), the details after it are not.
OBSERVATION = re.compile(r"^(.*?(?:\] outside| seen from outside): [^:]*):.*$")
REPLACEMENTS = [
    (re.compile(r"/tmp/importwatch-demo-[^/\s]+"), "DEMO"),
    (re.compile(r"\S*/bin/python[\d.]*"), "PYTHON"),
    (re.compile(r"\((virtualenv|conda) [^)]*\)"), r"(\1 ENV)"),
    (re.compile(r"\S*/importwatch/(\w+\.py)"), r"IMPORTWATCH/\1"),
    (re.compile(r"platform=\S+"), "platform=PLATFORM"),
    (re.compile(r"0x[0-9a-f]+"), "0xADDR"),
    (re.compile(r"\d+"), "0"),
    (re.compile(r" {2,}"), " "),
]


def shape(line: str) -> str:
    line = line.rstrip()
    for pattern, replacement in REPLACEMENTS:
        line = pattern.sub(replacement, line)
    if MACHINE_FACTS.match(line):
        return line.split()[0]
    observed = OBSERVATION.match(line)
    return observed.group(1) if observed else line


def samples() -> list[list[str]]:
    """The README's fenced blocks that show the demo's output."""
    blocks = re.findall(r"^```\n(.*?)^```$", (ROOT / "README.md").read_text(), re.MULTILINE | re.DOTALL)
    return [block.splitlines() for block in blocks if block.startswith(COMMAND)]


def stream(lines: list[str], outside: bool) -> list[str]:
    return [shape(line) for line in lines if ("] outside: " in line) == outside]


def missing_in_order(sample: list[str], real: list[str]) -> list[str]:
    """The sample lines (shapes) not found in REAL in the sample's order."""
    missing, position = [], 0
    for wanted in sample:
        try:
            position = real.index(wanted, position) + 1
        except ValueError:
            missing.append(wanted)
    return missing


def test_the_readme_has_both_samples() -> None:
    found = sorted("doctor" in block[0] for block in samples())
    assert found == [False, True], "README.md must show the demo's output and its doctor view"


@pytest.mark.slow
@pytest.mark.timeout(180)
@pytest.mark.parametrize("doctor", [False, True], ids=["runner", "doctor"])
def test_readme_sample_has_the_shape_of_the_demo_output(doctor: bool) -> None:
    (sample,) = [block for block in samples() if ("doctor" in block[0]) == doctor]
    shown = [line for line in sample if line.strip() != "..."]
    # A look from outside is a sample taken in time: on a loaded machine the try can end before
    # any look lands. Such a run is tried once more; any other difference is drift.
    for attempt in (1, 2):
        real = _demo_output(doctor)
        assert real[0] == sample[0], "the sample's command line is the demo's"
        missed = [
            missing_in_order(stream(shown, outside), stream(real, outside)) for outside in (False, True)
        ]
        if attempt == 1 and any(missed) and all("outside" in line for lines in missed for line in lines):
            continue
        break
    for missing in missed:
        assert not missing, (
            f"README sample lines (as shapes) not in this order in the output of `python "
            f"demo/stuck_job.py{' --doctor' if doctor else ''}`: copy the sample again from a real run:\n"
            + "\n".join(missing)
        )


def _demo_output(doctor: bool) -> list[str]:
    done = subprocess.run(
        [sys.executable, str(DEMO), *(["--doctor"] if doctor else [])],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=clean_env(), timeout=150,
        stdin=subprocess.DEVNULL,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout
    return done.stdout.splitlines()
