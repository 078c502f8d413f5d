"""The dynamic loader's own list of loaded objects, read in C or through the program's ctypes: what a load added.

After each native load, the end line lists the shared objects it pulled in.
/proc/self/maps answers that in half a millisecond in a process like torch's
(the kernel prints all of its hundreds of mappings); the loader answers in a
microsecond: dl_iterate_phdr hands out counters of the objects it ever added
and removed, and the list itself is walked (about 40 us for 60 objects) only
when they say that more than the file just loaded came.

Without the C accelerator, this is used only once the program has imported ctypes
itself: importwatch never loads a library into the program on its own account.
The accelerator reads the same list itself, and the same condition holds there,
so that both say the same names (see tracing/native.py). It is called with
the GIL held (through PyDLL), from the thread that has just finished a load:
dl_iterate_phdr takes the loader's list lock, which a dlopen holds only while
it links an object into the list, never while a constructor runs. Before the
program has ctypes, native.py reads the maps instead (mapped.py), as does the
watcher, which must answer while another thread's dlopen hangs.

Names are the paths the loader opened, as it built them from its search path
(/lib/x86_64-linux-gnu/libgomp.so.1, torch/lib/../../nvidia/cublas/lib/...),
not the resolved file names that the maps show: they say where it looked.
"""

import os

TYPE_CHECKING = False
if TYPE_CHECKING:
    from types import ModuleType
    from typing import Any, Callable


def through_ctypes(ctypes: "ModuleType") -> "tuple[Callable[[], tuple[int, ...]], Callable[[], list[bytes]]]":
    """The two looks LoadedObjects takes, bound to dl_iterate_phdr through CTYPES, the program's own module
    (the C accelerator has its own: _speedups.loaded_counters and loaded_names); raises if there is none."""

    class Info(ctypes.Structure):  # struct dl_phdr_info, as far as the counters
        _fields_ = (
            ("addr", ctypes.c_void_p),
            ("name", ctypes.c_char_p),
            ("phdr", ctypes.c_void_p),
            ("phnum", ctypes.c_uint16),
            ("adds", ctypes.c_ulonglong),
            ("subs", ctypes.c_ulonglong),
        )

    iterate = ctypes.PyDLL(None).dl_iterate_phdr  # PyDLL: the GIL stays held throughout
    iterate.restype = ctypes.c_int
    need = ctypes.sizeof(Info)
    counters: list[int] = []
    names: list[bytes] = []

    # Each callback reads and returns at once: an exception in one would be printed by ctypes.
    def read_counters(info: "Any", size: int, _: "Any") -> int:
        if size >= need:
            counters.append(info[0].adds)
            counters.append(info[0].subs)
        return 1  # the counters are the same in every entry: stop after the first

    def read_name(info: "Any", size: int, _: "Any") -> int:
        name = info[1]  # dlpi_name, the second pointer of the struct
        if name:
            names.append(name)
        return 0

    void_p, size_t = ctypes.c_void_p, ctypes.c_size_t
    on_counters = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.POINTER(Info), size_t, void_p)(read_counters)
    on_name = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.POINTER(ctypes.c_char_p), size_t, void_p)(read_name)

    def look_counters() -> "tuple[int, ...]":
        counters.clear()
        iterate(on_counters, None)
        return tuple(counters)

    def look_names() -> "list[bytes]":
        names.clear()
        iterate(on_name, None)
        return list(names)

    return look_counters, look_names


class LoadedObjects:
    """The objects in the loader's list, and which of them are new since the last look."""

    def __init__(self, counters: "Callable[[], tuple[int, ...]]", names: "Callable[[], list[bytes]]") -> None:
        """COUNTERS and NAMES look at the loader's list (see through_ctypes); raises OSError if it keeps no
        counters."""
        self._counters = counters
        self._names = names
        self._seen: tuple[int, ...] = ()
        self._known: set[bytes] = set()
        if not self._counters():  # counters unavailable: a loader too old or too unlike glibc's
            raise OSError("dl_iterate_phdr gives no dlpi_adds counter")
        self.added("")  # the baseline: everything loaded so far is known

    def added(self, loading: str) -> "list[str]":
        """The paths of the objects loaded since the last call besides LOADING, the file just dlopened.

        In load order; [] when nothing else was loaded. When the counters say that
        one object came and LOADING is a path not loaded before, that object is
        LOADING itself (a file loaded again adds nothing, so its dependencies were
        loaded already): no walk of the list. Most extension modules are that case.
        """
        counters = self._counters()
        seen, self._seen = self._seen, counters
        if counters == seen:
            return []
        name = os.fsencode(loading)
        known = self._known
        one_more = bool(seen) and counters == (seen[0] + 1, seen[1])
        if one_more and b"/" in name and name not in known:
            known.add(name)
            return []
        names = self._names()
        self._known = set(names)
        # The main program has an empty name and the vDSO one without a slash: neither is a file.
        return [
            os.fsdecode(other) for other in names if b"/" in other and other not in known and other != name
        ]
