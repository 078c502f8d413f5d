"""The inspected process's Python: its version and search path, asked of its own interpreter in a
separate, isolated process that runs none of the program's code, else read from its files."""

from __future__ import annotations

import json
import os
import subprocess

from importwatch import config
from importwatch.tools.inspection.process import owner_uid

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Sequence

INTERPRETER_TIMEOUT = 15.0

# Run by the target's own interpreter with -S: its version and search path, as site would make it,
# with no .pth code run: site.venv() and site.addsitedir() would run every `import` line of the
# environment's .pth files (one that hangs is what inspect may be looking at). pyvenv.cfg and the
# .pth files are read as text here instead, as site reads them.
_PATH_SCRIPT = r"""
import json, os, site, sys
exe_dir = os.path.dirname(os.path.abspath(sys.executable))
prefixes, system_site = [], True
for conf in (os.path.join(exe_dir, "pyvenv.cfg"), os.path.join(os.path.dirname(exe_dir), "pyvenv.cfg")):
    if os.path.isfile(conf):
        prefixes.append(os.path.dirname(exe_dir))
        system_site = False
        try:
            with open(conf, encoding="utf-8", errors="replace") as file:
                for line in file.read(1 << 16).splitlines():
                    key, equals, value = line.partition("=")
                    if equals and key.strip().lower() == "include-system-site-packages":
                        system_site = value.strip().lower() == "true"
        except OSError:
            pass
        break
if system_site:
    prefixes += [sys.base_prefix, sys.base_exec_prefix]
dirs = []
try:
    dirs += site.getsitepackages(prefixes)
except AttributeError:
    pass
# -I turns the user site off here; the program has it unless its venv leaves out the system's
# site-packages, or PYTHONNOUSERSITE is set.
if system_site and not os.environ.get("PYTHONNOUSERSITE"):
    dirs.append(site.getusersitepackages())
path = list(sys.path)
for folder in dirs:
    if not os.path.isdir(folder):
        continue
    path.append(folder)
    try:
        names = sorted(name for name in os.listdir(folder) if name.endswith(".pth"))
    except OSError:
        names = []
    for name in names:
        try:
            with open(os.path.join(folder, name), encoding="utf-8", errors="replace") as file:
                lines = file.read(1 << 16).splitlines()
        except OSError:
            continue
        for line in lines:
            line = line.strip()
            if line and not line.startswith(("#", "import ", "import\t")):
                entry = os.path.join(folder, line)
                if os.path.isdir(entry):
                    path.append(entry)
print(json.dumps({"version": sys.version.split()[0], "path": path}))
"""


def _invoked(argv0: str, cwd: str | None, environ: dict[str, str], exe: str) -> str:
    """The interpreter as the program named it (a venv's bin/python), when it is the same file as EXE."""
    candidates = []
    if "/" in argv0:
        candidates.append(os.path.join(cwd or "/", argv0))
    else:
        candidates += [os.path.join(folder, argv0) for folder in environ.get("PATH", "").split(":") if folder]
    for candidate in candidates:
        if os.path.isfile(candidate) and os.path.realpath(candidate) == os.path.realpath(exe):
            return candidate
    return exe


def interpreter_facts(pid: int, exe: str, argv0: str, cwd: str | None, environ: dict[str, str] | None):
    """(version, sys.path as the program has it, interpreter path, why not) from its own interpreter.

    It runs isolated (-I -S: no PYTHON* variable, no user site, no .pth code), so nothing the
    program's folders hold runs; PYTHONPATH is added here. It is not run at all for a process of
    another user: that would run their files as this user.
    """
    environ = environ or {}
    python_path = [entry for entry in environ.get("PYTHONPATH", "").split(os.pathsep) if entry]
    if not os.path.basename(exe).startswith("python"):
        return (
            None,
            python_path,
            exe,
            f"the program runs in {exe}, which embeds Python: its search path is unknown",
        )
    invoked = _invoked(argv0, cwd, environ, exe)
    if owner_uid(pid) != os.geteuid():
        why = (
            f"its search path: {invoked} belongs to another user, and running it here would run "
            "their files as this user; the mapped libraries and PYTHONPATH stand in"
        )
        return None, python_path, invoked, why
    env = config.for_child(environ=environ)[0]
    env["PYTHONDONTWRITEBYTECODE"] = "1"
    try:
        done = subprocess.run(
            [invoked, "-I", "-S", "-c", _PATH_SCRIPT],
            env=env,
            cwd="/",
            stdin=subprocess.DEVNULL,
            capture_output=True,
            timeout=INTERPRETER_TIMEOUT,
        )
        facts = json.loads(done.stdout)
    except (OSError, subprocess.SubprocessError, ValueError) as error:
        return None, python_path, invoked, f"could not ask {invoked} for its search path: {error}"
    found = [entry for entry in facts.get("path", []) if isinstance(entry, str)]
    return facts.get("version"), python_path + found, invoked, None


def version_from_maps(exe: str, mapped: Sequence[str]) -> str | None:
    """The Python version the file names tell (python3.11, libpython3.11.so): when it cannot be asked."""
    for path in [exe, *mapped]:
        name = os.path.basename(path)
        for prefix in ("libpython", "python"):
            if name.startswith(prefix):
                version = name[len(prefix) :].split(".so", 1)[0].rstrip("dmu")
                if version[:1].isdigit():
                    return version
    return None


def search_path(
    asked: Sequence[str], cmdline: Sequence[str], cwd: str | None, mapped: Sequence[str]
) -> list[str]:
    """Where the program finds modules: its interpreter's answer (ASKED), its working folder, its
    script's folder, and the site-packages folders of the shared objects it mapped."""
    return [*asked, *([cwd] if cwd else []), *_script_folder(cmdline, cwd), *_site_folders(mapped)]


def _site_folders(mapped: Sequence[str]) -> list[str]:
    """The site-packages folders of the shared objects mapped: a search path when none was asked for."""
    found: dict[str, None] = {}
    for path in mapped:
        for marker in ("/site-packages/", "/dist-packages/"):
            if marker in path:
                found.setdefault(path.split(marker, 1)[0] + marker.rstrip("/"), None)
    return list(found)


def _script_folder(cmdline: Sequence[str], cwd: str | None) -> list[str]:
    words = list(cmdline[1:])
    while words and words[0].startswith("-") and words[0] not in ("-m", "-c", "-"):
        words.pop(0)
    if words and not words[0].startswith("-"):
        return [os.path.dirname(os.path.join(cwd or "/", words[0]))]
    return []
