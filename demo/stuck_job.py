"""A stuck job, diagnosed: builds a CUDA-style extension that hangs in dlopen, then runs a job under importwatch.

    python demo/stuck_job.py

The job (`run.py`) prints "starting job..." and imports `fastkern`, whose
native `_kernels` module links a stand-in `libcudart.so.11.0` and blocks in its
shared object's constructor, holding the GIL, as a CUDA extension built for
another CUDA can. A stand-in torch says it was built for CUDA 12.1. Without
importwatch the job would sit there forever with no output; under it, the log
names the module, the file and the mismatch, faulthandler dumps the stacks
after 2 seconds, and --exit-on-stall ends it with status 1.
Needs a C compiler (cc) and the Python headers.
"""

from __future__ import annotations

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


def build(work: Path) -> Path:
    """Lay out the job, the stand-in torch and the hanging extension under WORK; returns the job dir."""
    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        sys.exit("demo: needs a C compiler (cc)")
    site = work / "site-packages"
    (site / "torch").mkdir(parents=True)
    (site / "torch" / "__init__.py").write_text("from torch.version import __version__\n")
    (site / "torch" / "version.py").write_text(TORCH_VERSION)
    libs = work / "cuda-11.0" / "lib64"
    libs.mkdir(parents=True)
    (work / "cudart.c").write_text(RUNTIME)
    runtime = libs / "libcudart.so.11.0"
    subprocess.run(
        [cc, "-shared", "-fPIC", "-o", str(runtime), str(work / "cudart.c"), "-Wl,-soname,libcudart.so.11.0"],
        check=True,
    )
    package = site / "fastkern"
    package.mkdir()
    (package / "__init__.py").write_text("from fastkern import _kernels\n")
    target = package / ("_kernels" + sysconfig.get_config_var("EXT_SUFFIX"))
    subprocess.run(
        [
            cc, "-shared", "-fPIC", "-o", str(target), str(ROOT / "fixtures" / "hang" / "blocking_ext.c"),
            f"-I{sysconfig.get_paths()['include']}", '-DMODULE_NAME="fastkern._kernels"',
            "-DMODULE_SYMBOL=_kernels", "-Wl,--no-as-needed", str(runtime), f"-Wl,-rpath,{libs}",
        ],
        check=True,
    )  # fmt: skip
    job = work / "job"
    job.mkdir()
    (job / "run.py").write_text(JOB)
    return job


def main() -> int:
    with tempfile.TemporaryDirectory(prefix="importwatch-demo-") as tmp:
        work = Path(tmp)
        job = build(work)
        command = [
            sys.executable, "-m", "importwatch", "--timeout", "2", "--exit-on-stall",
            "run.py", "--log", "job.log",
        ]  # fmt: skip
        print(
            "$ PYTHONPATH=.../site-packages python -m importwatch --timeout 2 --exit-on-stall run.py --log job.log"
        )
        sys.stdout.flush()
        env = {"PYTHONPATH": str(work / "site-packages"), "PATH": "/usr/bin:/bin"}
        result = subprocess.run(command, cwd=job, env=env, stdin=subprocess.DEVNULL, timeout=60)
        print(f"exit status {result.returncode}: the job was stuck, and the lines above say where")
        return 0 if result.returncode == 1 else 1


if __name__ == "__main__":
    sys.exit(main())
