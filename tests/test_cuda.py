"""cuda: torch facts from files, verdicts on a stand-in CUDA runtime and extension, load errors explained."""

from __future__ import annotations

import importlib.metadata
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from cbuild import FIXTURES, compile_extension, compile_shared, stand_in_torch
from helpers import torch_dir
from importwatch.events import TORCH as TORCH_LINE
from importwatch.events import render
from importwatch.facts.cuda import (
    NVIDIA_PROC,
    TorchFacts,
    cuda_major,
    driver_verdicts,
    driver_version,
    explain_load_error,
    find_torch,
    gpus,
    native_verdicts,
    torch_fields,
)
from importwatch.facts.elf import read_dynamic

CUDA = FIXTURES / "cuda"
TORCH = torch_dir()  # the torch this interpreter would import, if any
NO_LIBRARY_PATH: dict[str, str] = {}  # find_torch's environ when LD_LIBRARY_PATH must not count


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    out = tmp_path_factory.mktemp("cuda")
    cuda11 = compile_shared(
        CUDA / "cudart_standin.c", out / "cuda11" / "libcudart.so.11.0", soname="libcudart.so.11.0"
    )
    cuda12 = compile_shared(
        CUDA / "cudart_standin.c",
        out / "site12" / "nvidia" / "cuda_runtime" / "lib" / "libcudart.so.12",
        soname="libcudart.so.12",
        extra=["-DSTANDIN_CUDA_VERSION=12010"],
    )
    torches = {}
    for name, version, cuda in (
        ("cu121", "2.3.1+cu121", "12.1"),
        ("cpu", "2.3.1+cpu", None),
        ("cu118", "2.3.1+cu118", "11.8"),
    ):
        torches[name] = stand_in_torch(out / name, version, cuda).parent
    stand_in_torch(out / "rocm", "2.3.1+rocm6.0", None, hip="6.0.32830-d62f6a171")
    stand_in_torch(out / "site12", "2.3.1+cu121", "12.1")  # beside its nvidia-cuda-runtime wheel
    return {
        "out": out,
        "cuda11": cuda11,
        "kernels": compile_extension(CUDA / "kernels.c", out / "site", "fastkern._kernels", libs=[cuda11]),
        "kernels12": compile_extension(
            CUDA / "kernels.c", out / "site12", "fastkern12._kernels", libs=[cuda12]
        ),
        "unfound": compile_extension(
            CUDA / "kernels.c", out / "norpath", "fastkern._kernels", libs=[cuda11], rpath=False
        ),
        "plain": compile_shared(CUDA / "dep.c", out / "libplain.so"),
        **torches,
    }


def _facts(built: dict[str, Path], name: str) -> TorchFacts:
    facts = find_torch([str(built[name] if name in built else built["out"] / name)], NO_LIBRARY_PATH)
    assert facts is not None
    return facts


@pytest.mark.slow
@pytest.mark.timeout(60)
def test_the_stand_in_extension_really_loads_its_runtime(built: dict[str, Path]) -> None:
    code = "import fastkern._kernels as k; print(k.runtime_version())"
    env = {**os.environ, "PYTHONPATH": str(built["out"] / "site")}
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=30)
    assert done.stdout.strip() == "11000", done.stderr


@pytest.mark.slow
def test_verdict_names_both_cuda_versions(built: dict[str, Path]) -> None:
    extension = built["kernels"]
    verdicts = native_verdicts(str(extension), read_dynamic(str(extension)), _facts(built, "cu121"))
    assert verdicts == [
        f"fastkern/{extension.name} needs libcudart.so.11.0 (CUDA 11) but torch 2.3.1 is built for CUDA 12.1"
    ]


@pytest.mark.slow
def test_verdict_on_a_cpu_build(built: dict[str, Path]) -> None:
    extension = built["kernels"]
    verdicts = native_verdicts(str(extension), read_dynamic(str(extension)), _facts(built, "cpu"))
    assert verdicts == [
        f"fastkern/{extension.name} needs libcudart.so.11.0 but torch 2.3.1 is a CPU build, without CUDA"
    ]


@pytest.mark.slow
def test_verdict_on_a_rocm_build(built: dict[str, Path]) -> None:
    extension = built["kernels"]
    facts = _facts(built, "rocm")
    assert facts.build == "ROCm build, HIP 6.0.32830"
    verdicts = native_verdicts(str(extension), read_dynamic(str(extension)), facts)
    assert verdicts == [f"fastkern/{extension.name} needs libcudart.so.11.0 but torch 2.3.1 is a ROCm build"]


