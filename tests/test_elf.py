"""read_dynamic, elf.py's and the C accelerator's twin, on real files: compiled libraries, real torch, synthetic ELF
checked by readelf, junk; the two answer alike on every shared object found here, whole and damaged."""

from __future__ import annotations

import glob
import importlib.util
import os
import random
import shutil
import struct
import subprocess
import sys
import sysconfig
import time
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from cbuild import FIXTURES, compile_shared, compiler
from helpers import torch_dir
from importwatch.facts import elf
from importwatch.facts.elf import DynamicInfo
from importwatch.facts.libnames import cuda_needs, library_stem, torch_links

if TYPE_CHECKING:
    from collections.abc import Callable

    Reader = Callable[[object], DynamicInfo | None]

CUDA = FIXTURES / "cuda"
TORCH = torch_dir()  # the torch this interpreter would import, if any
BUILT = importlib.util.find_spec("importwatch.tracing._speedups") is not None
needs_accelerator = pytest.mark.skipif(not BUILT, reason="the C accelerator is not built for this Python")


def _c_read_dynamic(path: object) -> DynamicInfo | None:
    """The C accelerator's read_dynamic, its tuple as elf.py's DynamicInfo (tracing/native.py does so too)."""
    from importwatch.tracing import _speedups

    found = _speedups.read_dynamic(path)
    return None if found is None else DynamicInfo(*found)


@pytest.fixture(params=["python", pytest.param("C", marks=needs_accelerator)])
def read_dynamic(request: pytest.FixtureRequest) -> Reader:
    """Each twin in turn: elf.py's read_dynamic, and the C accelerator's."""
    return elf.read_dynamic if request.param == "python" else _c_read_dynamic


@pytest.fixture(scope="module")
def libs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    out = tmp_path_factory.mktemp("elf")
    dep = compile_shared(CUDA / "dep.c", out / "dep" / "libdep.so.1", soname="libdep.so.1")
    cudart = compile_shared(
        CUDA / "cudart_standin.c", out / "cuda" / "libcudart.so.11.0", soname="libcudart.so.11.0"
    )
    runpath = compile_shared(
        CUDA / "top.c", out / "libtop.so", libs=[dep, cudart], extra=["-Wl,--enable-new-dtags"]
    )
    rpath = compile_shared(
        CUDA / "top.c",
        out / "libtop_rpath.so",
        soname="libtop.so.2",
        libs=[dep],
        extra=["-Wl,--disable-new-dtags"],
    )
    return {"dep": dep, "cudart": cudart, "runpath": runpath, "rpath": rpath, "out": out}


@pytest.mark.slow
def test_needed_runpath_and_soname_of_a_compiled_library(libs: dict[str, Path], read_dynamic: Reader) -> None:
    info = read_dynamic(str(libs["runpath"]))
    assert info is not None
    assert info.needed[:2] == ("libdep.so.1", "libcudart.so.11.0")
    assert "libc.so.6" in info.needed
    assert info.runpath == f"{libs['dep'].parent}:{libs['cudart'].parent}"
    assert info.rpath is None and info.soname is None
    assert read_dynamic(str(libs["dep"])).soname == "libdep.so.1"
    assert read_dynamic(str(libs["cudart"])).soname == "libcudart.so.11.0"


@pytest.mark.slow
def test_old_style_rpath_is_told_from_runpath(libs: dict[str, Path], read_dynamic: Reader) -> None:
    info = read_dynamic(str(libs["rpath"]))
    assert info == DynamicInfo(
        ("libdep.so.1", "libc.so.6"), rpath=str(libs["dep"].parent), soname="libtop.so.2"
    )


@pytest.mark.slow
def test_dynamic_info_is_immutable_and_hashable(libs: dict[str, Path], read_dynamic: Reader) -> None:
    info = read_dynamic(str(libs["runpath"]))
    with pytest.raises(AttributeError):
        info.soname = "x"  # type: ignore[misc]
    assert {info, read_dynamic(str(libs["runpath"]))} == {info}
    assert "libdep.so.1" in repr(info)


