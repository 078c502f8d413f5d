"""Native loads: the dlopen of extension modules and of ctypes libraries, as start and end events.

The start line is written before dlopen is called: dlopen holds the GIL, so
while it hangs nothing in Python can speak, and the last start line without an
end is what names the culprit. The call itself runs through a frame named
after the file, so faulthandler's dump of the hung thread names it too.
"""

from __future__ import annotations

import _frozen_importlib_external as _external
import sys

from importwatch.hook import as_importlib_frame

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any, Callable

    from importwatch.hook import Tracer


def _call(function: Callable, *args: Any) -> Any:
    return function(*args)


def _named_call(path: str, owner: str) -> Callable:
    """_call, its frame shown by faulthandler as `... in dlopen PATH for OWNER`.

    A hung dlopen holds the GIL, and then faulthandler's dump is all that can
    speak; its frames would only say create_module. Like our other frames on the
    import path, it is filed under importlib's name, so CPython strips it from
    the traceback of a failed import.
    """
    return as_importlib_frame(_call, f"dlopen {path} for {owner}")


class NativeLoads:
    """Wraps the places where Python code calls dlopen, and reports each call."""

    def __init__(self, tracer: Tracer) -> None:
        self.tracer = tracer
        self.sink = tracer.sink
        self._create_module: Callable | None = None
        self._ctypes: Any = None
        self._ctypes_dlopen: Callable | None = None

    def install(self) -> None:
        if self._create_module is None:
            self._create_module = _external.ExtensionFileLoader.create_module
            original = self._create_module
            loads = self

            def create_module(loader: Any, spec: Any) -> Any:
                return loads.load(original, (loader, spec), spec.origin, spec.name)

            create_module.__qualname__ = "ExtensionFileLoader.create_module"
            _external.ExtensionFileLoader.create_module = as_importlib_frame(create_module)
        self.tracer.on_end["ctypes"] = self.wrap_ctypes
        ctypes = sys.modules.get("ctypes")
        if ctypes is not None:
            self.wrap_ctypes(ctypes)

    def uninstall(self) -> None:
        if self._create_module is not None:
            _external.ExtensionFileLoader.create_module = self._create_module
            self._create_module = None
        self.tracer.on_end.pop("ctypes", None)
        if self._ctypes is not None:
            self._ctypes._dlopen = self._ctypes_dlopen
            self._ctypes = self._ctypes_dlopen = None

    def wrap_ctypes(self, ctypes: Any) -> None:
        """ctypes.CDLL, PyDLL and cdll.LoadLibrary all call the module's _dlopen."""
        original = getattr(ctypes, "_dlopen", None)
        if original is None or self._ctypes is not None:
            return
        loads = self

        def _dlopen(name: Any, *args: Any) -> Any:
            if name is None:  # the main program's own symbols: nothing is loaded
                return original(name, *args)
            try:
                return loads.load(original, (name, *args), str(name), "ctypes")
            except BaseException as error:
                # The error passes through as dlopen raised it; only our frames are dropped.
                error.__traceback__ = None
                raise

        self._ctypes, self._ctypes_dlopen = ctypes, original
        ctypes._dlopen = _dlopen

    def load(self, function: Callable, args: tuple, path: str, owner: str) -> Any:
        """Call FUNCTION(*ARGS), which dlopens PATH for OWNER, between a start and an end line."""
        tracer = self.tracer
        frame, depth = tracer.push(f"dlopen {path}", "native", path)
        indent = "  " * depth
        fields = {"path": path, "owner": owner}
        self.sink.event("native", f"{indent}> dlopen {path} ({owner})", fields)
        try:
            result = _named_call(path, owner)(function, *args)
        except BaseException as error:
            now = tracer.pop(frame)
            ms = (now - frame.start) * 1000.0
            message = f"{type(error).__name__}: {error}"
            fields.update(ms=ms, error=message)
            self.sink.event("native_end", f"{indent}< dlopen {path} {ms:.3f} ms failed {message}", fields)
            raise
        now = tracer.pop(frame)
        ms = (now - frame.start) * 1000.0
        fields["ms"] = ms
        self.sink.event("native_end", f"{indent}< dlopen {path} {ms:.3f} ms", fields)
        return result

    load = as_importlib_frame(load)