@pytest.mark.slow
def test_matching_cuda_or_no_cuda_gives_no_verdict(built: dict[str, Path]) -> None:
    extension = built["kernels"]
    assert native_verdicts(str(extension), read_dynamic(str(extension)), _facts(built, "cu118")) == []
    plain = str(built["plain"])
    for name in ("cu121", "cpu"):
        assert native_verdicts(plain, read_dynamic(plain), _facts(built, name)) == []
    assert native_verdicts(str(extension), None, _facts(built, "cpu")) == []  # not ELF: not described
    assert native_verdicts(str(extension), read_dynamic(str(extension)), None) == []  # torch not installed


@pytest.mark.slow
def test_driver_too_old_for_the_runtime_an_extension_needs(built: dict[str, Path]) -> None:
    extension = built["kernels12"]
    info = read_dynamic(str(extension))
    torch = _facts(built, "site12")
    assert native_verdicts(str(extension), info, torch, driver="535.104.05") == []
    assert native_verdicts(str(extension), info, torch, driver="470.57.02") == [
        f"fastkern12/{extension.name} needs libcudart.so.12 (CUDA 12), which needs NVIDIA driver "
        ">= 525.60.13; this driver is 470.57.02"
    ]


def test_driver_verdicts_for_torch() -> None:
    torch = TorchFacts("/venv/torch", "2.3.1+cu121", "12.1")
    assert driver_verdicts(torch, "535.104.05") == []
    assert driver_verdicts(torch, None) == []
    assert driver_verdicts(TorchFacts("/venv/torch", "2.3.1+cpu", None), "450.80.02") == []
    assert driver_verdicts(torch, "470.57.02") == [
        "torch 2.3.1 is built for CUDA 12.1, which needs NVIDIA driver >= 525.60.13; this driver is 470.57.02"
    ]
    (soft,) = driver_verdicts(torch, "525.85.12")
    assert soft.startswith(
        "NVIDIA driver 525.85.12 is older than CUDA 12.1 (530.30.02): torch 2.3.1 runs in "
    )


@pytest.mark.slow
def test_find_torch_reads_the_version_file(built: dict[str, Path], tmp_path: Path) -> None:
    facts = find_torch([str(tmp_path), str(built["cu121"]), str(built["cpu"])], NO_LIBRARY_PATH)
    assert facts.path == str(built["cu121"] / "torch")
    assert (facts.version, facts.cuda, facts.hip, facts.cuda_major) == ("2.3.1+cu121", "12.1", None, 12)
    assert facts.git_version == "0123456789abcdef0123456789abcdef01234567"
    assert facts.build == "built for CUDA 12.1" and facts.short_version == "2.3.1"
    assert find_torch([str(tmp_path)]) is None
    (tmp_path / "torch").mkdir()  # a namespace folder named torch is not the package
    assert find_torch([str(tmp_path)]) is None
    (tmp_path / "torch" / "__init__.py").write_text("")
    assert find_torch([str(tmp_path)]).build == "version unknown: no torch/version.py"


@pytest.mark.slow
@pytest.mark.timeout(60)
def test_find_torch_never_imports_torch(built: dict[str, Path], tmp_path: Path) -> None:
    package = stand_in_torch(tmp_path, "2.3.1+cu121", "12.1")
    package.joinpath("__init__.py").write_text("raise SystemExit('torch was imported')\n")
    code = (
        "import sys\nfrom importwatch.facts.cuda import find_torch\n"
        f"facts = find_torch([{str(tmp_path)!r}])\n"
        "print(facts.version, facts.cuda, 'torch' in sys.modules, 'ctypes' in sys.modules)"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=30)
    assert done.stdout.split() == ["2.3.1+cu121", "12.1", "False", "False"], done.stderr


