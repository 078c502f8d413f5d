"""Init steps known to block forever, wrapped where present and watched: rendezvous, CUDA init, builds.

Each wrapper writes a start line that already says what the step waits for (the
rendezvous variables, the lock file), flushed before the call: if the step
holds the GIL, faulthandler's dump and that line are all there is. A stall
report adds what only a look at stall time can say (does the port answer, how
old is the lock). Nothing here imports torch: each wrapper is put in place when
torch's own module finishes importing.

This module itself is imported only when one of the modules it wraps arrives
(session.BLOCKING_TARGETS), through Tracer.import_own, which writes no line for
it; so at its top it imports only what start-up has imported already, and the
rest through import_own too (a line of ours must not appear in the program's log).
"""

import _thread
import os
import sys

from importwatch.events import SIGNAL  # loaded at start-up, by the Sink
from importwatch.masking import mask_environment
from importwatch.tracing import threads
from importwatch.tracing.hook import door
from importwatch.tracing.sink import CLOCKS

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any, Callable

    from importwatch.tracing.hook import Tracer

# What a distributed rendezvous reads from the environment, in the order a report lists them.
DISTRIBUTED_VARIABLES = ("MASTER_ADDR", "MASTER_PORT", "RANK", "WORLD_SIZE", "LOCAL_RANK")

# Bounds on what a stall report may spend finding out whether the rendezvous address answers.
RESOLVE_SECONDS = 1.0
CONNECT_SECONDS = 0.5

_MARK = "__importwatch_original__"  # set on our wrappers: the function they replaced


