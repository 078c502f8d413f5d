"""doctor's CUDA checks: whether they run, torch.cuda's answers from a killable child, GPU code per device."""

from __future__ import annotations

import json
import os
import sys
import tempfile

from importwatch.facts import cuda, scan
from importwatch.tools.doctor.child import last_error_line, run_child

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Sequence

    from importwatch.facts.cuda import TorchFacts

# Run in a child: each step announces itself (flushed) before it runs, so a hang names its step.
_CUDA_PROBE = """\
import json, sys
def say(**fields):
    sys.stdout.write(json.dumps(fields) + "\\n")
    sys.stdout.flush()
say(step="import torch")
import torch
say(step="torch.cuda.is_available()")
available = torch.cuda.is_available()
say(available=available, cuda=torch.version.cuda)
if available:
    say(step="torch.cuda.device_count()")
    count = torch.cuda.device_count()
    say(count=count)
    for index in range(count):
        say(step=f"torch.cuda.get_device_properties({index})")
        p = torch.cuda.get_device_properties(index)
        say(device=index, name=p.name, capability=[p.major, p.minor], total=p.total_memory)
        say(step=f"torch.cuda.mem_get_info({index})")
        free, total = torch.cuda.mem_get_info(index)
        say(device=index, free=free, total=total)
say(done=True)
"""


def cuda_skip_reasons(
    torch: TorchFacts | None, driver: str | None, torch_import: dict | None, asked: bool | None
) -> list[str]:
    """Why the CUDA checks cannot (or need not) run here; [] when they should."""
    if asked is False:
        return ["--no-cuda was given"]
    if torch is None:
        return ["torch is not installed"]
    if torch_import is not None and torch_import["status"] != "ok":
        return [f"import torch {torch_import['status']}"]
    if asked:
        return []
    reasons = []
    if driver is None:
        reasons.append(f"no NVIDIA driver (no {cuda.NVIDIA_PROC})")
    if not torch.cuda:
        kind = "a ROCm build" if torch.hip else "a CPU build"
        reasons.append(f"torch {torch.version or '?'} is {kind}")
    return reasons


def check_cuda(timeout: float, env: dict[str, str]) -> dict:
    """torch.cuda's answers (availability, devices, capability, memory) from a child with a timeout."""
    with tempfile.TemporaryDirectory(prefix="importwatch-doctor-") as folder:
        out = os.path.join(folder, "stdout.txt")
        errors = os.path.join(folder, "stderr.txt")
        with open(out, "wb") as stdout, open(errors, "wb") as stderr:
            command = [sys.executable, "-c", _CUDA_PROBE]
            status, seconds, view = run_child(command, timeout, env, stdout.fileno(), stderr.fileno(), folder)
        records = []
        with open(out, encoding="utf-8", errors="replace") as file:
            for line in file:
                try:
                    records.append(json.loads(line))
                except ValueError:
                    continue
        last_error = last_error_line(errors)
    result: dict = {"status": "ok", "seconds": round(seconds, 3), "devices": []}
    devices: dict[int, dict] = {}
    step = None
    for record in records:
        step = record.get("step", step)
        if "available" in record:
            result["available"] = record["available"]
        if "count" in record:
            result["count"] = record["count"]
        if "device" in record:
            device = devices.setdefault(record["device"], {"index": record["device"]})
            device.update({key: value for key, value in record.items() if key not in ("device", "step")})
    result["devices"] = [devices[index] for index in sorted(devices)]
    if status is None:
        result.update(status="hung", step=step, outside=view)
    elif status != 0 or not any(record.get("done") for record in records):
        result.update(status="failed", step=step, error=last_error or f"exited with status {status}")
    return result


def architecture_checks(devices: Sequence[dict], libraries: Sequence[scan.Library]) -> list[dict]:
    """For each GPU capability, the libraries whose GPU code does not run natively on it."""
    found = []
    capabilities = sorted({tuple(device["capability"]) for device in devices if device.get("capability")})
    if not capabilities:
        return found
    for lib in libraries:
        arches = scan.architectures(lib.path)
        if not arches:
            continue
        for major, minor in capabilities:
            runs = arches.runs_on(major, minor)
            if runs != "native":
                found.append(
                    {"path": lib.path, "gpu": f"sm_{major}{minor}", "runs": runs, "carries": arches.names()}
                )
    return found
