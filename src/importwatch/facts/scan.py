"""Find the installed shared objects that link CUDA or torch, and the GPU code they carry, loading none.

Nothing is imported or loaded: each file's ELF dynamic section is read with
importwatch.facts.elf, and the architectures from its .nv.fatbin section. A
site-packages holding torch has some 25,000 files, so the walk uses scandir and
looks only at names that can be shared objects.
"""

import os
import re
import site
import sys
import sysconfig
import time
from importlib.machinery import EXTENSION_SUFFIXES

from importwatch.facts import cuda
from importwatch.facts.elf import read_dynamic
from importwatch.facts.libnames import cuda_needs, library_stem, torch_links

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Iterable, Sequence

    from importwatch.facts.cuda import TorchFacts

# Folders that hold no code of their own, or code the loader never maps from there.
_SKIP_DIRS = frozenset({"__pycache__", ".git", "tests", "test"})
# The runtimes themselves: their CUDA is the one they ship, not a need to check against torch's.
_RUNTIME_PACKAGES = frozenset({"nvidia"})
# Longest first: .cpython-311-x86_64-linux-gnu.so before .so.
_EXTENSION_SUFFIXES = sorted(EXTENSION_SUFFIXES, key=len, reverse=True)


class Library:
    """One shared object under a package folder that links CUDA or torch libraries."""

    __slots__ = ("cuda", "major", "module", "package", "path", "torch_links")

    def __init__(
        self,
        path: str,
        package: str,
        cuda_libs: "Sequence[str]",
        torch_links: "Sequence[str]",
        module: "str | None" = None,
    ) -> None:
        self.path = path
        self.package = package  # the top-level folder or module it belongs to: fastkern, torch, nvidia
        self.module = module  # the extension module it is (fastkern._kernels); None for a plain library
        self.cuda = tuple(cuda_libs)  # its CUDA-related DT_NEEDED entries
        self.torch_links = tuple(torch_links)  # its torch/c10 DT_NEEDED entries
        majors = [major for name in self.cuda if (major := cuda.cuda_major(name)) is not None]
        runtime = [cuda.cuda_major(name) for name in self.cuda if library_stem(name) == "libcudart"]
        self.major = runtime[0] if runtime else (majors[0] if majors else None)

    @property
    def is_runtime(self) -> bool:
        """Part of the CUDA libraries themselves (an nvidia-* wheel), not a user of them."""
        return self.package in _RUNTIME_PACKAGES

    def to_json(self) -> dict:
        return {
            "path": self.path,
            "package": self.package,
            "module": self.module,
            "cuda": list(self.cuda),
            "cuda_major": self.major,
            "torch_links": list(self.torch_links),
        }


class ScanResult:
    """What a scan found: the libraries that matter, how much it looked at, and how long it took."""

    __slots__ = ("files", "libraries", "roots", "seconds", "shared_objects")

    def __init__(self, roots: "Sequence[str]") -> None:
        self.roots = list(roots)
        self.libraries: list[Library] = []
        self.files = 0  # directory entries looked at
        self.shared_objects = 0  # ELF files read
        self.seconds = 0.0

    @property
    def cuda_libraries(self) -> "list[Library]":
        """Libraries that link CUDA, the nvidia-* runtimes left out."""
        return [lib for lib in self.libraries if lib.cuda and not lib.is_runtime]

    def cuda_modules(self) -> "dict[str, list[str]]":
        """Per package that ships CUDA extensions (torch's own left out), its extension modules."""
        modules: dict[str, list[str]] = {}
        for lib in self.cuda_libraries:
            if lib.package != "torch" and lib.module is not None:
                modules.setdefault(lib.package, []).append(lib.module)
        return modules

    def to_json(self) -> dict:
        return {
            "roots": self.roots,
            "files": self.files,
            "shared_objects": self.shared_objects,
            "seconds": round(self.seconds, 4),
            "libraries": [lib.to_json() for lib in self.libraries],
        }


def _is_shared_object(name: str) -> bool:
    return name.endswith(".so") or ".so." in name


