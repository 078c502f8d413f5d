"""Read what a shared object links (DT_NEEDED, RPATH, RUNPATH, SONAME) from its ELF dynamic section.

This runs just before a dlopen, on files of up to hundreds of megabytes, so it
reads only the few blocks it needs with os.pread: the header, the program
headers, the dynamic segment and the strings it names. Anything that is not a
well-formed ELF file gives None; nothing here raises.
"""

from __future__ import annotations

import os
import struct

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Iterable

# Enough for the ELF header and, in every linker's usual layout, the program headers after it.
_HEAD = 4096
_PT_LOAD, _PT_DYNAMIC = 1, 2
_DT_NULL, _DT_NEEDED, _DT_STRTAB, _DT_STRSZ, _DT_SONAME, _DT_RPATH, _DT_RUNPATH = 0, 1, 5, 10, 14, 15, 29
# A dynamic segment has tens of entries; libtorch_cpu.so has 40. More than this is corruption.
_MAX_DYNAMIC = 1 << 20
_MAX_STRING = 1 << 16  # longer than any real library name or search path
_PN_XNUM = 0xFFFF  # e_phnum's escape: the real count is in section header 0


class DynamicInfo:
    """What one shared object asks of the dynamic linker."""

    __slots__ = ("needed", "rpath", "runpath", "soname")

    needed: tuple[str, ...]
    rpath: str | None
    runpath: str | None
    soname: str | None

    def __init__(
        self,
        needed: tuple[str, ...] = (),
        rpath: str | None = None,
        runpath: str | None = None,
        soname: str | None = None,
    ) -> None:
        setter = object.__setattr__
        setter(self, "needed", tuple(needed))
        setter(self, "rpath", rpath)
        setter(self, "runpath", runpath)
        setter(self, "soname", soname)

    def __setattr__(self, name: str, value: object) -> None:
        raise AttributeError(f"DynamicInfo is immutable: cannot set {name}")

    def _key(self) -> tuple:
        return (self.needed, self.rpath, self.runpath, self.soname)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, DynamicInfo) and self._key() == other._key()

    def __hash__(self) -> int:
        return hash(self._key())

    def __repr__(self) -> str:
        return (
            f"DynamicInfo(needed={self.needed!r}, rpath={self.rpath!r}, "
            f"runpath={self.runpath!r}, soname={self.soname!r})"
        )


class _Corrupt(Exception):
    """The file claims to be ELF but its structures do not hold together."""


def _pread(fd: int, size: int, offset: int) -> bytes:
    data = os.pread(fd, size, offset)
    if len(data) != size:
        raise _Corrupt  # truncated
    return data


def read_dynamic(path: str) -> DynamicInfo | None:
    """The dynamic section of the ELF file at PATH, or None if it is not a readable, well-formed ELF file."""
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_CLOEXEC", 0))
    except (OSError, ValueError, TypeError):
        return None
    try:
        return _read(fd)
    except (OSError, ValueError, OverflowError, struct.error, _Corrupt, UnicodeError, MemoryError):
        return None
    finally:
        os.close(fd)


