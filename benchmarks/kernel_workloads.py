"""The programs bench_kernel.py times: generated module trees and chains, torch, the frame probe, a first native load.

Generated folders are written once into the cache folder and reused (a stamp marks each complete).
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path
from typing import NamedTuple

from bench_overhead import make_tree

PROBE_DEPTH = 600  # longer than any chain the default recursion limit lets nest
PROBE_TIMEOUT_S = 120.0


class Workload(NamedTuple):
    """What to run, and the folder that goes on PYTHONPATH (empty for none)."""

    name: str
    code: str
    path: str


def generated(cache: Path, name: str, write) -> Path:
    """CACHE/trees/NAME, written once by WRITE(folder); a stamp marks it complete."""
    folder = cache / "trees" / name
    if not (folder / "bench-stamp").exists():
        shutil.rmtree(folder, ignore_errors=True)
        folder.mkdir(parents=True)
        write(folder)
        (folder / "bench-stamp").write_text("")
    return folder


def write_chain(folder: Path, depth: int) -> None:
    for index in range(depth):
        following = f"import chain_{index + 1}\n" if index + 1 < depth else ""
        (folder / f"chain_{index}.py").write_text(f"VALUE = {index}\n{following}")


def write_probe(folder: Path) -> None:
    """probe_0 .. probe_N, each noting its depth; probe_1 also counts the frames back to probe_0."""
    count_frames = (
        "import sys\n"
        "_frame, _steps = sys._getframe(), 0\n"
        "while _frame is not None and _frame.f_globals.get('__name__') != 'probe_0':\n"
        "    _frame, _steps = _frame.f_back, _steps + 1\n"
        "builtins.IW_PROBE_FRAMES = _steps if _frame is not None else -1\n"
    )
    for index in range(PROBE_DEPTH):
        text = f"import builtins\nbuiltins.IW_PROBE_DEPTH = {index}\n"
        text += count_frames if index == 1 else ""
        text += f"import probe_{index + 1}\n" if index + 1 < PROBE_DEPTH else ""
        (folder / f"probe_{index}.py").write_text(text)


def workloads(names: list[str], cache: Path, modules: int, depth: int) -> list[Workload]:
    chosen = []
    if "tree" in names:
        folder = generated(cache, f"tree-{modules}", lambda f: make_tree(f, modules))
        chosen.append(Workload("tree", "import bench_all", str(folder)))
    if "chain" in names:
        folder = generated(cache, f"chain-{depth}", lambda f: write_chain(f, depth))
        chosen.append(Workload("chain", "import chain_0", str(folder)))
    if "torch" in names:
        chosen.append(Workload("torch", "import torch", ""))
    return chosen


# Extension modules one of which a program's first native load is, in this order of preference.
_NATIVE_PROBES = ("math", "_json", "_struct", "_socket", "select")


def native_module(python: str) -> str | None:
    """An extension module that PYTHON loads from a file (not one built into the interpreter), if any."""
    code = (
        "import importlib.util as u\n"
        f"for name in {_NATIVE_PROBES!r}:\n"
        "    spec = u.find_spec(name)\n"
        "    if spec and spec.origin and spec.origin.endswith('.so'):\n"
        "        print(name); break\n"
    )
    done = subprocess.run([python, "-c", code], capture_output=True, text=True, timeout=PROBE_TIMEOUT_S)
    return done.stdout.strip() or None
