"""doctor's rules: the problems its facts and checks show, each with the fix to try."""

from __future__ import annotations

from importwatch.facts import cuda, dists

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Sequence

    from importwatch.facts import scan
    from importwatch.facts.cuda import TorchFacts

# Less free GPU memory than this share of the total: something else holds the device.
LOW_MEMORY = 0.1
GIB = 1 << 30


def _problem(problems: list[dict], text: str, fix: str) -> None:
    problems.append({"problem": text, "fix": fix})


def missing_package_problems(problems: list[dict], missing: Sequence[str]) -> None:
    for name in missing:
        _problem(problems, f"package {name} is not installed here", "check the name, or give its folder")


def mismatch_problems(
    problems: list[dict], mismatches: Sequence[tuple[scan.Library, str]], torch: TorchFacts | None
) -> None:
    """Scanned libraries built for another CUDA or torch than the one installed."""
    for lib, text in mismatches:
        wanted = f"CUDA {torch.cuda}" if torch is not None and torch.cuda else "this torch"
        fix = f"install the {lib.package} build for {wanted}, or rebuild it against this torch"
        if torch is not None and torch.cuda and lib.major is not None:
            fix += f" (or install the torch built for CUDA {lib.major})"
        _problem(problems, text, fix)


def metadata_problems(problems: list[dict], result: scan.ScanResult, torch: TorchFacts | None) -> list[str]:
    """What the distributions owning the scanned libraries pin, against torch and against each other."""
    owned = dists.owning_dists(lib.path for lib in result.libraries if not lib.is_runtime)
    found = []
    for dist in owned:
        text = dists.verdict(dist, torch)
        if text:
            found.append(text)
            problem, _, fix = text.rpartition(": ")
            _problem(problems, problem, fix)
    for text in dists.disagreements(owned):
        found.append(text)
        problem, _, fix = text.rpartition(": ")
        _problem(problems, f"{problem}: {fix}", "install the releases of them built for one torch")
    return found


def driver_problems(problems: list[dict], torch: TorchFacts | None, driver: str | None) -> None:
    for text in cuda.driver_verdicts(torch, driver):
        _problem(problems, text, "upgrade the NVIDIA driver, or install a torch built for an older CUDA")


def visibility_problems(problems: list[dict], visible: str | None, gpus: Sequence[str]) -> None:
    """CUDA_VISIBLE_DEVICES (VISIBLE) hiding every GPU the driver lists."""
    if visible is not None and visible.strip() in ("", "-1") and gpus:
        _problem(
            problems,
            f"CUDA_VISIBLE_DEVICES={visible!r} hides every GPU from the job",
            "unset it, or list the GPUs to use (CUDA_VISIBLE_DEVICES=0,1)",
        )


def import_problems(problems: list[dict], checks: Sequence[dict], timeout: float) -> None:
    for check in checks:
        module = check["module"]
        if check["status"] == "failed":
            cause = check.get("cause")
            fix = cause or f"read the full trace: python -m importwatch -c 'import {module}'"
            _problem(problems, f"import {module} failed: {check['error']}", fix)
        elif check["status"] == "hung":
            where = " > ".join(check["chain"]) or "(no import in flight: after its imports)"
            text = f"import {module} hung: no progress for {timeout:g} s in {where}"
            if check.get("library"):
                fix = (
                    f"{check['library']} blocks while loading (its constructor, or a library it needs): "
                    "check its CUDA and torch against the ones installed, and rebuild or reinstall it"
                )
            else:
                fix = (
                    f"trace it with a longer timeout: python -m importwatch --timeout 60 -c 'import {module}'"
                )
            _problem(problems, text, fix)


def cuda_problems(problems: list[dict], checks: dict) -> None:
    if checks.get("status") == "skipped":
        return
    if checks["status"] == "hung":
        _problem(
            problems,
            f"the CUDA checks hung in {checks.get('step')}",
            "the driver or a device does not answer: nvidia-smi shows whether the GPUs are healthy",
        )
        return
    if checks["status"] == "failed":
        _problem(
            problems,
            f"the CUDA checks failed in {checks.get('step')}: {checks.get('error')}",
            "run that step alone in python to see the full error",
        )
        return
    if not checks.get("available"):
        _problem(
            problems,
            "torch.cuda.is_available() is False",
            "check the driver (nvidia-smi), CUDA_VISIBLE_DEVICES, and that torch is a CUDA build",
        )
        return
    for device in checks.get("devices", []):
        total, free = device.get("total"), device.get("free")
        if total and free is not None and free < LOW_MEMORY * total:
            _problem(
                problems,
                f"GPU {device['index']} ({device.get('name')}) has {free / GIB:.1f} GiB free of "
                f"{total / GIB:.1f} GiB",
                "another process holds it: nvidia-smi lists the processes on each GPU",
            )
    _architecture_problems(problems, checks.get("architectures", []))


def _architecture_problems(problems: list[dict], architectures: Sequence[dict]) -> None:
    for arch in architectures:
        carried = ", ".join(arch["carries"])
        if arch["runs"] == "jit":
            _problem(
                problems,
                f"{cuda.short_path(arch['path'])} carries no code for {arch['gpu']} ({carried}): each kernel is "
                "compiled from PTX on first use, which can take minutes",
                f"rebuild it with {arch['gpu']} in its architectures (TORCH_CUDA_ARCH_LIST)",
            )
        else:
            _problem(
                problems,
                f"{cuda.short_path(arch['path'])} carries no code that runs on {arch['gpu']} ({carried}): its "
                "kernels fail with 'no kernel image is available for execution on the device'",
                f"rebuild it with {arch['gpu']} in its architectures (TORCH_CUDA_ARCH_LIST)",
            )