def test_cuda_needs_and_torch_links_pick_their_libraries() -> None:
    needed = [
        "libc10.so",
        "libcudart.so.11.0",
        "libcublasLt.so.12",
        "libcudnn_ops_infer.so.8",
        "libnccl.so.2",
        "libcuda.so.1",
        "libcudart-9335f6a2.so.12",
        "libtorch_cuda.so",
        "libc10_cuda.so",
        "libnvToolsExt.so.1",
        "libstdc++.so.6",
        "libcudadevrt.a",
        "libcurl.so.4",
    ]
    assert cuda_needs(needed) == [
        "libcudart.so.11.0",
        "libcublasLt.so.12",
        "libcudnn_ops_infer.so.8",
        "libnccl.so.2",
        "libcuda.so.1",
        "libcudart-9335f6a2.so.12",
        "libtorch_cuda.so",
        "libc10_cuda.so",
        "libnvToolsExt.so.1",
    ]
    assert library_stem("/x/libcudart-9335f6a2.so.12") == "libcudart"
    assert library_stem("libcudnn_ops_infer.so.8") == "libcudnn_ops_infer"
    assert torch_links(needed) == ["libc10.so", "libtorch_cuda.so", "libc10_cuda.so"]
    assert torch_links(["libshm-0123abcd.so", "libtorchvision.so", "libcaffe2_nvrtc.so"]) == [
        "libshm-0123abcd.so",
        "libtorchvision.so",  # a stem's prefix, as scan.py has always matched it
        "libcaffe2_nvrtc.so",
    ]


@pytest.mark.slow
def test_cuda_needs_of_a_compiled_library(libs: dict[str, Path], read_dynamic: Reader) -> None:
    assert cuda_needs(read_dynamic(str(libs["runpath"])).needed) == ["libcudart.so.11.0"]


def _synthetic_elf(wide: bool, order: str, needed: list[str], soname: str, runpath: str) -> bytes:
    """A minimal shared object: header, PT_LOAD at a non-zero address, PT_DYNAMIC, string table."""
    base = 0x400000
    strings, offsets = b"\0", {}
    for text in [*needed, soname, runpath]:
        offsets[text] = len(strings)
        strings += text.encode() + b"\0"
    header_size, ph_size = (64, 56) if wide else (52, 32)
    string_offset = header_size + 2 * ph_size
    dynamic_offset = (string_offset + len(strings) + 7) & ~7
    entries = [(1, offsets[name]) for name in needed]
    entries += [
        (14, offsets[soname]),
        (29, offsets[runpath]),
        (5, base + string_offset),
        (10, len(strings)),
        (0, 0),
    ]
    dynamic = b"".join(struct.pack(order + ("qQ" if wide else "iI"), tag, value) for tag, value in entries)
    total = dynamic_offset + len(dynamic)
    ident = b"\x7fELF" + bytes([2 if wide else 1, 1 if order == "<" else 2, 1]) + bytes(9)
    if wide:
        header = struct.pack(
            order + "HHIQQQIHHHHHH", 3, 62, 1, 0, header_size, 0, 0, header_size, ph_size, 2, 64, 0, 0
        )
        load = struct.pack(order + "IIQQQQQQ", 1, 5, 0, base, base, total, total, 0x1000)
        segment = struct.pack(
            order + "IIQQQQQQ", 2, 6, dynamic_offset, base + dynamic_offset, 0, len(dynamic), len(dynamic), 8
        )
    else:
        header = struct.pack(
            order + "HHIIIIIHHHHHH", 3, 3, 1, 0, header_size, 0, 0, header_size, ph_size, 2, 40, 0, 0
        )
        load = struct.pack(order + "IIIIIIII", 1, 0, base, base, total, total, 5, 0x1000)
        segment = struct.pack(
            order + "IIIIIIII", 2, dynamic_offset, base + dynamic_offset, 0, len(dynamic), len(dynamic), 6, 4
        )
    data = ident + header + load + segment + strings
    return data + bytes(dynamic_offset - len(data)) + dynamic