@pytest.mark.slow
def test_runtimes_from_wheels_and_library_path(built: dict[str, Path]) -> None:
    facts = find_torch(
        [str(built["out"] / "site12")], {"LD_LIBRARY_PATH": f"/nonexistent::{built['cuda11'].parent}"}
    )
    found = [(runtime.name, runtime.origin) for runtime in facts.runtimes]
    assert found[:2] == [
        ("libcudart.so.12", "nvidia-cuda-runtime wheel"),
        ("libcudart.so.11.0", "LD_LIBRARY_PATH"),
    ]
    line = describe_torch(facts)
    assert line.startswith(
        f"torch 2.3.1+cu121 (built for CUDA 12.1) at {facts.path}; CUDA runtime: libcudart.so.12 "
        "(nvidia-cuda-runtime wheel), libcudart.so.11.0 (LD_LIBRARY_PATH)"
    )


def test_describe_the_driver_gpus_and_visible_devices(tmp_path: Path) -> None:
    torch = TorchFacts("/venv/torch", "2.3.1+cu121", "12.1")
    assert describe_torch(torch, visible="") == (
        "torch 2.3.1+cu121 (built for CUDA 12.1) at /venv/torch; CUDA runtime: none found (torch/lib, "
        f"nvidia wheels, LD_LIBRARY_PATH, /usr/local/cuda*); driver: none (no {NVIDIA_PROC}/version); "
        "CUDA_VISIBLE_DEVICES is empty: no GPU visible"
    )
    line = describe_torch(torch, "535.104.05", ["NVIDIA H200", "NVIDIA H200"], "0,1")
    assert line.endswith("; driver: 535.104.05, 2 GPUs (NVIDIA H200); CUDA_VISIBLE_DEVICES=0,1")


def test_driver_version_and_gpus_from_proc_files(tmp_path: Path) -> None:
    # The first lines of /proc/driver/nvidia/version of the proprietary and the open kernel module.
    lines = {
        "535.104.05": "NVRM version: NVIDIA UNIX x86_64 Kernel Module  535.104.05  Sat Aug 19 01:15:15 UTC "
        "2023",
        "550.54.15": "NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  550.54.15  Release Build  "
        "(dvs-builder@U16-T02-35-3)  Tue Mar  5 22:15:33 UTC 2024",
    }
    for version, line in lines.items():
        (tmp_path / "version").write_text(
            line + "\nGCC version:  gcc version 12.3.0 (Ubuntu 12.3.0-1ubuntu1~22.04)\n"
        )
        assert driver_version(str(tmp_path)) == version
    gpu = tmp_path / "gpus" / "0000:18:00.0"
    gpu.mkdir(parents=True)
    (gpu / "information").write_text("Model: \t\t NVIDIA H200\nIRQ:   \t\t 16\nGPU UUID: \t GPU-0123\n")
    assert gpus(str(tmp_path)) == ["NVIDIA H200"]
    assert driver_version(str(tmp_path / "absent")) is None and gpus(str(tmp_path / "absent")) == []


def test_driver_of_this_machine() -> None:
    version = driver_version()
    if not os.path.exists(f"{NVIDIA_PROC}/version"):
        assert version is None and gpus() == []
        assert f"driver: none (no {NVIDIA_PROC}/version)" in describe_torch(TorchFacts("/t", "2", None))
    else:
        assert version is not None and version.replace(".", "").isdigit()
        assert len(gpus()) == len(os.listdir(f"{NVIDIA_PROC}/gpus"))


def describe_torch(facts: TorchFacts, *args: Any, **named: Any) -> str:
    """The torch line written before import, as the log has it (without its tail)."""
    line = render(TORCH_LINE, torch_fields(facts, *args, **named))
    assert line.endswith(" (from its files, before import)")
    return line.removesuffix(" (from its files, before import)")


def test_cuda_major_of_sonames() -> None:
    assert cuda_major("libcudart.so.11.0") == 11
    assert cuda_major("/usr/local/cuda/lib64/libcublas.so.12") == 12
    assert cuda_major("libcublasLt.so.12.1.3.1") == 12
    assert cuda_major("libcudart-9335f6a2.so.12") == 12
    assert cuda_major("libnvrtc.so.11.2") == 11
    for name in (
        "libcudart.so",
        "libcudnn.so.8",
        "libcuda.so.1",
        "libcufft.so.11",
        "libc.so.6",
        "libcudart.so.x",
    ):
        assert cuda_major(name) is None


LOADER = """
import ctypes, json, sys
messages = {}
for key, path in json.loads(sys.argv[1]).items():
    try:
        if key == "import":
            sys.path.insert(0, path)
            import fastkern._kernels
        else:
            ctypes.CDLL(path)
    except (ImportError, OSError) as error:
        messages[key] = str(error)
print(json.dumps(messages))
"""


