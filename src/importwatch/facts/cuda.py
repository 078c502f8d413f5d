"""CUDA facts read from files (torch's build, CUDA runtimes, the driver) and verdicts on native loads.

Importing torch may be exactly what hangs, so nothing here imports torch, ctypes
or any extension: torch's version and CUDA build come from torch/version.py read
as text, the runtime from the file names of the libraries, the driver from /proc.
"""

import os
import sys

from importwatch.events import torch_build
from importwatch.facts.libnames import cuda_needs, library_stem

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Iterable, Mapping, Sequence

    from importwatch.facts.elf import DynamicInfo

NVIDIA_PROC = "/proc/driver/nvidia"

# Libraries whose soname major is the CUDA major they ship with (libcudart.so.11.0 is CUDA 11.x,
# libcublas.so.12 is CUDA 12.x). Not cuFFT, cuRAND, cuSOLVER (libcufft.so.11 ships with CUDA 12),
# cuDNN or NCCL (own numbering), nor libcuda.so.1 (the driver).
_MAJOR_IS_CUDA = frozenset(
    {"libcudart", "libcublas", "libcublasLt", "libnvrtc", "libnvrtc-builtins", "libnvJitLink", "libcupti"}
)

# Minimum Linux driver per CUDA release. Source: NVIDIA CUDA Toolkit Release Notes, Table 2 "CUDA
# Toolkit and Minimum Required Driver Version for CUDA Minor Version Compatibility" (_MAJOR_FLOOR:
# below it nothing of that major runs) and Table 3 "CUDA Toolkit and Corresponding Driver Versions"
# (_RELEASE_DRIVER: the driver each GA release shipped with; between the two the runtime works in
# minor-version-compatibility mode, where PTX newer than the driver cannot be JIT-compiled).
_MAJOR_FLOOR = {
    10: (410, 48),
    11: (450, 80, 2),
    12: (525, 60, 13),
    13: (580, 65, 6),
}
_RELEASE_DRIVER = {
    (10, 0): (410, 48),
    (10, 1): (418, 39),
    (10, 2): (440, 33),
    (11, 0): (450, 51, 5),
    (11, 1): (455, 23),
    (11, 2): (460, 27, 3),
    (11, 3): (465, 19, 1),
    (11, 4): (470, 42, 1),
    (11, 5): (495, 29, 5),
    (11, 6): (510, 39, 1),
    (11, 7): (515, 43, 4),
    (11, 8): (520, 61, 5),
    (12, 0): (525, 60, 13),
    (12, 1): (530, 30, 2),
    (12, 2): (535, 54, 3),
    (12, 3): (545, 23, 6),
    (12, 4): (550, 54, 14),
    (12, 5): (555, 42, 2),
    (12, 6): (560, 28, 3),
    (12, 8): (570, 26),
    (12, 9): (575, 51, 3),
    (13, 0): (580, 65, 6),
}

# pip distributions that ship each library, for "install it or put it on the search path".
_WHEELS = {
    "libcudart": "nvidia-cuda-runtime",
    "libcublas": "nvidia-cublas",
    "libcublasLt": "nvidia-cublas",
    "libcudnn": "nvidia-cudnn",
    "libnccl": "nvidia-nccl",
    "libnvrtc": "nvidia-cuda-nvrtc",
    "libcufft": "nvidia-cufft",
    "libcurand": "nvidia-curand",
    "libcusparse": "nvidia-cusparse",
    "libcusparseLt": "nvidia-cusparselt",
    "libcusolver": "nvidia-cusolver",
    "libnvToolsExt": "nvidia-nvtx",
    "libnvJitLink": "nvidia-nvjitlink",
    "libcupti": "nvidia-cuda-cupti",
    "libcufile": "nvidia-cufile",
}
_TORCH_LIBRARIES = ("libc10", "libtorch", "libshm", "libcaffe2")


class Runtime:
    """One CUDA runtime library found on disk, and why the loader could find it there."""

    __slots__ = ("origin", "path")

    def __init__(self, path: str, origin: str) -> None:
        self.path = path
        self.origin = origin  # "torch/lib", "nvidia-cuda-runtime wheel", "LD_LIBRARY_PATH", "system"

    @property
    def name(self) -> str:
        return os.path.basename(self.path)

    def __repr__(self) -> str:
        return f"Runtime({self.path!r}, {self.origin!r})"