def _read(fd: int) -> DynamicInfo | None:
    head = os.pread(fd, _HEAD, 0)
    if len(head) < 52 or head[:4] != b"\x7fELF":
        return None
    wide = head[4] == 2
    if head[4] not in (1, 2) or head[5] not in (1, 2):
        return None
    order = "<" if head[5] == 1 else ">"
    if wide:
        if len(head) < 64:
            return None
        phoff, shoff = struct.unpack_from(order + "QQ", head, 32)
        phentsize, phnum, shentsize = struct.unpack_from(order + "HHH", head, 54)
        ph_format, ph_size = order + "IIQQQQQQ", 56
        dyn_format, dyn_size = order + "qQ", 16
    else:
        phoff, shoff = struct.unpack_from(order + "II", head, 28)
        phentsize, phnum, shentsize = struct.unpack_from(order + "HHH", head, 42)
        ph_format, ph_size = order + "IIIIIIII", 32
        dyn_format, dyn_size = order + "iI", 8
    if phnum == _PN_XNUM:
        # sh_info of section header 0: offset 44 in ELF64, 28 in ELF32.
        phnum = struct.unpack_from(order + "I", _pread(fd, shentsize, shoff), 44 if wide else 28)[0]
    if phnum == 0:
        return None
    if phentsize < ph_size:
        raise _Corrupt
    table_size = phentsize * phnum
    if phoff + table_size <= len(head):
        table = head[phoff : phoff + table_size]
    else:
        table = _pread(fd, table_size, phoff)

    loads = []  # (vaddr, filesz, offset)
    dynamic = None  # (offset, filesz)
    for index in range(phnum):
        fields = struct.unpack_from(ph_format, table, index * phentsize)
        if wide:
            p_type, _flags, p_offset, p_vaddr, _paddr, p_filesz = fields[:6]
        else:
            p_type, p_offset, p_vaddr, _paddr, p_filesz = fields[:5]
        if p_type == _PT_LOAD:
            loads.append((p_vaddr, p_filesz, p_offset))
        elif p_type == _PT_DYNAMIC and dynamic is None:
            dynamic = (p_offset, p_filesz)
    if dynamic is None:
        return DynamicInfo()  # statically linked: it asks nothing of the dynamic linker
    offset, size = dynamic
    if size > _MAX_DYNAMIC or size < dyn_size:
        raise _Corrupt
    raw = _pread(fd, size - size % dyn_size, offset)

    needed: list[int] = []
    soname = rpath = runpath = strtab = strsz = None
    for tag, value in struct.iter_unpack(dyn_format, raw):
        if tag == _DT_NULL:
            break
        if tag == _DT_NEEDED:
            needed.append(value)
        elif tag == _DT_STRTAB:
            strtab = value
        elif tag == _DT_STRSZ:
            strsz = value
        elif tag == _DT_SONAME:
            soname = value
        elif tag == _DT_RPATH:
            rpath = value
        elif tag == _DT_RUNPATH:
            runpath = value
    else:
        raise _Corrupt  # every dynamic section ends with DT_NULL
    wanted = [*needed, *(value for value in (soname, rpath, runpath) if value is not None)]
    if not wanted:
        return DynamicInfo()
    if strtab is None or strsz is None:
        raise _Corrupt
    # DT_STRTAB is an address in memory; the PT_LOAD segment holding it says where that is in the file.
    base = None
    for vaddr, filesz, file_offset in loads:
        if vaddr <= strtab < vaddr + filesz:
            base = strtab - vaddr + file_offset
            break
    if base is None:
        raise _Corrupt
    strings = _Strings(fd, base, strsz, wanted)
    return DynamicInfo(
        tuple(strings.get(value) for value in needed),
        strings.get(rpath) if rpath is not None else None,
        strings.get(runpath) if runpath is not None else None,
        strings.get(soname) if soname is not None else None,
    )


class _Strings:
    """Strings of the dynamic string table, read in one block when they lie close together.

    libtorch_cpu.so's table is tens of megabytes of symbol names; the library
    names sit together near its start, so one small read usually serves all.
    """

    def __init__(self, fd: int, base: int, size: int, offsets: Iterable[int]) -> None:
        self.fd, self.base, self.size = fd, base, size
        low, high = min(offsets), max(offsets)
        if high >= size:
            raise _Corrupt
        self.start = low
        span = high - low + 256 if high - low < _MAX_STRING else 256
        self.block = os.pread(fd, min(span, size - low), base + low)

    def get(self, offset: int) -> str:
        start = offset - self.start
        if 0 <= start < len(self.block):
            end = self.block.find(b"\0", start)
            if end >= 0:
                return os.fsdecode(self.block[start:end])
        data = os.pread(self.fd, min(_MAX_STRING, self.size - offset), self.base + offset)
        end = data.find(b"\0")
        if end < 0:
            raise _Corrupt
        return os.fsdecode(data[:end])


# Library-name stems of the CUDA toolkit, cuDNN, NCCL, the driver and torch's CUDA parts. A stem is
# the file name before ".so", with any "-HASH" that auditwheel appends removed (libcudart-9335f6a2.so.12).
_CUDA_STEMS = frozenset({"libcuda", "libnvidia-ml", "libnvcuvid", "libnvidia-encode"})
_CUDA_PREFIXES = (
    "libcudart",
    "libcublas",  # and libcublasLt
    "libcudnn",  # and libcudnn_ops_infer, libcudnn_cnn_train, ...
    "libnccl",
    "libnvrtc",  # and libnvrtc-builtins
    "libcufft",
    "libcurand",
    "libcusparse",  # and libcusparseLt
    "libcusolver",  # and libcusolverMg
    "libcufile",
    "libcupti",
    "libnvToolsExt",
    "libnvtx3",
    "libnvJitLink",
    "libnvjpeg",
    "libnpp",
    "libcudss",
    "libtorch_cuda",  # and libtorch_cuda_cpp, libtorch_cuda_cu, libtorch_cuda_linalg
    "libc10_cuda",
    "libcaffe2_nvrtc",
)


def library_stem(name: str) -> str:
    """libcudart-9335f6a2.so.12 -> libcudart: the library's name without version, suffix or wheel hash."""
    stem = name.rsplit("/", 1)[-1].split(".so", 1)[0]
    head, dash, tail = stem.rpartition("-")
    if dash and len(tail) == 8 and all(char in "0123456789abcdef" for char in tail):
        return head
    return stem


def cuda_needs(needed: Iterable[str]) -> list[str]:
    """The CUDA-related names among NEEDED, in their order."""
    found = []
    for name in needed:
        stem = library_stem(name)
        if stem in _CUDA_STEMS or stem.startswith(_CUDA_PREFIXES):
            found.append(name)
    return found
