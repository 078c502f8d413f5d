"""Module locks a fork child inherits held: recorded at each fork, so a child's report can name the holder.

Only the forking thread lives on in a fork child. A module lock that another
thread held at the fork stays held in the child for ever, and the child can no
longer learn that thread's name: both are noted just before the fork.
"""

import _frozen_importlib as _bootstrap
import _thread
import os
import sys

from importwatch.events import escape

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Callable


class ForkRecord:
    """The module locks other threads held at the last fork: a child inherits them held, for ever."""

    def __init__(self) -> None:
        self.parent = 0  # the pid that forked, 0 before any fork
        # module name: (its lock, the holder's ident, the holder's name), for locks held by other threads
        self.held: dict[str, tuple[object, int, str]] = {}


FORK = ForkRecord()


def note_locks_at_fork() -> None:
    """Before a fork: the module locks held by threads other than the forking one, with their names.

    Only the forking thread lives on in the child, so a lock held by another one
    is never released there; and the child cannot learn the holder's name later.
    The record keeps those locks alive until the fork has been made.
    """
    held = {}
    me = _thread.get_ident()
    threading = sys.modules.get("threading")
    names = getattr(threading, "_active", None) or {}
    for name, ref in list(_bootstrap._module_locks.items()):
        lock = ref()
        owner = getattr(lock, "owner", None)
        if owner is not None and owner != me:
            thread = names.get(owner)
            held[name] = (lock, owner, thread.name if thread is not None else f"thread-{owner:#x}")
    FORK.parent = os.getpid()
    FORK.held = held


def forgotten_in_parent() -> None:
    FORK.held = {}  # the parent's locks live on with their threads: nothing to keep


def lost_in_fork(module: str, owner: int) -> "str | None":
    """When module MODULE's lock, held by OWNER, was inherited held through a fork: the holder's name."""
    record = FORK.held.get(module)
    if record is None or FORK.parent == os.getpid():
        return None
    lock, ident, name = record
    ref = _bootstrap._module_locks.get(module)
    if ident != owner or ref is None or ref() is not lock:
        return None
    return name


def owner_text(module: str, owner: int, thread_name: "Callable[[int], str]") -> str:
    """The holder of MODULE's lock, by name; one lost in a fork says so."""
    lost = lost_in_fork(module, owner)
    if lost is not None:
        return f"{escape(lost)} in the parent {FORK.parent}, lost in the fork"
    return thread_name(owner)
