"""loaded: the loader's own list, read in C or through the program's ctypes, says what each real load added."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest

from cbuild import FIXTURES, compile_shared
from helpers import clean_env, importwatch

CUDA = FIXTURES / "cuda"
BUILT = importlib.util.find_spec("importwatch.tracing._speedups") is not None
pytestmark = [pytest.mark.timeout(60), pytest.mark.slow]


@pytest.fixture(scope="module")
def libs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    out = tmp_path_factory.mktemp("loaded")
    compile_shared(CUDA / "dep.c", out / "deps" / "libdep.so.1.2.3", soname="libdep.so.1")
    (out / "deps" / "libdep.so.1").symlink_to("libdep.so.1.2.3")
    top = compile_shared(CUDA / "top.c", out / "libtop.so", libs=[out / "deps" / "libdep.so.1"])
    lone = compile_shared(CUDA / "dep.c", out / "liblone.so")
    other = compile_shared(CUDA / "dep.c", out / "libother.so")
    (out / "liblink.so").symlink_to(other.name)
    opened = compile_shared(CUDA / "dep.c", out / "libopened.so")
    opener = compile_shared(CUDA / "opener.c", out / "libopener.so", extra=["-ldl"])
    return {
        "top": top,
        "dep": out / "deps" / "libdep.so.1",  # the name the loader found it by, through top's RPATH
        "lone": lone,
        "link": out / "liblink.so",
        "opened": opened,
        "opener": opener,
    }


STEPS = """
import ctypes, json, sys
from importwatch.facts import loaded
if sys.argv[1] == "C":
    from importwatch.tracing import _speedups
    looks = (_speedups.loaded_counters, _speedups.loaded_names)
else:
    looks = loaded.through_ctypes(ctypes)
loaded = loaded.LoadedObjects(*looks)
report = {"nothing": loaded.added("")}
for path in sys.argv[2:]:
    ctypes.CDLL(path)
    report[path] = loaded.added(path)
ctypes.CDLL(sys.argv[2])  # loaded again: nothing new at all
report["again"] = loaded.added(sys.argv[2])
print(json.dumps(report))
"""


@pytest.mark.parametrize(
    "looks",
    [
        "ctypes",
        pytest.param("C", marks=pytest.mark.skipif(not BUILT, reason="the C accelerator is not built")),
    ],
)
def test_each_load_lists_what_came_with_it(libs: dict[str, Path], looks: str) -> None:
    order = [libs["top"], libs["lone"], libs["link"], libs["opener"]]
    done = subprocess.run(
        [sys.executable, "-c", STEPS, looks, *map(str, order)],
        capture_output=True,
        text=True,
        timeout=30,
        env=clean_env(OPENER_LOADS=str(libs["opened"])),
    )
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    assert report["nothing"] == [] and report["again"] == []
    # A dependency, by the name the loader found it under (the link, not the file it points to).
    assert report[str(libs["top"])] == [str(libs["dep"])]
    # Only the file itself came: the counters say so, and the list is not walked.
    assert report[str(libs["lone"])] == [] and report[str(libs["link"])] == []
    # A constructor's own dlopen, which no DT_NEEDED entry announces.
    assert report[str(libs["opener"])] == [str(libs["opened"])]


@pytest.mark.parametrize("pure", ["0", "1"], ids=["C", "pure"])
def test_a_traced_load_lists_what_its_constructor_opened(libs: dict[str, Path], pure: str) -> None:
    code = f"import ctypes\nctypes.CDLL({str(libs['opener'])!r})\n"
    env = clean_env(OPENER_LOADS=str(libs["opened"]), IMPORTWATCH_PURE=pure)
    result = importwatch("-c", code, env=env)
    assert result.returncode == 0, result.stderr
    end = next(line for line in result.stderr.splitlines() if f"< dlopen {libs['opener']} " in line)
    assert end.endswith(f"; mapped 1 new: {libs['opened']}")
