"""The modules importwatch imports at start-up that the program had not: out of sys.modules until the program imports each.

A traced program must find in sys.modules at its first line what it finds under
plain python (plus importwatch's own), and its own first import of, say, errno
must be an import in its log, placed where it makes it. Our start-up still needs
a few modules plain ``python -c pass`` does not load (errno, atexit,
faulthandler, gc: see docs/architecture.md). So
once tracing is on they are taken out of sys.modules and kept here; the
program's first import of one reaches the tracer's hook (it is not in
sys.modules), which writes its lines as for any import and calls back here
(``Tracer.on_start``) to put the very same module object back: no second copy,
so whatever we hold of it (atexit's registrations, faulthandler's file) stays
the program's too. Such an import takes almost no time: its own cost was paid
at our start-up, before the program's first line.

Only leaves may be held (modules that import nothing the program has not),
since handing one back runs no body and so imports none of its children; the
start-up test holds this (tests/test_startup_modules.py).
"""

import sys

# What was in sys.modules before importwatch's own code ran (see mark): never ours to hold.
_before: set = set()
_OURS = ("importwatch", "_importwatch_boot")


def mark() -> None:
    """Everything in sys.modules now was the interpreter's or the program's, never to be held."""
    _before.update(sys.modules)


def import_as_python_would(name: str) -> object:
    """Module NAME, which python itself loads for this program (runpy, for -m and directories): never held."""
    before = set(sys.modules)
    module = __import__(name)
    _before.update(set(sys.modules) - before)
    return module


def _ours(name: str) -> bool:
    return name in _OURS or name.startswith("importwatch.")


class Held:
    """The modules taken out of sys.modules, by name, each handed back at its first import."""

    def __init__(self, tracer: object) -> None:
        self.tracer = tracer
        self.modules: dict = {}

    def put_aside(self) -> None:
        """Take out of sys.modules what importwatch imported since mark() and is not its own."""
        on_start = self.tracer.on_start  # type: ignore[attr-defined]
        for name in [name for name in sys.modules if name not in _before and not _ours(name)]:
            module = sys.modules.pop(name, None)
            if module is None or name in on_start:
                if module is not None:
                    sys.modules[name] = module  # someone waits for it already: left alone
                continue
            self.modules[name] = module
            on_start[name] = self.hand_back

    def hand_back(self, name: str) -> None:
        """The program imports NAME for the first time: the module we hold is what it gets."""
        self.tracer.on_start.pop(name, None)  # type: ignore[attr-defined]
        module = self.modules.pop(name, None)
        if module is not None:
            sys.modules.setdefault(name, module)

    def restore(self) -> None:
        """Tracing ends: every module still held goes back where it was."""
        on_start = self.tracer.on_start  # type: ignore[attr-defined]
        for name in list(self.modules):
            if on_start.get(name) == self.hand_back:
                del on_start[name]
            sys.modules.setdefault(name, self.modules.pop(name))

    def lending(self, import_own: object) -> object:
        """IMPORT_OWN (Tracer.import_own), with the held modules in sys.modules while it runs.

        Our own modules imported later (facts/, blocking.py) may import a held one too (errno,
        gc): that import is ours, not the program's, and must neither write a line nor hand it back.
        """
        held = self.modules

        def import_own_lending(name: str) -> object:
            lent = [name for name in held if name not in sys.modules]
            for each in lent:
                sys.modules[each] = held[each]
            try:
                return import_own(name)  # type: ignore[operator]
            finally:
                for each in lent:
                    if each in held and sys.modules.get(each) is held[each]:
                        del sys.modules[each]

        return import_own_lending
