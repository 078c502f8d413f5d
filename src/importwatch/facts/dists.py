"""Which installed distribution owns a file, and whether what its metadata pins fits the torch installed.

Packages that ship extensions against torch's C++ ABI (torchvision, torchaudio,
xformers, ...) pin the torch they were built for (`Requires-Dist: torch==2.7.1`)
and carry the CUDA they were built for as a local version (`0.22.1+cu126`).
This reads the `*.dist-info` folders as files, as importlib.metadata would, but
without importing it: these verdicts are said just before a dlopen, inside the
traced program, where importing email, csv or zipfile would change the
program's modules mid-import. Each RECORD is read once per process.
"""

import os

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Iterable, Sequence

    from importwatch.facts.cuda import TorchFacts

_METADATA_LIMIT = 1 << 20
_RECORD_LIMIT = 1 << 26  # torch's RECORD is a few megabytes
_OPERATORS = ("===", "==", "!=", "~=", ">=", "<=", ">", "<")  # longest first
# Pre-release spellings, longest first, and their order (a < b < rc).
_PRE = (("preview", 2), ("alpha", 0), ("beta", 1), ("pre", 2), ("rc", 2), ("a", 0), ("b", 1), ("c", 2))
_POST = ("post", "rev", "r")
_SEPARATORS = "-_."


class Dist:
    """One installed distribution: its name, version, and the requirement it states on torch."""

    __slots__ = ("name", "path", "torch_requirement", "version")

    def __init__(self, path: str, name: str, version: str, torch_requirement: "str | None") -> None:
        self.path = path  # the .dist-info folder
        self.name = name
        self.version = version
        self.torch_requirement = torch_requirement  # "==2.7.1", ">=2.0,<3"; None when it states none

    @property
    def local(self) -> str:
        return self.version.partition("+")[2]

    def __repr__(self) -> str:
        return f"Dist({self.name!r}, {self.version!r}, torch{self.torch_requirement or ' (any)'})"


def normalize(name: str) -> str:
    """A project name as the index compares them: torch_scatter, Torch-Scatter -> torch-scatter."""
    words = name.lower().replace("_", "-").replace(".", "-").split("-")
    return "-".join(word for word in words if word)


# -- reading dist-info folders ------------------------------------------------------------
def _read_text(path: str, limit: int) -> "str | None":
    try:
        with open(path, "rb") as file:
            return file.read(limit).decode("utf-8", "replace")
    except OSError:
        return None


def read_metadata(dist_info: str) -> "Dist | None":
    """The Name, Version and torch requirement in DIST_INFO/METADATA; None when it cannot be read."""
    text = _read_text(os.path.join(dist_info, "METADATA"), _METADATA_LIMIT)
    if text is None:
        return None
    name = version = None
    torch_requirement = None
    for line in text.splitlines():
        if not line.strip():
            break  # the headers end at the first empty line; the description follows
        key, colon, value = line.partition(":")
        if not colon:
            continue
        key, value = key.strip().lower(), value.strip()
        if key == "name":
            name = value
        elif key == "version":
            version = value
        elif key == "requires-dist" and torch_requirement is None:
            torch_requirement = torch_specifier(value)
    if not name or not version:
        return None
    return Dist(dist_info, name, version, torch_requirement)


def torch_specifier(requirement: str) -> "str | None":
    """'torch (==2.7.1)' or 'torch==2.7.1; python_version>"3"' -> '==2.7.1'; None for another project,
    a requirement only for an extra, or no version constraint."""
    spec, _, marker = requirement.partition(";")
    if "extra" in marker:
        return None
    spec = spec.strip()
    end = 0
    while end < len(spec) and (spec[end].isalnum() or spec[end] in _SEPARATORS):
        end += 1
    if end == 0 or normalize(spec[:end]) != "torch":
        return None
    rest = spec[end:].strip()
    if rest.startswith("["):  # extras: torch[opt-einsum]==2.7.1
        rest = rest.partition("]")[2].strip()
    constraint = rest.strip("()").replace(" ", "")
    return constraint or None


def _record_paths(dist_info: str) -> "frozenset[str]":
    """The files DIST_INFO/RECORD lists, relative to the folder that holds DIST_INFO, normalized."""
    text = _read_text(os.path.join(dist_info, "RECORD"), _RECORD_LIMIT) or ""
    paths = set()
    for line in text.splitlines():
        # path,hash,size; a path holding a comma is quoted (csv): "a,b.py",sha256=...,12
        if line.startswith('"'):
            entry = line[1:].split('",', 1)[0].replace('""', '"')
        else:
            entry = line.rsplit(",", 2)[0]
        if entry:
            paths.add(os.path.normpath(entry))
    return frozenset(paths)


