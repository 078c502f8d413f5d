"""Which shared objects a process has mapped, read from /proc/PID/maps, and which are new since last time.

No ctypes and no dl_iterate_phdr: this must answer while another thread is
inside a hung dlopen holding the loader lock, and from another process too.
/proc/PID/maps lists each file by its resolved path (libcudart.so.12.1.105 for
the libcudart.so.12 the loader asked for), so the names a DT_NEEDED entry may
use are derived from each file name.
"""

# Run from its compiled file in the program's import (tracing/native.py's FIRST_FACTS), this module may import
# nothing that start-up holds back from the program (tracing/handback.py).
import os

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Iterable

_DELETED = b" (deleted)"


def soname_candidates(basename: str) -> list[str]:
    """libstdc++.so.6.0.32 -> [libstdc++.so.6.0.32, libstdc++.so.6.0, libstdc++.so.6, libstdc++.so]."""
    names = [basename]
    head, dot_so, version = basename.partition(".so.")
    if dot_so:
        parts = version.split(".")
        names += [head + ".so." + ".".join(parts[:count]) for count in range(len(parts) - 1, 0, -1)]
        names.append(head + ".so")
    return names


def _is_shared_object(path: bytes) -> bool:
    name = path[path.rfind(b"/") + 1 :]
    return name.endswith(b".so") or b".so." in name


class MappedObjects:
    """The shared objects mapped in process PID ("self" by default), kept up to date by rescan()."""

    def __init__(self, pid: "int | str" = "self") -> None:
        self.maps = f"/proc/{pid}/maps"
        self.paths: dict[str, None] = {}  # in maps order, which is by address
        self._noted: dict[str, None] = {}  # loaded since the last scan, as given to note()
        self._names: set[str] = set()
        self.error: OSError | None = None  # why the last scan could not read the maps, if it could not
        self.rescan()

    def _read(self) -> bytes:
        fd = os.open(self.maps, os.O_RDONLY | getattr(os, "O_CLOEXEC", 0))
        try:
            chunks = []
            while True:
                # The kernel answers a page or so per call, whatever the size asked (measured).
                chunk = os.read(fd, 1 << 16)
                if not chunk:
                    break
                chunks.append(chunk)
        finally:
            os.close(fd)
        return b"".join(chunks)

    def scan(self) -> "dict[str, None] | None":
        """The paths of the shared objects mapped now, in maps order; None when the maps cannot be read."""
        try:
            data = self._read()
        except OSError as error:
            self.error = error
            return None
        self.error = None
        found: dict[bytes, None] = {}
        previous = b""
        for line in data.split(b"\n"):
            # "start-end perms offset dev inode    /path": the path is the first field starting with "/".
            start = line.find(b" /")
            if start < 0:
                continue
            path = line[start + 1 :]
            if path == previous:  # a library has several mappings in a row; skip the repeats cheaply
                continue
            previous = path
            if path.endswith(_DELETED):
                path = path[: -len(_DELETED)]
            if path not in found and _is_shared_object(path):
                found[path] = None
        return {os.fsdecode(path): None for path in found}

    def rescan(self) -> list[str]:
        """The paths mapped since the last scan, in maps order. [] also when the maps cannot be read."""
        current = self.scan()
        if current is None:
            return []
        new = [path for path in current if path not in self.paths]
        gone = len(current) - len(new) != len(self.paths)  # a dlclose unmapped something
        self.paths = current
        if gone:
            self._names = set()
            new_names: Iterable[str] = current
        else:
            new_names = new
        for path in new_names:
            self._names.update(soname_candidates(path.rsplit("/", 1)[-1]))
        noted, self._noted = self._noted, {}
        if noted:
            new = [path for path in new if path not in noted]
            # Maps names the file a link points to; only a noted path not found as given is resolved.
            aliases = {os.path.realpath(path) for path in noted if path not in current}
            new = [path for path in new if path not in aliases]
        return new

    def note(self, path: str) -> None:
        """Record PATH, just loaded without a rescan, so that the next rescan does not count it as new.

        Its sonames are known from now on; resolving it is left to that rescan, and
        only done if maps does not list it as given (os.path.realpath costs a system
        call per directory, and most files are loaded by their real path).
        """
        if path not in self.paths:
            self._noted[path] = None
            self._names.update(soname_candidates(path.rsplit("/", 1)[-1]))

    def known_names(self) -> frozenset[str]:
        """Basenames of the mapped objects, and the sonames each basename may stand for."""
        return frozenset(self._names)

    def needs_rescan(self, needed: "Iterable[str]") -> bool:
        """True when a name in NEEDED (DT_NEEDED of a file about to load) is not mapped yet."""
        names = self._names
        return any(name.rsplit("/", 1)[-1] not in names for name in needed)
