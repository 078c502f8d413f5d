"""From one look at a thread asleep: whether the sleep is the pause of a loop that retries a connection, and to where.

A stack read from outside (py-spy, pystack, gdb) shows the frame at its sleep call and,
with py-spy or pystack, the frame's locals; the exception that brought the thread there
is not in it. So the loop is read from the frame's source file: the innermost `while`
or `for` around the sleep whose body tries a connection (`connect`, `create_connection`,
`urlopen`, ...) in a `try` that catches the failure. The address is that call's
argument, worked out from literals, the frame's locals, the module's own constant
assignments and the process's environment (MASTER_ADDR, MASTER_PORT, ...). One look
cannot count the tries; /proc/PID/net/tcp still says whether anything listens.
"""

from __future__ import annotations

import ast
import os
import urllib.parse

from importwatch.facts import retry

TYPE_CHECKING = False
if TYPE_CHECKING:
    from importwatch.facts.stacks import StackFrame

# The calls that try a connection, by their last name.
CONNECTS = ("connect", "create_connection", "urlopen", "open_connection", "connect_ex")
_SLEEPS = ("sleep",)
_DEPTH = 6
_DEFAULT_PORTS = {"http": 80, "https": 443}


def retry_loop(pid: int, frame: StackFrame, asleep: bool = False) -> str | None:
    """`sleeping between tries of a loop that retries a connection to HOST:PORT (...); ...`, when FRAME
    (the innermost Python frame) sleeps in such a loop; None otherwise.

    A frame without its line (gdb's read) is placed in the one such loop of its file, if the thread
    is ASLEEP (its syscall a sleep) and the file has only one.
    """
    if not frame.line and not asleep:
        return None
    path = _source(pid, frame.filename)
    if path is None:
        return None
    try:
        with open(path, "rb") as file:
            source = file.read(1 << 22)
        lines = source.splitlines()
        if frame.line and (frame.line > len(lines) or b"sleep" not in lines[frame.line - 1]):
            return None  # parsed only where the frame's line sleeps
        if not frame.line and b"sleep" not in source:
            return None
        tree = ast.parse(source, path)
    except (OSError, SyntaxError, ValueError):
        return None
    if frame.line:
        found = _loop_call(tree, frame.line)
    else:
        sleeps = {node.lineno for node in ast.walk(tree) if isinstance(node, ast.Call) and _sleeps_at(node)}
        candidates = [each for each in (_loop_call(tree, line) for line in sorted(sleeps)) if each]
        found = candidates[0] if len({id(call) for call, _ in candidates}) == 1 else None
    if found is None:
        return None
    call, line = found
    address = _Evaluator(tree, frame.values, retry.environ(pid)).address(call)
    target = f" to {retry.joined(address)}" if address else ""
    where = f"{_name(call.func)} at {os.path.basename(path)}:{line}"
    text = f"sleeping between tries of a loop retrying a connection{target} ({where}) when it fails"
    return text + retry.listener_note(address, pid) + "; one look cannot count the refusals"


def _source(pid: int, filename: str) -> str | None:
    """The file FILENAME names (py-spy shortens it to its package part): as is, or under the process's
    working directory or one of its PYTHONPATH entries."""
    if os.path.isabs(filename):
        return filename if os.path.isfile(filename) else None
    if not filename.endswith(".py"):
        return None
    roots = [f"/proc/{pid}/cwd"]
    roots += [entry for entry in retry.environ(pid).get("PYTHONPATH", "").split(os.pathsep) if entry]
    for root in roots:
        path = os.path.join(root, filename)
        if os.path.isfile(path):
            return path
    return None


def _loop_call(tree: ast.AST, line: int) -> tuple[ast.Call, int] | None:
    """The connecting call of the innermost loop whose body sleeps at LINE inside a handler of (or after)
    the `try` that makes the call: (the call, its line)."""
    loops = [
        node
        for node in ast.walk(tree)
        if isinstance(node, (ast.While, ast.For, ast.AsyncFor)) and node.lineno <= line <= _end(node)
    ]
    if not loops or not any(
        isinstance(node, ast.Call) and node.lineno == line and _sleeps_at(node) for node in ast.walk(tree)
    ):
        return None
    loop = max(loops, key=lambda node: node.lineno)
    for node in ast.walk(loop):
        if isinstance(node, ast.Try) and node.handlers:
            for inner in ast.walk(ast.Module(body=node.body, type_ignores=[])):
                if isinstance(inner, ast.Call) and _name(inner.func).rsplit(".", 1)[-1] in CONNECTS:
                    return inner, inner.lineno
    return None


