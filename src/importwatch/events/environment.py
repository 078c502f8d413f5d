"""The banner's lines about the environment (env, torch) read back into their fields.

events/__init__.py renders them from their fields; events/read.py hands these two kinds' text here.
A line not as we write it gives None: no fields rather than wrong ones.
"""

import re

from importwatch.events import BEFORE_IMPORT, NO_DRIVER, NO_ENV, NO_RUNTIME, NO_VISIBLE

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

# torch: `VERSION (BUILD) at PATH`, BUILD as events.torch_build says it.
_TORCH = re.compile(
    r"^(\S+) \((?:built for CUDA (\S+)|ROCm build, HIP (\S+)|CPU build, no CUDA|"
    r"version unknown: no torch/version.py)\) at (.*)$",
    re.DOTALL,
)
# Before import, the driver's part: `VERSION, N GPUs (MODELS)` (or NO_DRIVER).
_DRIVER = re.compile(r"(\S+), (\d{1,6}) GPUs?(?: \((.*)\))?", re.DOTALL)
_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
# Each NAME=VALUE after the first begins at a space before a name (upper case, as all of ours).
_ENV_SPLIT = re.compile(r" (?=[A-Z][A-Za-z0-9_]*=)")
_EMPTY_VISIBLE = NO_VISIBLE[len("CUDA_VISIBLE_DEVICES") :]


def env(rest: str) -> "dict[str, Any] | None":
    """`NAME=VALUE NAME=VALUE ...` (or NO_ENV) after `env `."""
    if rest == NO_ENV:
        return {"env": {}}
    variables = {}
    for pair in _ENV_SPLIT.split(rest):
        name, equals, value = pair.partition("=")
        if not equals or not _ENV_NAME.fullmatch(name):
            return None
        variables[name] = value
    return {"env": variables}


def torch(rest: str) -> "dict[str, Any] | None":
    """What follows `torch `: after import its version, build and place; before import (from its
    files) also the CUDA runtimes at hand, the driver and its GPUs, and CUDA_VISIBLE_DEVICES."""
    before = rest.endswith(BEFORE_IMPORT)
    match = _TORCH.match(rest[: -len(BEFORE_IMPORT)] if before else rest)
    if match is None:
        return None
    version, cuda, hip, where = match.groups()
    fields: dict[str, Any] = {"version": None if version == "?" else version, "cuda": cuda, "hip": hip}
    if not before:
        return {**fields, "path": where}
    # `PATH[; CUDA runtime: ...]; driver: ...[; CUDA_VISIBLE_DEVICES...]`, cut where each part begins
    # (string searches: a regular expression of these optional parts backtracks for minutes on a
    # forged line).
    where, found, said = where.partition("; driver: ")
    if not found:
        return None
    where, listed, runtimes = where.partition("; CUDA runtime: ")
    said, shown, visible = said.partition("; CUDA_VISIBLE_DEVICES")
    if shown and not (visible == _EMPTY_VISIBLE or visible.startswith("=")):
        return None
    fields.update(path=where, before=True, driver=None, gpus=0, models=[])
    fields["runtimes"] = None if not listed else [] if runtimes == NO_RUNTIME else runtimes.split(", ")
    fields["visible"] = None if not shown else visible[1:] if visible.startswith("=") else ""
    if said != NO_DRIVER:
        match = _DRIVER.fullmatch(said)
        if match is None:
            return None
        driver, gpus, models = match.groups()
        fields.update(driver=driver, gpus=int(gpus), models=models.split(", ") if models else [])
    return fields
