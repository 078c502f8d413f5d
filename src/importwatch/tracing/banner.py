"""What a log starts with: the process, the interpreter, the environment that matters for hangs;
its secrets masked by the one rule in masking.py."""

import os
import sys

from importwatch.events import ENV, START, TORCH, VERDICT
from importwatch.masking import mask_argv, mask_environment

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

    from importwatch.facts.cuda import TorchFacts
    from importwatch.tracing.sink import Sink

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


def relevant_environment(environ: "dict[str, str] | os._Environ[str]" = os.environ) -> "dict[str, str]":
    """The variables that matter for hangs, those that are set, in a stable order, secrets masked."""
    found = {name: environ[name] for name in VARIABLES if name in environ}
    for name in sorted(environ):
        if name.startswith(PREFIXES) and name not in found:
            found[name] = environ[name]
    return mask_environment(found)


def write_banner(sink: "Sink", argv: "list[str]") -> None:
    """The first lines of a traced process: who it is, and what it was given (secrets masked)."""
    argv = mask_argv(argv)
    try:
        cwd = os.getcwd()
    except OSError as error:
        cwd = f"<unavailable: {error.strerror}>"
    version = ".".join(str(part) for part in sys.version_info[:3])
    system = os.uname()  # not the platform module: it costs milliseconds at start-up
    where = f"{system.sysname}-{system.release}-{system.machine}"
    fields = {"python": version, "executable": sys.executable, "argv": argv, "cwd": cwd, "platform": where}
    if sink.dump_fd() != sink.stderr.fd:
        # A stall that holds the GIL (a dlopen) can only be dumped by faulthandler, to one file: the
        # log. Said now, on the terminal too, since nothing of ours can speak there at that moment.
        fields["dumps"] = sink.log_path
    sink.event(START, fields)
    sink.event(ENV, {"env": relevant_environment()})


def torch_loaded(sink: "Sink", torch: "Any") -> None:
    """Once torch has imported: its version and the CUDA (or HIP) it was built for, without touching CUDA."""
    version = getattr(torch, "__version__", None)
    built = getattr(torch, "version", None)
    hip = getattr(built, "hip", None)
    fields = {
        "version": None if version is None else str(version),
        "cuda": getattr(built, "cuda", None),
        "hip": str(hip).split("-", 1)[0] if hip else None,
        "path": os.path.dirname(getattr(torch, "__file__", "") or "") or "?",
    }
    sink.event(TORCH, fields)


def torch_before(sink: "Sink", cuda: "Any", facts: "TorchFacts | None", driver: "str | None") -> None:
    """Before torch starts importing: what its files say, so a hang inside `import torch` has it logged.

    CUDA is importwatch.facts.cuda, which the native loads import when first needed (NativeLoads.fact).
    """
    if facts is None:
        return
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    sink.event(TORCH, cuda.torch_fields(facts, driver, cuda.gpus(), visible))
    for verdict in cuda.driver_verdicts(facts, driver):
        sink.event(VERDICT, {"verdict": verdict})