def _module_of(path: str, root: str) -> "str | None":
    """fastkern._kernels for ROOT/fastkern/_kernels.cpython-311-x86_64-linux-gnu.so; None for a file
    that is not an extension module (libfoo.so.1, a folder that is not a package name)."""
    relative = os.path.relpath(path, root).split(os.sep)
    name = relative[-1]
    for suffix in _EXTENSION_SUFFIXES:
        if name.endswith(suffix):
            stem = name[: -len(suffix)]
            break
    else:
        return None
    # A bare .so is an extension's suffix too, but libfoo.so is a library's name.
    if name.endswith(".so") and "." not in stem and stem.startswith("lib") and suffix == ".so":
        return None
    parts = [*relative[:-1], stem]
    return ".".join(parts) if all(part.isidentifier() for part in parts) else None


def _package_of(name: str) -> str:
    """The top-level module a root entry gives: fastkern for fastkern/ or fastkern.cpython-311-...so."""
    return name.split(".", 1)[0] if _is_shared_object(name) or name.endswith(".py") else name


def site_roots(path: "Sequence[str] | None" = None, environ: "dict[str, str] | None" = None) -> "list[str]":
    """The folders packages are installed in for this interpreter: site-packages (system, user, venv),
    folders added by .pth files, and PYTHONPATH; the standard library and the current folder left out."""
    environ = dict(os.environ) if environ is None else environ
    # Only the standard library itself and its lib-dynload: a venv's platstdlib is the folder above
    # its site-packages.
    stdlib = set()
    for key in ("stdlib", "platstdlib"):
        folder = sysconfig.get_paths().get(key)
        if folder:
            stdlib |= {os.path.realpath(folder), os.path.realpath(os.path.join(folder, "lib-dynload"))}
    candidates: list[str] = []
    try:
        candidates += site.getsitepackages()
    except AttributeError:  # old virtualenv's site.py
        pass
    if site.ENABLE_USER_SITE:
        candidates.append(site.getusersitepackages())
    candidates += [entry for entry in environ.get("PYTHONPATH", "").split(os.pathsep) if entry]
    # sys.path[0] is the script's folder or the current one: not an installation. `python -m
    # importwatch` moves the current folder to the end instead (a json.py there must not replace
    # ours), where it is no installation either: a checkout holding its .venv would hide the venv.
    try:
        here = os.path.realpath(os.getcwd())
    except OSError:
        here = None
    candidates += [
        entry
        for entry in (sys.path[1:] if path is None else path)
        if not (isinstance(entry, str) and entry and os.path.realpath(entry) == here)
    ]
    roots: list[str] = []
    seen: set[str] = set()
    for entry in candidates:
        if not isinstance(entry, str) or not entry:
            continue
        real = os.path.realpath(entry)
        if real in seen or not os.path.isdir(real):
            continue
        # The standard library and its lib-dynload are Python's, not installed packages.
        if real in stdlib:
            continue
        seen.add(real)
        roots.append(real)
    # A root inside another root would be walked twice.
    return [root for root in roots if not any(root.startswith(other + os.sep) for other in roots)]


def resolve_packages(
    names: "Iterable[str]", roots: "Sequence[str]"
) -> "tuple[list[tuple[str, str]], list[str]]":
    """Each --packages NAME as (folder or file, package name): a path as given (a package folder, a
    module file, or a site folder, whose package name is ""), else a top-level package or module
    found in ROOTS. Returns those found and the names not found."""
    found: list[tuple[str, str]] = []
    missing: list[str] = []
    for name in names:
        if os.sep in name or os.path.exists(name):
            place = os.path.realpath(name)
            if os.path.isfile(place):
                found.append((place, _package_of(os.path.basename(place))))
            elif os.path.isfile(os.path.join(place, "__init__.py")):
                found.append((place, os.path.basename(place)))  # a package folder
            elif os.path.isdir(place):
                found.append((place, ""))  # a site folder: each entry its own package
            else:
                missing.append(name)
            continue
        hits = []
        for root in roots:
            candidate = os.path.join(root, name)
            if os.path.isdir(candidate):
                hits.append(candidate)
                continue
            try:
                entries = os.listdir(root)
            except OSError:
                continue
            hits += [
                os.path.join(root, entry)
                for entry in entries
                if _is_shared_object(entry) and entry.split(".", 1)[0] == name
            ]
        if hits:
            found += [(hit, name) for hit in hits]
        else:
            missing.append(name)
    return found, missing


