"""doctor's import check: one import in a fresh traced interpreter, and what its log says: ok, failed or hung."""

from __future__ import annotations

import importlib.machinery
import os
import subprocess
import sys
import tempfile

from importwatch import config
from importwatch.events import OUTSIDE, OUTSIDE_HEAD, STALL, VERDICT, render
from importwatch.events.read import parse_line
from importwatch.facts import cuda
from importwatch.inflight import InFlight, named_once
from importwatch.signame import signal_name
from importwatch.tools.doctor.child import last_error_line, run_child

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Sequence

    from importwatch.config import Settings
    from importwatch.events.read import Event
    from importwatch.facts.cuda import TorchFacts
    from importwatch.inflight import Started

# After the stall threshold the traced child reports and exits by itself; this is how long it
# gets to do so before its process group is killed.
GRACE = 3.0


def _in_flight(events: Sequence[Event]) -> dict[str, list[Started]]:
    """Per thread, the steps started and not ended (imports, native loads, phases, steps), outermost first."""
    flying = InFlight()
    for event in events:
        if flying.follows(event.kind):
            flying.follow(event, event.thread)
    return flying.chains()


def _frame(step: Started) -> str:
    return f"dlopen {step.name}" if step.kind == "native" else step.name


def _chain(steps: Sequence[Started]) -> list[str]:
    """Steps in flight (outermost first) as the report names them: each once, as inspect does."""
    return named_once([_frame(step) for step in steps])


def _read_events(path: str) -> list[Event]:
    try:
        with open(path, encoding="utf-8", errors="replace") as file:
            return [event for event in map(parse_line, file) if event is not None]
    except OSError:
        return []


def _message(error: str) -> str:
    """The message of "ImportError: MESSAGE", as the loader wrote it."""
    kind, sep, message = error.partition(": ")
    return message if sep and kind.isidentifier() and kind.endswith(("Error", "Exception")) else error


def check_import(
    module: str,
    settings: Settings,
    env: dict[str, str],
    torch: TorchFacts | None = None,
    modules: Sequence[str] = (),
) -> dict:
    """Import MODULE (or, when given, its MODULES: a package's extension modules, one after the other)
    in a fresh interpreter traced with SETTINGS; ok, failed or hung, and why."""
    modules = list(modules) or [module]
    timeout = settings.timeout
    with tempfile.TemporaryDirectory(prefix="importwatch-doctor-") as folder:
        log = os.path.join(folder, "trace.jsonl")
        errors = os.path.join(folder, "stderr.txt")
        options = config.for_child(settings.replace(log=log, exit_on_stall=True))[1]
        command = [sys.executable, "-m", "importwatch", *options]
        command += ["-c", "; ".join(f"import {name}" for name in modules)]
        with open(errors, "wb") as stderr:
            status, seconds, view = run_child(
                command, timeout + GRACE, env, subprocess.DEVNULL, stderr.fileno(), folder
            )
        events = _read_events(log)
        last_error = last_error_line(errors)
    result: dict = {"module": module, "seconds": round(seconds, 3)}
    if modules != [module]:
        result["modules"] = modules
    top = [e for e in events if e.kind == "import_end" and e.name in modules and e.thread == "MainThread"]
    stalled = any(e.kind == STALL for e in events)
    flying = _in_flight(events)
    if status == 0:
        result["status"] = "ok"
        if top and len(modules) == 1 and top[-1].ms is not None:
            result["import_ms"] = round(top[-1].ms, 3)
    elif status is None or stalled or (flying and seconds >= timeout):
        result.update(_hung(events, flying, stalled or status is None, view))
    else:
        error = top[-1].error if top and top[-1].error else None
        result.update(_failed(status, events, flying, error or last_error, torch, env))
    verdicts = [event.fields["verdict"] for event in events if event.kind == VERDICT]
    if verdicts and result["status"] != "ok":  # what the child said before it hung or failed
        result["verdicts"] = verdicts
    return result


def _hung(events: Sequence[Event], flying: dict[str, list[Started]], stalled: bool, view: str | None) -> dict:
    """A hung import's fields: the chain in flight, its library, the other threads, the outside view."""
    stack = flying.get("MainThread") or next(iter(flying.values()), [])
    natives = [step.name for step in stack if step.kind == "native"]
    # The watcher's headline, in its words: what it saw, and what was in flight.
    told = [
        render(OUTSIDE, event.fields)[len(OUTSIDE_HEAD) :]
        for event in events
        if event.kind == OUTSIDE and "look" in event.fields
    ]
    return {
        "status": "hung",
        "stalled": stalled,
        "chain": _chain(stack),
        "library": natives[-1] if natives else None,
        "other_threads": {thread: _chain(steps) for thread, steps in flying.items() if steps is not stack},
        "outside": view or (told[0] if told else None),
    }


def _failed(
    status: int,
    events: Sequence[Event],
    flying: dict[str, list[Started]],
    error: str | None,
    torch: TorchFacts | None,
    env: dict[str, str],
) -> dict:
    """A failed import's fields: ERROR (its own, or the child's last stderr line) or how it died, and the likely cause."""
    result: dict = {"status": "failed"}
    if status < 0:
        error = f"the interpreter was killed by {signal_name(-status)}"
        stack = flying.get("MainThread") or []
        if stack:
            error += " during " + " > ".join(_chain(stack))
            natives = [step.name for step in stack if step.kind == "native"]
            result["library"] = natives[-1] if natives else None
    result["error"] = error or f"the interpreter exited with status {status}"
    failed_loads = [e for e in events if e.kind == "native_end" and e.error]
    cause = None
    if failed_loads:
        cause = cuda.explain_load_error(_message(failed_loads[-1].error or ""), failed_loads[-1].name, torch)
    result["cause"] = (
        cause
        or cuda.explain_load_error(_message(result["error"]), None, torch)
        or _in_working_folder(result["error"], env)
    )
    return result


def _in_working_folder(error: str, env: dict[str, str]) -> str | None:
    """Why a module not found is found by `python -c 'import it'` here: it lies in the working folder,
    which the checks leave out (see run_child); and the command that checks it. None otherwise."""
    kind, _, message = error.partition(": ")
    missing = message.partition("'")[2].partition("'")[0]
    if kind != "ModuleNotFoundError" or not missing:
        return None
    top = missing.split(".", 1)[0]
    here = os.getcwd()
    if here in env.get("PYTHONPATH", "").split(os.pathsep):
        return None  # on the child's path already: not found there either
    try:
        spec = importlib.machinery.PathFinder.find_spec(top, [here])
    except (ImportError, OSError, ValueError):
        return None
    if spec is None:
        return None
    found = spec.origin if spec.has_location else os.path.join(here, top)
    return (
        f"{found} is in the working folder, which doctor leaves off sys.path (so that a file there cannot "
        f"stand in for a module it checks): to check it from here, PYTHONPATH=. python -m importwatch "
        f"doctor --import {missing}"
    )