class Owners:
    """Finds the distribution that installed a file, from the RECORD files next to it; caches each read."""

    def __init__(self) -> None:
        self._records: dict[str, frozenset[str]] = {}
        self._dist_infos: dict[str, list[str]] = {}
        self._metadata: dict[str, Dist | None] = {}
        self._owners: dict[str, Dist | None] = {}

    def owner(self, path: str) -> "Dist | None":
        """The distribution whose RECORD lists PATH; None for a file no installed distribution owns."""
        path = os.path.abspath(path)
        if path not in self._owners:
            self._owners[path] = self._find(path)
        return self._owners[path]

    def _find(self, path: str) -> "Dist | None":
        folder = os.path.dirname(path)
        while True:
            parent = os.path.dirname(folder)
            if parent == folder:
                return None
            folder = parent
            infos = self._infos_in(folder)
            if not infos:
                continue
            relative = os.path.relpath(path, folder)
            top = normalize(relative.split(os.sep, 1)[0].split(".", 1)[0])
            # The dist named like the top folder first: one RECORD read instead of all of them.
            infos = sorted(infos, key=lambda info: normalize(os.path.basename(info).split("-", 1)[0]) != top)
            for info in infos:
                if relative in self._record(info):
                    return self.metadata(info)
            return None

    def _infos_in(self, folder: str) -> "list[str]":
        if folder not in self._dist_infos:
            try:
                names = os.listdir(folder)
            except OSError:
                names = []
            self._dist_infos[folder] = [
                os.path.join(folder, name) for name in sorted(names) if name.endswith(".dist-info")
            ]
        return self._dist_infos[folder]

    def _record(self, info: str) -> "frozenset[str]":
        if info not in self._records:
            self._records[info] = _record_paths(info)
        return self._records[info]

    def metadata(self, info: str) -> "Dist | None":
        if info not in self._metadata:
            self._metadata[info] = read_metadata(info)
        return self._metadata[info]


# -- versions (PEP 440, the parts requirements on torch use) -----------------------------------
def _number(text: str) -> "tuple[int | None, str]":
    """The leading digits of TEXT as a number (None without any), and the rest."""
    end = 0
    while end < len(text) and text[end].isdigit():
        end += 1
    return (int(text[:end]) if end else None), text[end:]


def _parse(version: str) -> "tuple | None":
    """(epoch, release, pre, post, dev, local) of VERSION; None when it is not a PEP 440 version."""
    text, _, local = version.strip().lower().partition("+")
    text = text[1:] if text.startswith("v") else text
    epoch = 0
    if "!" in text:
        head, _, text = text.partition("!")
        if not head.isdigit():
            return None
        epoch = int(head)
    release = []
    while True:
        number, text = _number(text)
        if number is None:
            return None
        release.append(number)
        if not (text.startswith(".") and text[1:2].isdigit()):
            break
        text = text[1:]
    pre = post = dev = None
    rest = text.lstrip(_SEPARATORS)
    for word, order in _PRE:
        if rest.startswith(word):
            number, text = _number(rest[len(word) :].lstrip(_SEPARATORS))
            pre, rest = (order, number or 0), text.lstrip(_SEPARATORS)
            break
    if text.startswith("-") and text[1:2].isdigit() and pre is None:
        post, rest = _number(text[1:])
        rest = rest.lstrip(_SEPARATORS)
    else:
        for word in _POST:
            if rest.startswith(word):
                number, text = _number(rest[len(word) :].lstrip(_SEPARATORS))
                post, rest = number or 0, text.lstrip(_SEPARATORS)
                break
    if rest.startswith("dev"):
        dev, rest = _number(rest[3:].lstrip(_SEPARATORS))
        dev = dev or 0
    if rest or (local and not all(part.isalnum() for part in local.replace("-", ".").split("."))):
        return None
    return (epoch, tuple(release), pre, post, dev, local)


def _key(parsed: tuple) -> tuple:
    """An ordering key for a parsed version without its local label (dev < pre < final < post)."""
    epoch, release, pre, post, dev, _ = parsed
    trimmed = list(release)
    while len(trimmed) > 1 and trimmed[-1] == 0:
        trimmed.pop()
    if pre is None and post is None and dev is not None:
        pre_key: tuple = (-1, 0)  # 1.0.dev1 comes before 1.0a1
    elif pre is None:
        pre_key = (3, 0)
    else:
        pre_key = pre
    return (
        epoch,
        tuple(trimmed),
        pre_key,
        post if post is not None else -1,
        dev if dev is not None else float("inf"),
    )


