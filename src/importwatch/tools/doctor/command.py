"""importwatch doctor: the options, and the flow from facts to checks to the verdict.

The doctor process itself imports nothing it inspects: torch and the CUDA
libraries are read from their files (facts/cuda.py, facts/scan.py); imports and
CUDA calls happen in fresh interpreters, each in its own process group, killed
with the group when its time is up (child.py). So doctor finishes within about
the sum of its timeouts, whatever the environment does.
"""

from __future__ import annotations

import argparse
import os
import sys

from importwatch import __version__, config
from importwatch.facts import cuda, scan
from importwatch.tools.bisection.trials import TerminationAsInterrupt, stop_status
from importwatch.tools.doctor import facts, render, rules
from importwatch.tools.doctor.child import child_env
from importwatch.tools.doctor.cudacheck import architecture_checks, check_cuda, cuda_skip_reasons
from importwatch.tools.doctor.importcheck import check_import
from importwatch.tracing import banner
from importwatch.tracing.accelerator import HOT_PATH
from importwatch.usage import UsageError, argument_parser, fail

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Sequence

    from importwatch.facts.cuda import TorchFacts

EXIT_OK = 0
EXIT_PROBLEM = 1

HELP_TIMEOUT = (
    "seconds each child (an import, the CUDA checks) may take before it is called hung "
    "(IMPORTWATCH_TIMEOUT, default 30)"
)


def _parser() -> argparse.ArgumentParser:
    parser = argument_parser(
        prog="importwatch doctor",
        description=(
            "Check this environment before a job: Python, torch, CUDA runtimes and driver, the native "
            "extensions that link CUDA, whether the key modules import (each in its own process, with a "
            "timeout), and what CUDA can do. Exit status 0 when all is well, 1 when a problem was found."
        ),
    )
    parser.add_argument(
        "--import",
        dest="imports",
        metavar="MOD",
        nargs="+",
        action="extend",
        help="modules to import, each in a fresh traced interpreter "
        "(default: torch if installed, plus the packages that ship CUDA extensions)",
    )
    parser.add_argument("--timeout", metavar="S", help=HELP_TIMEOUT)
    parser.add_argument("--json", action="store_true", help="print the facts and verdicts as one JSON object")
    parser.add_switch(
        "--cuda",
        None,
        "run the CUDA checks even without a driver or a CUDA build of torch (--no-cuda: never)",
    )
    parser.add_argument(
        "--packages",
        metavar="PKG",
        nargs="+",
        action="extend",
        help="scan only these packages (names, or folders: a site folder or a package folder)",
    )
    parser.add_switch(
        "--watcher",
        None,
        "a watcher process beside each traced import, as under the runner (IMPORTWATCH_WATCHER, default: on)",
    )
    return parser


def _settings(options: argparse.Namespace) -> config.Settings:
    """The children's settings: the options, else the IMPORTWATCH_* variables (a bad one said once)."""
    timeout = None
    if options.timeout is not None:
        try:
            timeout = config.parse_timeout(options.timeout, "--timeout", needs="doctor")
        except config.ConfigError as error:
            raise UsageError(str(error)) from None
    given = {"timeout": timeout, "watcher": options.watcher}
    settings, warnings = config.merge(given, watcher=True, needs="doctor")
    for warning in warnings:
        sys.stderr.write(f"importwatch doctor: {warning}\n")
    return settings


def _module_name(name: str) -> str:
    if not all(part.isidentifier() for part in name.split(".")):
        raise UsageError(f"--import: {name!r} is not a module name")
    return name


