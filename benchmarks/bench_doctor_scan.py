"""The extension scan of `importwatch doctor`: seconds to scan this interpreter's installed packages.

    python benchmarks/bench_doctor_scan.py [--runs 20] [ROOT ...]

Prints the first (cold cache, if the files were not read lately) and the median of the
following runs, with what the scan looked at. Run it with the interpreter whose packages
matter, e.g. the one torch is installed for.
"""

from __future__ import annotations

import argparse
import statistics
import time

from importwatch.facts import scan


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=20)
    parser.add_argument("roots", nargs="*", help="folders to scan (default: this interpreter's site folders)")
    options = parser.parse_args()
    roots = options.roots or scan.site_roots()
    places = [(root, "") for root in roots]
    times = []
    for _ in range(max(2, options.runs)):
        started = time.perf_counter()
        result = scan.scan(places)
        times.append(time.perf_counter() - started)
    print(f"roots: {', '.join(roots)}")
    print(
        f"entries looked at: {result.files}, shared objects read: {result.shared_objects}, "
        f"linking CUDA or torch: {len(result.libraries)}"
    )
    print(f"first run: {times[0] * 1000:.1f} ms; median of the next {len(times) - 1}: "
          f"{statistics.median(times[1:]) * 1000:.1f} ms")  # fmt: skip


if __name__ == "__main__":
    main()