def _end(node: ast.AST) -> int:
    return getattr(node, "end_lineno", None) or max(
        (getattr(each, "lineno", 0) for each in ast.walk(node)), default=0
    )


def _sleeps_at(call: ast.Call) -> bool:
    """Whether CALL is a sleep (`time.sleep`, `sleep`)."""
    return _name(call.func).rsplit(".", 1)[-1] in _SLEEPS


def _name(node: ast.AST) -> str:
    """`socket.create_connection` for a call's function, as written."""
    if isinstance(node, ast.Attribute):
        return f"{_name(node.value)}.{node.attr}"
    if isinstance(node, ast.Name):
        return node.id
    return "a call"


class _Evaluator:
    """Works out a connecting call's address from what one look has: literals, the frame's locals as
    the stack reader printed them, the module's constants, the process's environment. Runs nothing."""

    def __init__(self, tree: ast.AST, values: dict[str, str], environ: dict[str, str]) -> None:
        self.values = values
        self.environ = environ
        self.constants: dict[str, ast.expr] = {}
        for node in getattr(tree, "body", []):
            if (
                isinstance(node, ast.Assign)
                and len(node.targets) == 1
                and isinstance(node.targets[0], ast.Name)
            ):
                self.constants.setdefault(node.targets[0].id, node.value)

    def address(self, call: ast.Call) -> tuple[str, int] | None:
        if not call.args:
            return None
        value = self.value(call.args[0], _DEPTH)
        if isinstance(value, (tuple, list)) and len(value) >= 2:
            host, port = value[0], self._port(value[1])
            return (host, port) if isinstance(host, str) and port is not None else None
        if isinstance(value, str) and "://" in value:
            try:
                parts = urllib.parse.urlsplit(value)
                port = parts.port or _DEFAULT_PORTS.get(parts.scheme)
            except ValueError:
                return None
            return (parts.hostname, port) if parts.hostname and port else None
        return None

    @staticmethod
    def _port(value: object) -> int | None:
        try:
            return int(value)  # type: ignore[call-overload]
        except (TypeError, ValueError):
            return None

    def value(self, node: ast.expr, depth: int) -> object:
        """NODE's value, or None when one look cannot know it."""
        if depth <= 0:
            return None
        if isinstance(node, ast.Constant):
            return node.value
        if isinstance(node, (ast.Tuple, ast.List)):
            return tuple(self.value(each, depth - 1) for each in node.elts)
        if isinstance(node, ast.JoinedStr):
            parts = [self.value(each, depth - 1) for each in node.values]
            return None if None in parts else "".join(str(part) for part in parts)
        if isinstance(node, ast.FormattedValue):
            return self.value(node.value, depth - 1)
        if isinstance(node, ast.Name):
            return self._named(node.id, depth)
        if isinstance(node, ast.Subscript) and _name(node.value) == "os.environ":
            key = self.value(node.slice, depth - 1)
            return self.environ.get(key) if isinstance(key, str) else None
        if isinstance(node, ast.Call):
            return self._called(node, depth)
        return None

    def _named(self, name: str, depth: int) -> object:
        if name in self.values:
            printed = self.values[name]
            try:
                return ast.literal_eval(printed)
            except (SyntaxError, ValueError):
                return printed  # a string, its quotes stripped by the reader
        if name in self.constants:
            return self.value(self.constants[name], depth - 1)
        return None

    def _called(self, node: ast.Call, depth: int) -> object:
        name = _name(node.func)
        arguments = [self.value(each, depth - 1) for each in node.args]
        if name in ("int", "str") and len(arguments) == 1 and arguments[0] is not None:
            try:
                return int(arguments[0]) if name == "int" else str(arguments[0])  # type: ignore[call-overload]
            except (TypeError, ValueError):
                return None
        if name in ("os.environ.get", "os.getenv", "environ.get", "getenv") and arguments:
            key = arguments[0]
            default = arguments[1] if len(arguments) > 1 else None
            return self.environ.get(key, default) if isinstance(key, str) else None
        return None