class TorchFacts:
    """torch as installed: where, which version, which CUDA it is built for, which runtimes are at hand."""

    __slots__ = ("cuda", "git_version", "hip", "path", "runtimes", "version")

    def __init__(
        self,
        path: str,
        version: "str | None",
        cuda: "str | None",
        git_version: "str | None" = None,
        hip: "str | None" = None,
        runtimes: "Sequence[Runtime]" = (),
    ) -> None:
        self.path = path  # the package directory, .../site-packages/torch
        self.version = version  # "2.3.1+cu121", None when torch/version.py is missing
        self.cuda = cuda  # "12.1", None for a CPU or ROCm build
        self.git_version = git_version
        self.hip = hip  # ROCm builds: "6.0.32830-d62f6a171", and cuda is None
        self.runtimes = tuple(runtimes)

    @property
    def short_version(self) -> str:
        """2.3.1+cu121 -> 2.3.1, as the verdicts name it."""
        return (self.version or "?").split("+", 1)[0]

    @property
    def cuda_major(self) -> "int | None":
        version = _version_tuple(self.cuda)
        return version[0] if version else None

    @property
    def build(self) -> str:
        """'built for CUDA 12.1', 'CPU build, no CUDA' or 'ROCm build, HIP 6.0': the torch line's words."""
        return torch_build(self.fields())

    def fields(self) -> dict:
        """The torch event's fields for what the files say (see importwatch.events, TORCH)."""
        hip = self.hip.split("-", 1)[0] if self.hip else None
        return {"version": self.version, "cuda": self.cuda, "hip": hip, "path": self.path}

    def __repr__(self) -> str:
        return f"TorchFacts({self.path!r}, version={self.version!r}, cuda={self.cuda!r}, hip={self.hip!r})"


def _version_tuple(text: "str | None") -> "tuple[int, ...]":
    """'535.104.05' -> (535, 104, 5); the leading numeric run only; () when there is none."""
    parts = []
    for part in (text or "").split("."):
        if not part.isdigit():
            break
        parts.append(int(part))
    return tuple(parts)


def _dotted(version: "tuple[int, ...]") -> str:
    return ".".join(f"{part:02d}" if index == 2 else str(part) for index, part in enumerate(version))


def cuda_major(soname: str) -> "int | None":
    """libcudart.so.11.0 -> 11, libcublas.so.12 -> 12; None for a library not numbered by CUDA release."""
    name = os.path.basename(soname)
    if library_stem(name) not in _MAJOR_IS_CUDA:
        return None
    _, dot_so, version = name.partition(".so.")
    major = version.split(".", 1)[0]
    return int(major) if dot_so and major.isdigit() else None


def _read_text(path: str, limit: int = 1 << 16) -> "str | None":
    try:
        with open(path, "rb") as file:
            return file.read(limit).decode("utf-8", "replace")
    except OSError:
        return None


def _version_file(text: str) -> "dict[str, str | None]":
    """The simple assignments of torch/version.py: `cuda: Optional[str] = '12.1'`, `cuda = None`."""
    values: dict[str, str | None] = {}
    for line in text.splitlines():
        target, equals, value = line.partition("=")
        if not equals or line[:1].isspace():
            continue
        name = target.split(":", 1)[0].strip()
        value = value.split("#", 1)[0].strip()
        if value == "None":
            values[name] = None
        elif len(value) >= 2 and value[0] == value[-1] and value[0] in "'\"":
            values[name] = value[1:-1]
    return values


def find_torch(
    path: "Sequence[str] | None" = None, environ: "Mapping[str, str] | None" = None
) -> "TorchFacts | None":
    """torch as `import torch` would find it on PATH (default sys.path), without importing it."""
    for entry in sys.path if path is None else path:
        if not isinstance(entry, str):
            continue
        package = os.path.join(entry or os.curdir, "torch")
        if not os.path.isfile(os.path.join(package, "__init__.py")):
            continue
        package = os.path.abspath(package)
        text = _read_text(os.path.join(package, "version.py"))
        values = _version_file(text) if text is not None else {}
        return TorchFacts(
            package,
            values.get("__version__"),
            values.get("cuda"),
            values.get("git_version"),
            values.get("hip"),
            find_runtimes(package, os.environ if environ is None else environ),
        )
    return None


