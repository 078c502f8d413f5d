"""Hatch build hook: compile the optional C accelerator (src/importwatch/tracing/_speedups.c) into the wheel.

With the interpreter's own compiler settings (sysconfig's CC, CFLAGS, CCSHARED,
LDSHARED, include folder and extension suffix; CC in the environment replaces
sysconfig's, IMPORTWATCH_NO_ACCELERATOR=1 builds none). Where that fails (no compiler, no
Python.h) it prints one line and the install goes on without it: importwatch then
uses its pure-Python hook (tracing/hook.py). A wheel with the extension is tagged
for this Python and platform; an editable install gets it next to its source.
"""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess
import sys
import sysconfig
import tempfile
from pathlib import Path
from typing import Any

from hatchling.builders.hooks.plugin.interface import BuildHookInterface

SOURCE = Path("src/importwatch/tracing/_speedups.c")
PACKAGE_DIR = "importwatch/tracing"


def compile_extension(source: Path, folder: Path) -> Path:
    """SOURCE built as an extension module in FOLDER; raises OSError or CalledProcessError on failure."""
    config = sysconfig.get_config_vars()
    suffix = config.get("EXT_SUFFIX") or ".so"
    target = folder / (source.stem + suffix)
    cc = shlex.split(os.environ.get("CC") or config.get("CC") or "cc")  # CC: as setuptools lets one choose
    cflags = shlex.split(config.get("CFLAGS") or "") + shlex.split(config.get("CCSHARED") or "")
    ldshared = shlex.split(config.get("LDSHARED") or f"{cc[0]} -shared")
    include = sysconfig.get_paths()["include"]
    if not Path(include, "Python.h").is_file():
        raise OSError(f"no Python.h in {include}")
    with tempfile.TemporaryDirectory() as scratch:
        obj = Path(scratch) / (source.stem + ".o")
        run = {"check": True, "capture_output": True, "timeout": 300}
        subprocess.run([*cc, *cflags, "-I", include, "-c", str(source), "-o", str(obj)], **run)
        built = Path(scratch) / target.name
        subprocess.run([*ldshared, str(obj), "-o", str(built)], **run)
        os.replace(built, target)  # whole or not at all: never half a library where Python imports it
    return target


def _reason(error: BaseException) -> str:
    if isinstance(error, subprocess.CalledProcessError):
        text = (error.stderr or b"").decode(errors="replace").strip().splitlines()
        return text[-1] if text else f"the compiler exited with {error.returncode}"
    return str(error) or type(error).__name__


class AcceleratorHook(BuildHookInterface):
    PLUGIN_NAME = "custom"
    _scratch: str | None = None  # where a regular wheel's library waits to be packed

    def initialize(self, version: str, build_data: dict[str, Any]) -> None:
        if self.target_name != "wheel" or os.environ.get("IMPORTWATCH_NO_ACCELERATOR"):
            return
        source = Path(self.root) / SOURCE
        editable = version == "editable"
        # An editable install imports the package from src/: the library goes there (git ignores *.so).
        if not editable:
            self._scratch = tempfile.mkdtemp(prefix="importwatch-build-")
        folder = source.parent if self._scratch is None else Path(self._scratch)
        try:
            target = compile_extension(source, folder)
        except (OSError, subprocess.SubprocessError) as error:
            print(
                f"importwatch: C accelerator not built ({_reason(error)}); using the pure-Python hook",
                file=sys.stderr,
            )
            return
        build_data["pure_python"] = False
        build_data["infer_tag"] = True
        if not editable:
            build_data["force_include"][str(target)] = f"{PACKAGE_DIR}/{target.name}"

    def finalize(self, version: str, build_data: dict[str, Any], artifact_path: str) -> None:
        if self._scratch is not None:
            shutil.rmtree(self._scratch, ignore_errors=True)
            self._scratch = None