def scan(places: "Sequence[tuple[str, str]]") -> "ScanResult":
    """Every shared object under PLACES ((folder or file, package name or "" for a site folder))
    that links CUDA or torch libraries."""
    started = time.perf_counter()
    result = ScanResult([place for place, _ in places])
    seen: set[str] = set()
    for place, package in places:
        if os.path.isfile(place):
            _look(result, place, package or _package_of(os.path.basename(place)), os.path.dirname(place))
            continue
        if package:
            _walk(result, place, package, seen, os.path.dirname(place))
            continue
        # A site folder: each entry is its own package.
        try:
            entries = list(os.scandir(place))
        except OSError:
            continue
        for entry in entries:
            result.files += 1
            name = entry.name
            if entry.is_dir(follow_symlinks=False):
                if name in _SKIP_DIRS or name.endswith((".dist-info", ".egg-info")):
                    continue
                _walk(result, entry.path, _package_of(name), seen, place)
            elif _is_shared_object(name) and not entry.is_symlink():
                _look(result, entry.path, _package_of(name), place)
    result.seconds = time.perf_counter() - started
    return result


def _walk(result: "ScanResult", folder: str, package: str, seen: "set[str]", root: str) -> None:
    real = os.path.realpath(folder)
    if real in seen:
        return
    seen.add(real)
    stack = [folder]
    while stack:
        try:
            entries = os.scandir(stack.pop())
        except OSError:
            continue
        with entries:
            for entry in entries:
                result.files += 1
                name = entry.name
                if _is_shared_object(name):
                    # Symlinks (libfoo.so -> libfoo.so.1) name a file already looked at.
                    if not entry.is_symlink() and entry.is_file(follow_symlinks=False):
                        _look(result, entry.path, package, root)
                elif name not in _SKIP_DIRS and "." not in name and entry.is_dir(follow_symlinks=False):
                    stack.append(entry.path)
                elif name.endswith(".libs") and entry.is_dir(follow_symlinks=False):
                    stack.append(entry.path)  # auditwheel's vendored libraries: pkg.libs/


def _look(result: "ScanResult", path: str, package: str, root: str) -> None:
    info = read_dynamic(path)
    if info is None:
        return
    result.shared_objects += 1
    needs = cuda_needs(info.needed)
    links = torch_links(info.needed)
    if needs or links:
        result.libraries.append(Library(path, package, needs, links, _module_of(path, root)))


def verdicts(
    result: "ScanResult", torch: "TorchFacts | None", driver: "str | None"
) -> "list[tuple[Library, str]]":
    """Each mismatch in words (cuda.native_verdicts), with the library it is about."""
    found = []
    for lib in result.cuda_libraries:
        for sentence in cuda.native_verdicts(lib.path, read_dynamic(lib.path), torch, driver):
            found.append((lib, sentence))
    return found


# -- GPU architectures carried ---------------------------------------------------------------------
_FATBIN_MAGIC = 0xBA55ED50
_KIND_PTX = 1
_MAX_ENTRIES = 200_000  # libtorch_cuda.so has tens of thousands; more is a corrupt table
_SM = re.compile(rb"(?:sm|compute)_(\d{2,3})[af]?(?![0-9])")
_SCAN_LIMIT = 64 << 20  # without a readable fatbin, look for "sm_" names in at most this much


