"""importwatch: say which import a silent Python job is stuck in.

The public API is small and imports nothing heavy: install() and uninstall()
switch tracing on and off in the current process.
"""

from __future__ import annotations

__version__ = "0.1.0"
__all__ = ["__version__", "install", "uninstall"]


def install(timeout: float | None = None, log: str | None = None, exit_on_stall: bool = False) -> None:
    """Start tracing this process now, with the IMPORTWATCH_* variables for what is not given."""
    from importwatch import config, startup

    settings, warnings = config.from_env()
    settings = config.Settings(
        timeout=settings.timeout if timeout is None else timeout,
        log=settings.log if log is None else log,
        exit_on_stall=exit_on_stall or settings.exit_on_stall,
    )
    startup.activate(settings, warnings)


def uninstall() -> None:
    """Stop tracing and take every hook out again."""
    from importwatch import startup

    startup.deactivate()