def _clause_holds(operator: str, wanted: str, have: tuple, have_text: str) -> "bool | None":
    if operator == "===":
        return have_text.strip() == wanted
    if wanted.endswith(".*") and operator in ("==", "!="):
        prefix = _parse(wanted[:-2])
        if prefix is None:
            return None
        size = len(prefix[1])
        release = tuple(have[1]) + (0,) * size
        same = have[0] == prefix[0] and release[:size] == prefix[1]
        return same if operator == "==" else not same
    target = _parse(wanted)
    if target is None:
        return None
    if operator in ("==", "!="):
        # A requirement without a local label matches any local label (2.7.1 matches 2.7.1+cu126).
        same = _key(have) == _key(target) and (not target[5] or target[5] == have[5])
        return same if operator == "==" else not same
    if operator == "~=":
        if len(target[1]) < 2:
            return None
        prefix = target[1][:-1]
        return _key(have) >= _key(target) and tuple(have[1][: len(prefix)]) == prefix
    compare = {">=": lambda a, b: a >= b, "<=": lambda a, b: a <= b, ">": lambda a, b: a > b}
    if operator in compare:
        return compare[operator](_key(have), _key(target))
    return _key(have) < _key(target)


def satisfies(version: str, specifier: str) -> "bool | None":
    """Whether VERSION meets SPECIFIER ('==2.7.1', '>=2.0,<3'); None when either cannot be read."""
    have = _parse(version)
    if have is None:
        return None
    for clause in specifier.split(","):
        if not clause.strip():
            continue
        clause = clause.strip()
        operator = next((op for op in _OPERATORS if clause.startswith(op)), None)
        wanted = clause[len(operator) :].strip() if operator else ""
        if not wanted:
            return None
        holds = _clause_holds(operator, wanted, have, version)
        if holds is None:
            return None
        if not holds:
            return False
    return True


# -- verdicts ---------------------------------------------------------------------------------------
def _cuda_of_local(local: str) -> "str | None":
    """'cu126' -> '12.6', 'cu118' -> '11.8'; None for cpu, rocm..., or no label."""
    digits = local[2:] if local.startswith("cu") else ""
    return f"{digits[:-1]}.{digits[-1]}" if len(digits) >= 2 and digits.isdigit() else None


def _torch_build(torch: "TorchFacts") -> str:
    if torch.cuda:
        return f"built for CUDA {torch.cuda}"
    return "a ROCm build" if torch.hip else "a CPU build"


def verdict(dist: "Dist", torch: "TorchFacts | None") -> "str | None":
    """What DIST's metadata says against TORCH, in one sentence; None when it fits or says nothing.

    The torch pin comes first: it is decisive (an ABI built for another torch). Without a broken
    pin, a CUDA local version that is not torch's is said.
    """
    if torch is None or torch.version is None or normalize(dist.name) == "torch":
        return None
    spec = dist.torch_requirement
    if spec and satisfies(torch.version, spec) is False:
        return (
            f"{dist.name} {dist.version} requires torch{spec} but torch {torch.version} is installed: "
            f"install the {dist.name} release built for torch {torch.short_version}"
        )
    built_for = _cuda_of_local(dist.local)
    if built_for is None or (torch.cuda and _same_minor(built_for, torch.cuda)):
        return None
    return (
        f"{dist.name} {dist.version} is built for CUDA {built_for} but torch {torch.version} is "
        f"{_torch_build(torch)}: install the {dist.name} build for torch {torch.version}"
    )


def _same_minor(one: str, other: str) -> bool:
    return one.split(".")[:2] == other.split(".")[:2]


def disagreements(dists: "Sequence[Dist]") -> "list[str]":
    """Pairs of distributions that cannot share one torch: different exact pins, or different CUDA."""
    found = []
    for index, one in enumerate(dists):
        for other in dists[index + 1 :]:
            pins = _exact_pin(one), _exact_pin(other)
            if pins[0] and pins[1] and _key_or_text(pins[0]) != _key_or_text(pins[1]):
                found.append(
                    f"{one.name} {one.version} requires torch=={pins[0]} and {other.name} {other.version} "
                    f"requires torch=={pins[1]}: no torch satisfies both"
                )
                continue
            cudas = _cuda_of_local(one.local), _cuda_of_local(other.local)
            if cudas[0] and cudas[1] and not _same_minor(cudas[0], cudas[1]):
                found.append(
                    f"{one.name} {one.version} is built for CUDA {cudas[0]} and {other.name} "
                    f"{other.version} for CUDA {cudas[1]}: they cannot share one torch"
                )
    return found


def _exact_pin(dist: "Dist") -> "str | None":
    spec = dist.torch_requirement or ""
    if spec.startswith("==") and "," not in spec and not spec.endswith(".*"):
        return spec[2:]
    return None


def _key_or_text(version: str) -> object:
    parsed = _parse(version)
    return _key(parsed) if parsed is not None else version


def owning_dists(paths: "Iterable[str]", owners: "Owners | None" = None) -> "list[Dist]":
    """The distributions that own PATHS, each once, torch's own left out, in the order first met."""
    owners = owners or Owners()
    found: dict[str, Dist] = {}
    for path in paths:
        dist = owners.owner(path)
        if dist is not None and normalize(dist.name) != "torch":
            found.setdefault(dist.path, dist)
    return list(found.values())
