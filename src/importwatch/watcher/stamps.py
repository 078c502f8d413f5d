"""When the program wrote a line, on the watcher's monotonic clock: the stamp the line carries, placed.

The ring is read ten times a second, and a watcher busy starting (or reporting) reads
later still: a step timed from when its line was read would look younger than the
program's own watchdog finds it, and the program's report, or its --exit-on-stall,
would come before the outside view (see docs/decisions.md).
"""

from __future__ import annotations

import time

from importwatch.events.read import seconds_of_day

TYPE_CHECKING = False
if TYPE_CHECKING:
    from importwatch.events.read import Event


class Stamps:
    """The lines of one reading, read at NOW: each placed by its stamp. A stamp that cannot be placed
    (the wall clock stepped, the time zone changed) counts as read NOW."""

    __slots__ = ("now", "of_day", "wall")

    # A line older than this is a stepped clock rather than a late read: the ring is read 10 times a second.
    LATEST = 600.0

    def __init__(self, now: float) -> None:
        self.now = now
        self.wall = time.time()
        local = time.localtime(self.wall)
        self.of_day = local.tm_hour * 3600 + local.tm_min * 60 + local.tm_sec + self.wall % 1

    def written(self, event: Event) -> float:
        """EVENT's time of writing: NOW less how long ago its stamp was."""
        if event.time is not None:  # a JSON line: seconds since the epoch
            ago = self.wall - event.time
        else:  # a text line: HH:MM:SS.mmm, local time
            try:
                ago = self.of_day - seconds_of_day(event.clock)
            except ValueError:
                return self.now
            if ago < -43200:  # written before midnight, read after
                ago += 86400
        return self.now - ago if 0.0 < ago < self.LATEST else self.now