class BlockingSteps:
    """Puts the wrappers in place when torch's modules arrive, and takes them out again."""

    def __init__(self, tracer: "Tracer") -> None:
        self.tracer = tracer
        self.sink = tracer.sink
        self._socket: Any = None
        self._wrapped: list[tuple[Any, str, Callable]] = []  # module, attribute, original
        self._targets = {
            "torch.distributed.distributed_c10d": self._wrap_distributed,
            "torch.cuda": self._wrap_cuda,
            "torch.utils.cpp_extension": self._wrap_cpp_extension,
            # Not a step: a pool terminating its workers, told so that a worker's cut chain reads so.
            "multiprocessing.popen_fork": self._wrap_popen_fork,
        }

    def install(self) -> None:
        """Wrap the targets already imported; the others when they arrive (see arrive)."""
        for name, wrap in self._targets.items():
            module = sys.modules.get(name)
            if module is not None:
                self.tracer.safely(wrap, module)

    def arrive(self, name: str, module: "Any") -> None:
        """Module NAME, one of the targets, has just been imported: wrap its steps (Session calls this)."""
        self._targets[name](module)

    def uninstall(self) -> None:
        for module, attribute, original in reversed(self._wrapped):
            if getattr(getattr(module, attribute, None), _MARK, None) is original:
                setattr(module, attribute, original)
        self._wrapped.clear()

    def _replace(
        self,
        module: "Any",
        attribute: str,
        enter: "Callable",
        original: "Callable",
        leave: "Callable | None" = None,
    ) -> "Callable":
        """MODULE.ATTRIBUTE, ORIGINAL, made a door (hook.door) with ENTER before it: what ENTER returns
        (begin's token, or None to call ORIGINAL as is) is ended by LEAVE (end_step) after ORIGINAL. With
        the C accelerator no frame of ours is below ORIGINAL: the traceback of a CUDA initialisation that
        fails, or of a rendezvous that times out, reads as under plain python."""
        made = door(original, enter, leave or self.tracer.end_step, importing=False)
        setattr(made, _MARK, original)
        setattr(module, attribute, made)
        self._wrapped.append((module, attribute, original))
        return made

    # -- one step ---------------------------------------------------------
    def begin(
        self, name: str, detail: str, problems: "list[str]", context: "Callable[[], list[str]] | None"
    ) -> tuple:
        """The step NAME begun: its start line, then PROBLEMS as verdicts; what tracer.end_step needs."""
        return self.tracer.begin_step(f"step {name}", {"name": name, "detail": detail}, context, problems)

    # -- multiprocessing's terminate and kill -------------------------------------------
    def _wrap_popen_fork(self, module: "Any") -> None:
        """A line when the program signals a multiprocessing child (Pool.terminate, Process.kill).

        The child dies without a word (SIGTERM's default): without this line its
        imports in flight would read as a hang in `report`. Every start method's
        Popen on POSIX signals through popen_fork.Popen._send_signal.
        """
        popen = getattr(module, "Popen", None)
        original = getattr(popen, "_send_signal", None)
        if original is None or hasattr(original, _MARK):
            return
        sink = self.sink
        safely = self.tracer.safely
        signal_name = self.tracer.import_own("importwatch.signame").signal_name

        def note(sent: "tuple[int, int]") -> None:
            # A number the signal module does not name stays one word: report reads the line back.
            pid, name = sent[0], signal_name(sent[1], unknown="{}")
            sink.event(SIGNAL, {"signal": name, "child": pid, "via": "multiprocessing"})

        def _send_signal(self: "Any", sig: int) -> None:
            if self.returncode is None:  # as the original: a child already reaped is not signalled
                safely(note, (self.pid, sig))

        self._replace(popen, "_send_signal", _send_signal, original)

    # -- torch.distributed.init_process_group ---------------------------------------
    def _wrap_distributed(self, c10d: "Any") -> None:
        original = getattr(c10d, "init_process_group", None)
        if original is None or hasattr(original, _MARK):
            return
        import socket  # only now: this process does use torch.distributed (torch imported it already)

        self._socket = socket
        names = _parameters(original)
        steps = self

        def init_process_group(*args: "Any", **kwargs: "Any") -> "Any":
            call = _bind(names, args, kwargs)
            rendezvous = Rendezvous(
                os.environ,
                init_method=call.get("init_method"),
                rank=_as_int(call.get("rank", -1)),
                world_size=_as_int(call.get("world_size", -1)),
                store=call.get("store") is not None,
            )
            if rendezvous.rank is not None and rendezvous.rank != steps.sink.rank:
                steps.sink.set_rank(rendezvous.rank)  # a rank given as an argument (mp.spawn)
            backend = call.get("backend")
            detail = f"backend={backend} {rendezvous.describe()}"
            if call.get("timeout") is not None:
                detail += f" timeout={call['timeout']}"
            return steps.begin(
                "torch.distributed.init_process_group",
                detail,
                rendezvous.problems,
                lambda: rendezvous.context(steps._socket),
            )

        made = self._replace(c10d, "init_process_group", init_process_group, original)
        package = sys.modules.get("torch.distributed")  # imported before us: its copy of the name
        if package is not None and getattr(package, "init_process_group", None) is original:
            package.init_process_group = made
            self._wrapped.append((package, "init_process_group", original))

    # -- the first CUDA initialisation ------------------------------------------------
    def _wrap_cuda(self, cuda: "Any") -> None:
        original = getattr(cuda, "_lazy_init", None)
        if original is None or hasattr(original, _MARK):
            return
        steps = self
        end_step = self.tracer.end_step

        def _lazy_init() -> "Any":
            # Called before most CUDA calls: once CUDA is up (or while it comes up), go straight through.
            if getattr(cuda, "_initialized", False) or hasattr(
                getattr(cuda, "_tls", None), "is_initializing"
            ):
                return None
            variables = {
                name: value for name, value in os.environ.items() if name.startswith(("CUDA_", "NVIDIA_"))
            }
            variables = mask_environment(variables)
            shown = " ".join(f"{name}={value}" for name, value in sorted(variables.items()))
            detail = "(first CUDA initialisation) " + (shown or "CUDA_VISIBLE_DEVICES not set")
            return steps.begin("torch.cuda._lazy_init", detail, [], _cuda_context)

        def ended(token: tuple, error: "BaseException | None") -> None:
            end_step(token, error)
            ours = getattr(getattr(cuda, "_lazy_init", None), _MARK, None) is original
            if ours and getattr(cuda, "_initialized", False):
                cuda._lazy_init = original  # initialised for good: later calls cost nothing

        self._replace(cuda, "_lazy_init", _lazy_init, original, ended)

    # -- torch.utils.cpp_extension.load ----------------------------------------------------
    def _wrap_cpp_extension(self, module: "Any") -> None:
        for attribute in ("load", "load_inline"):
            original = getattr(module, attribute, None)
            if original is not None and not hasattr(original, _MARK):
                self._replace(module, attribute, self._build_enter(module, attribute, original), original)

    def _build_enter(self, module: "Any", attribute: str, original: "Callable") -> "Callable":
        names = _parameters(original)
        steps = self
        step = f"torch.utils.cpp_extension.{attribute}"

        def build(*args: "Any", **kwargs: "Any") -> "Any":
            call = _bind(names, args, kwargs)
            name = call.get("name")
            directory = call.get("build_directory") or _default_build_directory(module, name)
            if not directory:
                return steps.begin(step, f"name={name}", [], None)
            lock = os.path.abspath(os.path.join(str(directory), "lock"))
            problems = []
            age = file_age(lock)
            if age is not None:
                problems.append(
                    f"lock file {lock} is {format_age(age)} old: torch waits until it is gone; "
                    "if no build of this extension is running, remove it"
                )
            return steps.begin(
                step, f"name={name} build_directory={directory}", problems, lambda: lock_context(lock)
            )

        return build


