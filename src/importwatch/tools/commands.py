"""The commands and code the tools print for a person to paste: quoted so that they run as printed.

A word of printable ASCII is quoted as POSIX shells read it (shlex.quote). A word with a newline,
another control character or a non-ASCII character is written as bash's `$'...'` (also zsh's and
ksh's), with escapes, so the printed line stays one ASCII line and the shell gives back the very
bytes: shlex.quote's own quotes would hold a raw newline, which our ASCII-safe output escapes into
a literal backslash-n that the shell keeps as two characters.
"""

from __future__ import annotations

import keyword
import os
import shlex

_ESCAPES = {"\\": "\\\\", "'": "\\'", "\n": "\\n", "\t": "\\t", "\r": "\\r"}


def quote(word: str) -> str:
    """WORD as one shell word that gives WORD back."""
    if all(" " <= char <= "~" for char in word):
        return shlex.quote(word)
    out = []
    for byte in os.fsencode(word):  # surrogate escapes (undecodable bytes of argv) come back as bytes
        char = chr(byte)
        if char in _ESCAPES:
            out.append(_ESCAPES[char])
        elif 0x20 <= byte <= 0x7E:
            out.append(char)
        else:
            out.append(f"\\x{byte:02x}")
    return "$'" + "".join(out) + "'"


def join(words: list[str]) -> str:
    """WORDS as one command line."""
    return " ".join(quote(word) for word in words)


def import_code(names: list[str]) -> str:
    """Python code that imports NAMES in order: `import a.b` where that is a statement python reads,
    else by name (`importlib.import_module('my-plugin')`): a module file can have any name."""
    statements = []
    for name in names:
        if all(part.isidentifier() and not keyword.iskeyword(part) for part in name.split(".")):
            statements.append(f"import {name}")
        else:
            if "import importlib" not in statements:
                statements.insert(0, "import importlib")
            statements.append(f"importlib.import_module({name!r})")
    return "; ".join(statements)
