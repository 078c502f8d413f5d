"""Retry loops: a connection refused, a sleep, the same connection again; the address and whether anything listens.

A refused connection on a reachable host ends at once (the peer answers the SYN with a
reset), so a thread that retries it spends its time asleep between tries and looks like
"sleeping on a timer". What ties the sleep to the connection is the exception being
handled while it sleeps (the `except ConnectionRefusedError:` around the sleep), whose
traceback keeps the frames that tried: socket.create_connection's `sa`/`address`
(urllib, http.client and urllib3 go through one such function), or a local address
tuple of the caller. /proc/net/tcp says whether anything listens on the port. The
standard library only, imported by the stall report only when it needs it.
"""

# Run from memory at a stall (tracing/standby.py), this module may import nothing that start-up holds back
# from the program (tracing/handback.py).
import builtins
import os
import sys

from importwatch.facts import procstat

# Locals that hold the address a connection was tried to, best first.
_ADDRESS_NAMES = ("sa", "address", "addr", "sockaddr")
# Else a host and a port apart, as a retry loop's own function may take them.
_HOST_NAMES = ("host", "addr", "address", "hostname", "master_addr")
_PORT_NAMES = ("port", "master_port")
# How deep a chain of causes, contexts and reasons is followed.
_DEPTH = 8
_LISTEN = "0A"
_GROUP = getattr(builtins, "BaseExceptionGroup", None)  # 3.11+
# A function's f_locals is a snapshot kept on its frame (a view from 3.13 on: PEP 667); see _locals.
_SNAPSHOTS = sys.version_info < (3, 13)
_OPTIMIZED = 0x1  # inspect.CO_OPTIMIZED: a function's frame, whose locals live in the frame

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Mapping
    from types import FrameType


def refusal(error: object) -> "BaseException | None":
    """The ConnectionRefusedError in ERROR or what it wraps (its cause, context, a URLError's reason, an
    ExceptionGroup's members); None when the error is no refused connection."""
    seen = 0
    todo = [error]
    while todo and seen < _DEPTH * 4:
        each = todo.pop(0)
        seen += 1
        if isinstance(each, ConnectionRefusedError):  # what OSError makes of ECONNREFUSED
            return each
        if not isinstance(each, BaseException):
            continue
        # A URLError's reason from the instance's own attributes: no property of the program's runs.
        todo += [getattr(each, "__dict__", {}).get("reason"), each.__cause__, each.__context__]
        if _GROUP is not None and isinstance(each, _GROUP):
            todo += list(each.exceptions)
    return None


def address_of(errors: list[BaseException]) -> "tuple[str, int] | None":
    """The (host, port) a connection was tried to, from the locals of the frames in the ERRORS' tracebacks
    (innermost first): create_connection's resolved `sa`, an `address`-like tuple, a host and a port;
    else any (host, port) tuple the frame's code names (a loop's own `sock.connect(store)`)."""
    frames = []
    for error in errors:
        traceback = error.__traceback__
        chain = []
        while traceback is not None and len(chain) < 64:
            chain.append(traceback.tb_frame)
            traceback = traceback.tb_next
        frames += reversed(chain)
    running = _running_frames() if _SNAPSHOTS else set()
    scopes = [(frame, values) for frame in frames if (values := _locals(frame, running)) is not None]
    for _, values in scopes:
        found = _pair_in(values)
        if found is not None:
            return found
    for frame, values in scopes:
        code = frame.f_code
        for name in (*code.co_varnames, *code.co_names):
            found = _pair(values.get(name))
            if found is not None:
                return found
    return None


