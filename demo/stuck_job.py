"""A stuck job, diagnosed: builds a CUDA-style extension that hangs in dlopen, then runs a job under importwatch.

    python demo/stuck_job.py             # the job under the runner
    python demo/stuck_job.py --doctor    # `importwatch doctor` on the same environment

The job (`run.py`) prints "starting job..." and imports `fastkern`, whose
native `_kernels` module links a stand-in `libcudart.so.11.0` and blocks in its
shared object's constructor, holding the GIL, as a CUDA extension built for
another CUDA can. A stand-in torch says it was built for CUDA 12.1. Without
importwatch the job would sit there forever with no output; under it, the log
names the module, the file and the mismatch, faulthandler dumps the stacks
after 2 seconds, and --exit-on-stall ends it with status 1. With --doctor,
`importwatch doctor` checks the same environment instead: the mismatch, and the
import that hangs.

Needs a C compiler (CC, else cc, gcc or clang on PATH) and the Python headers
(Python.h); without them it says which is missing in one line and exits 3.
"""

from __future__ import annotations

import argparse
import os
import shlex
import shutil
import subprocess
import sys
import sysconfig
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent

RUNTIME = "int cudaRuntimeGetVersion(int *version) { *version = 11000; return 0; }\n"
TORCH_VERSION = "__version__ = '2.3.1+cu121'\ncuda = '12.1'\ndebug = False\n"
JOB = """\
import sys
print("starting job...", flush=True)
import fastkern  # never returns: the extension's constructor blocks in dlopen
print("training")
"""


MISSING = 3  # the exit status when a prerequisite is missing
PROBE = "#include <Python.h>\nint probe(void) { return PY_MAJOR_VERSION; }\n"


class Missing(Exception):
    """A prerequisite of the demo is missing; the message says which, in one line."""


def compiler() -> list[str]:
    """The C compiler's command: $CC as the build tools read it, else cc, gcc or clang on PATH."""
    named = os.environ.get("CC", "").strip()
    if named:
        argv = shlex.split(named)
        found = shutil.which(argv[0])
        if found is None:
            raise Missing(f"no C compiler found: CC={named!r} is not an executable on PATH")
        return [found, *argv[1:]]
    for name in ("cc", "gcc", "clang"):
        found = shutil.which(name)
        if found is not None:
            return [found]
    raise Missing("no C compiler found: no cc, gcc or clang on PATH and no CC; install one (e.g. gcc)")


def compile_c(cc: list[str], args: list[str]) -> None:
    """Run the compiler; its failure becomes one line naming the command and its first error."""
    try:
        done = subprocess.run([*cc, *args], capture_output=True, text=True)
    except OSError as error:
        raise Missing(f"the C compiler could not run ({shlex.join(cc)}): {error.strerror}") from None
    if done.returncode != 0:
        errors = [line for line in done.stderr.splitlines() if "error" in line] or done.stderr.splitlines()
        first = errors[0].strip() if errors else f"exit status {done.returncode}"
        if "Python.h" in first:
            version = "{}.{}".format(*sys.version_info[:2])
            raise Missing(
                f"Python.h missing: the C compiler ({shlex.join(cc)}) does not find the Python headers "
                f"(looked in {sysconfig.get_paths()['include']}); install them, e.g. python{version}-dev"
            )
        raise Missing(f"the C compiler failed ({shlex.join(cc)}): {first}")


def check_headers(cc: list[str], work: Path) -> str:
    """The folder of Python.h, once the compiler has compiled a file that includes it."""
    include = sysconfig.get_paths()["include"]
    (work / "probe.c").write_text(PROBE)
    compile_c(cc, ["-c", "-o", str(work / "probe.o"), str(work / "probe.c"), f"-I{include}"])
    return include


def build(work: Path) -> Path:
    """Lay out the job, the stand-in torch and the hanging extension under WORK; returns the job dir."""
    cc = compiler()
    include = check_headers(cc, work)
    site = work / "site-packages"
    (site / "torch").mkdir(parents=True)
    (site / "torch" / "__init__.py").write_text("from torch.version import __version__\n")
    (site / "torch" / "version.py").write_text(TORCH_VERSION)
    libs = work / "cuda-11.0" / "lib64"
    libs.mkdir(parents=True)
    (work / "cudart.c").write_text(RUNTIME)
    runtime = libs / "libcudart.so.11.0"
    compile_c(
        cc, ["-shared", "-fPIC", "-o", str(runtime), str(work / "cudart.c"), "-Wl,-soname,libcudart.so.11.0"]
    )
    package = site / "fastkern"
    package.mkdir()
    (package / "__init__.py").write_text("from fastkern import _kernels\n")
    target = package / ("_kernels" + sysconfig.get_config_var("EXT_SUFFIX"))
    compile_c(
        cc,
        [
            "-shared", "-fPIC", "-o", str(target), str(ROOT / "fixtures" / "hang" / "blocking_ext.c"),
            f"-I{include}", '-DMODULE_NAME="fastkern._kernels"',
            "-DMODULE_SYMBOL=_kernels", "-Wl,--no-as-needed", str(runtime), f"-Wl,-rpath,{libs}",
        ],
    )  # fmt: skip
    job = work / "job"
    job.mkdir()
    (job / "run.py").write_text(JOB)
    return job


def run(work: Path, job: Path, doctor: bool) -> int:
    """Run the job under the runner (or doctor on its environment), its output on ours; 0 if it was diagnosed."""
    if doctor:
        args = ["doctor", "--timeout", "2", "--no-cuda", "--packages", str(work / "site-packages")]
        shown = "doctor --timeout 2 --no-cuda --packages .../site-packages"
    else:
        args = ["--timeout", "2", "--exit-on-stall", "run.py", "--log", "job.log"]
        shown = " ".join(args)
    print(f"$ PYTHONPATH=.../site-packages python -m importwatch {shown}", flush=True)
    env = {"PYTHONPATH": str(work / "site-packages"), "PATH": "/usr/bin:/bin"}
    command = [sys.executable, "-m", "importwatch", *args]
    result = subprocess.run(command, cwd=job, env=env, stdin=subprocess.DEVNULL, timeout=60)
    if doctor:
        print(f"exit status {result.returncode}: doctor found the problems before any job ran")
    else:
        print(f"exit status {result.returncode}: the job was stuck, and the lines above say where")
    return 0 if result.returncode == 1 else 1


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--doctor", action="store_true", help="run `importwatch doctor` on the job's environment"
    )
    options = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="importwatch-demo-") as tmp:
        work = Path(tmp)
        try:
            job = build(work)
        except Missing as missing:
            print(f"demo: {missing}", file=sys.stderr)
            return MISSING
        return run(work, job, options.doctor)


if __name__ == "__main__":
    sys.exit(main())
