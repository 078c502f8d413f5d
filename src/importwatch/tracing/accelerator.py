"""Which hot path this process runs: the C accelerator (_speedups.c) where it is built and not refused, else pure Python.

Decided once, at the first import of the tracing modules, for all of them: the hook
(hook.py) and the sink's class (sink.py) must agree, since the C hook keeps what it
read of a sink only when the sink counts its changes (a _speedups.Counted).
"""

import os

TYPE_CHECKING = False
if TYPE_CHECKING:
    from types import ModuleType

# The environment variable that makes the tracer use the pure-Python hook even where the C one is built.
PURE_ENV = "IMPORTWATCH_PURE"


def _accelerator() -> "tuple[ModuleType | None, str]":
    """The C module when built and not refused by IMPORTWATCH_PURE, and which hot path that makes, in
    words (--version and doctor say it)."""
    if os.environ.get(PURE_ENV, "") not in ("", "0"):
        return None, f"pure Python ({PURE_ENV} is set)"  # its value unsaid: output stays ASCII
    try:
        from importwatch.tracing import _speedups
    except ImportError:  # not built (no compiler at install), or built for another Python
        return None, "pure Python (the C accelerator is not built)"
    return _speedups, "C accelerator"


ACCELERATOR, HOT_PATH = _accelerator()
# The sink's base: one that counts its attribute sets with the C hook (see _speedups_route.h), else object.
SINK_BASE: type = getattr(ACCELERATOR, "Counted", object)