def _runtimes_in(directory: str, origin: str) -> "list[Runtime]":
    """The libcudart files in DIRECTORY, one per major: libcudart.so.12 rather than its symlinks."""
    try:
        names = os.listdir(directory)
    except OSError:
        return []
    best: dict[int | None, str] = {}
    for name in names:
        if not name.startswith("libcudart") or library_stem(name) != "libcudart" or ".so" not in name:
            continue
        major = cuda_major(name)
        # The shortest versioned name is the soname the loader looks for (libcudart.so.12, not .12.1.105).
        if major not in best or len(name) < len(best[major]):
            best[major] = name
    if len(best) > 1:
        best.pop(None, None)  # the unversioned libcudart.so is a link for the linker, not the runtime
    return [Runtime(os.path.join(directory, name), origin) for name in best.values()]


def find_runtimes(torch_dir: str, environ: "Mapping[str, str]") -> "list[Runtime]":
    """CUDA runtimes in the order the loader tends to meet them: torch's own, the nvidia wheels,
    LD_LIBRARY_PATH, then the system CUDA installs."""
    found = _runtimes_in(os.path.join(torch_dir, "lib"), "torch/lib")
    nvidia = os.path.join(os.path.dirname(torch_dir), "nvidia")
    try:
        wheels = sorted(os.listdir(nvidia))
    except OSError:
        wheels = []
    for wheel in wheels:
        label = "nvidia-" + wheel.replace("_", "-") + " wheel"
        found += _runtimes_in(os.path.join(nvidia, wheel, "lib"), label)
    for directory in environ.get("LD_LIBRARY_PATH", "").split(":"):
        if directory:
            found += _runtimes_in(directory, "LD_LIBRARY_PATH")
    try:
        system = sorted(name for name in os.listdir("/usr/local") if name.startswith("cuda"))
    except OSError:
        system = []
    for name in system:
        found += _runtimes_in(os.path.join("/usr/local", name, "lib64"), "system")
    unique, seen = [], set()
    for runtime in found:
        real = os.path.realpath(runtime.path)
        if real not in seen:
            seen.add(real)
            unique.append(runtime)
    return unique


def driver_version(root: str = NVIDIA_PROC) -> "str | None":
    """The NVIDIA kernel driver's version, '535.104.05', or None when no driver is loaded."""
    text = _read_text(os.path.join(root, "version"), 4096)
    if not text:
        return None
    # "NVRM version: NVIDIA UNIX x86_64 Kernel Module  535.104.05  Sat Aug 19 ..." (or "Open Kernel Module")
    for word in text.splitlines()[0].split():
        if "." in word and word.replace(".", "").isdigit():
            return word
    return None


def gpus(root: str = NVIDIA_PROC) -> "list[str]":
    """The model of each GPU the driver sees, by bus id order: ['NVIDIA H200', ...]."""
    directory = os.path.join(root, "gpus")
    try:
        buses = sorted(os.listdir(directory))
    except OSError:
        return []
    models = []
    for bus in buses:
        text = _read_text(os.path.join(directory, bus, "information"), 4096) or ""
        for line in text.splitlines():
            key, colon, value = line.partition(":")
            if colon and key.strip() == "Model":
                models.append(value.strip())
                break
        else:
            models.append(f"GPU at {bus}")
    return models


def short_path(path: str) -> str:
    """The last two components of PATH: fastkern/_kernels.cpython-311-x86_64-linux-gnu.so."""
    parts = path.rstrip("/").split("/")
    return "/".join(parts[-2:])


def _torch_name(torch: "TorchFacts") -> str:
    return f"torch {torch.short_version}"


def _runtime_need(names: "Iterable[str]") -> "tuple[str, int] | None":
    """The library that fixes which CUDA major a file needs: libcudart first, else any CUDA-numbered one."""
    numbered = [(name, major) for name in names if (major := cuda_major(name)) is not None]
    for name, major in numbered:
        if library_stem(name) == "libcudart":
            return name, major
    return numbered[0] if numbered else None