@pytest.mark.slow
@pytest.mark.parametrize("wide", [True, False], ids=["64bit", "32bit"])
@pytest.mark.parametrize("order", ["<", ">"], ids=["little", "big"])
def test_both_word_sizes_and_byte_orders(
    tmp_path: Path, wide: bool, order: str, read_dynamic: Reader
) -> None:
    path = tmp_path / "libsynthetic.so"
    path.write_bytes(
        _synthetic_elf(wide, order, ["libc.so.6", "libcudart.so.11.0"], "libs.so.1", "$ORIGIN/x")
    )
    readelf = shutil.which("readelf")
    if readelf:  # an independent reader agrees that the file says what we built
        shown = subprocess.run([readelf, "-d", str(path)], capture_output=True, text=True).stdout
        assert "[libcudart.so.11.0]" in shown and "[libs.so.1]" in shown and "[$ORIGIN/x]" in shown
    assert read_dynamic(str(path)) == DynamicInfo(
        ("libc.so.6", "libcudart.so.11.0"), runpath="$ORIGIN/x", soname="libs.so.1"
    )


@pytest.mark.slow
def test_a_32bit_library_built_by_the_toolchain(
    libs: dict[str, Path], tmp_path: Path, read_dynamic: Reader
) -> None:
    objects = []
    for name in ("dep", "top"):
        done = subprocess.run(
            [compiler(), "-m32", "-fPIC", "-c", str(CUDA / f"{name}.c"), "-o", str(tmp_path / f"{name}.o")],
            capture_output=True,
        )
        objects.append(tmp_path / f"{name}.o")
        if done.returncode != 0:
            pytest.skip("this compiler cannot make 32-bit objects")
    link = ["ld", "-m", "elf_i386", "-shared"]
    if subprocess.run(
        [*link, "-soname", "libdep32.so.1", "-o", str(tmp_path / "libdep32.so.1"), str(objects[0])]
    ).returncode:
        pytest.skip("this linker cannot link 32-bit x86")
    subprocess.run(
        [
            *link,
            "-o",
            str(tmp_path / "libtop32.so"),
            str(objects[1]),
            f"-L{tmp_path}",
            "-l:libdep32.so.1",
            "-rpath",
            "/opt/x",
        ],
        check=True,
    )
    assert read_dynamic(str(tmp_path / "libtop32.so")) == DynamicInfo(("libdep32.so.1",), runpath="/opt/x")
    assert read_dynamic(str(tmp_path / "libdep32.so.1")).soname == "libdep32.so.1"


@pytest.mark.slow
def test_a_static_executable_needs_nothing(tmp_path: Path, read_dynamic: Reader) -> None:
    source = tmp_path / "main.c"
    source.write_text("int main(void) { return 0; }\n")
    done = subprocess.run(
        [compiler(), "-static", "-o", str(tmp_path / "main"), str(source)], capture_output=True
    )
    if done.returncode != 0:
        pytest.skip("no static C library to link against")
    assert read_dynamic(str(tmp_path / "main")) == DynamicInfo()


@pytest.mark.slow
def test_files_that_are_not_readable_elf_give_none(
    libs: dict[str, Path], tmp_path: Path, read_dynamic: Reader
) -> None:
    text = tmp_path / "notelf.so"
    text.write_text("INPUT(-lfoo)\n")  # a linker script named .so, as libc.so is
    empty = tmp_path / "empty.so"
    empty.write_bytes(b"")
    truncated = tmp_path / "truncated.so"
    truncated.write_bytes(libs["runpath"].read_bytes()[:100])
    for path in (text, empty, truncated, tmp_path / "missing.so", tmp_path, "", "a\0b"):
        assert read_dynamic(str(path)) is None


