"""Native loads say what each file links, what it pulled in, and why a CUDA mismatch is suspect."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from cbuild import FIXTURES, compile_extension, compile_shared, stand_in_torch
from helpers import clean_env, importwatch, traced
from test_side_by_side import _ours_removed, three_ways

pytestmark = [pytest.mark.timeout(60), pytest.mark.slow]
CUDA = FIXTURES / "cuda"


@pytest.fixture(scope="module")
def kernels(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """fastkern._kernels linked against a stand-in libcudart.so.11.0, in a site folder."""
    out = tmp_path_factory.mktemp("native")
    runtime = compile_shared(
        CUDA / "cudart_standin.c", out / "cuda-11.0" / "libcudart.so.11.0", soname="libcudart.so.11.0"
    )
    compile_extension(CUDA / "kernels.c", out / "site", "fastkern._kernels", libs=[runtime])
    return out


def _torch(tmp_path: Path, version: str, cuda: str | None) -> Path:
    stand_in_torch(tmp_path / "torch-site", version, cuda)
    return tmp_path / "torch-site"


def _run(
    kernels: Path, torch_site: Path, code: str = "import fastkern._kernels"
) -> subprocess.CompletedProcess:
    env = clean_env(PYTHONPATH=f"{kernels / 'site'}{os.pathsep}{torch_site}")
    return importwatch("-c", code, env=env)


def test_cuda_mismatch_verdict_names_both_versions(kernels: Path, tmp_path: Path) -> None:
    result = _run(kernels, _torch(tmp_path, "2.3.1+cu121", "12.1"))
    assert result.returncode == 0, result.stderr
    lines = result.stderr.splitlines()
    start = next(i for i, line in enumerate(lines) if "> dlopen " in line and "_kernels" in line)
    assert lines[start].endswith("(fastkern._kernels) needs libcudart.so.11.0")
    verdict = lines[start + 1]  # written before dlopen is called
    assert "] ! fastkern/_kernels" in verdict
    assert "needs libcudart.so.11.0 (CUDA 11) but torch 2.3.1 is built for CUDA 12.1" in verdict


def test_matching_cuda_gives_no_verdict(kernels: Path, tmp_path: Path) -> None:
    result = _run(kernels, _torch(tmp_path, "2.0.1+cu118", "11.8"))
    assert result.returncode == 0, result.stderr
    assert "needs libcudart.so.11.0" in result.stderr
    assert "] ! " not in result.stderr


def test_cpu_torch_with_a_cuda_extension_is_named(kernels: Path, tmp_path: Path) -> None:
    result = _run(kernels, _torch(tmp_path, "2.3.1+cpu", None))
    verdicts = [line for line in result.stderr.splitlines() if "] ! " in line]
    assert len(verdicts) == 1 and "CPU build" in verdicts[0] and "libcudart.so.11.0" in verdicts[0]


def test_end_line_lists_what_the_load_pulled_in(kernels: Path, tmp_path: Path) -> None:
    result = _run(kernels, _torch(tmp_path, "2.0.1+cu118", "11.8"))
    end = next(line for line in result.stderr.splitlines() if "< dlopen " in line and "_kernels" in line)
    assert "; mapped 1 new: " in end and end.endswith("cuda-11.0/libcudart.so.11.0")


def test_torch_facts_are_logged_before_its_import_starts(kernels: Path, tmp_path: Path) -> None:
    result = _run(kernels, _torch(tmp_path, "2.3.1+cu121", "12.1"), code="import torch")
    lines = [line.split("] ", 1)[1] for line in result.stderr.splitlines() if line.startswith("[importwatch")]
    facts = next(
        i for i, line in enumerate(lines) if line.startswith("torch 2.3.1+cu121 (built for CUDA 12.1)")
    )
    assert lines[facts + 1] == "> torch"
    assert any(line.startswith("torch 2.3.1+cu121 (built for CUDA 12.1) at ") for line in lines[facts + 1 :])


def test_ctypes_missing_library_error_passes_through_unchanged(tmp_path: Path) -> None:
    # ctypes._dlopen is a door around the builtin: it reads as the builtin, and a failed load's error, caught
    # or not, is plain python's (the frame that names the file takes its entry out; so does the pure twin's door).
    code = (
        "import ctypes\n"
        "print(ctypes._dlopen.__name__, ctypes._dlopen.__module__, ctypes._dlopen.__doc__.split('(')[0])\n"
        "try:\n    ctypes.CDLL('libdoes_not_exist_here.so.3')\n"
        "except OSError as error:\n    print(type(error).__name__, error.errno, error)\n"
        "ctypes.CDLL('libdoes_not_exist_here.so.3')\n"
    )
    runs = three_ways(["-c", code], tmp_path)
    plain = runs["plain"]
    assert (
        plain.stdout.startswith("dlopen _ctypes dlopen\n")
        and "cannot open shared object file" in plain.stdout
    )
    for name in ("runner", "IMPORTWATCH=1"):
        run = runs[name]
        assert (run.returncode, run.stdout) == (plain.returncode, plain.stdout) == (1, plain.stdout), name
        assert "< dlopen libdoes_not_exist_here.so.3 " in run.stderr and " failed OSError: " in run.stderr
        assert "] ! " in run.stderr and "libdoes_not_exist_here.so.3" in run.stderr.split("] ! ")[1]
        if os.environ.get("IMPORTWATCH_PURE") == "1" and sys.version_info < (3, 11):
            # The pure twin before 3.11: a bare raise re-raises the traceback as it was caught (docs/limits.md).
            assert _ours_removed(run.stderr).count(", in dlopen") == 2, run.stderr
            continue
        assert _ours_removed(run.stderr) == plain.stderr, name


ODD_CREATE_MODULE = """\
import importlib.machinery, importlib.util, sys
spec = next(spec for spec in map(importlib.util.find_spec, ("_json", "_struct", "_csv", "select", "math"))
            if spec is not None and (spec.origin or "").endswith(".so"))
