"""The import rules docs/architecture.md states, checked on the source: every module parsed with ast,
its imports (absolute, relative, and those inside functions) drawn as a graph of our modules."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parent.parent / "src"
PACKAGE = SRC / "importwatch"
ENTRY_POINTS = {"importwatch", "importwatch.__main__", "importwatch.cli", "importwatch.pytest_plugin"}
# Modules every part may use: the event model and the leaves that import nothing of ours.
SHARED_LEAVES = {"importwatch.signame", "importwatch.masking"}
LIMIT = 600
# Files over LIMIT lines today, each with the issue that splits it. Nothing else may grow past it.
OVER_LIMIT: dict[str, int] = {}


def _name(path: Path) -> str:
    parts = list(path.relative_to(SRC).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _modules() -> dict[str, Path]:
    return {_name(path): path for path in sorted(PACKAGE.rglob("*.py"))}


def _imports(name: str, path: Path, known: set[str]) -> set[str]:
    """Our modules that NAME imports anywhere in its file (a package's own `from . import x` names x)."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(anchor + ([base] if base else []))
            # `from importwatch.facts import process` imports the module facts.process.
            targets = [
                f"{base}.{alias.name}" if f"{base}.{alias.name}" in known else base for alias in node.names
            ]
        else:
            continue
        for target in targets:
            while target and target not in known:
                target = target.rpartition(".")[0]
            if target and target != name:
                found.add(target)
    return found


def _graph() -> dict[str, set[str]]:
    modules = _modules()
    known = set(modules)
    return {name: _imports(name, path, known) for name, path in modules.items()}


def _in(name: str, folder: str) -> bool:
    return name == folder or name.startswith(folder + ".")


def test_the_graph_sees_our_imports_of_every_kind() -> None:
    graph = _graph()
    assert "importwatch.facts.procstat" in graph["importwatch.tracing.watchdog"]  # absolute, top level
    assert "importwatch.facts.stacks" in graph["importwatch.watcher.loop"]  # inside a function
    assert "importwatch.events" in graph["importwatch.events.read"]  # from the package itself
    assert "importwatch.facts.gdb_frames" not in graph["importwatch.facts.stacks"]  # a path, not an import


def test_no_module_imports_itself_back_through_others() -> None:
    graph = _graph()
    cycles = []
    state: dict[str, int] = {}  # 1: on the path being walked, 2: done

    def walk(node: str, path: list[str]) -> None:
        state[node] = 1
        for target in sorted(graph[node]):
            # No package's __init__ is exempt: events/read.py uses the model in events/__init__,
            # which never imports read.py back.
            if state.get(target) == 1:
                cycles.append([*path[path.index(target) :], target])
            elif target not in state:
                walk(target, [*path, target])
        state[node] = 2

    for name in sorted(graph):
        if name not in state:
            walk(name, [name])
    assert not cycles, "import cycles:\n" + "\n".join(" -> ".join(cycle) for cycle in cycles)


@pytest.mark.parametrize(
    ("folder", "allowed", "why"),
    [
        (
            "importwatch.facts",
            ("importwatch.facts", "importwatch.events"),
            "facts/ uses nothing of ours but the event model",
        ),
        ("importwatch.events", ("importwatch.events",), "the event model is the bottom layer"),
        ("importwatch.inflight", ("importwatch.events",), "the in-flight reader uses only the event model"),
    ],
)
def test_lower_layers_import_only_what_is_below_them(folder: str, allowed: tuple[str, ...], why: str) -> None:
    graph = _graph()
    wrong = [
        f"{name} -> {target}"
        for name, targets in graph.items()
        if _in(name, folder)
        for target in targets
        if not any(_in(target, ok) for ok in allowed) and target not in SHARED_LEAVES
    ]
    assert not wrong, f"{why}:\n" + "\n".join(wrong)


def test_shared_leaves_import_nothing_of_ours() -> None:
    graph = _graph()
    assert {leaf: graph[leaf] for leaf in SHARED_LEAVES} == {leaf: set() for leaf in SHARED_LEAVES}


@pytest.mark.parametrize(
    ("folder", "never"),
    [
        ("importwatch.tracing", "importwatch.watcher"),
        ("importwatch.tracing", "importwatch.tools"),
        ("importwatch.watcher", "importwatch.tools"),
        ("importwatch.facts", "importwatch.tracing"),
    ],
)
def test_no_part_imports_a_part_above_it(folder: str, never: str) -> None:
    graph = _graph()
    wrong = [
        f"{name} -> {target}"
        for name, targets in graph.items()
        if _in(name, folder)
        for target in targets
        if _in(target, never)
    ]
    assert not wrong, "\n".join(wrong)


def test_only_the_entry_points_and_the_tools_import_the_tools() -> None:
    graph = _graph()
    wrong = [
        f"{name} -> {target}"
        for name, targets in graph.items()
        if name not in ENTRY_POINTS and not _in(name, "importwatch.tools")
        for target in targets
        if _in(target, "importwatch.tools")
    ]
    assert not wrong, "\n".join(wrong)


def test_no_source_file_is_over_600_lines_but_those_an_issue_splits() -> None:
    # The package's modules, its C accelerator (its .c and the parts it includes), the benchmarks.
    code = [*PACKAGE.rglob("*.py"), *PACKAGE.rglob("*.c"), *PACKAGE.rglob("*.h")]
    files = [*code, *(SRC.parent / "benchmarks").glob("*.py")]
    sizes = {str(path.relative_to(SRC.parent)): len(path.read_text().splitlines()) for path in files}
    over = {path for path, lines in sizes.items() if lines > LIMIT}
    assert over <= set(OVER_LIMIT), f"over {LIMIT} lines: {sorted(over - set(OVER_LIMIT))}"
    # An entry whose file has been split goes: the list only shrinks.
    assert set(OVER_LIMIT) <= over, (
        f"no longer over {LIMIT} lines, drop from OVER_LIMIT: {sorted(set(OVER_LIMIT) - over)}"
    )


# Our modules that never run in a traced process: the tools, the watcher (a process of its own) and the
# command line's entry points.
OUTSIDE_THE_PROGRAM = ("importwatch.tools", "importwatch.watcher", "importwatch.cli", "importwatch.usage")


def test_no_module_that_runs_in_a_traced_process_imports_future() -> None:
    """`from __future__ import annotations` is an import of a source file: 0.3 ms of every traced start-up,
    and a module the program has not loaded. Annotations are quoted where Python 3.9 evaluates them."""
    found = []
    for name, path in _modules().items():
        if any(_in(name, outside) for outside in OUTSIDE_THE_PROGRAM) or name in ENTRY_POINTS - {
            "importwatch"
        }:
            continue
        for node in ast.parse(path.read_text(), str(path)).body:
            if isinstance(node, ast.ImportFrom) and node.module == "__future__":
                found.append(name)
    assert not found, found
