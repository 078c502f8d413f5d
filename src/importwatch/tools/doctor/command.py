"""importwatch doctor: check an environment before the job runs, every risky step in a killable child.

The doctor process itself imports nothing it inspects: torch and the CUDA
libraries are read from their files (cuda.py, scan.py); imports and CUDA calls
happen in fresh interpreters, each in its own process group, killed with the
group when its time is up. So doctor finishes within about the sum of its
timeouts, whatever the environment does.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import time

import importwatch
from importwatch import __version__
from importwatch.events import parse_line
from importwatch.facts import cuda, dists, scan
from importwatch.tools.bisection.trials import TerminationAsInterrupt, stop_status
from importwatch.tracing import banner
from importwatch.usage import UsageError, argument_parser, fail

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Sequence

    from importwatch.events import Event
    from importwatch.facts.cuda import TorchFacts

EXIT_OK = 0
EXIT_PROBLEM = 1


DEFAULT_TIMEOUT = 30.0
# After the stall threshold the traced child reports and exits by itself; this is how long it
# gets to do so before its process group is killed.
GRACE = 3.0
SAMPLE_INTERVAL = 0.25
# Less free GPU memory than this share of the total: something else holds the device.
LOW_MEMORY = 0.1
GIB = 1 << 30

# The folder importwatch is imported from (site-packages, or a source tree).
_PACKAGE_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(importwatch.__file__)))

HELP_TIMEOUT = (
    "seconds each child (an import, the CUDA checks) may take before it is called hung (default 30)"
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
    parser.add_argument("--timeout", metavar="S", default=str(DEFAULT_TIMEOUT), help=HELP_TIMEOUT)
    parser.add_argument("--json", action="store_true", help="print the facts and verdicts as one JSON object")
    parser.add_argument(
        "--cuda",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="run the CUDA checks even without a driver or a CUDA build of torch (--no-cuda: never)",
    )
    parser.add_argument(
        "--packages",
        metavar="PKG",
        nargs="+",
        action="extend",
        help="scan only these packages (names, or folders: a site folder or a package folder)",
    )
    parser.add_argument(
        "--watcher",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="a watcher process beside each traced import, as under the runner (default: on)",
    )
    return parser


def _timeout(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise UsageError(f"--timeout: expected a number of seconds, got {text!r}") from None
    if not 0 < value < float("inf"):
        raise UsageError(f"--timeout: expected a finite number of seconds > 0, got {text!r}")
    return value


def _module_name(name: str) -> str:
    if not all(part.isidentifier() for part in name.split(".")):
        raise UsageError(f"--import: {name!r} is not a module name")
    return name


# -- facts -----------------------------------------------------------------------------------------
def python_facts() -> dict:
    """The interpreter: version, executable, and the environment it belongs to."""
    virtualenv = sys.prefix if sys.prefix != getattr(sys, "base_prefix", sys.prefix) else None
    return {
        "version": ".".join(str(part) for part in sys.version_info[:3]),
        "implementation": sys.implementation.name,
        "executable": sys.executable,
        "prefix": sys.prefix,
        "virtualenv": virtualenv,
        "conda": os.environ.get("CONDA_PREFIX"),
    }


def platform_facts() -> dict:
    """The kernel, the machine and the C library (glibc's version decides which wheels load)."""
    system = os.uname()
    try:
        libc = os.confstr("CS_GNU_LIBC_VERSION")
    except (ValueError, OSError, AttributeError):
        libc = None  # not glibc (musl, or not Linux)
    return {"system": system.sysname, "release": system.release, "machine": system.machine, "libc": libc}


def torch_facts(torch: TorchFacts | None) -> dict | None:
    if torch is None:
        return None
    return {
        "path": torch.path,
        "version": torch.version,
        "cuda": torch.cuda,
        "hip": torch.hip,
        "build": torch.build,
    }


def cuda_facts(torch: TorchFacts | None, environ: dict[str, str]) -> dict:
    """The CUDA runtimes at hand, the driver and the GPUs it sees, which of them the job may use."""
    runtimes = torch.runtimes if torch is not None else cuda.find_runtimes(os.devnull, environ)
    return {
        "driver": cuda.driver_version(),
        "gpus": cuda.gpus(),
        "visible_devices": environ.get("CUDA_VISIBLE_DEVICES"),
        "runtimes": [{"name": r.name, "path": r.path, "origin": r.origin} for r in runtimes],
    }


# -- running children --------------------------------------------------------------------------------
def _child_env(extra_path: Sequence[str]) -> dict[str, str]:
    """Ours, minus IMPORTWATCH* settings (the child's options say all), plus folders given to --packages.

    The children run in a folder of their own (see _run_child): a relative PYTHONPATH
    entry is made absolute from here, and importwatch itself stays importable when
    only the working directory held it.
    """
    env = {key: value for key, value in os.environ.items() if not key.startswith("IMPORTWATCH")}
    entries = [*extra_path, *env.get("PYTHONPATH", "").split(os.pathsep)]
    entries = [os.path.abspath(entry) for entry in entries if entry]
    if _PACKAGE_ROOT not in entries and _PACKAGE_ROOT not in sys.path[1:]:
        entries.append(_PACKAGE_ROOT)
    if entries:
        env["PYTHONPATH"] = os.pathsep.join(entries)
    return env


def _kill_group(process: subprocess.Popen) -> None:
    try:
        os.killpg(process.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


class _OutsideLook:
    """The outside view of a child while it runs: its main thread's state and CPU, sampled.

    The child's own watcher may stop it for a moment with a debugger, to read its
    native stacks: a look that finds it so is no verdict, and the CPU share is only
    measured between two looks with no such stop in between (a busy thread stopped
    would look idle).
    """

    def __init__(self, pid: int) -> None:
        from importwatch.watcher import outside

        self.outside = outside
        self.pid = pid
        self.last = None  # (time, ThreadSample of the main thread), since no stop of ours
        self.view: str | None = None

    def sample(self) -> None:
        outside = self.outside
        try:
            if outside.traced_by_us(self.pid):
                self.last = None  # the watcher's debugger holds it: the next share starts after it
                return
            now = time.monotonic()
            if self.last is not None and now - self.last[0] < SAMPLE_INTERVAL:
                return
            threads = outside.sample_threads(self.pid, detail=True)
            main = threads.get(self.pid)
            tracer = outside.tracer_pid(self.pid)
            # Stopped by a debugger that is ours now, or gone since: the watcher's, letting go.
            ours = outside.traced_by_us(self.pid, tracer) or (
                main is not None and main.state == "t" and not tracer
            )
            if main is None or ours:
                self.last = None
                return
            share = outside.cpu_share(self.last[1], main, now - self.last[0]) if self.last else None
            self.last = (now, main)
            state = outside.verdict(main, share)
            cpu = f", {share * 100:.0f}% CPU" if share is not None else ""
            waits = outside.waits_on(self.pid, main) if state != outside.BUSY else None
            others = len(threads) - 1
            more = f"; {others} other thread{'s' if others != 1 else ''}" if others else ""
            self.view = (
                f"{state}: main thread {main.state_name}{cpu}" + (f", {waits}" if waits else "") + more
            )
        except Exception:  # a look from outside may fail; the check goes on without it
            return


def _run_child(
    command: list[str], limit: float, env: dict[str, str], stdout: int, stderr: int, cwd: str
) -> tuple[int | None, float, str | None]:
    """Run COMMAND in CWD, in its own process group; kill the group at LIMIT seconds.

    CWD is the check's own private folder: `python -c` and `-m` put the working
    directory first on sys.path, and a json.py left in the user's folder must not
    run, nor stand in for what the check names.
    Returns (exit status, or None when killed; seconds; the outside view just before the end).
    """
    started = time.monotonic()
    process = subprocess.Popen(
        command,
        stdin=subprocess.DEVNULL,
        stdout=stdout,
        stderr=stderr,
        env=env,
        cwd=cwd,
        start_new_session=True,
    )
    status: int | None = None
    try:  # from here on the group is killed whatever stops us (a signal: see trials.Terminated)
        watch = _OutsideLook(process.pid)
        while True:
            try:
                status = process.wait(0.05)
                break
            except subprocess.TimeoutExpired:
                pass
            if time.monotonic() - started >= limit:
                _kill_group(process)
                process.wait()
                status = None
                break
            watch.sample()
    finally:
        if process.returncode is None:
            _kill_group(process)
            process.wait()
    # Anything the child left behind in its group goes with it.
    _kill_group(process)
    return status, time.monotonic() - started, watch.view


# -- import checks -----------------------------------------------------------------------------------
def _in_flight(events: Sequence[Event]) -> dict[str, list[Event]]:
    """Per thread, the steps started and not ended (imports, native loads, phases, steps), outermost first."""
    stacks: dict[str, list[Event]] = {}
    ends = {"import_end": "import", "native_end": "native", "phase_end": "phase", "step_end": "step"}
    for event in events:
        if event.kind in ("import", "native", "phase", "step"):
            stacks.setdefault(event.thread, []).append(event)
        elif event.kind in ends:
            stack = stacks.get(event.thread, [])
            for index in range(len(stack) - 1, -1, -1):
                if stack[index].kind == ends[event.kind] and stack[index].name == event.name:
                    del stack[index:]
                    break
    return {thread: stack for thread, stack in stacks.items() if stack}


def _frame(event: Event) -> str:
    return f"dlopen {event.name}" if event.kind == "native" else event.name


def _read_events(path: str) -> list[Event]:
    try:
        with open(path, encoding="utf-8", errors="replace") as file:
            return [event for event in map(parse_line, file) if event is not None]
    except OSError:
        return []


def _last_error_line(path: str) -> str | None:
    """The last line of a traceback on the child's stderr: "RuntimeError: boom"."""
    try:
        with open(path, "rb") as file:
            file.seek(0, os.SEEK_END)
            file.seek(max(0, file.tell() - 65536))
            lines = file.read().decode("utf-8", "replace").splitlines()
    except OSError:
        return None
    for line in reversed(lines):
        if line.strip() and not line.startswith(("[importwatch ", " ", "\t")):
            return line.strip()
    return None


def _message(error: str) -> str:
    """The message of "ImportError: MESSAGE", as the loader wrote it."""
    kind, sep, message = error.partition(": ")
    return message if sep and kind.isidentifier() and kind.endswith(("Error", "Exception")) else error


def check_import(
    module: str,
    timeout: float,
    env: dict[str, str],
    torch: TorchFacts | None = None,
    modules: Sequence[str] = (),
    watcher: bool = True,
) -> dict:
    """Import MODULE (or, when given, its MODULES: a package's extension modules, one after the other)
    in a fresh interpreter under the tracer; ok, failed or hung, and why."""
    modules = list(modules) or [module]
    with tempfile.TemporaryDirectory(prefix="importwatch-doctor-") as folder:
        log = os.path.join(folder, "trace.jsonl")
        errors = os.path.join(folder, "stderr.txt")
        command = [sys.executable, "-m", "importwatch", "--timeout", repr(timeout), "--exit-on-stall"]
        command += [] if watcher else ["--no-watcher"]
        command += ["--log", log, "-c", "; ".join(f"import {name}" for name in modules)]
        with open(errors, "wb") as stderr:
            status, seconds, view = _run_child(
                command, timeout + GRACE, env, subprocess.DEVNULL, stderr.fileno(), folder
            )
        events = _read_events(log)
        last_error = _last_error_line(errors)
    result: dict = {"module": module, "seconds": round(seconds, 3)}
    if modules != [module]:
        result["modules"] = modules
    top = [e for e in events if e.kind == "import_end" and e.name in modules and e.thread == "MainThread"]
    stalled = any(e.kind == "stall" for e in events)
    flying = _in_flight(events)
    if status == 0:
        result["status"] = "ok"
        if top and len(modules) == 1 and top[-1].ms is not None:
            result["import_ms"] = round(top[-1].ms, 3)
        return result
    if status is None or stalled or (flying and seconds >= timeout):
        result["status"] = "hung"
        result["stalled"] = stalled or status is None
        stack = flying.get("MainThread") or next(iter(flying.values()), [])
        result["chain"] = [_frame(event) for event in stack]
        natives = [event.name for event in stack if event.kind == "native"]
        result["library"] = natives[-1] if natives else None
        result["other_threads"] = {
            thread: [_frame(event) for event in frames]
            for thread, frames in flying.items()
            if frames is not stack
        }
        told = [e.text.strip()[len("outside: ") :] for e in events if e.text.strip().startswith("outside: ")]
        result["outside"] = view or (told[0] if told else None)
        return result
    result["status"] = "failed"
    failed_loads = [e for e in events if e.kind == "native_end" and e.error]
    error = top[-1].error if top and top[-1].error else None
    if status < 0:
        try:
            name = signal.Signals(-status).name
        except ValueError:
            name = f"signal {-status}"
        error = f"the interpreter was killed by {name}"
        stack = flying.get("MainThread") or []
        if stack:
            error += " during " + " > ".join(_frame(event) for event in stack)
            natives = [event.name for event in stack if event.kind == "native"]
            result["library"] = natives[-1] if natives else None
    result["error"] = error or last_error or f"the interpreter exited with status {status}"
    cause = None
    if failed_loads:
        cause = cuda.explain_load_error(_message(failed_loads[-1].error or ""), failed_loads[-1].name, torch)
    result["cause"] = cause or cuda.explain_load_error(_message(result["error"]), None, torch)
    return result


# -- CUDA checks -------------------------------------------------------------------------------------
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
            status, seconds, view = _run_child(
                command, timeout, env, stdout.fileno(), stderr.fileno(), folder
            )
        records = []
        with open(out, encoding="utf-8", errors="replace") as file:
            for line in file:
                try:
                    records.append(json.loads(line))
                except ValueError:
                    continue
        last_error = _last_error_line(errors)
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


# -- the report ---------------------------------------------------------------------------------------
def _problem(problems: list[dict], text: str, fix: str) -> None:
    problems.append({"problem": text, "fix": fix})


def _import_problems(problems: list[dict], checks: Sequence[dict], timeout: float) -> None:
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


def _cuda_problems(problems: list[dict], checks: dict) -> None:
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
    for arch in checks.get("architectures", []):
        carried = ", ".join(arch["carries"])
        if arch["runs"] == "jit":
            _problem(
                problems,
                f"{scan_short(arch['path'])} carries no code for {arch['gpu']} ({carried}): each kernel is "
                "compiled from PTX on first use, which can take minutes",
                f"rebuild it with {arch['gpu']} in its architectures (TORCH_CUDA_ARCH_LIST)",
            )
        else:
            _problem(
                problems,
                f"{scan_short(arch['path'])} carries no code that runs on {arch['gpu']} ({carried}): its "
                "kernels fail with 'no kernel image is available for execution on the device'",
                f"rebuild it with {arch['gpu']} in its architectures (TORCH_CUDA_ARCH_LIST)",
            )


def scan_short(path: str) -> str:
    """The last two components of PATH, as the verdicts name files."""
    return "/".join(path.rstrip("/").split("/")[-2:])


def diagnose(
    imports: Sequence[str] | None = None,
    timeout: float = DEFAULT_TIMEOUT,
    packages: Sequence[str] | None = None,
    run_cuda: bool | None = None,
    watcher: bool = True,
) -> dict:
    """Every fact and check of the doctor, as the JSON object --json prints."""
    environ = dict(os.environ)
    report: dict = {"importwatch": __version__, "python": python_facts(), "platform": platform_facts()}
    roots = scan.site_roots(environ=environ)
    extra_path: list[str] = []
    problems: list[dict] = []
    if packages:
        places, missing = scan.resolve_packages(packages, roots)
        for name in missing:
            _problem(problems, f"package {name} is not installed here", "check the name, or give its folder")
        # A folder given by path is what the imports should see too.
        for place, package in places:
            folder = os.path.dirname(place) if package else place
            if folder not in roots and folder not in extra_path and folder not in sys.path:
                extra_path.append(folder)
    else:
        places = [(root, "") for root in roots]
    torch = cuda.find_torch([*extra_path, *sys.path], environ)
    driver = cuda.driver_version()
    report["torch"] = torch_facts(torch)
    report["cuda"] = cuda_facts(torch, environ)
    report["environment"] = banner.relevant_environment(environ)

    result = scan.scan(places)
    mismatches = scan.verdicts(result, torch, driver)
    report["scan"] = result.to_json()
    report["scan"]["mismatches"] = [
        {"path": lib.path, "package": lib.package, "text": t} for lib, t in mismatches
    ]
    for lib, text in mismatches:
        wanted = f"CUDA {torch.cuda}" if torch is not None and torch.cuda else "this torch"
        fix = f"install the {lib.package} build for {wanted}, or rebuild it against this torch"
        if torch is not None and torch.cuda and lib.major is not None:
            fix += f" (or install the torch built for CUDA {lib.major})"
        _problem(problems, text, fix)
    report["scan"]["metadata"] = _metadata_problems(problems, result, torch)
    for text in cuda.driver_verdicts(torch, driver):
        _problem(problems, text, "upgrade the NVIDIA driver, or install a torch built for an older CUDA")
    visible = environ.get("CUDA_VISIBLE_DEVICES")
    if visible is not None and visible.strip() in ("", "-1") and report["cuda"]["gpus"]:
        _problem(
            problems,
            f"CUDA_VISIBLE_DEVICES={visible!r} hides every GPU from the job",
            "unset it, or list the GPUs to use (CUDA_VISIBLE_DEVICES=0,1)",
        )

    # By default: torch, then each package with CUDA extensions, importing those extensions.
    if imports is not None:
        planned = {name: [name] for name in imports}
    else:
        planned = {"torch": ["torch"]} if torch is not None else {}
        planned.update(result.cuda_modules())
    env = _child_env(extra_path)
    checks = [check_import(name, timeout, env, torch, modules, watcher) for name, modules in planned.items()]
    report["imports"] = checks
    _import_problems(problems, checks, timeout)

    torch_import = next((check for check in checks if check["module"] == "torch"), None)
    reasons = cuda_skip_reasons(torch, driver, torch_import, run_cuda)
    if reasons:
        cuda_checks: dict = {"status": "skipped", "reason": "; ".join(reasons)}
    else:
        cuda_checks = check_cuda(timeout, env)
        cuda_checks["architectures"] = architecture_checks(
            cuda_checks.get("devices", []), result.cuda_libraries
        )
    report["cuda_checks"] = cuda_checks
    _cuda_problems(problems, cuda_checks)

    report["problems"] = problems
    report["ok"] = not problems
    return report


def _metadata_problems(problems: list[dict], result: scan.ScanResult, torch: TorchFacts | None) -> list[str]:
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


def _gib(value: int | None) -> str:
    return f"{value / GIB:.1f} GiB" if value is not None else "?"


def render(report: dict) -> str:
    """The report for people: facts, scan, imports, CUDA, then the verdict with a fix for each problem."""
    lines = [f"importwatch {report['importwatch']} doctor", ""]
    py = report["python"]
    where = f" (virtualenv {py['virtualenv']})" if py["virtualenv"] else ""
    where += f" (conda {py['conda']})" if py.get("conda") else ""
    lines.append(f"python      {py['version']} {py['executable']}{where}")
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
        lines.append(f"driver      {facts['driver']}; {len(facts['gpus'])} GPU(s): {models}")
    else:
        lines.append(f"driver      none (no {cuda.NVIDIA_PROC})")
    if facts["visible_devices"] is not None:
        lines.append(f"visible     CUDA_VISIBLE_DEVICES={facts['visible_devices']!r}")
    env = report["environment"]
    if env:
        lines.append("environment " + " ".join(f"{name}={value}" for name, value in env.items()))
    else:
        lines.append("environment (no CUDA, library path or distributed variable is set)")

    found = report["scan"]
    lines += ["", f"extensions  {found['shared_objects']} shared objects read in {found['seconds']:.3f} s "
              f"under {len(found['roots'])} folder(s)"]  # fmt: skip
    libraries = [lib for lib in found["libraries"] if lib["cuda"] and lib["package"] != "nvidia"]
    if not libraries:
        lines.append("  none links CUDA")
    for lib in libraries:
        need = f"CUDA {lib['cuda_major']}" if lib["cuda_major"] is not None else "CUDA"
        torch_links = ", ".join(lib["torch_links"]) or "no torch library"
        lines.append(
            f"  {scan_short(lib['path'])}: needs {need} ({', '.join(lib['cuda'])}); links {torch_links}"
        )
    for mismatch in found["mismatches"]:
        lines.append(f"  MISMATCH {mismatch['text']}")
    for text in found.get("metadata", []):
        lines.append(f"  MISMATCH {text}")

    lines += ["", "imports"]
    if not report["imports"]:
        lines.append("  none to check (no torch, no package with CUDA extensions; name some with --import)")
    for check in report["imports"]:
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
        else:
            chain = " > ".join(check["chain"]) or "(nothing in flight)"
            lines.append(f"  {module:<16} HUNG    after {check['seconds']:.1f} s in {chain}")
            if check.get("outside"):
                lines.append(f"  {'':<16}         seen from outside: {check['outside']}")
            for thread, frames in check.get("other_threads", {}).items():
                lines.append(f"  {'':<16}         also in flight in {thread}: {' > '.join(frames)}")

    checks = report["cuda_checks"]
    lines.append("")
    if checks["status"] == "skipped":
        lines.append(f"CUDA checks skipped: {checks['reason']}")
    else:
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

    problems = report["problems"]
    lines.append("")
    if not problems:
        lines.append("verdict: all good")
    else:
        lines.append(f"verdict: {len(problems)} problem{'s' if len(problems) != 1 else ''}")
        for number, problem in enumerate(problems, 1):
            lines.append(f"  {number}. {problem['problem']}")
            lines.append(f"     fix: {problem['fix']}")
    return "\n".join(lines) + "\n"


def main(args: list[str]) -> int:
    """`importwatch doctor [OPTIONS]`: the exit code is 0 when all is well, 1 on a problem, 2 on bad usage."""
    try:
        options = _parser().parse_args(args)
        timeout = _timeout(options.timeout)
        imports = [_module_name(name) for name in options.imports] if options.imports is not None else None
    except UsageError as error:
        return fail(error)
    except SystemExit as exit:  # --help
        return int(exit.code or 0)
    try:
        with TerminationAsInterrupt():
            report = diagnose(imports, timeout, options.packages, options.cuda, options.watcher)
    except KeyboardInterrupt as stop:  # SIGINT, SIGTERM or SIGHUP
        # The child in flight was killed with its process group, its folder removed, on the way out.
        how, status = stop_status(stop)
        sys.stderr.write(f"importwatch doctor: {how}\n")
        return status
    if options.json:
        sys.stdout.write(json.dumps(report, indent=2) + "\n")
    else:
        sys.stdout.write(render(report))
    sys.stdout.flush()
    return EXIT_OK if report["ok"] else EXIT_PROBLEM