def _locals(frame: "FrameType", running: set[int]) -> "Mapping[str, object] | None":
    """FRAME's locals, or None where reading them would keep the program's objects alive.

    Before 3.13 a function's `f_locals` is a snapshot kept on its frame until the next read or the
    frame's end: read while the function runs (in a thread's stack), it holds values the function
    drops later, and an exception then bound in it (`except ... as error:`) makes a cycle with the
    traceback that carries the frame away, freed only by the collector, if it runs. A frame that
    has ended holds its locals itself, so a snapshot of them holds nothing more; a module's or a
    class's `f_locals` is its namespace, no copy; 3.13's is a view that keeps nothing.
    """
    if not _SNAPSHOTS or not frame.f_code.co_flags & _OPTIMIZED or id(frame) not in running:
        return frame.f_locals
    return None


def _running_frames() -> set[int]:
    """The ids of the frames in every thread's stack, now."""
    running = set()
    for frame in sys._current_frames().values():
        while frame is not None:
            running.add(id(frame))
            frame = frame.f_back
    return running


def _pair(value: object) -> "tuple[str, int] | None":
    """VALUE as an address (host, port, ...): a tuple of a host name and an int."""
    if isinstance(value, tuple) and len(value) >= 2 and isinstance(value[1], int):
        host = value[0]
        if isinstance(host, bytes):
            host = host.decode("ascii", "backslashreplace")
        if isinstance(host, str) and host:
            return host, value[1]
    return None


def _pair_in(values: dict) -> "tuple[str, int] | None":
    for name in _ADDRESS_NAMES:
        found = _pair(values.get(name))
        if found is not None:
            return found
    ports = [values[name] for name in _PORT_NAMES if isinstance(values.get(name), int)]
    hosts = [values[name] for name in _HOST_NAMES if isinstance(values.get(name), str)]
    if ports and hosts:
        return hosts[0], ports[0]
    return None


def listening(port: int, pid: "int | None" = None) -> "bool | None":
    """Whether a TCP socket listens on PORT in PID's network namespace (None: this process's); None when
    /proc cannot say."""
    where = "self" if pid is None else str(pid)
    known = False
    for table in ("tcp", "tcp6"):
        rows = procstat.net_rows(where, table)
        if rows is None:
            continue
        known = True
        for fields in rows:
            if len(fields) > 3 and fields[3] == _LISTEN and int(fields[1].rpartition(":")[2], 16) == port:
                return True
    return False if known else None


def words(address: "tuple[str, int] | None", refused: "int | None", pid: "int | None" = None) -> str:
    """`retrying a connection to HOST:PORT, refused N times; nothing listens there`, with what is known.

    REFUSED: the refusals counted (None: not counted, one look).
    """
    where = f" to {joined(address)}" if address else ""
    text = f"retrying a connection{where}"
    if refused is not None:
        text += f", refused {refused} time{'s' if refused != 1 else ''}"
    else:
        text += ", refused"
    return text + listener_note(address, pid)


def listener_note(address: "tuple[str, int] | None", pid: "int | None" = None) -> str:
    """`; nothing listens there`, or what else refuses a connection to ADDRESS; empty when unknown."""
    if address is None:
        return ""
    # A refusal is the host's answer that nothing listens on the port; a listener seen in this network
    # namespace on a loopback address means something else refuses (a full backlog, a firewall).
    if _loopback(address[0]) and listening(address[1], pid):
        return f"; a socket listens on port {address[1]} here, yet refuses (a full backlog? a firewall?)"
    return "; nothing listens there"


def _loopback(host: str) -> bool:
    return host.startswith("127.") or host in ("::1", "localhost", "::ffff:127.0.0.1")


def joined(address: tuple[str, int]) -> str:
    host, port = address
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def environ(pid: int) -> dict[str, str]:
    """PID's environment as it started (/proc/PID/environ); empty when unreadable."""
    try:
        with open(f"/proc/{pid}/environ", "rb") as file:
            data = file.read(1 << 20)
    except OSError:
        return {}
    found = {}
    for entry in data.split(b"\0"):
        name, equals, value = entry.partition(b"=")
        if equals:
            found[os.fsdecode(name)] = os.fsdecode(value)
    return found
