"""doctor: facts read from files, the extension scan, imports that pass, fail and hang, CUDA checks, exits."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from cbuild import FIXTURES, compile_extension, compile_shared, stand_in_torch
from helpers import clean_env
from importwatch.facts import scan
from importwatch.tools.doctor import cudacheck, importcheck, rules

pytestmark = pytest.mark.slow  # every test here starts processes

CUDA = FIXTURES / "cuda"
HANG = FIXTURES / "hang"
DOCTOR = FIXTURES / "doctor"


def run_doctor(*args: str, timeout: float = 60, **env: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "importwatch", "doctor", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=clean_env(**env),
        stdin=subprocess.DEVNULL,
    )


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """A site folder with a stand-in torch built for CUDA 12.1 beside an extension that needs CUDA 11,
    one that hangs in its constructor, one that raises, and one whose CUDA runtime is not found."""
    out = tmp_path_factory.mktemp("doctor")
    cuda11 = compile_shared(
        CUDA / "cudart_standin.c", out / "cuda11" / "libcudart.so.11.0", soname="libcudart.so.11.0"
    )
    site = out / "site"
    torch = stand_in_torch(site, "2.3.1+cu121", "12.1")
    libc10 = compile_shared(CUDA / "dep.c", torch / "lib" / "libc10.so", soname="libc10.so")
    compile_extension(CUDA / "kernels.c", site, "fastkern._kernels", libs=[cuda11, libc10])
    hangsite = out / "hangsite"
    compile_extension(HANG / "blocking_ext.c", hangsite, "hangpkg._core")
    (hangsite / "raises.py").write_text((DOCTOR / "raises.py").read_text())
    compile_extension(CUDA / "kernels.c", out / "unfound", "lostkern._kernels", libs=[cuda11], rpath=False)
    return {"out": out, "site": site, "hangsite": hangsite, "unfound": out / "unfound", "cuda11": cuda11}


# -- the extension scan ----------------------------------------------------------------------------
@pytest.mark.timeout(60)
def test_scan_finds_the_cuda_extension_and_what_it_links(built: dict[str, Path]) -> None:
    result = scan.scan([(str(built["site"]), "")])
    kernels = [lib for lib in result.cuda_libraries if lib.package == "fastkern"]
    assert len(kernels) == 1
    assert kernels[0].cuda == ("libcudart.so.11.0",)
    assert kernels[0].major == 11
    assert kernels[0].torch_links == ("libc10.so",)
    assert kernels[0].module == "fastkern._kernels"
    assert result.cuda_modules() == {"fastkern": ["fastkern._kernels"]}


@pytest.mark.timeout(60)
def test_extension_for_another_cuda_is_a_mismatch_and_exit_1(built: dict[str, Path]) -> None:
    done = run_doctor(
        "--packages", "fastkern", "--no-cuda", "--timeout", "2", PYTHONPATH=str(built["site"])
    )  # fmt: skip
    assert done.returncode == 1, done.stdout + done.stderr
    out = done.stdout
    assert "torch       2.3.1+cu121 (built for CUDA 12.1)" in out
    assert "fastkern/_kernels" in out and "needs CUDA 11 (libcudart.so.11.0); links libc10.so" in out
    assert (
        "MISMATCH" in out
        and "needs libcudart.so.11.0 (CUDA 11) but torch 2.3.1 is built for CUDA 12.1" in out
    )
    # The defaults import torch and the package that ships a CUDA extension; both import here.
    assert (
        "  torch            ok" in out
        and "  fastkern         ok      " in out
        and "(import fastkern._kernels)" in out
    )
    assert "verdict: 1 problem\n" in out
    assert "fix: install the fastkern build for CUDA 12.1" in out


@pytest.mark.timeout(60)
def test_a_site_folder_given_by_path_is_scanned_and_imported_from(built: dict[str, Path]) -> None:
    done = run_doctor("--packages", str(built["site"]), "--no-cuda", "--timeout", "2", "--json")
    assert done.returncode == 1, done.stdout + done.stderr
    report = json.loads(done.stdout)
    assert report["torch"]["cuda"] == "12.1"
    assert [m["package"] for m in report["scan"]["mismatches"]] == ["fastkern"]
    statuses = {check["module"]: check["status"] for check in report["imports"]}
    assert statuses == {"torch": "ok", "fastkern": "ok"}, report["imports"]
    assert report["ok"] is False and len(report["problems"]) == 1, report["problems"]


# -- import checks -------------------------------------------------------------------------------
@pytest.mark.timeout(60)
def test_hung_import_is_named_with_its_library_within_the_timeout(built: dict[str, Path]) -> None:
    started = time.monotonic()
    done = run_doctor(
        "--import", "hangpkg", "hangpkg._core", "--timeout", "1", "--no-cuda",
        "--packages", str(built["hangsite"]),
    )  # fmt: skip
    elapsed = time.monotonic() - started
    assert done.returncode == 1, done.stdout + done.stderr
    # Two imports of 1 s each, plus the grace and start-up: never the hang's forever.
    assert elapsed < 2 * (1 + importcheck.GRACE) + 4, elapsed
    out = done.stdout
    library = next(built["hangsite"].glob("hangpkg/_core*.so"))
    assert "  hangpkg          ok" in out
    assert "  hangpkg._core    HUNG    after" in out
    assert f"in hangpkg._core > dlopen {library}" in out
    # The last look before the end: sleeping in the constructor, unless a loaded machine caught it
    # still starting up; test_outside.py checks the verdicts themselves.
    assert "seen from outside: " in out
    assert f"import hangpkg._core hung: no progress for 1 s in hangpkg._core > dlopen {library}" in out
    assert f"fix: {library} blocks while loading" in out


@pytest.mark.timeout(60)
def test_a_hung_import_shows_the_verdict_its_log_gave_before_the_load(tmp_path: Path) -> None:
    runtime = compile_shared(
        CUDA / "cudart_standin.c", tmp_path / "cuda11" / "libcudart.so.11.0", soname="libcudart.so.11.0"
    )
    # It blocks in its constructor, as an extension built for another CUDA can.
    compile_extension(HANG / "blocking_ext.c", tmp_path / "site", "fastkern._kernels", libs=[runtime])
    stand_in_torch(tmp_path / "site", "2.3.1+cu121", "12.1")
    (tmp_path / "empty").mkdir()
    done = run_doctor(
        "--import", "fastkern._kernels", "--timeout", "1", "--no-cuda", "--packages", str(tmp_path / "empty"),
        PYTHONPATH=str(tmp_path / "site"),
    )  # fmt: skip
    assert done.returncode == 1, done.stdout + done.stderr
    verdict = "needs libcudart.so.11.0 (CUDA 11) but torch 2.3.1 is built for CUDA 12.1"
    lines = done.stdout.splitlines()
    hung = next(i for i, line in enumerate(lines) if line.startswith("  fastkern._kernels HUNG"))
    said = [line for line in lines[hung:] if line.strip().startswith("verdict: ! ")]
    assert said and verdict in said[0], done.stdout


@pytest.mark.timeout(60)
def test_a_package_that_imports_its_own_hung_extension_names_each_step_once(tmp_path: Path) -> None:
    # `import selfkern._kernels` imports selfkern first, whose __init__ imports selfkern._kernels:
    # the log's stack is selfkern._kernels > selfkern > selfkern._kernels > dlopen.
    library = compile_extension(HANG / "blocking_ext.c", tmp_path / "site", "selfkern._kernels")
    (tmp_path / "site" / "selfkern" / "__init__.py").write_text("from selfkern import _kernels\n")
    (tmp_path / "empty").mkdir()
    done = run_doctor(
        "--import", "selfkern._kernels", "--timeout", "1", "--no-cuda", "--packages", str(tmp_path / "empty"),
        PYTHONPATH=str(tmp_path / "site"),
    )  # fmt: skip
    assert done.returncode == 1, done.stdout + done.stderr
    chain = f"selfkern > selfkern._kernels > dlopen {library}"
    assert "  selfkern._kernels HUNG    after " in done.stdout, done.stdout
    assert f" s in {chain}\n" in done.stdout, done.stdout
    assert f"hung: no progress for 1 s in {chain}\n" in done.stdout, done.stdout


@pytest.mark.timeout(60)
def test_a_module_only_in_the_working_folder_is_explained_with_a_command_that_checks_it(
    tmp_path: Path,
) -> None:
    (tmp_path / "localmod.py").write_text("VALUE = 1\n")
    (tmp_path / "empty").mkdir()
    args = ("--import", "localmod", "--timeout", "5", "--no-cuda", "--packages", str(tmp_path / "empty"))
    plain = subprocess.run(
        [sys.executable, "-c", "import localmod"],
        cwd=tmp_path,
        env=clean_env(),
        capture_output=True,
        timeout=60,
    )
    assert plain.returncode == 0  # python itself finds it, from the working folder
    done = subprocess.run(
        [sys.executable, "-m", "importwatch", "doctor", *args],
        cwd=tmp_path, env=clean_env(), capture_output=True, text=True, timeout=60, stdin=subprocess.DEVNULL,
    )  # fmt: skip
    assert done.returncode == 1, done.stdout + done.stderr
    assert "localmod         FAILED  ModuleNotFoundError: No module named 'localmod'" in done.stdout
    assert (
        f"{tmp_path / 'localmod.py'} is in the working folder, which doctor leaves off sys.path (so that a "
        "file there cannot stand in for a module it checks): to check it from here, PYTHONPATH=. "
        "python -m importwatch doctor --import localmod"
    ) in done.stdout, done.stdout
    assert "-c 'import localmod'" not in done.stdout  # no command that would import it fine
    # The command it gives does check it.
    suggested = subprocess.run(
        [sys.executable, "-m", "importwatch", "doctor", *args],
        cwd=tmp_path, env=clean_env(PYTHONPATH="."), capture_output=True, text=True, timeout=60,
        stdin=subprocess.DEVNULL,
    )  # fmt: skip
    assert suggested.returncode == 0, suggested.stdout + suggested.stderr
    assert "  localmod         ok" in suggested.stdout


@pytest.mark.timeout(60)
def test_module_that_raises_is_failed_with_its_message(built: dict[str, Path]) -> None:
    done = run_doctor(
        "--import", "raises", "--timeout", "2", "--no-cuda", "--json", PYTHONPATH=str(built["hangsite"])
    )
    assert done.returncode == 1, done.stdout + done.stderr
    (check,) = json.loads(done.stdout)["imports"]
    assert check["status"] == "failed"
    assert check["error"] == "RuntimeError: doctor fixture: CONFIG_PATH is not set"


@pytest.mark.timeout(60)
def test_missing_cuda_runtime_is_failed_with_its_likely_cause(built: dict[str, Path]) -> None:
    done = run_doctor(
        "--import", "lostkern._kernels", "--timeout", "2", "--no-cuda", PYTHONPATH=str(built["unfound"])
    )
    assert done.returncode == 1, done.stdout + done.stderr
    assert (
        "lostkern._kernels FAILED  ImportError: libcudart.so.11.0: cannot open shared object file"
        in done.stdout
    )
    assert "likely cause: lostkern/_kernels" in done.stdout
    assert "needs libcudart.so.11.0, which is not on the library search path" in done.stdout


@pytest.mark.timeout(60)
def test_all_good_exits_0(tmp_path: Path) -> None:
    done = run_doctor("--import", "json", "email.parser", "--packages", str(tmp_path), "--timeout", "2")
    assert done.returncode == 0, done.stdout + done.stderr
    assert "  json             ok" in done.stdout and "  email.parser     ok" in done.stdout
    assert done.stdout.endswith("verdict: all good\n")


@pytest.mark.timeout(60)
def test_without_torch_it_still_works_and_says_so(tmp_path: Path) -> None:
    # A fresh virtual environment has no torch, whatever this interpreter has; importwatch comes from
    # its source folder.
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(tmp_path / "venv")], check=True)
    python = str(tmp_path / "venv" / "bin" / "python")
    source = str(Path(importcheck.__file__).resolve().parent.parent.parent.parent)
    command = [python, "-m", "importwatch", "doctor", "--timeout", "2"]
    env = clean_env(PYTHONPATH=source)
    done = subprocess.run(command, capture_output=True, text=True, timeout=30, env=env)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "torch       not installed (no torch package on sys.path)" in done.stdout
    assert "imports\n  none to check" in done.stdout
    assert "CUDA checks skipped: torch is not installed" in done.stdout
    as_json = subprocess.run([*command, "--json"], capture_output=True, text=True, timeout=30, env=env)
    report = json.loads(as_json.stdout)
    assert report["torch"] is None and report["imports"] == []
    assert report["cuda_checks"] == {"status": "skipped", "reason": "torch is not installed"}


# -- bad usage -------------------------------------------------------------------------------------
@pytest.mark.timeout(60)
@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--timeout", "soon"], "importwatch: error: --timeout: expected a number of seconds, got 'soon'\n"),
        (
            ["--timeout", "0"],
            "importwatch: error: --timeout: doctor needs a number of seconds > 0, got '0'\n",
        ),
        (["--import", "not a module"], "importwatch: error: --import: 'not a module' is not a module name\n"),
        (["--frobnicate"], "importwatch: error: unrecognized arguments: --frobnicate\n"),
    ],
)
def test_bad_usage_is_one_line_and_exit_2(args: list[str], message: str) -> None:
    done = run_doctor(*args)
    assert (done.returncode, done.stderr, done.stdout) == (2, message, "")


# -- GPU code carried ------------------------------------------------------------------------------
def _fatbin(entries: list[tuple[int, int]]) -> bytes:
    """One fat binary container: (kind, sm) entries, 1 for PTX and 2 for a cubin, each with a payload."""
    body = b""
    for kind, arch in entries:
        payload = f"payload for {arch}".encode().ljust(24, b"\0")
        header = bytearray(64)
        header[0:2] = kind.to_bytes(2, "little")
        header[2:4] = (0x0101).to_bytes(2, "little")
        header[4:8] = (64).to_bytes(4, "little")
        header[8:16] = len(payload).to_bytes(8, "little")
        header[28:32] = arch.to_bytes(4, "little")
        body += bytes(header) + payload
    return (
        (0xBA55ED50).to_bytes(4, "little")
        + (1).to_bytes(2, "little")
        + (16).to_bytes(2, "little")
        + (len(body).to_bytes(8, "little") + body)
    )


def _with_fatbin(tmp_path: Path, name: str, data: bytes) -> Path:
    folder = tmp_path / name
    folder.mkdir()
    (folder / "fatbin_data.h").write_text("#define FATBIN_BYTES {" + ",".join(str(b) for b in data) + "}\n")
    return compile_shared(DOCTOR / "fatbin.c", folder / f"lib{name}.so", extra=[f"-I{folder}"])


@pytest.mark.timeout(60)
def test_architectures_are_read_from_the_fatbin_headers(tmp_path: Path) -> None:
    # Two containers, as two translation units leave them.
    data = _fatbin([(2, 80), (2, 90), (1, 90)]) + _fatbin([(2, 80)])
    arches = scan.architectures(str(_with_fatbin(tmp_path, "kern", data)))
    assert (arches.cubins, arches.ptx) == ([80, 90], [90])
    assert arches.runs_on(9, 0) == "native"
    assert arches.runs_on(8, 6) == "native"  # sm_80 code runs on later minors of 8
    assert arches.runs_on(10, 0) == "jit"  # only PTX for compute_90 fits
    assert arches.runs_on(7, 5) == "none"


@pytest.mark.timeout(60)
def test_architectures_fall_back_to_names_in_clear(tmp_path: Path) -> None:
    data = b".version 8.0\n.target sm_75\n\0code for sm_70\0compute_75\0"
    arches = scan.architectures(str(_with_fatbin(tmp_path, "loose", data)))
    assert (arches.cubins, arches.ptx) == ([70, 75], [75])


@pytest.mark.timeout(60)
def test_a_gpu_without_native_code_in_an_extension_is_a_problem(tmp_path: Path) -> None:
    path = _with_fatbin(tmp_path, "old", _fatbin([(2, 70), (1, 70)]))
    lib = scan.Library(str(path), "old", ["libcudart.so.12"], [])
    found = cudacheck.architecture_checks([{"index": 0, "capability": [9, 0]}], [lib])
    assert found == [{"path": str(path), "gpu": "sm_90", "runs": "jit", "carries": ["sm_70", "compute_70"]}]
    problems: list[dict] = []
    rules.cuda_problems(problems, {"status": "ok", "available": True, "architectures": found})
    assert "carries no code for sm_90 (sm_70, compute_70)" in problems[0]["problem"]
    assert "compiled from PTX on first use" in problems[0]["problem"]


# -- the real torch (CPU) ---------------------------------------------------------------------------
def _has_torch() -> bool:
    return any(Path(entry, "torch", "__init__.py").is_file() for entry in sys.path if entry)


@pytest.mark.torch
@pytest.mark.timeout(120)
@pytest.mark.skipif(not _has_torch(), reason="torch is not importable in this interpreter")
def test_real_torch_imports_and_cuda_checks_are_skipped_with_the_reason() -> None:
    done = run_doctor("--timeout", "20")
    text = done.stdout
    report = json.loads(run_doctor("--timeout", "20", "--json").stdout)
    torch = report["torch"]
    dist = [p.name for p in Path(torch["path"]).parent.glob("torch-*.dist-info")]
    assert dist == [f"torch-{torch['version']}.dist-info"]
    assert f"torch       {torch['version']} ({torch['build']}) at {torch['path']}" in text
    (check,) = [c for c in report["imports"] if c["module"] == "torch"]
    assert check["status"] == "ok"
    assert "  torch            ok" in text
    skipped = report["cuda_checks"]
    assert skipped["status"] == "skipped"
    if not torch["cuda"]:
        assert f"torch {torch['version']} is a CPU build" in skipped["reason"]
    if not os.path.isdir("/proc/driver/nvidia"):
        assert "no NVIDIA driver (no /proc/driver/nvidia)" in skipped["reason"]
    assert f"CUDA checks skipped: {skipped['reason']}" in text
    assert report["scan"]["shared_objects"] > 0
    read = report["scan"]["shared_objects"]
    assert f"extensions  {read} shared object{'s' if read != 1 else ''} read" in text
    assert (done.returncode, report["ok"]) == (0, True)