def diagnose(
    imports: Sequence[str] | None,
    settings: config.Settings,
    packages: Sequence[str] | None = None,
    run_cuda: bool | None = None,
) -> dict:
    """Every fact and check of the doctor, as the JSON object --json prints; SETTINGS are the children's."""
    timeout = settings.timeout
    environ = dict(os.environ)
    report: dict = {
        "importwatch": __version__,
        "hot_path": HOT_PATH,
        "python": facts.python_facts(),
        "platform": facts.platform_facts(),
    }
    problems: list[dict] = []
    roots = scan.site_roots(environ=environ)
    places, missing, extra_path = facts.scan_places(packages, roots)
    rules.missing_package_problems(problems, missing)
    torch = cuda.find_torch([*extra_path, *sys.path], environ)
    driver = cuda.driver_version()
    report["torch"] = facts.torch_facts(torch)
    report["cuda"] = facts.cuda_facts(torch, environ)
    report["environment"] = banner.relevant_environment(environ)

    result = scan.scan(places)
    mismatches = scan.verdicts(result, torch, driver)
    report["scan"] = result.to_json()
    report["scan"]["mismatches"] = [
        {"path": lib.path, "package": lib.package, "text": t} for lib, t in mismatches
    ]
    rules.mismatch_problems(problems, mismatches, torch)
    report["scan"]["metadata"] = rules.metadata_problems(problems, result, torch)
    rules.driver_problems(problems, torch, driver)
    rules.visibility_problems(problems, environ.get("CUDA_VISIBLE_DEVICES"), report["cuda"]["gpus"])

    env = child_env(extra_path)
    checks = [
        check_import(name, settings, env, torch, modules)
        for name, modules in _planned(imports, torch, result).items()
    ]
    report["imports"] = checks
    rules.import_problems(problems, checks, timeout)

    torch_import = next((check for check in checks if check["module"] == "torch"), None)
    report["cuda_checks"] = _cuda_checks(timeout, env, torch, driver, torch_import, run_cuda, result)
    rules.cuda_problems(problems, report["cuda_checks"])

    report["problems"] = problems
    report["ok"] = not problems
    return report


def _planned(
    imports: Sequence[str] | None, torch: TorchFacts | None, result: scan.ScanResult
) -> dict[str, list[str]]:
    """Each import check's name and the modules it imports: those asked for, else by default torch,
    then each package with CUDA extensions, importing those extensions."""
    if imports is not None:
        return {name: [name] for name in imports}
    planned = {"torch": ["torch"]} if torch is not None else {}
    planned.update(result.cuda_modules())
    return planned


def _cuda_checks(
    timeout: float,
    env: dict[str, str],
    torch: TorchFacts | None,
    driver: str | None,
    torch_import: dict | None,
    run_cuda: bool | None,
    result: scan.ScanResult,
) -> dict:
    """The CUDA checks' answers, with the GPU code each scanned library carries; or why they were skipped."""
    reasons = cuda_skip_reasons(torch, driver, torch_import, run_cuda)
    if reasons:
        return {"status": "skipped", "reason": "; ".join(reasons)}
    checks = check_cuda(timeout, env)
    checks["architectures"] = architecture_checks(checks.get("devices", []), result.cuda_libraries)
    return checks


def main(args: list[str]) -> int:
    """`importwatch doctor [OPTIONS]`: the exit code is 0 when all is well, 1 on a problem, 2 on bad usage."""
    try:
        options = _parser().parse_args(args)
        settings = _settings(options)
        imports = [_module_name(name) for name in options.imports] if options.imports is not None else None
    except UsageError as error:
        return fail(error)
    except SystemExit as exit:  # --help
        return int(exit.code or 0)
    try:
        with TerminationAsInterrupt():
            report = diagnose(imports, settings, options.packages, options.cuda)
    except KeyboardInterrupt as stop:  # SIGINT, SIGTERM or SIGHUP
        # The child in flight was killed with its process group, its folder removed, on the way out.
        how, status = stop_status(stop)
        sys.stderr.write(f"importwatch doctor: {how}\n")
        return status
    sys.stdout.write(render.as_json(report) if options.json else render.render(report))
    sys.stdout.flush()
    return EXIT_OK if report["ok"] else EXIT_PROBLEM
