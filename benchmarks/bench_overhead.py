"""Tracing overhead: plain versus traced runs, alternating, medians and ratios.

    python benchmarks/bench_overhead.py [--modules 4000] [--pairs 15] [--torch-pairs 15] [--timeout-off] [--stalls]

Three figures, as the README reports them:
- a generated tree of small modules: microseconds per import added by tracing
  ((traced - plain) / number of imports), and the traced/plain ratio;
- `python -c "import torch"` (when torch is installed): traced/plain ratio;
- installed but off: the cost of the .pth line per interpreter start.
Traced runs write every event to a log file and stderr to a file, as a job would.
Each comparison also splits the added time into user and system CPU (the
children's rusage), which tells the kernel's side of the writes from the rest.
With --timeout-off a third run joins each round, traced with IMPORTWATCH_TIMEOUT=0:
no watchdog, so no second thread, whose cost to the program is then its own figure.
With --stalls another run joins each round, traced with IMPORTWATCH_STDERR=stalls:
every line still goes to the log, but only stall reports and warnings to stderr.
Uses the standard library only; each figure is a median over alternating rounds.
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
import timeit
from pathlib import Path
from typing import NamedTuple


def measured_env() -> dict[str, str]:
    """This environment for the processes a benchmark times: our variables left out but IMPORTWATCH_PURE
    (`IMPORTWATCH_PURE=1` times the pure-Python twin), and bytecode caches written, as in an
    installation. With PYTHONDONTWRITEBYTECODE set (CI's shell sets it) every import would compile its
    source, several times what tracing adds, and drown it in noise."""
    env = {k: v for k, v in os.environ.items() if k == "IMPORTWATCH_PURE" or not k.startswith("IMPORTWATCH")}
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    return env


def make_tree(root: Path, count: int) -> str:
    """COUNT tiny modules in packages of 50, and the code that imports them all."""
    lines = []
    per_package = 50
    for index in range(count):
        package = root / f"bench_pkg{index // per_package}"
        if not package.exists():
            package.mkdir()
            (package / "__init__.py").write_text("")
        (package / f"mod{index}.py").write_text(f"VALUE = {index}\n")
        lines.append(f"import bench_pkg{index // per_package}.mod{index}")
    packages = (count + per_package - 1) // per_package
    (root / "bench_all.py").write_text("\n".join(lines) + "\n")
    return f"import bench_all  # {count} modules in {packages} packages"


class Run(NamedTuple):
    """One process: wall, user CPU and system CPU seconds."""

    wall: float
    user: float
    system: float


def run_once(code: str, env: dict[str, str], stderr_path: Path) -> Run:
    with open(stderr_path, "ab") as stderr:
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        began = time.perf_counter()
        subprocess.run(
            [sys.executable, "-c", code], env=env, stderr=stderr, stdout=subprocess.DEVNULL, check=True
        )
        wall = time.perf_counter() - began
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return Run(wall, after.ru_utime - before.ru_utime, after.ru_stime - before.ru_stime)


def median_interval(values: list[float]) -> tuple[float, float]:
    """A distribution-free 95% confidence interval for the median of VALUES (order statistics).

    The median's rank in a sample of n is binomial(n, 1/2): the interval runs
    from the k-th smallest to the k-th largest value, k = n/2 - 0.98 sqrt(n).
    """
    ordered = sorted(values)
    k = max(int(len(ordered) / 2 - 0.98 * len(ordered) ** 0.5), 0)
    return ordered[k], ordered[-k - 1]


def compare(
    code: str,
    rounds: int,
    env: dict[str, str],
    workdir: Path,
    timeout_off: bool = False,
    stalls: bool = False,
) -> dict[str, tuple[float, float]]:
    """Per arm: the median seconds, and the median of the per-round ratios arm/plain."""
    plain_env = {k: v for k, v in env.items() if not k.startswith("IMPORTWATCH")}
    traced_env = dict(plain_env, IMPORTWATCH="1", IMPORTWATCH_LOG=str(workdir / "trace.log"))
    arms = {"plain": plain_env, "traced": traced_env}
    if timeout_off:
        arms["traced, no watchdog"] = dict(traced_env, IMPORTWATCH_TIMEOUT="0")
    if stalls:
        arms["traced, --stderr stalls"] = dict(traced_env, IMPORTWATCH_STDERR="stalls")
    for name, arm_env in arms.items():  # warm the page cache and bytecode caches
        run_once(code, arm_env, workdir / f"{name}.err")
    runs: dict[str, list[Run]] = {name: [] for name in arms}
    for index in range(rounds):
        order = list(arms.items())
        if index % 2:
            order.reverse()  # no arm always runs right after another
        for name, arm_env in order:
            runs[name].append(run_once(code, arm_env, workdir / f"{name}.err"))
            (workdir / "trace.log").unlink(missing_ok=True)
    plain = runs["plain"]
    # The fastest runs are the least disturbed by a shared machine; reported beside the medians.
    fastest = ", ".join(f"{name} {min(r.wall for r in arm) * 1000:.1f} ms" for name, arm in runs.items())
    print(f"  (fastest runs: {fastest})")
    ratios = {name: [t.wall / p.wall for t, p in zip(arm, plain)] for name, arm in runs.items()}
    for name in list(arms)[1:]:
        low, high = median_interval(ratios[name])
        user = statistics.median((t.user - p.user) * 1000 for t, p in zip(runs[name], plain))
        system = statistics.median((t.system - p.system) * 1000 for t, p in zip(runs[name], plain))
        print(
            f"  ({name}/plain {statistics.median(ratios[name]):.3f}, 95% interval of the median {low:.3f}-{high:.3f};"
        )
        print(
            f"   CPU added per run, medians of the differences: user {user:+.1f} ms, system {system:+.1f} ms)"
        )
    return {
        name: (statistics.median(r.wall for r in arm), statistics.median(ratios[name]))
        for name, arm in runs.items()
    }


def pth_cost() -> float:
    """Microseconds that the .pth line costs an interpreter start while tracing is off."""
    line = (Path(__file__).resolve().parent.parent / "src" / "importwatch.pth").read_text()
    env_value = os.environ.pop("IMPORTWATCH", None)
    try:
        code = compile(line, "importwatch.pth", "exec")
        number = 100_000
        return min(timeit.repeat(lambda: exec(code, {}), number=number, repeat=5)) / number * 1e6
    finally:
        if env_value is not None:
            os.environ["IMPORTWATCH"] = env_value


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--modules", type=int, default=4000)
    parser.add_argument("--pairs", type=int, default=15)
    parser.add_argument("--torch-pairs", type=int, default=15)
    parser.add_argument(
        "--timeout-off", action="store_true", help="add a run per round: traced, IMPORTWATCH_TIMEOUT=0"
    )
    parser.add_argument(
        "--stalls", action="store_true", help="add a run per round: traced, IMPORTWATCH_STDERR=stalls"
    )
    args = parser.parse_args()
    print(f"python {sys.version.split()[0]} at {sys.executable}")
    with tempfile.TemporaryDirectory() as tmp:
        workdir = Path(tmp)
        tree = workdir / "tree"
        tree.mkdir()
        code = make_tree(tree, args.modules)
        # Bytecode caches written as in a normal installation, for the program and for importwatch.
        env = dict(os.environ, PYTHONPATH=str(tree), PYTHONDONTWRITEBYTECODE="")
        arms = compare(code, args.pairs, env, workdir, args.timeout_off, args.stalls)
        imports = args.modules + (args.modules + 49) // 50 + 1
        plain = arms.pop("plain")[0]
        print(f"module tree: {imports} imports, plain {plain * 1000:.1f} ms (median of {args.pairs} rounds)")
        for name, (median, ratio) in arms.items():
            per_import = (median - plain) / imports * 1e6
            print(
                f"  {name}: {median * 1000:.1f} ms, overhead {per_import:.1f} us per import, {name}/plain {ratio:.3f}"
            )
        has_torch = (
            subprocess.run([sys.executable, "-c", "import torch"], capture_output=True).returncode == 0
        )
        if has_torch and args.torch_pairs:
            arms = compare(
                "import torch",
                args.torch_pairs,
                dict(os.environ, PYTHONDONTWRITEBYTECODE=""),
                workdir,
                args.timeout_off,
                args.stalls,
            )
            plain = arms.pop("plain")[0]
            print(f"import torch: plain {plain * 1000:.0f} ms (median of {args.torch_pairs} rounds)")
            for name, (median, ratio) in arms.items():
                print(f"  {name}: {median * 1000:.0f} ms, {name}/plain {ratio:.3f}")
        else:
            print("import torch: skipped (torch is not installed in this interpreter)")
    print(f"installed but off: the .pth line costs {pth_cost():.2f} us per interpreter start")


if __name__ == "__main__":
    main()
