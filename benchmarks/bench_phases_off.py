"""The cost of checkpoint() and phase() left in a program while importwatch is off, in ns per call.

    python benchmarks/bench_phases_off.py [--number 1000000] [--repeat 7]

Run it without IMPORTWATCH set. Each figure is the best of REPEAT timeit runs,
minus the same loop around an empty function or an empty `with` (what any call
costs), so what is left is importwatch's own share. Standard library only.
"""

from __future__ import annotations

import argparse
import os
import sys
import timeit


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--number", type=int, default=1_000_000, help="calls per timeit run")
    parser.add_argument("--repeat", type=int, default=7, help="timeit runs; the best one counts")
    options = parser.parse_args()
    if os.environ.get("IMPORTWATCH", "0") not in ("", "0"):
        sys.stderr.write("bench_phases_off: unset IMPORTWATCH first: this measures the API while off\n")
        return 2

    import importwatch

    class Nothing:
        def __enter__(self) -> None:
            pass

        def __exit__(self, *_: object) -> None:
            pass

    def empty(name: str) -> None:
        pass

    @importwatch.phase("decorated")
    def decorated() -> None:
        pass

    def undecorated() -> None:
        pass

    namespace = {
        "checkpoint": importwatch.checkpoint,
        "phase": importwatch.phase,
        "empty": empty,
        "Nothing": Nothing,
        "decorated": decorated,
        "undecorated": undecorated,
    }
    cases = [
        ('checkpoint("config loaded")', 'empty("config loaded")'),
        ('with phase("load model"):\n    pass', "with Nothing():\n    pass"),
        ('with phase("load model", timeout=600):\n    pass', "with Nothing():\n    pass"),
        ("decorated()", "undecorated()"),
    ]

    def best(statement: str) -> float:
        runs = timeit.repeat(statement, globals=namespace, number=options.number, repeat=options.repeat)
        return min(runs) / options.number * 1e9

    version = ".".join(map(str, sys.version_info[:3]))
    print(f"importwatch off, Python {version}: ns per call (best of {options.repeat} x {options.number:,})")
    print(f"{'call':<44} {'total':>8} {'baseline':>9} {'ours':>7}")
    for statement, baseline in cases:
        total, base = best(statement), best(baseline)
        shown = statement.replace("\n    pass", " pass")
        print(f"{shown:<44} {total:8.1f} {base:9.1f} {total - base:7.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
