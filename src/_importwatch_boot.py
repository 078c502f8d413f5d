"""What the .pth line calls once IMPORTWATCH is on: activation now, or as soon as importwatch can be imported.

The .pth is installed as 00-importwatch.pth so that site runs it before the other
.pth files of its folder (site sorts them by name), whose imports would otherwise
happen untraced: distutils-precedence.pth, setuptools' __editable__.*.pth finders.
This module is installed beside it, so it can always be imported. importwatch
itself may not be yet: an editable install puts its source folder on sys.path
through a .pth of its own that sorts later (_editable_impl_importwatch.pth). Then
activation waits for the first .pth after which importwatch can be imported.
"""

from __future__ import annotations

import os
import sys


def activate() -> None:
    if _activated():
        return
    site = sys.modules.get("site")
    addpackage = getattr(site, "addpackage", None)
    if addpackage is None:
        return

    # site looks addpackage up by name for each .pth it reads: try again after each one.
    def addpackage_then_activate(*args, **kwargs):
        result = addpackage(*args, **kwargs)
        if site.addpackage is addpackage_then_activate and _activated():
            site.addpackage = addpackage
        return result

    site.addpackage = addpackage_then_activate


def _activated() -> bool:
    """Activate if importwatch can be imported now; False when it cannot be found (yet)."""
    try:
        from importwatch import startup
    except ModuleNotFoundError as error:
        if error.name == "importwatch":
            return False
        _say(error)
        return True
    except Exception as error:
        _say(error)
        return True
    startup.activate_from_env()
    return True


def _say(error: BaseException) -> None:
    message = f"[importwatch {os.getpid()}] ! tracing is off: {type(error).__name__}: {error}\n"
    try:
        os.write(2, message.encode("ascii", "backslashreplace"))
    except OSError:
        pass
