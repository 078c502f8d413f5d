"""Read what a shared object links (DT_NEEDED, RPATH, RUNPATH, SONAME) from its ELF dynamic section.

This runs just before a dlopen, on files of up to hundreds of megabytes, so it
reads only the few blocks it needs with os.pread: the header, the program
headers, the dynamic segment and the strings it names. Anything that is not a
well-formed ELF file gives None; nothing here raises.
"""

import os
import sys

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Sequence

# Enough for the ELF header and, in every linker's usual layout, the program headers after it.
_HEAD = 4096
_PT_LOAD, _PT_DYNAMIC = 1, 2
_DT_NULL, _DT_NEEDED, _DT_STRTAB, _DT_STRSZ, _DT_SONAME, _DT_RPATH, _DT_RUNPATH = 0, 1, 5, 10, 14, 15, 29
# A dynamic segment has tens of entries (libtorch_cpu.so: 40), a program header table about ten.
# A table larger than this is corruption.
_MAX_DYNAMIC = 1 << 20
_MAX_STRING = 1 << 16  # longer than any real library name or search path
_PN_XNUM = 0xFFFF  # e_phnum's escape: the real count is in section header 0
# os.fsdecode's own arguments, looked up once: it runs for every name, in the hot path of a load.
_FS_ENCODING, _FS_ERRORS = sys.getfilesystemencoding(), sys.getfilesystemencodeerrors()


