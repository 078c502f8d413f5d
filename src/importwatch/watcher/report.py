"""The watcher's report of a stall, in words: a headline first, then each thread, the native load, the stacks.

The headline is one line a person can act on: the state from outside (busy, waiting on
what, stopped), the shared object in flight and whether its constructor runs, what the
program said of it, the advice, and the chain in flight. The rest is detail. Native
stacks come folded on the terminal (the interpreter's and the dynamic loader's frames
counted, importwatch's threads counted) and whole in the log, when there is one.
For a native load waiting in futex(2) the native stacks are read before the headline, which then
may name a deadlock across the GIL (facts/gil.py). Used by watcher/loop.py's Watcher, which this
class is a part of.
"""

from __future__ import annotations

import os
import re

from importwatch.events import OUTSIDE

TYPE_CHECKING = False
if TYPE_CHECKING:
    from importwatch.facts import gil, process, stacks
    from importwatch.facts.mapped import MappedObjects
    from importwatch.facts.process import ThreadSample
    from importwatch.inflight import Started

# Names the program's own threads of ours are announced under (see watchdog.py).
OUR_THREADS = {"importwatch-heartbeat": "importwatch's heartbeat (ours)"}
TIMER_THREAD = "faulthandler's timer thread, armed by importwatch (ours)"
_THREAD_LINES = 12  # threads listed one per line; the rest are counted
# Native frames the program can do nothing about, by source file or function: CPython's own, and the
# dynamic loader's (whose call_init says a constructor runs: the headline says so already).
_INTERPRETER_SOURCE = re.compile(r" at \.{0,2}/?(?:Python|Objects|Include|Parser|Programs)/")
_INTERPRETER_CODE = re.compile(
    r"^(?:_?Py|cfunction_|method_vectorcall|builtin_|do_call_core|object_vacall|import_find_and_load|"
    r"import_name|_imp_|slot_tp_|call_function|pymain_|run_mod|run_eval_code_obj|pyrun_)"
)
_LOADER_SOURCE = re.compile(r" at \.{0,2}/?(?:elf|dlfcn)/")
# Our C accelerator's frames: its shared object without debug information, its sources with it (the
# translation unit _speedups.c and its parts, _speedups_door.h and the others).
_OUR_C = re.compile(r"/_speedups(?:\.|_\w+\.h:)")


def culprit_of(chains: dict[str, list[Started]]) -> str:
    """The thread a report is about: the main thread when it has something in flight, else the first."""
    return "MainThread" if "MainThread" in chains else next(iter(chains))


def describe(step: Started, now: float) -> str:
    label = f"dlopen {step.name}" if step.kind == "native" else step.name
    return f"{label} ({now - step.start:.1f} s)"


def _frame_kind(frame: str) -> str | None:
    """'interpreter' or 'dynamic loader' for a frame of theirs, None for one worth showing."""
    words = frame.split()
    name = words[1] if len(words) > 1 else ""
    if name.startswith("0x") and len(words) > 3:  # `#N 0xADDR in NAME (...)`
        name = words[3]
    if name.lstrip("_") == "dlopen":  # the call the program made: kept, as the loader's frames fold
        return None
    if _LOADER_SOURCE.search(frame) or name in ("call_init", "_dl_init", "dl_open_worker"):
        return "dynamic loader"
    # Our C hook (tracing/_speedups.c) stands where importlib's _find_and_load stood: part of the import
    # machinery, folded with it.
    if _INTERPRETER_SOURCE.search(frame) or _INTERPRETER_CODE.match(name) or _OUR_C.search(frame):
        return "interpreter"
    return None


def folded(frames: list[str]) -> list[str]:
    """FRAMES with each run of the interpreter's or the dynamic loader's folded to a count."""
    lines: list[str] = []
    run, kind = 0, None
    for frame in frames:
        this = _frame_kind(frame)
        if this is not None and (kind is None or this == kind):
            run, kind = run + 1, this
            continue
        if run:
            lines.append(f"... {run} {kind} frame{'s' if run != 1 else ''}")
        run, kind = (1, this) if this is not None else (0, None)
        if this is None:
            lines.append(frame)
    if run:
        lines.append(f"... {run} {kind} frame{'s' if run != 1 else ''}")
    return lines