class Architectures:
    """The GPU code a file carries: real code (cubins) per sm_XY, and PTX per compute_XY."""

    __slots__ = ("cubins", "ptx")

    def __init__(self, cubins: "Iterable[int]" = (), ptx: "Iterable[int]" = ()) -> None:
        self.cubins = sorted(set(cubins))  # 80 for sm_80
        self.ptx = sorted(set(ptx))

    def __bool__(self) -> bool:
        return bool(self.cubins or self.ptx)

    def names(self) -> "list[str]":
        return [f"sm_{arch}" for arch in self.cubins] + [f"compute_{arch}" for arch in self.ptx]

    def runs_on(self, major: int, minor: int) -> str:
        """'native', 'jit' (only PTX fits: the driver compiles it on first use) or 'none'."""
        wanted = major * 10 + minor
        # A cubin runs on its own major and any later minor of it; PTX compiles for anything newer.
        if any(arch // 10 == major and arch <= wanted for arch in self.cubins):
            return "native"
        if any(arch <= wanted for arch in self.ptx):
            return "jit"
        return "none"


def _section(fd: int, name: bytes) -> "tuple[int, int] | None":
    """(file offset, size) of the ELF section NAME, from the section headers; None if absent."""
    head = os.pread(fd, 64, 0)
    if len(head) < 52 or head[:4] != b"\x7fELF":
        return None
    wide, order = head[4] == 2, ("little" if head[5] == 1 else "big")

    def number(data: bytes, at: int, size: int) -> int:
        return int.from_bytes(data[at : at + size], order)

    shoff = number(head, 40 if wide else 32, 8 if wide else 4)
    shentsize, shnum, shstrndx = (number(head, (58 if wide else 46) + 2 * i, 2) for i in range(3))
    if not shoff or shentsize < (64 if wide else 40) or not 0 < shnum < 1 << 16:
        return None
    table = os.pread(fd, shentsize * shnum, shoff)
    if len(table) < shentsize * shnum or shstrndx >= shnum:
        return None
    # sh_name@0, sh_offset and sh_size at 24, 32 (ELF64) or 16, 20 (ELF32).
    word, at_offset, at_size = (8, 24, 32) if wide else (4, 16, 20)

    def header(index: int) -> "tuple[int, int, int]":
        base = index * shentsize
        return (
            number(table, base, 4),
            number(table, base + at_offset, word),
            number(table, base + at_size, word),
        )

    _, names_at, names_size = header(shstrndx)
    names = os.pread(fd, min(names_size, 1 << 20), names_at)
    for index in range(shnum):
        name_at, offset, size = header(index)
        if names[name_at : name_at + len(name) + 1] == name + b"\0":
            return offset, size
    return None


def architectures(path: str) -> "Architectures":
    """The sm_XY (cubin) and compute_XY (PTX) code in PATH's .nv.fatbin section (empty when none)."""
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_CLOEXEC", 0))
    except OSError:
        return Architectures()
    try:
        section = _section(fd, b".nv.fatbin")
        if section is not None:
            found = _fatbin_entries(fd, *section)
            if found:
                return found
            # Not the layout we know: fall back to the names the entries carry in clear text.
            return _names_in(fd, section[0], min(section[1], _SCAN_LIMIT))
        size = os.fstat(fd).st_size
        return _names_in(fd, 0, size) if size <= _SCAN_LIMIT else Architectures()
    except (OSError, ValueError, OverflowError):
        return Architectures()
    finally:
        os.close(fd)


def _fatbin_entries(fd: int, start: int, size: int) -> "Architectures":
    """Walk the fat binary containers in the section: a 16-byte header (magic, version, header size,
    size of what follows) then entries, each a header (kind u16 @0, header size u32 @4, payload size
    u64 @8, sm architecture u32 @28) and its payload. Only headers are read, never payloads."""
    cubins: set[int] = set()
    ptx: set[int] = set()
    end = start + size
    position = start
    entries = 0
    while position + 16 <= end and entries < _MAX_ENTRIES:
        head = os.pread(fd, 16, position)
        if len(head) < 16:
            break
        if int.from_bytes(head[:4], "little") != _FATBIN_MAGIC:
            # Containers may be padded apart: look a little further for the next one.
            window = os.pread(fd, min(4096, end - position), position)
            skip = window.find(_FATBIN_MAGIC.to_bytes(4, "little"), 1)
            if skip < 0:
                break
            position += skip
            continue
        header_size = int.from_bytes(head[6:8], "little") or 16
        container_end = min(end, position + header_size + int.from_bytes(head[8:16], "little"))
        entry = position + header_size
        while entry + 32 <= container_end and entries < _MAX_ENTRIES:
            data = os.pread(fd, 32, entry)
            entry_size = int.from_bytes(data[4:8], "little")
            payload = int.from_bytes(data[8:16], "little")
            if entry_size < 32:
                break
            arch = int.from_bytes(data[28:32], "little")
            if 10 <= arch < 1000:
                (ptx if int.from_bytes(data[0:2], "little") == _KIND_PTX else cubins).add(arch)
            entries += 1
            entry += entry_size + payload
        position = max(container_end, position + 16)
    return Architectures(cubins, ptx)


def _names_in(fd: int, start: int, size: int) -> "Architectures":
    """sm_XY and compute_XY names written in clear (PTX text, cubin notes) in SIZE bytes at START."""
    cubins: set[int] = set()
    ptx: set[int] = set()
    chunk = 1 << 20
    offset = 0
    while offset < size:
        # Overlap chunks by a few bytes so a name across the boundary is still seen.
        data = os.pread(fd, min(chunk + 16, size - offset), start + offset)
        if not data:
            break
        for match in _SM.finditer(data):
            (ptx if match.group(0).startswith(b"compute") else cubins).add(int(match.group(1)))
        offset += chunk
    return Architectures(cubins, ptx)