def _versioned(out: Path, node: str) -> Path:
    script = out / f"{node}.map"
    script.write_text(f"{node} {{ global: versioned_symbol; local: *; }};\n")
    return compile_shared(
        CUDA / "versioned.c",
        out / "libversioned.so.1",
        soname="libversioned.so.1",
        extra=[f"-Wl,--version-script={script}"],
    )


@pytest.mark.slow
@pytest.mark.timeout(60)
def test_real_load_errors_are_explained(built: dict[str, Path], tmp_path: Path) -> None:
    user = compile_shared(
        CUDA / "versioned_user.c", tmp_path / "libuser.so", libs=[_versioned(tmp_path, "GLIBCXX_9.9.99")]
    )
    _versioned(tmp_path, "GLIBCXX_1.0")  # the library found at run time is older than the one linked
    not_elf = tmp_path / "notelf.so"
    not_elf.write_text("not a shared object\n")
    loads = {
        "import": str(built["unfound"].parent.parent),
        "c10": str(compile_shared(CUDA / "needs_c10.c", tmp_path / "libneeds_c10.so")),
        "version": str(user),
        "not_elf": str(not_elf),
    }
    done = subprocess.run(
        [sys.executable, "-c", LOADER, json.dumps(loads)], capture_output=True, text=True, timeout=30
    )
    messages = json.loads(done.stdout)
    assert set(messages) == set(loads), done.stderr

    torch = TorchFacts("/venv/torch", "2.3.1+cu121", "12.1")
    assert explain_load_error(messages["import"], str(built["unfound"])) == (
        f"fastkern/{built['unfound'].name} needs libcudart.so.11.0, which is not on the library search path "
        "(RUNPATH/RPATH, LD_LIBRARY_PATH, ldconfig); it ships in the nvidia-cuda-runtime-cu11 wheel "
        "or a CUDA toolkit"
    )
    assert explain_load_error(messages["c10"], torch=torch) == (
        f"{tmp_path.name}/libneeds_c10.so misses c10::detail::torchCheckFail "
        "(_ZN3c106detail14torchCheckFailEPKcS2_jRKSs): it was built against another torch than torch 2.3.1; "
        "rebuild it against this torch"
    )
    assert explain_load_error(messages["version"]) == (
        f"the libstdc++ loaded is older than {tmp_path.name}/libuser.so was built with "
        "(needs GLIBCXX_9.9.99): an older libstdc++ (conda's, the system's, one in LD_LIBRARY_PATH) "
        "was found first"
    )
    assert (
        explain_load_error(messages["not_elf"])
        == f"{tmp_path.name}/notelf.so is not a valid shared object (not ELF, or truncated)"
    )
    assert explain_load_error("No module named 'fastkern'") is None


def test_missing_libraries_name_what_ships_them() -> None:
    message = "{}: cannot open shared object file: No such file or directory"
    assert "is torch's: import torch first" in explain_load_error(message.format("libc10.so"))
    assert "NVIDIA driver's" in explain_load_error(message.format("libcuda.so.1"))
    assert "nvidia-cudnn wheel" in explain_load_error(message.format("libcudnn.so.8"))
    assert "nvidia-cublas-cu12 wheel" in explain_load_error(message.format("libcublasLt.so.12"))
    assert explain_load_error(message.format("libfoo.so.3")).endswith(
        "(RUNPATH/RPATH, LD_LIBRARY_PATH, ldconfig)"
    )


@pytest.mark.torch
@pytest.mark.skipif(TORCH is None, reason="torch is not installed for this interpreter")
def test_real_torch_is_a_cpu_build() -> None:
    assert TORCH is not None
    facts = find_torch([str(TORCH.parent)])
    assert facts is not None and facts.path == str(TORCH)
    assert facts.version.split("+")[0] == importlib.metadata.version("torch").split("+")[0]
    assert facts.cuda is None and facts.build == "CPU build, no CUDA"
    line = describe_torch(facts, driver_version(), gpus())
    assert line.startswith(f"torch {facts.version} (CPU build, no CUDA) at {TORCH}; driver: ")
    assert "CUDA runtime" not in line  # a CPU build uses none, whatever /usr/local/cuda holds
