"""mapped: the shared objects a process maps, seen from inside and from outside, after real ctypes loads."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from cbuild import FIXTURES, compile_shared
from importwatch.facts.mapped import MappedObjects, soname_candidates

CUDA = FIXTURES / "cuda"


@pytest.fixture(scope="module")
def libs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    out = tmp_path_factory.mktemp("mapped")
    # The file is libdep.so.1.2.3 and the loader asks for libdep.so.1, as with real versioned libraries.
    dep = compile_shared(CUDA / "dep.c", out / "deps" / "libdep.so.1.2.3", soname="libdep.so.1")
    (out / "deps" / "libdep.so.1").symlink_to("libdep.so.1.2.3")
    top = compile_shared(CUDA / "top.c", out / "libtop.so", libs=[out / "deps" / "libdep.so.1"])
    lone = compile_shared(CUDA / "dep.c", out / "liblone.so")
    other = compile_shared(CUDA / "dep.c", out / "libother.so")
    (out / "liblink.so").symlink_to(other.name)  # loaded by this name, mapped under the other
    return {"dep": dep, "top": top, "lone": lone, "link": out / "liblink.so"}


INSIDE = """
import ctypes, json, sys, time
from importwatch.facts.mapped import MappedObjects
mapped = MappedObjects()
report = {"before": mapped.needs_rescan(["libdep.so.1"]), "libc": mapped.needs_rescan(["libc.so.6"])}
ctypes.CDLL(sys.argv[1])
start = time.perf_counter()
report["new"] = mapped.rescan()
report["ms"] = (time.perf_counter() - start) * 1000
report["after"] = mapped.needs_rescan(["libdep.so.1", "libtop.so"])
report["again"] = mapped.rescan()
report["names"] = sorted(mapped.known_names())
ctypes.CDLL(sys.argv[2])  # all it needs is mapped already: no rescan, only a note
report["skip"] = mapped.needs_rescan(["libc.so.6"])
mapped.note(sys.argv[2])
report["noted"] = mapped.rescan()
ctypes.CDLL(sys.argv[3])  # a link: maps lists the file it points to, which note() must cover too
mapped.note(sys.argv[3])
report["linked"] = mapped.rescan()
print(json.dumps(report))
"""


@pytest.mark.slow
@pytest.mark.timeout(60)
def test_a_ctypes_load_shows_the_library_and_its_dependency(libs: dict[str, Path]) -> None:
    done = subprocess.run(
        [sys.executable, "-c", INSIDE, str(libs["top"]), str(libs["lone"]), str(libs["link"])],
        capture_output=True,
        text=True,
        timeout=30,
    )
    report = json.loads(done.stdout)
    assert report["before"] is True and report["libc"] is False
    assert sorted(report["new"]) == sorted([str(libs["dep"]), str(libs["top"])])  # resolved paths
    assert report["after"] is False and report["again"] == []
    assert {"libdep.so.1", "libdep.so.1.2.3", "libtop.so", "libc.so.6"} <= set(report["names"])
    assert report["skip"] is False and report["noted"] == [] and report["linked"] == []
    print(f"rescan after one load: {report['ms']:.3f} ms")


@pytest.mark.slow
@pytest.mark.timeout(60)
def test_another_process_seen_from_outside(libs: dict[str, Path]) -> None:
    code = "import ctypes, sys; ctypes.CDLL(sys.argv[1]); print('loaded', flush=True); sys.stdin.read()"
    child = subprocess.Popen(
        [sys.executable, "-c", code, str(libs["top"])],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert child.stdout.readline().strip() == "loaded"
        mapped = MappedObjects(child.pid)
        assert mapped.error is None
        assert {str(libs["top"]), str(libs["dep"])} <= set(mapped.paths)
        assert not mapped.needs_rescan(["libdep.so.1", "libc.so.6"])
    finally:
        child.stdin.close()
        child.wait(timeout=30)
    assert mapped.rescan() == [] and isinstance(mapped.error, OSError)  # the process is gone


def test_this_process_lists_only_shared_objects() -> None:
    mapped = MappedObjects()
    assert mapped.error is None and mapped.paths
    for path in mapped.paths:
        name = os.path.basename(path)
        assert path.startswith("/") and (name.endswith(".so") or ".so." in name), path
    assert mapped.rescan() == []


def test_soname_candidates() -> None:
    assert soname_candidates("libstdc++.so.6.0.32") == [
        "libstdc++.so.6.0.32",
        "libstdc++.so.6.0",
        "libstdc++.so.6",
        "libstdc++.so",
    ]
    assert soname_candidates("libtorch_cpu.so") == ["libtorch_cpu.so"]
    assert soname_candidates("_C.cpython-311-x86_64-linux-gnu.so") == ["_C.cpython-311-x86_64-linux-gnu.so"]