def native_verdicts(
    path: str, info: "DynamicInfo | None", torch: "TorchFacts | None", driver: "str | None" = None
) -> "list[str]":
    """Sentences on what in PATH's needs cannot work with this torch or driver; [] when nothing is wrong.

    INFO is read_dynamic(PATH); DRIVER is driver_version(), None when unknown or absent.
    """
    if info is None:
        return []
    cuda = cuda_needs(info.needed)
    if not cuda:
        return []
    who = short_path(path)
    verdicts = []
    need = _runtime_need(cuda)
    if torch is not None:
        if torch.cuda is None:
            build = "a ROCm build" if torch.hip else "a CPU build, without CUDA"
            verdicts.append(f"{who} needs {', '.join(cuda)} but {_torch_name(torch)} is {build}")
        elif need is not None and torch.cuda_major is not None and need[1] != torch.cuda_major:
            verdicts.append(
                f"{who} needs {need[0]} (CUDA {need[1]}) "
                f"but {_torch_name(torch)} is built for CUDA {torch.cuda}"
            )
    if driver is not None and need is not None:
        floor = _MAJOR_FLOOR.get(need[1])
        if floor is not None and _version_tuple(driver) < floor:
            verdicts.append(
                f"{who} needs {need[0]} (CUDA {need[1]}), which needs NVIDIA driver >= {_dotted(floor)}; "
                f"this driver is {driver}"
            )
    return verdicts


def driver_verdicts(torch: "TorchFacts | None", driver: "str | None") -> "list[str]":
    """Sentences on a driver too old for the CUDA torch is built for; [] when it is new enough or unknown."""
    if torch is None or not torch.cuda or driver is None:
        return []
    version = _version_tuple(torch.cuda)
    have = _version_tuple(driver)
    floor = _MAJOR_FLOOR.get(version[0]) if version else None
    name = _torch_name(torch)
    if floor is not None and have < floor:
        return [
            f"{name} is built for CUDA {torch.cuda}, which needs NVIDIA driver >= {_dotted(floor)}; "
            f"this driver is {driver}"
        ]
    release = _RELEASE_DRIVER.get(version[:2])
    if release is not None and have < release:
        return [
            f"NVIDIA driver {driver} is older than CUDA {torch.cuda} ({_dotted(release)}): {name} runs in "
            "minor-version-compatibility mode, where kernels shipped only as newer PTX cannot be compiled"
        ]
    return []


def torch_fields(
    facts: "TorchFacts",
    driver: "str | None" = None,
    gpu_models: "Sequence[str]" = (),
    visible: "str | None" = None,
) -> dict:
    """The torch event's fields before import: the files' facts, the CUDA runtimes at hand, the
    driver and its GPUs (events.render says them in one line).

    DRIVER is driver_version(), GPU_MODELS is gpus(), VISIBLE is CUDA_VISIBLE_DEVICES (None when unset).
    """
    runtimes: list[str] | None = None  # None: not said (a CPU build); []: none found
    if facts.runtimes and (facts.cuda or facts.version is None):
        runtimes = [f"{runtime.name} ({runtime.origin})" for runtime in facts.runtimes]
    elif facts.cuda:
        runtimes = []
    return {
        **facts.fields(),
        "before": True,
        "runtimes": runtimes,
        "driver": driver,
        "gpus": len(gpu_models),
        "models": sorted(set(gpu_models)),
        "visible": None if visible is None else visible if visible.strip() else "",
    }


def _demangle_prefix(symbol: str) -> "str | None":
    """The qualified name a mangled symbol starts with: _ZN3c1010TensorImpl4sizeEv -> c10::TensorImpl::size.

    Only nested names made of plain identifiers; templates and substitutions end it.
    """
    if symbol.startswith("_ZN"):
        index = 3
        while index < len(symbol) and symbol[index] in "KVrRO":  # cv- and ref-qualifiers of a method
            index += 1
    elif symbol.startswith("_Z"):
        index = 2
    else:
        return None
    names = []
    while index < len(symbol) and symbol[index].isdigit():
        end = index
        while end < len(symbol) and symbol[end].isdigit():
            end += 1
        length = int(symbol[index:end])
        names.append(symbol[end : end + length])
        index = end + length
        if not symbol.startswith("_ZN"):
            break
    return "::".join(names) if names and all(names) else None


