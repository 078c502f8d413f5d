"""What a log starts with: the process, the interpreter, the environment that matters for hangs;
and the one rule that masks secrets in it, and wherever else importwatch shows a command line."""

from __future__ import annotations

import os
import sys

from importwatch.events import ENV, NO_ENV, START, TORCH, VERDICT

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

    from importwatch.facts.cuda import TorchFacts
    from importwatch.tracing.sink import Sink

# Variables that decide where a job looks for libraries, devices and peers.
VARIABLES = (
    "CUDA_VISIBLE_DEVICES",
    "NVIDIA_VISIBLE_DEVICES",
    "CUDA_HOME",
    "CUDA_PATH",
    "LD_LIBRARY_PATH",
    "LD_PRELOAD",
    "PYTHONPATH",
    "PYTHONHOME",
    "VIRTUAL_ENV",
    "CONDA_PREFIX",
    "MASTER_ADDR",
    "MASTER_PORT",
    "RANK",
    "LOCAL_RANK",
    "WORLD_SIZE",
    "LOCAL_WORLD_SIZE",
    "OMP_NUM_THREADS",
)
PREFIXES = ("NCCL_", "TORCH_", "CUDA_", "GLOO_", "TORCHELASTIC_")


# -- secrets ------------------------------------------------------------------------------------
# A log is often read by others than the job's owner (attached to a ticket, left in a shared
# folder): the start line's argv, the env line, doctor's environment, inspect's and bisect's
# command lines, report's reading of old logs and the watcher's view of other processes' command
# lines all pass through these. It runs at start-up in the traced process: no `re`, no imports.
MASK = "***"

# Words that make a name secret wherever they appear in it (PGPASSWORD, --max-tokens: the safe side).
_ANYWHERE = ("TOKEN", "SECRET", "PASSWORD", "PASSWD")
# Cheap first test: a name that holds none of these is no secret (most are not).
_HINTS = ("TOKEN", "SECRET", "PASS", "AUTH", "CRED", "KEY")
# KEY only as a word of the name (--key, API_KEY) or the end of one of these (apikey): not --monkey.
_KEY_WORDS = ("KEY", "APIKEY", "ACCESSKEY", "PRIVATEKEY", "AUTHKEY", "SIGNINGKEY", "CLIENTKEY", "SSHKEY")
# A name whose last word says the value is a place (--keys-file, --password-file) names where a
# secret is kept, not the secret: it is shown.
_PLACES = ("FILE", "PATH", "DIR", "FOLDER")


def _words(upper: str) -> list[str]:
    """The words of an upper-case name, split at every character that is not a letter or a digit."""
    words, word = [], ""
    for char in upper:
        if char.isalnum():
            word += char
        elif word:
            words.append(word)
            word = ""
    if word:
        words.append(word)
    return words


def is_secret(name: str) -> bool:
    """Whether NAME (a variable, an option, a NAME=value's name) says its value is a secret: it holds
    TOKEN, SECRET, PASSWORD or PASSWD anywhere, or a word PASS, AUTH, CRED..., KEY (see _KEY_WORDS),
    in any case; unless its last word is FILE, PATH, DIR or FOLDER."""
    upper = name.upper()
    # Spelled out, not any() over a generator: this runs for every argument at start-up.
    if not ("TOKEN" in upper or "SECRET" in upper or "PASS" in upper or "AUTH" in upper or "CRED" in upper
            or "KEY" in upper):  # fmt: skip
        return False
    words = _words(upper)
    if not words or words[-1] in _PLACES:
        return False
    for word in words:
        if "TOKEN" in word or "SECRET" in word or "PASSWORD" in word or "PASSWD" in word:
            return True
        if word == "PASS" or word.startswith(("PASSPHRASE", "PASSCODE", "PASSKEY")):
            return True
        if word == "AUTH" or word.startswith(("AUTHORIZ", "AUTHTOKEN")) or word.endswith("OAUTH"):
            return True
        if word.startswith("CRED") or word in _KEY_WORDS:
            return True
    return False


def mask_text(text: str) -> str:
    """TEXT with the password of each URL (`scheme://user:PASSWORD@host`) and each bearer token masked."""
    if "://" in text:
        text = _mask_urls(text)
    lower = text.lower()
    at = lower.find("bearer ")
    while at >= 0:
        begin = at + len("bearer ")
        while begin < len(text) and text[begin] == " ":
            begin += 1
        end = begin
        while end < len(text) and not text[end].isspace() and text[end] not in "'\",;":
            end += 1
        if end > begin and text[begin:end] != MASK:
            text = text[:begin] + MASK + text[end:]
            lower = text.lower()
        at = lower.find("bearer ", begin)
    return text


