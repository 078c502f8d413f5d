"""Our modules that start-up reads but does not run: each runs at its first use, without the import system.

The stall report's modules (stalls.py, report.py, cpushare.py and the facts they read: about 65 KB
of code, 0.6 ms to import) are needed once a step has gone a look without progress, and most
processes never get there. So start-up reads each one's compiled file, checked against its
source as importlib checks it, and runs nothing; the first use runs the code from those bytes.
Neither what can hang a stalled program can hold that up: the bytes are in memory already (a
file system that blocks later cannot stop them), and no finder runs and no import lock is taken (a
finder hung on such a file system holds importlib's global lock for ever, and the report is for
exactly that hang). A module whose compiled file is missing, stale or hash-based is imported the
usual way at once, as before. Nothing of this writes a line: these imports are ours.

Nor do they touch sys.modules beyond their own names: they run in the heartbeat while the program
imports in its own threads, so what start-up holds back from the program (tracing/handback.py) is
not lent to them, and they import none of it (no `from __future__ import annotations`;
tests/test_standby.py holds it).
"""

from __future__ import annotations

import _frozen_importlib as _bootstrap
import _frozen_importlib_external as _external
import _thread
import marshal
import os
import sys

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any, Callable

# A compiled file's header: magic number, flags (0: checked by the source's time and size), the
# source's modification time and size, each 4 bytes, little-endian (PEP 552).
_HEADER = 16
# More than any of these compiled files (the largest is about 21 KB): one read takes it whole, and a
# buffer this size is still malloc's, not a mapping of its own.
_MOST = 1 << 16


class Standby:
    """The compiled code of our modules read at start-up, by name, until each is run once."""

    def __init__(self) -> None:
        self._code: dict[str, tuple[str, bytes]] = {}  # name: (its source file, its compiled file's bytes)
        # Two threads may want one module at once (a heartbeat ending as the next one starts, or a
        # program thread through import_own): one runs it, the other waits. Never held across a fork:
        # a fork ends the heartbeat first, and nothing else here runs long.
        self._lock = _thread.allocate_lock()

    def read(self, names: tuple[str, ...]) -> bool:
        """Keep the compiled code of each of our modules NAMES; False (keeping none) unless every one is
        fresh: then the caller imports them now."""
        found = {}
        for name in names:
            source = _source_of(name)
            data = None if source is None else _compiled(source)
            if data is None:
                return False
            found[name] = (source, data)
        self._code.update(found)
        return True

    def serving(self, import_own: Callable[[str], Any]) -> Callable[[str], Any]:
        """IMPORT_OWN (Tracer.import_own), running a module read here from its bytes instead."""

        def import_own_standing_by(name: str) -> Any:
            if name in self._code:
                with self._lock:
                    module = sys.modules.get(name)
                    entry = self._code.pop(name, None)
                    if module is None and entry is not None:
                        return _run(name, *entry)
            return import_own(name)

        return import_own_standing_by


def _source_of(name: str) -> str | None:
    """The source file of our module NAME, a submodule of a package loaded from files."""
    parent, _, child = name.rpartition(".")
    package = sys.modules.get(parent)
    folders = getattr(package, "__path__", None)
    if not folders or not isinstance(folders[0], str):
        return None
    return os.path.join(folders[0], child + ".py")


def _compiled(source: str) -> bytes | None:
    """The compiled file of SOURCE as an import would use it; None when it is missing or stale, or is
    checked by hash (which would mean reading and hashing the source as well)."""
    try:
        compiled = _external.cache_from_source(source)
        stat = os.stat(source)
        fd = os.open(compiled, os.O_RDONLY | os.O_CLOEXEC | os.O_NONBLOCK)
        try:
            data = os.read(fd, _MOST)
        finally:
            os.close(fd)
    except (OSError, ValueError, NotImplementedError):
        return None

    def word(at: int) -> int:
        return int.from_bytes(data[at : at + 4], "little")

    fresh = (
        _HEADER < len(data) < _MOST
        and data[:4] == _external.MAGIC_NUMBER
        and word(4) == 0
        and word(8) == int(stat.st_mtime) & 0xFFFFFFFF
        and word(12) == stat.st_size & 0xFFFFFFFF
    )
    return data if fresh else None


def _run(name: str, source: str, data: bytes) -> Any:
    """Module NAME made from its compiled code, as an import would make it (spec, file, loader, its
    place in its package), with no finder, no lock and no line."""
    code = marshal.loads(memoryview(data)[_HEADER:])
    module = _bootstrap.module_from_spec(_external.spec_from_file_location(name, source))
    sys.modules[name] = module
    try:
        exec(code, module.__dict__)
    except BaseException:
        sys.modules.pop(name, None)
        raise
    module = sys.modules[name]
    parent, _, child = name.rpartition(".")
    setattr(sys.modules[parent], child, module)
    return module
