"""Our modules run from their compiled files without the import system: start-up's at once, the stall report's at their first use.

Start-up's modules (START_UP, 290 KB of compiled code) are loaded the way an import loads them, less the
import system's own work: no finder searches sys.path, no lock is taken, nothing is cached in
sys.path_importer_cache, and the collector does not run meanwhile (these are thousands of objects
that live as long as the process). That is a tenth of their import (0.45-0.7 ms), measured in
docs/performance.md. Each module comes as an import would make it: spec, file, cached, loader, its
place in its package; what it imports of the standard library it imports the usual way.

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
not lent to them, and they import none of it (tests/test_standby.py holds it).
"""

import _frozen_importlib as _bootstrap
import _frozen_importlib_external as _external
import _imp
import _thread
import gc
import marshal
import os
import sys

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any, Callable

# start-up's modules of ours (tracing/session.py's and the .pth lines' hook), each after what it
# imports of ours: each finds those in sys.modules, run already. The package and the few modules
# that import this one are imported the usual way before it. One left off this list, or listed too
# early, is imported the usual way: slower, never wrong (tests/test_standby.py holds the list).
START_UP = (
    "importwatch.config",
    "importwatch.events",
    "importwatch.facts",
    "importwatch.facts.procstat",
    "importwatch.masking",
    "importwatch.tracing.banner",
    "importwatch.tracing.forklocks",
    "importwatch.tracing.accelerator",
    "importwatch.tracing.descriptors",
    "importwatch.tracing.sink",
    "importwatch.tracing.hook",
    "importwatch.tracing.doors",
    "importwatch.tracing.threads",
    "importwatch.tracing.faults",
    "importwatch.tracing.native",
    "importwatch.tracing.watchdog",
    "importwatch.tracing.session",
    "importwatch.tracing.pthlines",
)
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

    def read(self, names: "tuple[str, ...]") -> bool:
        """Keep the compiled code of each of our modules NAMES; False (keeping none) unless every one is
        fresh: then the caller imports them now."""
        found = {}
        for name in names:
            entry = _fresh(name)
            if entry is None:
                return False
            found[name] = entry
        self._code.update(found)
        return True

    def serving(self, import_own: "Callable[[str], Any]") -> "Callable[[str], Any]":
        """IMPORT_OWN (Tracer.import_own), running a module read here from its bytes instead."""

        def import_own_standing_by(name: str) -> "Any":
            if name in self._code:
                with self._lock:
                    module = sys.modules.get(name)
                    entry = self._code.pop(name, None)
                    if module is None and entry is not None:
                        return _run(name, *entry)
            return import_own(name)

        return import_own_standing_by


def load(names: "tuple[str, ...]") -> None:
    """Run each of our modules NAMES not loaded yet, in that order, from its compiled file; one whose
    compiled file is missing, stale or checked by hash is imported the usual way (which writes it
    afresh where python may)."""
    collecting = gc.isenabled()
    gc.disable()
    try:
        for name in names:
            if name in sys.modules:
                continue
            entry = _fresh(name)
            if entry is None:
                __import__(name)
            else:
                _run(name, *entry)
    finally:
        if collecting:
            gc.enable()


def _fresh(name: str) -> "tuple[str, bytes] | None":
    """Our module NAME's source file (a module's, else a package's __init__.py) and its compiled file's
    bytes; None when there is no fresh compiled file (see _compiled)."""
    for package in (False, True):
        source = _source_of(name, package)
        data = None if source is None else _compiled(source)
        if data is not None:
            return source, data
    return None


def _source_of(name: str, package: bool = False) -> "str | None":
    """The source file of our module NAME (of its __init__.py when PACKAGE), a submodule of a package
    loaded from files."""
    parent, _, child = name.rpartition(".")
    package_module = sys.modules.get(parent)
    folders = getattr(package_module, "__path__", None)
    if not folders or not isinstance(folders[0], str):
        return None
    if package:
        return os.path.join(folders[0], child, "__init__.py")
    return os.path.join(folders[0], child + ".py")


def _compiled(source: str) -> "bytes | None":
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


def _run(name: str, source: str, data: bytes) -> "Any":
    """Module NAME made from its compiled code, as an import would make it (spec, file, loader, its
    place in its package), with no finder, no lock and no line."""
    code = marshal.loads(memoryview(data)[_HEADER:])
    # Its file names as an import gives them: the source's path, not the one it was compiled at (a
    # build folder, a relative path, a venv since moved); tracebacks, inspect and trace read them.
    _imp._fix_co_filename(code, source)
    # (From an __init__.py the spec is a package's, its folder where its submodules are found.)
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
