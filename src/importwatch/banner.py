"""What a log starts with: the process, the interpreter, and the environment that matters for hangs."""

from __future__ import annotations

import os
import sys

from importwatch.cuda import describe_torch, driver_verdicts, gpus

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

    from importwatch.cuda import TorchFacts
    from importwatch.log import Sink

# Variables that decide where a job looks for libraries, devices and peers.
VARIABLES = (
    "CUDA_VISIBLE_DEVICES",
    "NVIDIA_VISIBLE_DEVICES",
    "CUDA_HOME",
    "CUDA_PATH",
    "LD_LIBRARY_PATH",
    "LD_PRELOAD",
    "PYTHONPATH",
    "PYTHONHOME",
    "VIRTUAL_ENV",
    "CONDA_PREFIX",
    "MASTER_ADDR",
    "MASTER_PORT",
    "RANK",
    "LOCAL_RANK",
    "WORLD_SIZE",
    "LOCAL_WORLD_SIZE",
    "OMP_NUM_THREADS",
)
PREFIXES = ("NCCL_", "TORCH_", "CUDA_", "GLOO_", "TORCHELASTIC_")


def relevant_environment(environ: dict[str, str] | os._Environ[str] = os.environ) -> dict[str, str]:
    """The variables that matter for hangs, those that are set, in a stable order."""
    found = {name: environ[name] for name in VARIABLES if name in environ}
    for name in sorted(environ):
        if name.startswith(PREFIXES) and name not in found:
            found[name] = environ[name]
    return found


def write_banner(sink: Sink, argv: list[str]) -> None:
    """The first lines of a traced process: who it is, and what it was given."""
    try:
        cwd = os.getcwd()
    except OSError as error:
        cwd = f"<unavailable: {error.strerror}>"
    version = ".".join(str(part) for part in sys.version_info[:3])
    system = os.uname()  # not the platform module: it costs milliseconds at start-up
    where = f"{system.sysname}-{system.release}-{system.machine}"
    sink.event(
        "start",
        f"start python {version} {sys.executable} argv={argv!r} cwd={cwd} platform={where}",
        {"python": version, "executable": sys.executable, "argv": argv, "cwd": cwd, "platform": where},
    )
    variables = relevant_environment()
    text = " ".join(f"{name}={value}" for name, value in variables.items())
    if not text:
        text = "(no CUDA, library path or distributed variable is set)"
    sink.event("env", f"env {text}", {"env": variables})


def torch_loaded(sink: Sink, torch: Any) -> None:
    """Once torch has imported: its version and the CUDA it was built for, without touching CUDA."""
    version = getattr(torch, "__version__", "?")
    cuda = getattr(getattr(torch, "version", None), "cuda", None)
    build = f"built for CUDA {cuda}" if cuda else "CPU build, no CUDA"
    where = os.path.dirname(getattr(torch, "__file__", "") or "") or "?"
    sink.event(
        "torch",
        f"torch {version} ({build}) at {where}",
        {"version": str(version), "cuda": cuda, "path": where},
    )


def torch_before(sink: Sink, facts: TorchFacts | None, driver: str | None) -> None:
    """Before torch starts importing: what its files say, so a hang inside `import torch` has it logged."""
    if facts is None:
        return
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    line = describe_torch(facts, driver, gpus(), visible)
    sink.event(
        "torch",
        f"{line} (from its files, before import)",
        {"version": facts.version, "cuda": facts.cuda, "path": facts.path, "driver": driver},
    )
    for verdict in driver_verdicts(facts, driver):
        sink.event("verdict", f"! {verdict}", {"verdict": verdict})
