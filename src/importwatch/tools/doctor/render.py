"""doctor's output: the report for people (facts, scan, imports, CUDA, then the verdict), or as JSON."""

from __future__ import annotations

import json

from importwatch.facts import cuda
from importwatch.tools.doctor.rules import GIB

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Sequence


def as_json(report: dict) -> str:
    return json.dumps(report, indent=2) + "\n"


def render(report: dict) -> str:
    """The report for people: facts, scan, imports, CUDA, then the verdict with a fix for each problem."""
    lines = [f"importwatch {report['importwatch']} doctor", ""]
    lines += _facts(report)
    lines += _scan(report["scan"])
    lines += _imports(report["imports"])
    lines += _cuda_checks(report["cuda_checks"])
    lines += _verdict(report["problems"])
    return "\n".join(lines) + "\n"


def _gib(value: int | None) -> str:
    return f"{value / GIB:.1f} GiB" if value is not None else "?"


def _facts(report: dict) -> list[str]:
    lines = []
    py = report["python"]
    where = f" (virtualenv {py['virtualenv']})" if py["virtualenv"] else ""
    where += f" (conda {py['conda']})" if py.get("conda") else ""
    lines.append(f"python      {py['version']} {py['executable']}{where}")
    lines.append(f"hot path    {report['hot_path']}")
    plat = report["platform"]
    libc = plat["libc"] or "not glibc"
    lines.append(f"platform    {plat['system']} {plat['release']} {plat['machine']}, {libc}")
    torch = report["torch"]
    if torch is None:
        lines.append("torch       not installed (no torch package on sys.path)")
    else:
        lines.append(f"torch       {torch['version'] or '?'} ({torch['build']}) at {torch['path']}")
    facts = report["cuda"]
    runtimes = ", ".join(f"{r['name']} ({r['origin']})" for r in facts["runtimes"]) or "none found"
    lines.append(f"CUDA        runtime: {runtimes}")
    if facts["driver"]:
        models = ", ".join(facts["gpus"]) or "no GPU listed"
        gpus = len(facts["gpus"])
        lines.append(f"driver      {facts['driver']}; {gpus} GPU{'s' if gpus != 1 else ''}: {models}")
    else:
        lines.append(f"driver      none (no {cuda.NVIDIA_PROC})")
    if facts["visible_devices"] is not None:
        lines.append(f"visible     CUDA_VISIBLE_DEVICES={facts['visible_devices']!r}")
    env = report["environment"]
    if env:
        lines.append("environment " + " ".join(f"{name}={value}" for name, value in env.items()))
    else:
        lines.append("environment (no CUDA, library path or distributed variable is set)")
    return lines


def _scan(found: dict) -> list[str]:
    read, roots = found["shared_objects"], len(found["roots"])
    lines = ["", f"extensions  {read} shared object{'s' if read != 1 else ''} read in {found['seconds']:.3f} s "
             f"under {roots} folder{'s' if roots != 1 else ''}"]  # fmt: skip
    libraries = [lib for lib in found["libraries"] if lib["cuda"] and lib["package"] != "nvidia"]
    if not libraries:
        lines.append("  none links CUDA")
    for lib in libraries:
        need = f"CUDA {lib['cuda_major']}" if lib["cuda_major"] is not None else "CUDA"
        torch_links = ", ".join(lib["torch_links"]) or "no torch library"
        lines.append(
            f"  {cuda.short_path(lib['path'])}: needs {need} ({', '.join(lib['cuda'])}); links {torch_links}"
        )
    for mismatch in found["mismatches"]:
        lines.append(f"  MISMATCH {mismatch['text']}")
    for text in found.get("metadata", []):
        lines.append(f"  MISMATCH {text}")
    return lines


def _imports(checks: Sequence[dict]) -> list[str]:
    lines = ["", "imports"]
    if not checks:
        lines.append("  none to check (no torch, no package with CUDA extensions; name some with --import)")
    for check in checks:
        module = check["module"]
        if check["status"] == "ok":
            ms = check.get("import_ms")
            took = f"{ms / 1000:.2f} s" if ms is not None else f"{check['seconds']:.2f} s"
            what = f" (import {', '.join(check['modules'])})" if check.get("modules") else ""
            lines.append(f"  {module:<16} ok      {took}{what}")
        elif check["status"] == "failed":
            lines.append(f"  {module:<16} FAILED  {check['error']}")
            if check.get("cause"):
                lines.append(f"  {'':<16}         likely cause: {check['cause']}")
            lines.extend(_said(check))
        else:
            chain = " > ".join(check["chain"]) or "(nothing in flight)"
            lines.append(f"  {module:<16} HUNG    after {check['seconds']:.1f} s in {chain}")
            if check.get("outside"):
                lines.append(f"  {'':<16}         seen from outside: {check['outside']}")
            for thread, frames in check.get("other_threads", {}).items():
                lines.append(f"  {'':<16}         also in flight in {thread}: {' > '.join(frames)}")
            lines.extend(_said(check))
    return lines


def _said(check: dict) -> list[str]:
    """The verdicts the import's own log gave before it failed or hung (on its native loads)."""
    return [f"  {'':<16}         verdict: ! {text}" for text in check.get("verdicts", ())]


def _cuda_checks(checks: dict) -> list[str]:
    lines = [""]
    if checks["status"] == "skipped":
        lines.append(f"CUDA checks skipped: {checks['reason']}")
        return lines
    lines.append(f"CUDA checks ({checks['seconds']:.1f} s)")
    if "available" in checks:
        lines.append(f"  torch.cuda.is_available(): {checks['available']}")
    if "count" in checks:
        lines.append(f"  devices: {checks['count']}")
    for device in checks.get("devices", []):
        capability = ".".join(str(part) for part in device.get("capability", [])) or "?"
        lines.append(
            f"  GPU {device['index']}: {device.get('name', '?')}, compute capability {capability}, "
            f"{_gib(device.get('free'))} free of {_gib(device.get('total'))}"
        )
    if checks["status"] != "ok":
        lines.append(f"  {checks['status'].upper()} in {checks.get('step')}")
    return lines


def _verdict(problems: Sequence[dict]) -> list[str]:
    lines = [""]
    if not problems:
        lines.append("verdict: all good")
        return lines
    lines.append(f"verdict: {len(problems)} problem{'s' if len(problems) != 1 else ''}")
    for number, problem in enumerate(problems, 1):
        lines.append(f"  {number}. {problem['problem']}")
        lines.append(f"     fix: {problem['fix']}")
    return lines
