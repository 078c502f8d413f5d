"""A deadlock across the GIL in an inspected process: an extension's init holds the GIL and waits for
a native mutex whose owner waits for the GIL. Said in one line (facts/gil.py's words, the watcher's
too), and each thread with a part in it says that part instead of its /proc state."""

from __future__ import annotations

from importwatch.facts import gil, process

TYPE_CHECKING = False
if TYPE_CHECKING:
    from importwatch.facts.process import ThreadSample


def gil_deadlock(
    pid: int, threads: list[dict], samples: dict[int, ThreadSample], native: dict[int, list[str]]
) -> str | None:
    """The relation's line, first among the problems; None when no thread waits for a mutex while
    holding the GIL in an extension's init. The threads' entries get their part (`relation`)."""
    names = {thread["tid"]: thread["name"] for thread in threads}

    def name(tid: int) -> str:
        return f"{names.get(tid) or f'thread-{tid}'} (tid {tid})"

    for thread in threads:
        load = thread.get("load")
        found = gil.crossing(pid, samples, thread["tid"], native, in_load=load is not None)
        if found is None:
            continue
        for other in threads:
            part = found.words_for(other["tid"], name)
            if part is None:
                continue
            other["relation"] = part
            if other["tid"] in found.waiters:  # it polls the GIL: /proc may catch it running, yet it waits
                other["state"], other["verdict"] = gil.GIL_WAIT, process.WAITING
        where = f"the load of {load['file'] or load['initialising']}" if load else "an extension's init"
        verdict, words = found.sentence(name, where)
        return f"{verdict}: {words}"
    return None