class Composing:
    """The lines of the watcher's reports (a part of watcher/loop.py's Watcher)."""

    pid: int
    tids: dict[str, int]
    samples: list[tuple[float, dict[int, ThreadSample]]]
    timer_tids: set[int]
    lost: int
    mapped: MappedObjects
    mapped_before: dict[str, None]
    sink: object
    stacks_for: Started | None
    native_for: tuple[Started | None, dict[int, list[str]]]
    stacks_timeout: float

    def _window(self) -> float:
        raise NotImplementedError

    def _in_flight(self) -> dict[str, list[Started]]:
        raise NotImplementedError

    # -- the stacks -------------------------------------------------------------------------
    def _stack_lines(
        self, found: stacks.Stacks | str, chains: dict[str, list[Started]], culprit_name: str
    ) -> tuple[list[str], list[str]]:
        """The stacks folded for the terminal, and whole for a log: the stalled thread first, then the
        other threads in flight, the rest, ours last (counted, on the terminal)."""
        if isinstance(found, str):
            return [found], [found]
        names = {tid: name for name, tid in self.tids.items()}
        first = self.tids.get(culprit_name, self.pid)
        flying = {self.tids.get(name) for name in chains}
        ordered = sorted(
            found.threads, key=lambda thread: (thread[0] != first, thread[0] not in flying, thread[0] or 0)
        )
        full: list[str] = []
        short: list[str] = []
        ours = []
        for tid, header, frames in ordered:
            label = OUR_THREADS.get(names.get(tid, ""))
            if label is None and any("faulthandler_thread" in frame for frame in frames):
                label = TIMER_THREAD
                self.timer_tids.add(tid or 0)
            if label is not None:
                ours.append(f"{header}: {label}")
                continue
            name = names.get(tid)
            head = [f"{header} {name}" if name else header] if header else []
            full += head + frames
            short += head + [f"  {line}" if line.startswith("...") else line for line in folded(frames)]
        title = f"native stacks ({found.tool}, read in {found.seconds:.1f} s with the process stopped):"
        full = [title, *(f"  {line}" for line in full), *(f"  {line}" for line in ours)]
        if ours:
            short.append(f"(and {len(ours)} thread{'s' if len(ours) != 1 else ''} of importwatch's own)")
        return [title, *(f"  {line}" for line in short)], full

    def _stacks_first(self, seen: tuple) -> stacks.Stacks | str | None:
        """The native stacks read before the headline, where they may change it: the stalled thread is
        in a native load (its init holds the GIL) and waits in futex(2), perhaps for a mutex whose
        owner waits for the GIL. None where they are read after it (or were read for this step)."""
        from importwatch.facts import gil, stacks

        chains = self._in_flight()
        if not chains:
            return None
        culprit_name = culprit_of(chains)
        step = chains[culprit_name][-1]
        current, stat = seen
        culprit = current.get(self.tids.get(culprit_name, -1))
        if (
            step is self.stacks_for
            or culprit is None
            or not gil.in_futex(culprit)
            or (stat is not None and stat.state in "Tt")
            or not any(each.kind == "native" for each in chains[culprit_name])
        ):
            return None
        self.stacks_for = step
        found = stacks.read_native_stacks(self.pid, self.stacks_timeout)
        if not isinstance(found, str):
            self.native_for = (step, {tid: frames for tid, _, frames in found.threads if tid is not None})
        return found

    def _let_go(self, early: stacks.Stacks | str | None) -> None:
        """The process goes on, if stacks read before the headline held it (idempotent)."""
        if early is not None and not isinstance(early, str) and early.holding:
            early.release()
            self.samples.clear()  # they span the stop

    # -- the report -------------------------------------------------------------------------
    def _look(self) -> tuple[dict[int, ThreadSample], process.ProcessStat | None]:
        """The threads and the process as they are now, before any debugger stops them."""
        from importwatch.facts import process

        return process.sample_threads(self.pid, detail=True), process.process_stat(self.pid)

    def _report_lines(
        self,
        now: float,
        seen: tuple[dict[int, ThreadSample], process.ProcessStat | None],
        native: dict[int, list[str]] | None = None,
    ) -> list[tuple[str, dict]]:
        """The lines of one outside report: the headline, each thread, then what the culprit's chain adds.
        SEEN: _look()'s answer; NATIVE: the native stacks per tid, when read before the headline."""
        from importwatch.facts import gil, process, waits

        pid = self.pid
        current, stat = seen
        if not current:
            return []
        earlier, seconds = self._earlier(now)
        chains = self._in_flight()
        culprit_name = culprit_of(chains)
        culprit = (
            current.get(self.tids.get(culprit_name, -1)) or current.get(pid) or next(iter(current.values()))
        )
        verdicts = {}
        for tid, sample in current.items():
            share = process.cpu_share(earlier.get(tid), sample, seconds)
            verdicts[tid] = (process.verdict(sample, share), share)
        stopped = stat is not None and stat.state in "Tt"
        if stopped:
            overall = process.STOPPED
        else:
            overall = verdicts[culprit.tid][0]
            if overall == process.GONE:
                overall = process.WAITING
        code = process.CodeRanges(pid)
        lone = self._lone_wait(culprit, code)
        in_load = any(step.kind == "native" for step in chains[culprit_name])
        crossing = None if stopped else gil.crossing(pid, current, culprit.tid, native or {}, in_load)
        detail = self._thread_lines(current, verdicts, chains, code, crossing, lone)
        if not stopped and waits.stdin_terminal(pid) and stat is not None and stat.background:
            detail.append(
                (OUTSIDE, {"message": "it reads a terminal on stdin from the background: redirect stdin"})
            )
        mapped, loading = self._mapped_lines(pid, chains[culprit_name], culprit, code)
        detail += mapped
        said = [(step.name, warning) for step in chains[culprit_name] for warning in step.warnings]
        for name, warning in said[1:]:
            detail.append((OUTSIDE, {"message": f"said for {name}: {warning}"}))
        if self.lost:
            lost = f"{self.lost} byte{'s' if self.lost != 1 else ''} of lines"
            detail.append((OUTSIDE, {"message": f"the feed lost {lost}: in-flight steps may be incomplete"}))
        chain = " > ".join(describe(step, now) for step in chains[culprit_name])
        told = None
        if overall == process.WAITING:
            told = lone[1] if lone is not None else waits.waits_on(pid, culprit)
        what = f" ({told})" if told else ""
        what += f"; {loading}" if loading else ""
        what += f"; {said[0][1]}" if said else ""
        look = self._headline(overall, culprit_name, culprit, verdicts[culprit.tid][1], seconds, stat, what)
        if crossing is not None:  # a relation across the GIL says more than the culprit's own state
            load = next(step.name for step in reversed(chains[culprit_name]) if step.kind == "native")
            overall, look = crossing.sentence(self._thread_name, f"the load of {os.path.basename(load)}")
        headline = {"verdict": overall, "look": look, "stalled": culprit_name, "chain": chain}
        return [(OUTSIDE, headline), *detail]

    def _thread_lines(
        self,
        current: dict[int, ThreadSample],
        verdicts: dict[int, tuple[str, float | None]],
        chains: dict[str, list[Started]],
        code: process.CodeRanges,
        crossing: gil.Crossing | None = None,
        lone: tuple[int, str, str] | None = None,
    ) -> list[tuple[str, dict]]:
        """One line per thread: those in flight first, then the rest, ours last; a long tail of idle
        threads is counted. A thread with a part in CROSSING says it; one that waits for the GIL says
        so for its state (it polls the GIL, so /proc may catch it running, yet it waits)."""
        from importwatch.facts import gil, process, waits

        pid = self.pid
        names = {tid: name for name, tid in self.tids.items()}
        ours = {tid: self._ours(tid, names.get(tid), sample, code) for tid, sample in current.items()}
        order = sorted(
            current, key=lambda tid: (bool(ours[tid]), names.get(tid) not in chains, tid != pid, tid)
        )
        lines: list[tuple[str, dict]] = []
        for index, tid in enumerate(order):
            if index == _THREAD_LINES:
                rest = [verdicts[t][0] for t in order[index:]]
                summary = ", ".join(f"{rest.count(v)} {v}" for v in sorted(set(rest)))
                more = f"{len(rest)} more thread{'s' if len(rest) != 1 else ''}"
                lines.append((OUTSIDE, {"message": f"{more}: {summary}"}))
                break
            sample = current[tid]
            if ours[tid]:
                label = names.get(tid) or "faulthandler-timer"
                lines.append((OUTSIDE, {"thread_name": label, "tid": tid, "ours": ours[tid]}))
                continue
            label = names.get(tid) or f"thread-{tid}"
            what, share = verdicts[tid]
            waiting = waits.waits_on(pid, sample) if what != process.BUSY else None
            if lone is not None and lone[0] == tid:
                waiting = lone[2]
            state = self._state_text(sample, share)
            part = crossing.words_for(tid, self._thread_name) if crossing is not None else None
            if part is not None:
                if tid in crossing.waiters:
                    state, what, waiting = gil.GIL_WAIT, process.WAITING, None
                waiting = f"{waiting}; {part}" if waiting else part
            thread = {"thread_name": label, "tid": tid, "comm": sample.comm, "state": state, "verdict": what}
            lines.append((OUTSIDE, {**thread, "waits": waiting or None}))
        return lines

    def _thread_name(self, tid: int) -> str:
        """A thread as a relation names it: 'NAME (tid N)', NAME its Python name when known."""
        names = {number: name for name, number in self.tids.items()}
        return f"{names.get(tid) or f'thread-{tid}'} (tid {tid})"

    def _ours(self, tid: int, name: str | None, sample: ThreadSample, code: process.CodeRanges) -> str | None:
        """What a thread of ours is, or None for the program's own threads."""
        from importwatch.facts import process

        if name in OUR_THREADS:
            return OUR_THREADS[name]
        if tid in self.timer_tids or (name is None and process.is_timer_thread(self.pid, sample, code)):
            self.timer_tids.add(tid)
            return TIMER_THREAD
        return None

    def _lone_wait(self, culprit: ThreadSample, code: process.CodeRanges) -> tuple[int, str, str] | None:
        """When the culprit waits on a futex in an OpenMP runtime and no thread here could wake it (the
        pool's threads stayed in a parent): (its tid, the headline's words, its thread line's words)."""
        from importwatch.facts import pools

        library = pools.orphaned_wait(self.pid, culprit, code)
        if library is None:
            return None  # waits_on says when no thread here can wake a futex wait
        told = pools.orphaned_pool(library, self.parent)
        return culprit.tid, told, f"in futex, in {os.path.basename(library)}: its pool has no threads here"

    def _earlier(self, now: float) -> tuple[dict[int, ThreadSample], float]:
        """The sample about one window ago, taken during the stall, and the seconds since."""
        window = self._window()
        for when, sample in self.samples:
            if now - when <= window * 1.3:
                return sample, now - when
        if self.samples:
            when, sample = self.samples[-1]
            return sample, now - when
        return {}, 0.0

    @staticmethod
    def _state_text(sample: ThreadSample, share: float | None) -> str:
        from importwatch.facts import process

        text = process.state_words(sample.state_name, process.verdict(sample, share))
        if sample.wchan:
            text += f" in {sample.wchan}"
        if share is not None:
            text += f", {share * 100:.0f}% CPU"
        return text

    def _headline(self, overall, name, culprit, share, seconds, stat, what: str) -> str:
        """The headline's look for OVERALL (the event model puts the verdict's words before it), with WHAT
        (what it waits on, the load, what was said of it)."""
        from importwatch.facts import process

        who = f"{name} {self._state_text(culprit, share)}"
        span = f" over the last {seconds:.1f} s" if seconds else ""
        if overall == process.BUSY:
            from importwatch.facts import cuda

            # CUDA JIT only where it can happen: a machine with an NVIDIA driver loaded.
            often = "CUDA JIT (compiling PTX for this GPU) or a build" if cuda.driver_version() else "a build"
            return (
                f"{who}{span}{what}; a long import that keeps a CPU busy is often {often} "
                "or a long computation, and ends by itself"
            )
        if overall == process.STOPPED:
            state = stat.state_name if stat else "stopped"
            return f"process {self.pid} is {state}, nothing runs{what}; {self._stopped_hint(stat)}"
        return f"{who}{span}{what}; not using CPU: blocked, not slow"

    def _stopped_hint(self, stat) -> str:
        if stat is not None and stat.background:
            return (
                "it is a background job of its terminal: touching the terminal stops it (SIGTTIN/SIGTTOU); "
                "redirect stdin (< /dev/null) or run it in the foreground"
            )
        from importwatch.facts import process

        tracer = process.tracer_pid(self.pid)
        if tracer:
            return (
                f"pid {tracer} {process.command_of(tracer)} is debugging it (ptrace): it goes on when freed"
            )
        return f"something stopped it (SIGSTOP or SIGTSTP); kill -CONT {self.pid} resumes it"

    def _mapped_lines(
        self, pid: int, chain: list[Started], culprit: ThreadSample, code: process.CodeRanges
    ) -> tuple[list[tuple[str, dict]], str]:
        """What the native load in flight mapped and which library most likely initialises, and the
        headline's words on that load ("" when none is in flight)."""
        from importwatch.facts import process

        load = next((step for step in reversed(chain) if step.kind == "native"), None)
        if load is None:
            return [], ""
        current = self.mapped.scan() or {}
        new = [path for path in current if path not in self.mapped_before]
        lines: list[tuple[str, dict]] = []
        if new:
            names = [os.path.basename(path) for path in new]
            lines.append((OUTSIDE, {"load": load.name, "names": names, "mapped": new}))
        on_stack = process.libraries_on_stack(pid, culprit, code)
        # The file in dlopen counts too: the watcher may read the maps only after dlopen mapped it.
        candidates = {*new, os.path.realpath(load.name), load.name}
        initialising = next((path for path in on_stack if path in candidates), None)
        running = initialising is not None
        how = "innermost new library on its stack"
        if initialising is None and new:
            # No stack to read: mmap hands out addresses top down, so the lowest is the last mapped.
            initialising, how = new[0], "mapped last"
        if initialising is None:
            initialising, how = os.path.realpath(load.name), "the file in dlopen, or one it needs"
        lines.append((OUTSIDE, {"initialising": initialising, "how": how}))
        if on_stack:
            shown = ", ".join(os.path.basename(path) for path in on_stack[:8])
            lines.append((OUTSIDE, {"message": f"libraries on the stack, innermost first: {shown}"}))
        base = os.path.basename(initialising)
        loading = (
            f"in the constructor of {base}" if running else f"in dlopen, most likely initialising {base}"
        )
        return lines, loading