@pytest.mark.slow
def test_unreadable_file_gives_none(libs: dict[str, Path], tmp_path: Path, read_dynamic: Reader) -> None:
    locked = tmp_path / "locked.so"
    shutil.copy(libs["runpath"], locked)
    locked.chmod(0)
    try:
        if os.access(locked, os.R_OK):
            pytest.skip("this user (root) reads files whatever their mode")
        assert read_dynamic(str(locked)) is None
    finally:
        locked.chmod(0o644)


def _dynamic_segment(data: bytes) -> tuple[int, int]:
    """Offset and size of PT_DYNAMIC in a little-endian ELF64 file."""
    phoff = struct.unpack_from("<Q", data, 32)[0]
    phentsize, phnum = struct.unpack_from("<HH", data, 54)
    for index in range(phnum):
        p_type, _, offset, _, _, size = struct.unpack_from("<IIQQQQ", data, phoff + index * phentsize)
        if p_type == 2:
            return offset, size
    raise AssertionError("no PT_DYNAMIC")


@pytest.mark.slow
def test_garbage_in_the_dynamic_section_gives_none(
    libs: dict[str, Path], tmp_path: Path, read_dynamic: Reader
) -> None:
    data = bytearray(libs["runpath"].read_bytes())
    offset, size = _dynamic_segment(bytes(data))
    for fill in (b"\xff", b"\x01\x00\x00\x00\x00\x00\x00\x00\xff\xff\xff\x7f\x00\x00\x00\x00"):
        garbage = bytearray(data)
        garbage[offset : offset + size] = (fill * size)[:size]
        path = tmp_path / "garbage.so"
        path.write_bytes(garbage)
        assert read_dynamic(str(path)) is None


@pytest.mark.slow
@pytest.mark.timeout(60)
def test_no_cut_or_damage_makes_it_raise(libs: dict[str, Path], tmp_path: Path, read_dynamic: Reader) -> None:
    data = libs["runpath"].read_bytes()
    path = tmp_path / "damaged.so"
    end = max(_dynamic_segment(data)) + sum(_dynamic_segment(data))
    for cut in range(0, min(len(data), end + 64), 61):
        path.write_bytes(data[:cut])
        read_dynamic(str(path))  # None or a DynamicInfo; never an exception
    offset, size = _dynamic_segment(data)
    for position in [*range(0, 64), *range(offset, offset + size, 3)]:
        for value in (0x00, 0x7F, 0xFF):
            damaged = bytearray(data)
            damaged[position] = value
            path.write_bytes(damaged)
            assert read_dynamic(str(path)) is None or isinstance(read_dynamic(str(path)), DynamicInfo)