def _library_wheel(name: str) -> str:
    stem = library_stem(name)
    major = name.partition(".so.")[2].split(".", 1)[0]
    for known, wheel in _WHEELS.items():
        if stem == known or (stem.startswith(known) and known == "libcudnn"):
            suffix = f"-cu{major}" if major.isdigit() and cuda_major(name) is not None else ""
            return f"{wheel}{suffix} wheel"
    return ""


_CUDA_SYMBOLS = (
    "cuda",
    "__cuda",
    "cublas",
    "cudnn",
    "cufft",
    "curand",
    "cusparse",
    "cusolver",
    "nccl",
    "nvrtc",
)


def explain_load_error(
    message: str, path: "str | None" = None, torch: "TorchFacts | None" = None
) -> "str | None":
    """One line on the likely cause of a failed native load of PATH, from its ImportError/OSError message.

    None when the message is not one of the failures recognised here.
    """
    text = str(message)
    who, sep, _ = text.partition(": ")
    if not sep or " " in who:
        who = ""
    named = short_path(path) if path else (short_path(who) if "/" in who else who)
    if "undefined symbol: " in text:
        words = text.rsplit("undefined symbol: ", 1)[1].split()
        symbol = words[0].rstrip(",") if words else "?"
        readable = _demangle_prefix(symbol)
        shown = f"{readable} ({symbol})" if readable else symbol
        subject = f"{short_path(who) if who else named or 'the library'} misses {shown}"
        if readable and readable.split("::", 1)[0] in ("c10", "at", "torch", "caffe2"):
            other = f"than {_torch_name(torch)}" if torch is not None else "than the one installed"
            return f"{subject}: it was built against another torch {other}; rebuild it against this torch"
        if symbol.startswith(("Py", "_Py")):
            return f"{subject}: it was built for another Python version or ABI"
        if symbol.startswith(_CUDA_SYMBOLS):
            return f"{subject}: it was built against another CUDA (or CUDA library) than the one loaded"
        return f"{subject}: it was built against another version of a library it links"
    if "cannot open shared object file" in text and who:
        if "/" in who:
            return f"{who} cannot be opened: the file does not exist or is not readable"
        needs = f"{named} needs {who}, which" if path else who
        stem = library_stem(who)
        if stem == "libcuda":
            return f"{needs} is the NVIDIA driver's: no driver is installed or visible (no {NVIDIA_PROC})"
        if stem.startswith(_TORCH_LIBRARIES):
            return f"{needs} is torch's: import torch first, or the file lacks an RPATH to torch/lib"
        wheel = _library_wheel(who)
        ships = f"; it ships in the {wheel} or a CUDA toolkit" if wheel else ""
        return f"{needs} is not on the library search path (RUNPATH/RPATH, LD_LIBRARY_PATH, ldconfig){ships}"
    if "version `" in text and "' not found" in text:
        symbol_version = text.split("version `", 1)[1].split("'", 1)[0]
        required = text.rsplit("(required by ", 1)[1].rstrip(")") if "(required by " in text else named
        by = f" than {short_path(required)} was built with" if required else ""
        if symbol_version.startswith(("GLIBCXX_", "CXXABI_")):
            return (
                f"the libstdc++ loaded is older{by} (needs {symbol_version}): an older libstdc++ "
                "(conda's, the system's, one in LD_LIBRARY_PATH) was found first"
            )
        if symbol_version.startswith("GLIBC_"):
            return f"the C library is older{by} (needs {symbol_version}): it was built on a newer system"
        return f"a library loaded is older{by} (needs symbol version {symbol_version})"
    subject = short_path(who) if "/" in who else who or named or "the library"
    if "cannot allocate memory in static TLS block" in text:
        return f"{subject} uses static TLS and was loaded too late: import it earlier or put it in LD_PRELOAD"
    if "wrong ELF class" in text:
        return f"{subject} is built for another word size (32 or 64 bit) than this Python"
    if "invalid ELF header" in text or "file too short" in text:
        return f"{subject} is not a valid shared object (not ELF, or truncated)"
    if "does not define module export function" in text:
        return f"{subject} is not an extension for this module name, or is built for another Python"
    return None