def _mask_urls(text: str) -> str:
    at = text.find("://")
    while at >= 0:
        begin = at + 3
        end = begin
        # The authority ends at the path, the query, a quote or a space (a URL inside -c code).
        while end < len(text) and text[end] not in "/?#'\" \t\n":
            end += 1
        authority = text[begin:end]
        userinfo, has_at, _ = authority.rpartition("@")
        user, colon, password = userinfo.partition(":")
        if has_at and colon and password != MASK:
            text = text[:begin] + user + ":" + MASK + text[begin + len(userinfo) :]
            end = begin + len(user) + 1 + len(MASK)
        at = text.find("://", end)
    return text


def mask_argv(argv: list[str]) -> list[str]:
    """ARGV with secrets masked.

    `--password=xyz` and `db.api_key=xyz` (a NAME=value anywhere) keep their name;
    `--token X` and `-password X` mask the next argument, unless it is a long option itself;
    `-pVALUE` (a short -p with its value attached, as mysql takes a password) masks the value;
    a URL's password and a bearer token are masked in any argument.
    """
    masked: list[str] = []
    hide_next = False
    for arg in argv:
        if hide_next:
            hide_next = False
            if not arg.startswith("--"):
                masked.append(MASK)
                continue
        name, equals, _ = arg.partition("=")
        if equals and is_secret(name):
            masked.append(name + equals + MASK)
            continue
        if arg.startswith("-") and len(arg) > 1:
            if is_secret(arg):  # -passwd X: the value comes next
                hide_next = True
            elif arg.startswith("-p") and len(arg) > 2 and arg[2] != "-":
                masked.append("-p" + MASK)
                continue
        masked.append(mask_text(arg))
    return masked


def mask_environment(variables: dict[str, str]) -> dict[str, str]:
    """VARIABLES with the value of each secret-looking name masked (and URLs' passwords in the rest),
    in the same order."""
    return {name: MASK if is_secret(name) else mask_text(value) for name, value in variables.items()}


def relevant_environment(environ: dict[str, str] | os._Environ[str] = os.environ) -> dict[str, str]:
    """The variables that matter for hangs, those that are set, in a stable order, secrets masked."""
    found = {name: environ[name] for name in VARIABLES if name in environ}
    for name in sorted(environ):
        if name.startswith(PREFIXES) and name not in found:
            found[name] = environ[name]
    return mask_environment(found)


def write_banner(sink: Sink, argv: list[str]) -> None:
    """The first lines of a traced process: who it is, and what it was given (secrets masked)."""
    argv = mask_argv(argv)
    try:
        cwd = os.getcwd()
    except OSError as error:
        cwd = f"<unavailable: {error.strerror}>"
    version = ".".join(str(part) for part in sys.version_info[:3])
    system = os.uname()  # not the platform module: it costs milliseconds at start-up
    where = f"{system.sysname}-{system.release}-{system.machine}"
    fields = {"python": version, "executable": sys.executable, "argv": argv, "cwd": cwd, "platform": where}
    if sink.dump_fd() != sink.stderr.fd:
        # A stall that holds the GIL (a dlopen) can only be dumped by faulthandler, to one file: the
        # log. Said now, on the terminal too, since nothing of ours can speak there at that moment.
        fields["dumps"] = sink.log_path
    sink.event(START, fields)
    variables = relevant_environment()
    text = " ".join(f"{name}={value}" for name, value in variables.items())
    if not text:
        text = NO_ENV
    sink.event(ENV, {"message": text, "env": variables})


def torch_loaded(sink: Sink, torch: Any) -> None:
    """Once torch has imported: its version and the CUDA it was built for, without touching CUDA."""
    version = getattr(torch, "__version__", "?")
    cuda = getattr(getattr(torch, "version", None), "cuda", None)
    build = f"built for CUDA {cuda}" if cuda else "CPU build, no CUDA"
    where = os.path.dirname(getattr(torch, "__file__", "") or "") or "?"
    sink.event(
        TORCH,
        {"message": f"{version} ({build}) at {where}", "version": str(version), "cuda": cuda, "path": where},
    )


def torch_before(sink: Sink, cuda: Any, facts: TorchFacts | None, driver: str | None) -> None:
    """Before torch starts importing: what its files say, so a hang inside `import torch` has it logged.

    CUDA is importwatch.facts.cuda, which the native loads import when first needed (NativeLoads.fact).
    """
    if facts is None:
        return
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    line = cuda.describe_torch(facts, driver, cuda.gpus(), visible)
    fields = {"version": facts.version, "cuda": facts.cuda, "path": facts.path, "driver": driver}
    # describe_torch's line starts with the word torch, the kind's head.
    sink.event(TORCH, {"message": f"{line.removeprefix('torch ')} (from its files, before import)", **fields})
    for verdict in cuda.driver_verdicts(facts, driver):
        sink.event(VERDICT, {"verdict": verdict})