@pytest.mark.slow
def test_reading_does_not_import_anything(libs: dict[str, Path]) -> None:
    code = (
        "import sys; before = set(sys.modules); from importwatch.facts.elf import read_dynamic\n"
        f"read_dynamic({str(libs['runpath'])!r})\n"
        "new = set(sys.modules) - before\n"
        "print(sorted(name for name in new if getattr(sys.modules[name], '__file__', '').endswith('.so')))"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "[]"  # no extension module: _struct is one


@pytest.mark.torch
@pytest.mark.skipif(TORCH is None, reason="torch is not installed for this interpreter")
def test_real_torch_libraries(read_dynamic: Reader) -> None:
    assert TORCH is not None
    extension = read_dynamic(str(TORCH / f"_C{sysconfig.get_config_var('EXT_SUFFIX')}"))
    assert "libtorch_python.so" in extension.needed
    assert "$ORIGIN/lib" in extension.runpath.split(":")
    cpu = TORCH / "lib" / "libtorch_cpu.so"
    info = read_dynamic(str(cpu))
    assert info.soname == "libtorch_cpu.so" and "libc10.so" in info.needed
    assert cuda_needs(info.needed) == []  # a CPU build
    rounds = 200
    start = time.perf_counter()
    for _ in range(rounds):
        read_dynamic(str(cpu))
    per_read_ms = (time.perf_counter() - start) / rounds * 1000
    print(f"read_dynamic(libtorch_cpu.so, {cpu.stat().st_size >> 20} MiB): {per_read_ms:.3f} ms")


def _shared_objects() -> list[str]:
    """Every shared object of this interpreter, its venv (torch's libraries among them) and the system's."""
    found = glob.glob(os.path.join(os.path.dirname(os.__file__), "lib-dynload", "*.so"))
    found += glob.glob(os.path.join(sysconfig.get_paths()["purelib"], "**", "*.so*"), recursive=True)
    found += glob.glob("/usr/lib/x86_64-linux-gnu/*.so*") + glob.glob("/lib64/*.so*")
    return sorted(path for path in set(found) if os.path.isfile(path))


@pytest.mark.slow
@needs_accelerator
@pytest.mark.timeout(120)
def test_the_twins_answer_alike_on_every_shared_object_here_whole_and_damaged(tmp_path: Path) -> None:
    paths = _shared_objects()
    assert len(paths) > 50
    for path in [*paths, str(tmp_path), str(tmp_path / "missing.so"), "a\0b", b"/proc/self/exe", 7]:
        assert _c_read_dynamic(path) == elf.read_dynamic(path), path  # type: ignore[arg-type]
    # Damage where the reading goes: the program headers, the dynamic segment, the string table, cuts.
    chance = random.Random(25)
    damaged = tmp_path / "damaged.so"
    nothing = 0
    for source in chance.sample([path for path in paths if "lib-dynload" in path], 10):
        data = Path(source).read_bytes()
        offset, size = _dynamic_segment(data)
        phoff = struct.unpack_from("<Q", data, 32)[0]
        for _ in range(300):
            copy = bytearray(data)
            for _ in range(chance.randrange(1, 5)):
                where = chance.choice(
                    [
                        offset + chance.randrange(size),
                        phoff + chance.randrange(448),
                        chance.randrange(len(copy)),
                    ]
                )
                word = chance.choice([b"\xff" * 8, bytes(8), struct.pack("<Q", chance.getrandbits(64))])
                copy[where : where + chance.choice([1, 8])] = word[: chance.choice([1, 8])]
            if chance.random() < 0.1:
                del copy[chance.randrange(len(copy)) :]
            damaged.write_bytes(copy)
            python = elf.read_dynamic(str(damaged))
            nothing += python is None
            assert _c_read_dynamic(str(damaged)) == python
    assert 100 < nothing < 2900  # damage both ways: files still read, and files refused


BLOCKED_READ = """
import os, sys, threading
from importwatch.facts import elf
from importwatch.tracing import _speedups
read = elf.read_dynamic if sys.argv[2] == "python" else _speedups.read_dynamic
path, found = sys.argv[1], []
reader = threading.Thread(target=lambda: found.append(read(path)))
reader.start()  # its open waits for a writer
reader.join(0.3)
try:
    with open(path, "wb") as fifo:  # this thread runs only if the reader let go of the GIL
        fifo.write(b"not an ELF file at all\\n")
except BrokenPipeError:
    pass  # the reader's pread failed at once (a FIFO cannot seek), and it closed its end
reader.join()
print(found)
"""


@pytest.mark.slow
@pytest.mark.timeout(60)
@pytest.mark.parametrize("reader", ["python", pytest.param("C", marks=needs_accelerator)])
def test_a_read_that_blocks_lets_the_program_s_other_threads_run(tmp_path: Path, reader: str) -> None:
    """A file system that blocks as a library's headers are read (a FIFO stands for one: its open waits for
    a writer) stops the loading thread alone: the C reader lets go of the GIL around each system call, as
    os.open and os.pread do, so the watchdog can name the load, and the program's other threads go on."""
    fifo = tmp_path / "libslow.so"
    os.mkfifo(fifo)
    done = subprocess.run(
        [sys.executable, "-c", BLOCKED_READ, str(fifo), reader], capture_output=True, text=True, timeout=30
    )
    assert (done.returncode, done.stdout) == (0, "[None]\n"), done.stderr
