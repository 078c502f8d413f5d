"""Phase markers: checkpoint() and phase() say where a program is, and phases are watched like imports.

Both are meant to stay in a program's code for good: while importwatch is off
they cost one global lookup (checkpoint) or one small object (phase), and write
nothing. This module imports nothing, so ``import importwatch`` stays light.
"""

# No `from __future__ import annotations` (annotations are quoted instead): `import importwatch`
# would import __future__, which the program may not (see tracing/handback.py).
import _thread

TYPE_CHECKING = False
if TYPE_CHECKING:
    from types import TracebackType
    from typing import Any, Callable

    from importwatch.tracing.hook import TracedStep, Tracer

# The tracer of the tracing active in this process; the session binds it, None while off.
_tracer: "Tracer | None" = None
# The kinds of line written here (events.py's CHECKPOINT, PHASE, PHASE_END), read when a tracer is bound:
# a checkpoint in a finaliser at the very end, when nothing can be imported any more, still works.
_CHECKPOINT = _PHASE = _PHASE_END = ""
_INFINITY = float("inf")


def bind(tracer: "Tracer | None") -> None:
    """Where phases and checkpoints go from now on (the session's call; None: nowhere)."""
    global _tracer, _CHECKPOINT, _PHASE, _PHASE_END
    if tracer is not None:
        # Imported here, not above: with tracing off this module must import nothing (the sink has it loaded).
        from importwatch.events import CHECKPOINT, PHASE, PHASE_END

        _CHECKPOINT, _PHASE, _PHASE_END = CHECKPOINT, PHASE, PHASE_END
    _tracer = tracer


def checkpoint(name: str) -> None:
    """Log that the program reached NAME; it counts as progress of the phase it is in."""
    tracer = _tracer
    if tracer is None:
        return
    name = str(name)
    stack = tracer.stacks.get(_thread.get_ident())
    now = tracer.clock()
    if stack:
        stack[-1].progress = now  # a phase timed from its last progress starts again from here
    tracer.write(_CHECKPOINT, {"name": name}, len(stack) if stack else 0)


# Lower case: it is used like a function, `with importwatch.phase(...)` or `@importwatch.phase(...)`.
class phase:
    """A named stretch of the program, logged at its start and end and watched for stalls.

    ``with phase("load model", timeout=600):`` or ``@phase("load model")``. With a
    timeout (seconds), a stall report is written once the phase has run that long
    (0: never); without one, the watchdog's threshold applies, counted from the
    phase's last sign of life (a nested import or native load ending, a checkpoint).
    One object serves one ``with`` at a time; as a decorator each call gets its own.
    """

    __slots__ = ("_started", "name", "timeout")

    def __init__(self, name: str, timeout: "float | None" = None) -> None:
        if timeout is not None:
            timeout = float(timeout)
            if not 0 <= timeout < _INFINITY:
                raise ValueError(f"phase {name!r}: timeout must be a number of seconds >= 0, not {timeout!r}")
        self.name = name
        self.timeout = timeout
        self._started: tuple[Tracer, TracedStep, str, str] | None = None

    def __enter__(self) -> "phase":
        tracer = _tracer
        if tracer is not None:
            name = str(self.name)
            frame, depth = tracer.push(f"phase {name}", "phase", self.timeout)
            self._started = (tracer, frame, depth, name)
            tracer.write(_PHASE, {"name": name, "timeout": self.timeout}, depth)
        return self

    def __exit__(
        self,
        kind: "type[BaseException] | None",
        error: "BaseException | None",
        traceback: "TracebackType | None",
    ) -> None:
        started = self._started
        if started is None:
            return
        self._started = None
        tracer, frame, depth, name = started
        now = tracer.pop(frame)
        fields = {"name": name, "ms": (now - frame.start) * 1000.0}
        if error is not None:
            fields["error"] = f"{type(error).__name__}: {error}"
        tracer.write(_PHASE_END, fields, depth)

    def __call__(self, function: "Callable") -> "Callable":
        """As a decorator: each call of FUNCTION runs in this phase (tracing on or off at call time)."""
        import functools  # only when decorating: importing importwatch must stay light

        name, timeout = self.name, self.timeout

        @functools.wraps(function)
        def in_phase(*args: "Any", **kwargs: "Any") -> "Any":
            if _tracer is None:
                return function(*args, **kwargs)
            with phase(name, timeout):
                return function(*args, **kwargs)

        return in_phase
