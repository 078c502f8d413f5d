"""Build test fixtures: C shared libraries and CPython extensions compiled into a temporary folder,
and stand-in torch packages and distributions (.dist-info) laid out like the real ones."""

from __future__ import annotations

import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures"


def compiler() -> str:
    """The system C compiler; the calling test is skipped when there is none."""
    cc = shutil.which("cc") or shutil.which("gcc") or shutil.which("clang")
    if cc is None:
        pytest.skip("no C compiler (cc) on this machine")
    return cc


def _link_args(libs: list[Path] | tuple[Path, ...], rpath: bool) -> list[str]:
    """Link each library by its file name (-l:NAME), so DT_NEEDED gets its soname, not a path."""
    args = ["-Wl,--no-as-needed"] if libs else []  # keep each one listed, used or not
    for lib in libs:
        lib = Path(lib)
        args += [f"-L{lib.parent}", f"-l:{lib.name}"]
        if rpath:
            args.append(f"-Wl,-rpath,{lib.parent}")
    return args


def _run(command: list[str]) -> None:
    done = subprocess.run(command, capture_output=True, text=True, timeout=120)
    if done.returncode != 0:
        raise RuntimeError(f"compile failed: {' '.join(command)}\n{done.stderr}")


def compile_shared(
    source: Path,
    out: Path,
    *,
    soname: str | None = None,
    libs: list[Path] | tuple[Path, ...] = (),
    extra: list[str] | tuple[str, ...] = (),
    rpath: bool = True,
) -> Path:
    """cc -shared -fPIC SOURCE -o OUT, with an optional soname, linked against LIBS (with an RPATH to
    each one's folder unless RPATH is false)."""
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    command = [compiler(), "-shared", "-fPIC", "-o", str(out), str(source)]
    if soname:
        command.append(f"-Wl,-soname,{soname}")
    _run(command + _link_args(libs, rpath) + list(extra))
    return out


def compile_extension(
    source: Path,
    out_dir: Path,
    module_name: str,
    *,
    libs: list[Path] | tuple[Path, ...] = (),
    extra: list[str] | tuple[str, ...] = (),
    rpath: bool = True,
) -> Path:
    """The CPython extension MODULE_NAME (dotted names make packages) under OUT_DIR, for this interpreter.

    The file is NAME.cpython-XY-...so after sysconfig's EXT_SUFFIX. The source gets
    the macros MODULE_NAME (the dotted name, a string) and MODULE_SYMBOL (the last part, for PyInit_).
    """
    suffix = sysconfig.get_config_var("EXT_SUFFIX") or ".so"
    include = sysconfig.get_paths()["include"]
    if not Path(include, "Python.h").is_file():
        pytest.skip(f"no Python.h for {sys.executable} in {include}")
    *package, leaf = module_name.split(".")
    for depth in range(len(package)):
        folder = Path(out_dir).joinpath(*package[: depth + 1])
        folder.mkdir(parents=True, exist_ok=True)
        if not (folder / "__init__.py").exists():
            (folder / "__init__.py").write_text("")
    return compile_shared(
        source,
        Path(out_dir).joinpath(*package, f"{leaf}{suffix}"),
        libs=libs,
        extra=[f"-I{include}", f'-DMODULE_NAME="{module_name}"', f"-DMODULE_SYMBOL={leaf}", *extra],
        rpath=rpath,
    )


def stand_in_torch(root: Path, version: str, cuda: str | None, *, hip: str | None = None) -> Path:
    """ROOT/torch, a package whose version.py reads like a real torch build's; returns the package path.

    Importing it works and sets torch.__version__ and torch.version.cuda, nothing else.
    """
    package = Path(root) / "torch"
    package.mkdir(parents=True, exist_ok=True)
    package.joinpath("__init__.py").write_text(
        "from torch import version as version\nfrom torch.version import __version__ as __version__\n"
    )
    package.joinpath("version.py").write_text(
        "from typing import Optional\n\n"
        "__all__ = ['__version__', 'debug', 'cuda', 'git_version', 'hip', 'rocm', 'xpu']\n"
        f"__version__ = {version!r}\n"
        "debug = False\n"
        f"cuda: Optional[str] = {cuda!r}\n"
        "git_version = '0123456789abcdef0123456789abcdef01234567'\n"
        f"hip: Optional[str] = {hip!r}\n"
        "rocm: Optional[str] = None\n"
        "xpu: Optional[str] = None\n"
    )
    return package


def dist_info(site: Path, name: str, version: str, requires: list[str], files: list[Path]) -> Path:
    """SITE/NAME-VERSION.dist-info as pip leaves it: METADATA (Name, Version, each Requires-Dist) and a
    RECORD that lists FILES and itself."""
    folder = site / f"{name.replace('-', '_')}-{version}.dist-info"
    folder.mkdir(parents=True, exist_ok=True)
    headers = ["Metadata-Version: 2.1", f"Name: {name}", f"Version: {version}"]
    headers += [f"Requires-Dist: {requirement}" for requirement in requires]
    # A description that mentions torch pins must not be read as headers.
    (folder / "METADATA").write_text("\n".join(headers) + "\n\nRequires-Dist: torch==0.0.1 in prose\n")
    rows = [f"{path.relative_to(site)},sha256=x,1" for path in files]
    rows += [f"{(folder / name).relative_to(site)},," for name in ("METADATA", "RECORD")]
    (folder / "RECORD").write_text("\n".join(rows) + "\n")
    return folder
