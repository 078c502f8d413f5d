"""Which libraries a name stands for: its stem, and whether it is CUDA's or torch's own.

A native load's start line names the CUDA libraries the file links, and a verdict
is looked for when it links CUDA's or torch's: tracing/native.py asks these of
every load, before dlopen, and so they live apart from the ELF reader
(facts/elf.py), which the C accelerator's own reader replaces there.
"""

# Run from its compiled file in the program's import (tracing/native.py's FIRST_FACTS), this module may import
# nothing that start-up holds back from the program (tracing/handback.py).
TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Iterable

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


# torch's own libraries, by name stem.
TORCH_STEMS = ("libc10", "libtorch", "libshm", "libcaffe2")


def cuda_needs(needed: "Iterable[str]") -> list[str]:
    """The CUDA-related names among NEEDED, in their order."""
    found = []
    for name in needed:
        stem = library_stem(name)
        if stem in _CUDA_STEMS or stem.startswith(_CUDA_PREFIXES):
            found.append(name)
    return found


def torch_links(needed: "Iterable[str]") -> list[str]:
    """The names among NEEDED that are torch's own libraries, in their order."""
    return [name for name in needed if library_stem(name).startswith(TORCH_STEMS)]
