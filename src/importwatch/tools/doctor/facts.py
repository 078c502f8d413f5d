"""doctor's facts: the interpreter, the platform, torch and CUDA as read from files, and where to scan."""

from __future__ import annotations

import os
import sys

from importwatch.facts import cuda, scan

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Sequence

    from importwatch.facts.cuda import TorchFacts


def python_facts() -> dict:
    """The interpreter: version, executable, and the environment it belongs to."""
    virtualenv = sys.prefix if sys.prefix != getattr(sys, "base_prefix", sys.prefix) else None
    return {
        "version": ".".join(str(part) for part in sys.version_info[:3]),
        "implementation": sys.implementation.name,
        "executable": sys.executable,
        "prefix": sys.prefix,
        "virtualenv": virtualenv,
        "conda": os.environ.get("CONDA_PREFIX"),
    }


def platform_facts() -> dict:
    """The kernel, the machine and the C library (glibc's version decides which wheels load)."""
    system = os.uname()
    try:
        libc = os.confstr("CS_GNU_LIBC_VERSION")
    except (ValueError, OSError, AttributeError):
        libc = None  # not glibc (musl, or not Linux)
    return {"system": system.sysname, "release": system.release, "machine": system.machine, "libc": libc}


def torch_facts(torch: TorchFacts | None) -> dict | None:
    if torch is None:
        return None
    return {
        "path": torch.path,
        "version": torch.version,
        "cuda": torch.cuda,
        "hip": torch.hip,
        "build": torch.build,
    }


def cuda_facts(torch: TorchFacts | None, environ: dict[str, str]) -> dict:
    """The CUDA runtimes at hand, the driver and the GPUs it sees, which of them the job may use."""
    runtimes = torch.runtimes if torch is not None else cuda.find_runtimes(os.devnull, environ)
    return {
        "driver": cuda.driver_version(),
        "gpus": cuda.gpus(),
        "visible_devices": environ.get("CUDA_VISIBLE_DEVICES"),
        "runtimes": [{"name": r.name, "path": r.path, "origin": r.origin} for r in runtimes],
    }


def scan_places(
    packages: Sequence[str] | None, roots: list[str]
) -> tuple[list[tuple[str, str]], list[str], list[str]]:
    """What to scan (every site folder, or the PACKAGES named), the names not found, and the folders
    the imports must see too (those of packages given by path, off sys.path)."""
    if not packages:
        return [(root, "") for root in roots], [], []
    places, missing = scan.resolve_packages(packages, roots)
    extra_path: list[str] = []
    for place, package in places:
        folder = os.path.dirname(place) if package else place
        if folder not in roots and folder not in extra_path and folder not in sys.path:
            extra_path.append(folder)
    return places, missing, extra_path
