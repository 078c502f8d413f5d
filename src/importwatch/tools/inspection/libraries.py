"""The shared objects of an inspected process as Python sees them: the module a file is, whether it
is the system's, the torch the process has, and a library's CUDA and torch needs with the verdicts."""

from __future__ import annotations

import os

from importwatch.facts import cuda, dists, scan
from importwatch.facts.elf import read_dynamic
from importwatch.facts.libnames import TORCH_STEMS, cuda_needs, library_stem, torch_links

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Sequence

    from importwatch.facts.cuda import TorchFacts

_SYSTEM_DIRS = ("/lib/", "/lib64/", "/usr/lib/", "/usr/lib64/", "/usr/local/lib/")


def module_of(path: str, search: Sequence[str]) -> str | None:
    """The module a shared object is, named from its path under the search path: fastkern._kernels."""
    real = os.path.realpath(path)
    for entry in sorted({os.path.realpath(entry or ".") for entry in search}, key=len, reverse=True):
        if real.startswith(entry.rstrip("/") + "/"):
            name = scan._module_of(real, entry)
            if name:
                return name
    return None


def is_system(path: str, exe: str) -> bool:
    """True for the C library, the loader, libpython and the interpreter: code every load runs through."""
    name = os.path.basename(path)
    return (
        path.startswith(_SYSTEM_DIRS)
        or name.startswith(("libpython", "ld-linux", "libc.so", "libpthread", "libdl"))
        or name == os.path.basename(exe)
        or os.path.realpath(path) == os.path.realpath(exe)
    )


def find_torch_for(
    mapped: Sequence[str], search: Sequence[str], environ: dict[str, str]
) -> TorchFacts | None:
    """torch as the process has it: the one whose libraries it mapped, else the one on its search path."""
    for path in mapped:
        folder = os.path.dirname(path)
        if library_stem(path).startswith(TORCH_STEMS) and folder.endswith("/torch/lib"):
            facts = cuda.find_torch([os.path.dirname(os.path.dirname(folder))], environ)
            if facts is not None:
                return facts
    return cuda.find_torch([entry for entry in search if entry], environ)


def library_facts(path: str, torch: TorchFacts | None, driver: str | None, owners: dists.Owners) -> dict:
    """A shared object's CUDA and torch needs, its owner's metadata, and the verdicts on them."""
    info = read_dynamic(path)
    needed = list(info.needed) if info is not None else []
    needs = cuda_needs(needed)
    links = torch_links(needed)
    verdicts = cuda.native_verdicts(path, info, torch, driver) if info is not None else []
    owner = owners.owner(path) if (needs or links) else None
    if owner is not None:
        said = dists.verdict(owner, torch)
        if said:
            verdicts.insert(0, said)
    return {
        "path": path,
        "needs": needs,
        "torch_links": links,
        "distribution": f"{owner.name} {owner.version}" if owner is not None else None,
        "verdicts": verdicts,
    }
