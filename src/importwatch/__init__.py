"""importwatch: say which import a silent Python job is stuck in.

The public API is small and imports nothing heavy: install() and uninstall()
switch tracing on and off in the current process; checkpoint() and phase() mark
where the program is, and do nothing while tracing is off.
"""

# No `from __future__ import annotations` here: it imports __future__, and what is loaded before
# handback.mark() below counts as the program's (docs/architecture.md, start-up imports).
import sys

from importwatch.tracing import handback

handback.mark()

__version__ = "0.1.0"
__all__ = ["__version__", "checkpoint", "install", "phase", "uninstall"]

from importwatch.tracing.phases import checkpoint, phase  # noqa: E402


def install(timeout: "float | None" = None, log: "str | None" = None, exit_on_stall: bool = False) -> None:
    """Start tracing this process now, with the IMPORTWATCH_* variables for what is not given.

    TIMEOUT is the stall threshold in seconds: 0 (the watchdog off) or 0.1 to 604800. A bad
    argument is a programming error: a ValueError that names it, and tracing stays off. A bad
    IMPORTWATCH_* variable is said once on stderr, and its default is used.
    """
    from importwatch import config
    from importwatch.tracing import session

    # False is "not asked for", so that IMPORTWATCH_EXIT_ON_STALL=1 still turns it on.
    given = {
        "timeout": timeout,
        "log": log,
        "exit_on_stall": exit_on_stall if exit_on_stall is not False else None,
    }
    session.activate(*config.merge(given, source=_argument))


def _argument(field: str) -> str:
    """How an error names install()'s argument for FIELD."""
    return f"install({field}=...)"


def uninstall() -> None:
    """Stop tracing and take every hook out again."""
    # Nothing imported: tracing that was never switched on never loaded the session (and a finaliser at
    # the very end, when nothing can be imported any more, may call this too).
    session = sys.modules.get("importwatch.tracing.session")
    if session is not None:
        session.deactivate()


def pytest_plugin_registered(plugin: object, manager: object) -> None:
    """`pytest -p importwatch`: trace this pytest process from the moment the plugin is registered.

    That is before pytest's capture takes over stderr and before conftest files
    and test modules are collected, so a hang in collection is named too.
    """
    import sys

    if plugin is sys.modules[__name__]:
        from importwatch import pytest_plugin

        pytest_plugin.start()
