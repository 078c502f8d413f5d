"""Verdicts from package metadata: the torch a distribution pins, the CUDA of its local version.

Stand-in distributions are laid out in tmp_path as pip leaves them (a .dist-info
with METADATA and RECORD beside the package), with extensions linking stand-in
torch libraries; a real torchvision wheel is downloaded once into pytest's cache
and unpacked into a folder, never installed.
"""

from __future__ import annotations

import json
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from cbuild import FIXTURES, compile_extension, compile_shared, dist_info, stand_in_torch
from helpers import clean_env, importwatch
from importwatch.facts import dists

CUDA = FIXTURES / "cuda"
TORCHVISION_WHEEL = "torchvision==0.22.1"


def run(*args: str, path: Path, timeout: float = 60, **env: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=clean_env(PYTHONPATH=str(path), IMPORTWATCH_TIMEOUT="0", **env),
        stdin=subprocess.DEVNULL,
    )


@pytest.fixture(scope="module")
def sites(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Sites with a stand-in torch 2.13.0+cpu and extensions whose distributions pin other torches."""
    out = tmp_path_factory.mktemp("dists")
    site = out / "site"
    torch = stand_in_torch(site, "2.13.0+cpu", None)
    libc10 = compile_shared(CUDA / "dep.c", torch / "lib" / "libc10.so", soname="libc10.so")
    cuda12 = compile_shared(
        CUDA / "cudart_standin.c", out / "cuda12" / "libcudart.so.12", soname="libcudart.so.12"
    )
    # Built for torch 2.7.1 and CUDA 12.6, like torchvision 0.22.1+cu126.
    vision = compile_extension(CUDA / "kernels.c", site, "visionkern._C", libs=[libc10, cuda12])
    dist_info(site, "visionkern", "0.22.1+cu126", ["numpy", "torch (==2.7.1)"], [vision])
    # A distribution whose name is not its folder's: found from the RECORD, not the name.
    scatter = compile_extension(FIXTURES / "outside" / "init_ext.c", site, "scatter_ops._ops", libs=[libc10])
    dist_info(site, "Torch_Scatter", "2.1.2", ["torch>=2.13", "pytest ; extra == 'test'"], [scatter])
    # Pinned to another torch, but links neither torch nor CUDA: its metadata is never read.
    plain = compile_extension(FIXTURES / "outside" / "init_ext.c", site, "plainkern._k")
    dist_info(site, "plainkern", "1.0", ["torch==1.0"], [plain])
    # A second site where two distributions cannot share one torch.
    pair = out / "pair"
    torch2 = stand_in_torch(pair, "2.7.1+cu126", "12.6")
    libc10b = compile_shared(CUDA / "dep.c", torch2 / "lib" / "libc10.so", soname="libc10.so")
    one = compile_extension(CUDA / "kernels.c", pair, "onekern._C", libs=[libc10b, cuda12])
    two = compile_extension(CUDA / "kernels.c", pair, "twokern._C", libs=[libc10b, cuda12])
    dist_info(pair, "onekern", "0.22.1+cu126", ["torch==2.7.1"], [one])
    dist_info(pair, "twokern", "2.6.0+cu124", ["torch==2.6.0"], [two])
    return {"out": out, "site": site, "vision": vision, "scatter": scatter, "pair": pair, "two": two}


# -- the traced load ---------------------------------------------------------------------------------
@pytest.mark.slow
@pytest.mark.timeout(60)
def test_traced_load_says_the_pinned_torch_before_dlopen(sites: dict[str, Path]) -> None:
    done = run("-m", "importwatch", "-c", "import visionkern._C", path=sites["site"])
    lines = done.stderr.splitlines()
    expected = (
        "! visionkern 0.22.1+cu126 requires torch==2.7.1 but torch 2.13.0+cpu is installed: "
        "install the visionkern release built for torch 2.13.0"
    )
    said = [index for index, line in enumerate(lines) if line.endswith(expected)]
    start = [index for index, line in enumerate(lines) if "> dlopen " in line and "visionkern/_C" in line]
    assert said and start, done.stderr
    # The metadata reader is loaded for this load, but never shows up as one of the program's imports.
    assert "importwatch.facts.dists" not in done.stderr
    # Written before the dlopen returns (its end line), right after its start line.
    end = [index for index, line in enumerate(lines) if "< dlopen " in line and "visionkern/_C" in line]
    assert start[0] < said[0] < end[0], done.stderr
    # The CUDA verdict is still said, after it.
    cuda_line = [
        index for index, line in enumerate(lines) if "needs libcudart.so.12 but torch 2.13.0 is a CPU" in line
    ]
    assert cuda_line and said[0] < cuda_line[0] < end[0], done.stderr


@pytest.mark.slow
@pytest.mark.timeout(60)
def test_owner_is_found_from_the_record_and_a_satisfied_pin_says_nothing(sites: dict[str, Path]) -> None:
    owner = dists.Owners().owner(str(sites["scatter"]))
    assert owner is not None and owner.name == "Torch_Scatter" and owner.torch_requirement == ">=2.13"
    done = run("-m", "importwatch", "-c", "import scatter_ops._ops", path=sites["site"], OUTSIDE_BUSY="0")
    assert done.returncode == 0, done.stderr
    assert "> dlopen " in done.stderr and "scatter_ops/_ops" in done.stderr
    assert "! " not in done.stderr, done.stderr


@pytest.mark.slow
@pytest.mark.timeout(60)
def test_extension_that_links_neither_torch_nor_cuda_is_not_looked_up(sites: dict[str, Path]) -> None:
    # plainkern pins torch==1.0, but its extension links nothing of torch or CUDA: its pin is not read.
    done = run("-m", "importwatch", "-c", "import plainkern._k", path=sites["site"], OUTSIDE_BUSY="0")
    assert done.returncode == 0, done.stderr
    assert "> dlopen " in done.stderr and "plainkern/_k" in done.stderr
    assert "! " not in done.stderr and "requires torch" not in done.stderr


# -- verdict wording and versions ---------------------------------------------------------------------
@pytest.mark.slow
def test_local_cuda_version_is_said_when_the_pin_fits(sites: dict[str, Path]) -> None:
    from importwatch.facts.cuda import TorchFacts, find_torch

    torch = find_torch([str(sites["pair"])], {})
    assert torch is not None and torch.version == "2.7.1+cu126"
    owner = dists.Owners().owner(str(sites["two"]))
    assert owner is not None and owner.name == "twokern"
    assert dists.verdict(owner, torch) == (
        "twokern 2.6.0+cu124 requires torch==2.6.0 but torch 2.7.1+cu126 is installed: "
        "install the twokern release built for torch 2.7.1"
    )
    built_for_cuda = dists.Dist("x", "tv", "0.22.1+cu126", "==2.7.1")
    cpu = TorchFacts("/nowhere/torch", "2.7.1+cpu", None)
    assert dists.verdict(built_for_cuda, cpu) == (
        "tv 0.22.1+cu126 is built for CUDA 12.6 but torch 2.7.1+cpu is a CPU build: "
        "install the tv build for torch 2.7.1+cpu"
    )
    assert dists.verdict(built_for_cuda, torch) is None
    other = TorchFacts("/nowhere/torch", "2.7.1+cu118", "11.8")
    assert "is built for CUDA 12.6 but torch 2.7.1+cu118 is built for CUDA 11.8" in (
        dists.verdict(built_for_cuda, other) or ""
    )


@pytest.mark.parametrize(
    ("version", "specifier", "expected"),
    [
        ("2.13.0+cpu", "==2.7.1", False),
        ("2.7.1+cu126", "==2.7.1", True),
        ("2.7.1+cpu", "==2.7.1+cu126", False),
        ("2.7.1", ">=2.0,<3", True),
        ("2.7.0rc1", ">=2.7", False),
        ("2.7.1.post1", "==2.7.1", False),
        ("2.7.1", "==2.7.*", True),
        ("2.8", "~=2.7", True),
        ("3.0", "~=2.7", False),
        ("2.0.dev1", "<2.0a1", True),
        ("2.13.0.dev20250101+cpu", ">=2.13.0.dev0", True),
        ("2.6", "!=2.6.0", False),
        ("banana", "==1", None),
    ],
)
def test_specifiers(version: str, specifier: str, expected: bool | None) -> None:
    assert dists.satisfies(version, specifier) is expected


def test_requirement_lines() -> None:
    assert dists.torch_specifier("torch (==2.7.1)") == "==2.7.1"
    assert dists.torch_specifier("torch==2.7.1 ; python_version >= '3.9'") == "==2.7.1"
    assert dists.torch_specifier("Torch[opt] (>=2.0, <3)") == ">=2.0,<3"
    assert dists.torch_specifier("torch>=2 ; extra == 'cuda'") is None
    assert dists.torch_specifier("torchvision==0.22.1") is None
    assert dists.torch_specifier("torch") is None


# -- doctor ---------------------------------------------------------------------------------------------
@pytest.mark.slow
@pytest.mark.timeout(120)
def test_doctor_names_each_pin_and_two_distributions_that_disagree(sites: dict[str, Path]) -> None:
    done = run(
        "-m", "importwatch", "doctor", "--packages", str(sites["pair"]), "--no-cuda", "--timeout", "5",
        "--import", "json", "--json", path=sites["pair"],
    )  # fmt: skip
    assert done.returncode == 1, done.stdout + done.stderr
    report = json.loads(done.stdout)
    texts = [problem["problem"] for problem in report["problems"]]
    assert "twokern 2.6.0+cu124 requires torch==2.6.0 but torch 2.7.1+cu126 is installed" in texts, texts
    assert any(
        "onekern 0.22.1+cu126 requires torch==2.7.1 and twokern 2.6.0+cu124 requires torch==2.6.0: "
        "no torch satisfies both" in text
        for text in texts
    ), texts
    fixes = [problem["fix"] for problem in report["problems"]]
    assert "install the twokern release built for torch 2.7.1" in fixes
    assert not any("onekern 0.22.1+cu126 requires torch==2.7.1 but" in text for text in texts)


# -- a real wheel ---------------------------------------------------------------------------------------
@pytest.fixture(scope="session")
def torchvision_site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The real torchvision 0.22.1 wheel (built for torch 2.7.1 and CUDA 12), unpacked into a folder.

    Downloaded once into a folder beside pytest's temporary folders, which outlives each run (the
    suite runs without pytest's cache plugin); skipped when the package index cannot be reached.
    """
    if sys.version_info[:2] != (3, 11):
        pytest.skip("the torchvision wheel used here is the CPython 3.11 one")
    cache = tmp_path_factory.getbasetemp().parent / "importwatch-wheel-cache"
    cache.mkdir(mode=0o700, exist_ok=True)
    wheels = sorted(cache.glob("torchvision-0.22.1-*.whl"))
    if not wheels:
        command = [
            sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:",
            "--python-version", "3.11", "--platform", "manylinux_2_28_x86_64", TORCHVISION_WHEEL,
            "--dest", str(cache), "--quiet", "--disable-pip-version-check",
        ]  # fmt: skip
        try:
            done = subprocess.run(command, capture_output=True, text=True, timeout=180)
        except (OSError, subprocess.TimeoutExpired):
            pytest.skip("downloading the torchvision wheel took too long")
        wheels = sorted(cache.glob("torchvision-0.22.1-*.whl"))
        if done.returncode != 0 or not wheels:
            pytest.skip(f"cannot download {TORCHVISION_WHEEL} (offline?)")
    site = tmp_path_factory.mktemp("torchvision-site")
    with zipfile.ZipFile(wheels[0]) as wheel:
        wheel.extractall(site)
    return site


def _venv_torch() -> Path:
    torch = next(
        (Path(entry) / "torch" for entry in sys.path if (Path(entry) / "torch" / "version.py").is_file()),
        None,
    )
    if torch is None:
        pytest.skip("no torch installed in this environment")
    return torch


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_real_torchvision_wheel_is_named_by_its_pin(torchvision_site: Path) -> None:
    torch = _venv_torch()
    from importwatch.facts.cuda import find_torch

    facts = find_torch([str(torch.parent)], {})
    assert facts is not None and facts.version
    extension = torchvision_site / "torchvision" / "_C.so"
    # ctypes loads the file itself: the traced load reads its needs and its owner's METADATA.
    code = f"import ctypes\ntry:\n    ctypes.CDLL({str(extension)!r})\nexcept OSError:\n    pass\n"
    done = run("-m", "importwatch", "-c", code, path=torchvision_site)
    expected = (
        f"! torchvision 0.22.1 requires torch==2.7.1 but torch {facts.version} is installed: "
        f"install the torchvision release built for torch {facts.short_version}"
    )
    assert expected in done.stderr, done.stderr
    doctor = run(
        "-m", "importwatch", "doctor", "--packages", str(torchvision_site), "--no-cuda", "--timeout", "60",
        "--import", "json", "--json", path=torchvision_site, timeout=200,
    )  # fmt: skip
    report = json.loads(doctor.stdout)
    texts = [problem["problem"] for problem in report["problems"]]
    assert f"torchvision 0.22.1 requires torch==2.7.1 but torch {facts.version} is installed" in texts, texts
    assert doctor.returncode == 1


@pytest.mark.slow
@pytest.mark.torch
def test_torch_s_own_extensions_are_never_looked_up_in_the_metadata() -> None:
    """torch pins no torch: reading its 14,000-line RECORD would only slow `import torch` down."""
    pytest.importorskip("torch")
    code = "import sys, torch; print('importwatch.facts.dists' in sys.modules)"
    done = importwatch("-c", code, timeout=180)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout == "False\n"