class DynamicInfo:
    """What one shared object asks of the dynamic linker."""

    __slots__ = ("needed", "rpath", "runpath", "soname")

    needed: "tuple[str, ...]"
    rpath: "str | None"
    runpath: "str | None"
    soname: "str | None"

    def __init__(
        self,
        needed: "tuple[str, ...]" = (),
        rpath: "str | None" = None,
        runpath: "str | None" = None,
        soname: "str | None" = None,
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


def _number(data: bytes, offset: int, size: int, order: str) -> int:
    field = data[offset : offset + size]
    if len(field) != size:
        raise _Corrupt
    return int.from_bytes(field, order)


def _words(data: bytes, size: int, order: str) -> "list[int]":
    """DATA as a list of unsigned SIZE-byte words, converted in C when the byte order is this machine's."""
    data = data[: len(data) - len(data) % size]
    if order == sys.byteorder:
        return memoryview(data).cast("Q" if size == 8 else "I").tolist()
    return [int.from_bytes(data[index : index + size], order) for index in range(0, len(data), size)]


def read_dynamic(path: str) -> "DynamicInfo | None":
    """The dynamic section of the ELF file at PATH, or None if it is not a readable, well-formed ELF file."""
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_CLOEXEC", 0))
    except (OSError, ValueError, TypeError):
        return None
    try:
        return _read(fd)
    except (OSError, ValueError, OverflowError, _Corrupt, UnicodeError, MemoryError):
        return None
    finally:
        os.close(fd)


def _read(fd: int) -> "DynamicInfo | None":
    head = os.pread(fd, _HEAD, 0)
    if len(head) < 52 or head[:4] != b"\x7fELF" or head[4] not in (1, 2) or head[5] not in (1, 2):
        return None
    # struct would do, but _struct is an extension module, and nothing here may load one.
    order = "little" if head[5] == 1 else "big"
    wide = head[4] == 2
    word = 8 if wide else 4
    table, phentsize = _program_headers(fd, head, wide, order)
    if not table:
        return None

    # As words: p_type (with p_flags in ELF64), p_offset, p_vaddr, p_paddr, p_filesz, in both classes.
    # Whole columns are sliced out at once: a loop over entries costs more, in the hot path of a load.
    fields = _words(table, word, order)
    stride = phentsize // word
    type_shift = 32 if wide and order == "big" else 0  # where p_type lies in ELF64's first word
    types = [(value >> type_shift) & 0xFFFFFFFF for value in fields[0::stride]]
    if _PT_DYNAMIC not in types:
        return DynamicInfo()  # statically linked: it asks nothing of the dynamic linker
    first = types.index(_PT_DYNAMIC) * stride
    tags, values = _dynamic_entries(fd, fields[first + 1], fields[first + 4], word, order)
    needed = [value for tag, value in zip(tags, values) if tag == _DT_NEEDED]
    last = dict(zip(tags, values))  # the tags read once each; the last one counts, as for the linker
    soname, rpath, runpath = last.get(_DT_SONAME), last.get(_DT_RPATH), last.get(_DT_RUNPATH)
    strtab, strsz = last.get(_DT_STRTAB), last.get(_DT_STRSZ)
    wanted = [*needed, *(value for value in (soname, rpath, runpath) if value is not None)]
    if not wanted:
        return DynamicInfo()
    if strtab is None or strsz is None:
        raise _Corrupt
    strings = _Strings(fd, _file_offset(fields, stride, types, strtab), strsz, wanted)
    return DynamicInfo(
        tuple(strings.get(value) for value in needed),
        strings.get(rpath) if rpath is not None else None,
        strings.get(runpath) if runpath is not None else None,
        strings.get(soname) if soname is not None else None,
    )


def _program_headers(fd: int, head: bytes, wide: bool, order: str) -> "tuple[bytes, int]":
    """The program header table (empty when there is none) and the size of its entries, from HEAD."""
    # Offsets of the fields used, in ELF64 and ELF32: e_phoff, e_shoff, e_phentsize, e_phnum, e_shentsize.
    word = 8 if wide else 4
    phoff = _number(head, 32 if wide else 28, word, order)
    shoff = _number(head, 40 if wide else 32, word, order)
    phentsize, phnum, shentsize = (_number(head, (54 if wide else 42) + 2 * i, 2, order) for i in range(3))
    if phnum == _PN_XNUM:
        # sh_info of section header 0: offset 44 in ELF64, 28 in ELF32.
        phnum = _number(_pread(fd, shentsize, shoff), 44 if wide else 28, 4, order)
    if phnum == 0:
        return b"", phentsize
    if phentsize < (56 if wide else 32) or phentsize % word:
        raise _Corrupt
    table_size = phentsize * phnum
    if table_size > _MAX_DYNAMIC:
        raise _Corrupt  # os.pread would first allocate whatever size a damaged header asks for
    if phoff + table_size <= len(head):
        return head[phoff : phoff + table_size], phentsize
    return _pread(fd, table_size, phoff), phentsize


def _dynamic_entries(fd: int, offset: int, size: int, word: int, order: str) -> "tuple[list[int], list[int]]":
    """The dynamic segment at OFFSET as its (d_tag, d_val) pairs, in two lists, up to DT_NULL."""
    if size > _MAX_DYNAMIC or size < 2 * word:
        raise _Corrupt
    words = _words(_pread(fd, size - size % (2 * word), offset), word, order)
    # DT_NULL ends every dynamic section.
    tags, values = words[0::2], words[1::2]
    if _DT_NULL not in tags:
        raise _Corrupt
    end = tags.index(_DT_NULL)
    del tags[end:], values[end:]
    return tags, values


def _file_offset(fields: "list[int]", stride: int, types: "list[int]", address: int) -> int:
    """Where ADDRESS (DT_STRTAB's, an address in memory) lies in the file: the PT_LOAD segment holding it says."""
    for entry in range(0, len(fields), stride):
        vaddr, filesz = fields[entry + 2], fields[entry + 4]
        if types[entry // stride] == _PT_LOAD and vaddr <= address < vaddr + filesz:
            return address - vaddr + fields[entry + 1]
    raise _Corrupt


class _Strings:
    """Strings of the dynamic string table: one read when they lie close together, else one each.

    libtorch_cpu.so's table is megabytes of symbol names, its library names
    scattered among them: reading the span would cost more than ten small reads.
    """

    def __init__(self, fd: int, base: int, size: int, offsets: "Sequence[int]") -> None:
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
                return self.block[start:end].decode(_FS_ENCODING, _FS_ERRORS)
        for size in (256, _MAX_STRING):  # a name is short; a search path may be long
            data = os.pread(self.fd, min(size, self.size - offset), self.base + offset)
            end = data.find(b"\0")
            if end >= 0:
                return data[:end].decode(_FS_ENCODING, _FS_ERRORS)
        raise _Corrupt