class Rendezvous:
    """What a call of init_process_group will wait for, from its arguments and the environment."""

    def __init__(
        self,
        environ: "dict[str, str] | os._Environ[str]",
        init_method: "str | None" = None,
        rank: int = -1,
        world_size: int = -1,
        store: bool = False,
    ) -> None:
        # torch treats an empty variable as a missing one.
        self.values = {name: environ[name] for name in DISTRIBUTED_VARIABLES if environ.get(name)}
        self.missing = [name for name in DISTRIBUTED_VARIABLES if name not in self.values]
        self.problems: list[str] = []
        self.method = "a store passed in" if store else str(init_method or "env://")
        self.uses_env = not store and self.method.startswith("env://")
        self.host: str | None = None
        self.port: int | None = None
        self._lookup: _Lookup | None = None
        numbers = {name: self._number(name) for name in ("MASTER_PORT", "RANK", "WORLD_SIZE", "LOCAL_RANK")}
        if self.uses_env:
            self.host = self.values.get("MASTER_ADDR")
            self.port = numbers["MASTER_PORT"]
            if "MASTER_ADDR" in self.missing:
                self.problems.append("MASTER_ADDR is not set: env:// needs the address where rank 0 listens")
            if "MASTER_PORT" in self.missing:
                self.problems.append("MASTER_PORT is not set: env:// needs the port where rank 0 listens")
        elif self.method.startswith("tcp://"):
            self.host, self.port = _host_port(self.method[len("tcp://") :].split("?")[0])
        self.rank = self._pick(rank, "RANK", numbers["RANK"], "rank")
        self.world_size = self._pick(world_size, "WORLD_SIZE", numbers["WORLD_SIZE"], "world_size")
        self._check(numbers["LOCAL_RANK"])

    def _number(self, name: str) -> "int | None":
        text = self.values.get(name)
        if text is None:
            return None
        try:
            value = int(text)
        except ValueError:
            self.problems.append(f"{name}={text!r} is not a whole number")
            return None
        if name == "MASTER_PORT" and not 0 < value < 65536:
            self.problems.append(f"MASTER_PORT={value} is not a TCP port (1-65535)")
            return None
        return value

    def _pick(self, given: int, variable: str, from_env: "int | None", argument: str) -> "int | None":
        """The value torch will use: the argument if given, else (env://) the variable."""
        if given >= 0:
            if from_env is not None and from_env != given and self.uses_env:
                self.problems.append(
                    f"{argument}={given} was passed but {variable}={from_env}: the argument wins"
                )
            return given
        if not self.uses_env:
            return None
        if variable in self.missing:
            self.problems.append(f"{variable} is not set and no {argument}= was passed")
        return from_env

    def _check(self, local_rank: "int | None") -> None:
        rank, size = self.rank, self.world_size
        if size is not None and size < 1:
            self.problems.append(f"the world size is {size}: it must be at least 1")
        elif rank is not None and size is not None and rank >= size:
            self.problems.append(f"rank {rank} is not below the world size {size}: no such rank")
        if local_rank is not None and rank is not None and local_rank > rank:
            self.problems.append(f"LOCAL_RANK={local_rank} is above the rank {rank}")

    def variables(self) -> str:
        """`MASTER_ADDR=h MASTER_PORT=p ...; not set: LOCAL_RANK`."""
        text = " ".join(f"{name}={value}" for name, value in self.values.items())
        if self.missing:
            text += ("; " if text else "") + "not set: " + ", ".join(self.missing)
        return text

    def describe(self) -> str:
        """The start line's details: how it meets its peers, who it is, and the variables."""
        return f"init_method={self.method} rank={self.rank} world_size={self.world_size} {self.variables()}"

    def context(self, socket: "Any") -> "list[str]":
        """For a stall report (the heartbeat thread): who waits for whom, and does the address answer."""
        who = f"rank {self.rank}" if self.rank is not None else "this process"
        size = f" of {self.world_size}" if self.world_size is not None else ""
        where = f" at {self.host}:{self.port}" if self.host and self.port else ""
        lines = [
            f"torch.distributed.init_process_group: {who}{size} waits for its peers{where} ({self.method})"
        ]
        lines.append(self.variables() or "none of " + ", ".join(DISTRIBUTED_VARIABLES) + " is set")
        if socket is not None and self.host and self.port:
            lines.append(self.probe(socket))
        lines.extend(self.problems)
        return lines

    def probe(self, socket: "Any") -> str:
        """Does the address resolve, does the port answer; bounded to about 1.5 s, once per report."""
        if self._lookup is None:
            self._lookup = _Lookup(socket, self.host or "", self.port or 0)
        lookup = self._lookup
        what = f"MASTER_ADDR={self.host}" if self.uses_env else f"host {self.host}"
        if not lookup.wait(RESOLVE_SECONDS):
            return f"{what} does not resolve within {RESOLVE_SECONDS:g} s (a slow or dead DNS server?)"
        if isinstance(lookup.result, str):
            return f"{what} does not resolve: {lookup.result}"
        family, address = lookup.result
        head = f"{what} resolves to {address[0]}; port {self.port}"
        probe = socket.socket(family, socket.SOCK_STREAM)
        probe.settimeout(CONNECT_SECONDS)
        try:
            probe.connect(address)
        except socket.timeout:
            return f"{head}: no answer within {CONNECT_SECONDS:g} s (a firewall, or the wrong address)"
        except ConnectionRefusedError:
            return f"{head}: nothing listens there (connection refused): rank 0 has not started its store"
        except OSError as error:
            return f"{head}: cannot connect: {error.strerror or error}"
        finally:
            probe.close()
        return f"{head} answers: rank 0's store is up, so the wait is for ranks that have not joined"


