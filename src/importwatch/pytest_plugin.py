"""`pytest -p importwatch`: tracing for a pytest process, collection included, set by IMPORTWATCH_* variables."""

from __future__ import annotations

import os

from importwatch import config
from importwatch.tracing import session


def start() -> None:
    """Switch tracing on, writing to a copy of stderr that pytest's output capture leaves alone."""
    if session.active() is not None:
        return  # IMPORTWATCH=1 already traces this process
    settings, warnings = config.merge()
    try:
        stderr_fd = os.dup(2)
    except OSError:
        stderr_fd = 2
    os.set_inheritable(stderr_fd, False)
    session.activate(settings, warnings, stderr_fd=stderr_fd)
