"""The watcher's `outside:` lines read back into their fields, as events/__init__.py renders them.

Which line it is (a headline, a thread, the library initialising, what a load mapped) is told by
its shape; a line of none of these shapes is a detail in words (`message`).
"""

import re

from importwatch.events import _MAX_ID, MAX_MS, OUTSIDE_HEADS, OUTSIDE_STILL

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

_VERDICTS = {head: verdict for verdict, head in OUTSIDE_HEADS.items()}
_STILL = {**_VERDICTS, **{words: verdict for verdict, words in OUTSIDE_STILL.items()}}
_HEAD = "|".join(re.escape(head) for head in sorted(_VERDICTS, key=len, reverse=True))
_STILL_HEAD = "|".join(re.escape(head) for head in sorted(_STILL, key=len, reverse=True))
# A first headline starts with its verdict's head (or a verdict word of a newer version); a later
# one with `still HEAD after N s (report K)`.
_FIRST = re.compile(rf"^({_HEAD}|[a-z]{{1,20}}): ")
_REPEAT = re.compile(
    rf"^still ({_HEAD}|[a-z]{{1,20}}) after (\d{{1,15}}(?:\.\d{{1,15}})?) s \(report (\d{{1,9}})\): "
)
# `LABEL (tid N, COMM): STATE: VERDICT[; WAITS]` for a thread of the program's, `LABEL (tid N): WHAT`
# for one of ours. Labels have no spaces (the Sink's thread names); a comm is at most 64 bytes.
_THREAD = re.compile(r"^(\S+) \(tid (\d{1,10})(?:, (.{1,64}?))?\): (.*)$", re.DOTALL)
_INITIALISING = re.compile(r"^most likely initialising: (.*) \(([^()]*)\)$", re.DOTALL)
_MAPPED = "mapped since dlopen "


def fields(rest: str) -> "dict[str, Any]":
    """The fields of the line whose words after `outside: ` are REST."""
    look = _headline(rest)
    if look is not None:
        return look
    if rest.startswith(_MAPPED):
        load, found, names = rest[len(_MAPPED) :].partition(" began: ")
        if found:
            return {"load": load, "names": names.split(", ")}
    match = _INITIALISING.match(rest)
    if match is not None:
        return {"initialising": match.group(1), "how": match.group(2)}
    thread = _thread(rest)
    return thread if thread is not None else {"message": rest}


def _headline(rest: str) -> "dict[str, Any] | None":
    said: dict[str, Any] = {}
    match = _REPEAT.match(rest)
    if match is not None:
        after = float(match.group(2))
        if after > MAX_MS / 1000:
            return None
        said = {"report": int(match.group(3)), "after": after}
    else:
        match = _FIRST.match(rest)
        if match is None:
            return None
    look, found, chain = rest[match.end() :].partition("; in flight: ")
    stalled, named, chain = chain.partition(": ")
    if not found or not named or not stalled or " " in stalled:
        return None
    verdict = (_STILL if said else _VERDICTS).get(match.group(1), match.group(1))
    return {"verdict": verdict, "look": look, "stalled": stalled, "chain": chain, **said}


def _thread(rest: str) -> "dict[str, Any] | None":
    match = _THREAD.match(rest)
    if match is None:
        return None
    label, tid, comm, said = match.groups()
    if int(tid) >= _MAX_ID:
        return None
    fields: dict[str, Any] = {"thread_name": label, "tid": int(tid)}
    if comm is None:  # one of ours
        return {**fields, "ours": said}
    state, found, verdict = said.partition(": ")
    verdict, _, waits = verdict.partition("; ")
    if not found or not verdict.isalpha():
        return None
    return {**fields, "comm": comm, "state": state, "verdict": verdict, "waits": waits or None}
