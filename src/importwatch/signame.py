"""Names a signal by its number, as every line of ours that reports one does (SIGKILL, SIGTERM)."""


def signal_name(number: int, unknown: str = "signal {}") -> str:
    """SIGTERM for 15; UNKNOWN, formatted with the number, for one the signal module does not name.

    Also called inside the traced process (a multiprocessing child signalled), where the
    signal module is imported already: the import below only looks it up.
    """
    import signal

    try:
        return signal.Signals(number).name
    except (ValueError, TypeError):
        return unknown.format(number)