module = spec.loader.create_module(spec=spec)  # a keyword call
print(type(module).__name__, module.__name__)
try:
    importlib.machinery.ExtensionFileLoader.create_module(spec.loader, object())  # a spec that is no spec
except Exception as error:
    print(type(error).__name__, error)
"""


def test_create_module_called_otherwise_than_by_importlib_behaves_as_under_plain_python(
    tmp_path: Path,
) -> None:
    # The native load's door makes an event only of importlib's call, (loader, spec): any other call meets
    # importlib's function as without importwatch, and no line of ours says anything about it.
    runs = three_ways(
        ["-c", ODD_CREATE_MODULE],
        tmp_path,
        runner_options=("--stderr", "stalls"),
        IMPORTWATCH_STDERR="stalls",
    )
    plain = runs["plain"]
    assert plain.returncode == 0 and plain.stdout.count("\n") == 2 and "AttributeError" in plain.stdout, plain
    for name in ("runner", "IMPORTWATCH=1"):
        run = runs[name]
        assert (run.returncode, run.stdout, run.stderr) == (0, plain.stdout, plain.stderr), name


def test_undefined_symbol_is_explained(tmp_path: Path) -> None:
    library = compile_shared(CUDA / "needs_c10.c", tmp_path / "libneeds_c10.so", extra=["-Wl,-z,now"])
    code = f"import ctypes\ntry:\n    ctypes.CDLL({str(library)!r})\nexcept OSError:\n    pass\n"
    result = importwatch("-c", code)
    verdict = next(line for line in result.stderr.splitlines() if "] ! " in line)
    assert "misses c10::detail::torchCheckFail" in verdict and "built against another torch" in verdict


@pytest.mark.parametrize("content", [b"not an ELF at all\n", b"\x7fELF\x02\x01\x01" + b"\0" * 40, b""])
def test_broken_files_named_so_fail_as_without_us(tmp_path: Path, content: bytes) -> None:
    site = tmp_path / "site"
    site.mkdir()
    import sysconfig

    (site / ("broken" + sysconfig.get_config_var("EXT_SUFFIX"))).write_bytes(content)
    code = "try:\n    import broken\nexcept ImportError as e:\n    print(type(e).__name__, e)\n"
    env = clean_env(PYTHONPATH=str(site))
    plain = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env)
    traced = importwatch("-c", code, env=env)
    assert traced.stdout == plain.stdout and traced.stdout.startswith("ImportError")
    assert "internal error" not in traced.stderr and "needs " not in traced.stderr


@pytest.mark.torch
def test_real_torch_lists_its_native_loads_and_what_torch_c_pulled_in(tmp_path: Path) -> None:
    pytest.importorskip("torch")
    log = tmp_path / "torch.log"
    result = importwatch("--log", str(log), "-c", "import torch", timeout=180)
    assert result.returncode == 0, result.stderr[-2000:]
    text = log.read_text()
    lines = [line.split("] ", 1)[1] for line in text.splitlines() if line.startswith("[importwatch")]
    first_torch = next(i for i, line in enumerate(lines) if line.startswith("torch 2.13.0"))
    assert lines[first_torch + 1] == "> torch"  # version known before its import starts
    c_end = next(line for line in lines if "< dlopen " in line and "/torch/_C." in line)
    assert "libtorch_cpu.so" in c_end and "libc10.so" in c_end and "libtorch_python.so" in c_end
    assert sum(1 for line in lines if "> dlopen " in line) >= 20


def test_hang_in_a_dependency_names_the_extension_and_what_it_mapped(
    kernels: Path, tmp_path: Path, start
) -> None:
    blocking = compile_shared(FIXTURES / "hang" / "blocking_lib.c", tmp_path / "deps" / "libblocking.so")
    runtime = kernels / "cuda-11.0" / "libcudart.so.11.0"
    compile_extension(CUDA / "kernels.c", tmp_path / "site", "depkern._kernels", libs=[runtime, blocking])
    proc = start(traced("--timeout", "1", "-c", "import depkern._kernels"), PYTHONPATH=str(tmp_path / "site"))
    proc.wait_for("outside: mapped since dlopen", timeout=20)
    report = proc.stderr
    so = next((tmp_path / "site" / "depkern").glob("_kernels*.so"))
    assert f"> dlopen {so} (depkern._kernels) needs libcudart.so.11.0" in report
    mapped = next(line for line in report.splitlines() if "outside: mapped since dlopen" in line)
    assert str(so) in mapped and "libblocking.so" in mapped.split(": ", 2)[-1]