class _Lookup:
    """getaddrinfo in a thread of its own: it takes no timeout, and a stall report must not hang on DNS."""

    def __init__(self, socket: "Any", host: str, port: int) -> None:
        self.result: tuple[int, tuple] | str = "not resolved"
        self._done = _thread.allocate_lock()
        self._done.acquire()
        # Bytes: a str host would be encoded with the idna codec, an import in this thread.
        name = host.encode("ascii", "replace")
        threads.start(self._resolve, (socket, name, port))  # every signal blocked: the program's

    def _resolve(self, socket: "Any", host: bytes, port: int) -> None:
        try:
            found = socket.getaddrinfo(host, port, 0, socket.SOCK_STREAM)
            self.result = (found[0][0], found[0][4])
        except OSError as error:
            self.result = str(error.strerror or error)
        finally:
            self._done.release()

    def wait(self, seconds: float) -> bool:
        if self._done.acquire(timeout=seconds):
            self._done.release()
            return True
        return False


def _cuda_context() -> "list[str]":
    return [
        "torch.cuda._lazy_init: the first CUDA call loads the driver and sets up every visible GPU;"
        " if this process uses CPU it is busy, not stuck (the driver may be compiling PTX for this GPU)",
        "CUDA_VISIBLE_DEVICES=" + os.environ.get("CUDA_VISIBLE_DEVICES", "(not set: every GPU)"),
    ]


def lock_context(lock: str) -> "list[str]":
    """A stall report's words on a build's lock file, as it is now."""
    age = file_age(lock)
    if age is None:
        return [f"torch.utils.cpp_extension: no lock file at {lock}: building or loading the extension"]
    return [
        f"torch.utils.cpp_extension waits for the lock file {lock}, {format_age(age)} old: "
        "another build holds it, or a killed build left it behind; if no build is running, remove it"
    ]


def file_age(path: str) -> "float | None":
    """Seconds since PATH was last modified, or None when it does not exist."""
    try:
        return max(0.0, CLOCKS.wall() - os.stat(path).st_mtime)
    except OSError:
        return None


def format_age(seconds: float, digits: int = 0) -> str:
    """SECONDS as a person reads an age: s, min, h or days; DIGITS after the point below an hour."""
    if seconds < 120:
        return f"{seconds:.{digits}f} s"
    if seconds < 7200:
        return f"{seconds / 60:.{digits}f} min"
    if seconds < 172800:
        return f"{seconds / 3600:.1f} h"
    return f"{seconds / 86400:.1f} days"


def _default_build_directory(module: "Any", name: "Any") -> "str | None":
    """Where torch will build NAME when no build_directory is given (its own private helper)."""
    finder = getattr(module, "_get_build_directory", None)
    if finder is None or not isinstance(name, str):
        return None
    try:
        return finder(name, False)
    except Exception:
        return None


def _parameters(function: "Callable") -> "tuple[str, ...]":
    """The names of FUNCTION's positional parameters, looking through decorators."""
    while hasattr(function, "__wrapped__"):
        function = function.__wrapped__
    code = getattr(function, "__code__", None)
    return code.co_varnames[: code.co_argcount] if code is not None else ()


def _bind(names: "tuple[str, ...]", args: tuple, kwargs: dict) -> "dict[str, Any]":
    call = dict(zip(names, args))
    call.update(kwargs)
    return call


def _as_int(value: "Any") -> int:
    try:
        return int(value)
    except (TypeError, ValueError):
        return -1


def _host_port(text: str) -> "tuple[str | None, int | None]":
    """`host:port` or `[v6]:port`."""
    host, _, port = text.rpartition(":")
    host = host.strip("[]") or None
    return host, int(port) if port.isdigit() else None
