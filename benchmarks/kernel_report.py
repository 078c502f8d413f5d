"""How bench_kernel.py's results are read out: the figures of issue 25's targets, and the tables.

Kept apart from the measuring (bench_kernel.py) so that each file has one job. Standard library only.
"""

from __future__ import annotations

# The traced modes beside plain, in table order (bench_kernel.py runs each).
MODES = ("plain", "runner log", "runner stalls", "env log", "env stalls")
PROBE_LIMIT = 1000  # Python's default recursion limit, under which the frame probe nests


def targets(result: dict) -> dict[str, object]:
    """The figures of issue 25's target table, from RESULT (None where not measured)."""
    tree = result["workloads"].get("tree")
    torch = result["workloads"].get("torch")
    frames = result.get("frames")

    def mmaps(work: dict | None) -> int | None:
        if work is None or not work["syscalls"]:
            return None
        calls = work["syscalls"]
        both = {m: calls[m]["kinds"].get("mmap", 0) + calls[m]["kinds"].get("munmap", 0) for m in calls}
        return both["runner log"] - both["plain"]

    return {
        "per_import_all_lines": tree["per_import"]["runner log"] if tree and "per_import" in tree else None,
        "per_import_quiet": tree["per_import"]["runner stalls"] if tree and "per_import" in tree else None,
        "torch_cpu_ratio_log": torch["modes"]["runner log"]["ratio_cpu"] if torch else None,
        "startup_added_ms": result["startup"]["added_ms"] if result.get("startup") else None,
        "syscalls_per_import_all_lines": (
            tree["syscalls_per_import"]["runner log"] if tree and "syscalls_per_import" in tree else None
        ),
        "torch_extra_mmap_munmap": mmaps(torch),
        "frames_added_per_import": (
            frames["runner log"]["frames_per_import"] - frames["plain"]["frames_per_import"]
            if frames
            else None
        ),
    }


# -- output -----------------------------------------------------------------------------------


def workload_table(name: str, work: dict) -> list[str]:
    lines_logged = work["lines_logged_per_import"]
    out = [
        f"  {name}: {work['imports']} imports"
        + (f", {lines_logged:.2f} lines logged per import" if lines_logged else "")
        + f"; medians of {work['rounds']} rounds; per import: beyond what the mode adds to start-up",
        f"    {'mode':<14}{'wall ms':>9}{'user':>8}{'sys':>8}{'minflt':>8}{'majflt':>7}"
        f"{'wall x':>8}{'cpu x':>7}{'+ms':>8}{'us/imp':>8}{'cpu us':>8}{'sys us':>8}{'calls':>8}",
    ]
    for mode, row in work["modes"].items():
        calls = work["syscalls"][mode]["total"] if work["syscalls"] else "-"
        cells = f"{'':>31}"
        if mode != "plain":
            cells = f"{row['ratio_wall']:>8.3f}{row['ratio_cpu']:>7.3f}{row['added_wall_ms']:>+8.1f}"
            if "per_import" in work:
                each = work["per_import"][mode]
                cells += f"{each['wall_us']:>8.1f}{each['cpu_us']:>8.1f}{each['sys_us']:>8.1f}"
            else:
                cells += f"{'':>24}"
        else:
            cells += f"{'':>24}"
        out.append(
            f"    {mode:<14}{row['wall_ms']:>9.1f}{row['user_ms']:>8.1f}{row['sys_ms']:>8.1f}"
            f"{row['minflt']:>8.0f}{row['majflt']:>7.0f}{cells}{calls:>8}"
        )
    if "syscalls_per_import" in work:
        out.append("    system calls added per import, by kind (strace; the program and its threads):")
        for mode, extra in work["syscalls_per_import"].items():
            helpers = work["syscalls"][mode]["helper_processes_total"]
            out.append(f"      {mode:<14}{format_value(extra)}; helper processes: {helpers} calls")
    if work["syscalls"]:
        calls = {m: work["syscalls"][m]["kinds"] for m in MODES}
        mm = ", ".join(f"{m} {calls[m].get('mmap', 0)}/{calls[m].get('munmap', 0)}" for m in MODES)
        out.append(f"    mmap/munmap per run: {mm}")
    return out


def table(results: dict) -> str:
    out = [
        f"machine: {results['cpus']} CPUs, load average {results['load_before']} before, "
        f"{results['load_after']} after"
    ]
    for version, result in results["pythons"].items():
        if "error" in result:
            out.append(f"\npython {version}: skipped: {result['error']}")
            continue
        out.append(f"\npython {version} ({result['executable']})")
        if result["baseline"]:
            out += workload_table("python -c pass (the start-up baseline)", result["baseline"])
        for name, work in result["workloads"].items():
            out += workload_table(name, work)
        if result.get("startup"):
            s = result["startup"]
            out.append(
                f"  start-up (IMPORTWATCH=1, watcher on, python -c pass): plain {s['plain_ms']:.1f} ms, "
                f"traced {s['traced_ms']:.1f} ms, added {s['added_ms']:+.1f} ms wall, "
                f"{s['added_cpu_ms']:+.1f} ms CPU (medians of {s['rounds']} rounds); watcher off (IMPORTWATCH=1's "
                f"default): added {s['unwatched_added_ms']:+.1f} ms wall, {s['unwatched_added_cpu_ms']:+.1f} ms CPU"
            )
            if s.get("native_module"):
                out.append(
                    f"  start-up with a first native load (IMPORTWATCH=1, python -c 'import {s['native_module']}'): "
                    f"added {s['native_added_ms']:+.1f} ms wall, {s['native_added_cpu_ms']:+.1f} ms CPU"
                )
        if result.get("frames"):
            cells = ", ".join(
                f"{m} {f['frames_per_import']} ({f['deepest_nesting']} deep)"
                for m, f in result["frames"].items()
            )
            out.append(f"  Python frames per nested import (deepest nesting at limit {PROBE_LIMIT}): {cells}")
        out.append("  targets (issue 25):")
        for key, value in result["targets"].items():
            out.append(f"    {key}: {format_value(value)}")
        for reason in result["skipped"]:
            out.append(f"  skipped: {reason}")
    return "\n".join(out)


def format_value(value: object) -> str:
    if value is None:
        return "not measured"
    if isinstance(value, float):
        return f"{value:.3f}"
    if isinstance(value, dict):
        shown = [(k, v) for k, v in value.items() if not isinstance(v, float) or abs(v) >= 0.005][:10]
        return ", ".join(f"{k} {v:+.2f}" if isinstance(v, float) else f"{k} {v}" for k, v in shown)
    return str(value)
