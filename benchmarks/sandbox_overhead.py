"""Per-call overhead of `temper.sandbox` (tier A bubblewrap, tier B Landlock) against a plain subprocess.

    PYTHONPATH=src python benchmarks/sandbox_overhead.py [--n 50]

Each figure is the median (and p90) wall time of N calls of `true` and of `python3 -c pass`, run one
after another: a plain `subprocess.run`, and `Sandbox.run_cmd` (namespaces, binds, rlimits via
prlimit, status fd, output capture, the wait for the PID namespace's death) on every tier this host
has (tier B: the launcher, a Python process that joins the episode's cgroups, sets the rlimits, drops
the uid and forks the program under Landlock + seccomp, then sweeps the tree). The research note
measured 26.5 ms / 57.0 ms for its tier-A prototype (which also made a cgroup per command) and
11.1 / 44.7 ms for its Landlock prototype (restrictions applied in preexec, no supervisor process).
The load average is printed because these machines are shared: figures under load are slower.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import time

from temper.sandbox import Limits, Sandbox, probe

PYTHON = "/usr/bin/python3"


def cpu_model() -> str:
    with open("/proc/cpuinfo") as f:
        for line in f:
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    return "unknown CPU"


def timed(fn, n: int) -> tuple[float, float]:
    fn()  # warm the page cache and the probe
    xs = []
    for _ in range(n):
        t = time.perf_counter()
        fn()
        xs.append((time.perf_counter() - t) * 1000)
    xs.sort()
    return statistics.median(xs), xs[min(len(xs) - 1, int(0.9 * len(xs)))]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=50)
    n = ap.parse_args().n
    host = probe()
    print(f"CPU: {cpu_model()}, {os.cpu_count()} cores; load average {os.getloadavg()[0]:.2f}")
    print(f"sandbox tier: {host.tier} ({host.reason})")
    rows = {"plain subprocess": lambda argv: subprocess.run(argv, capture_output=True, check=True)}
    sandboxes = [Sandbox(limits=Limits(wall_s=30), tier=tier) for tier in host.tiers]
    for sbx in sandboxes:

        def sandboxed(argv, sbx=sbx):
            r = sbx.run_cmd(argv)
            assert r.exit_code == 0 and r.tier == sbx.tier, r

        rows[f"Sandbox.run_cmd ({sbx.tier})"] = sandboxed
    print(f"median (p90) of {n} calls, ms")
    print(f"| {'configuration':<28} | {'true':>15} | {'python3 -c pass':>15} |")
    print(f"|{'-' * 30}|{'-' * 17}|{'-' * 17}|")
    for name, run in rows.items():
        cells = []
        for argv in (["/bin/true"], [PYTHON, "-c", "pass"]):
            med, p90 = timed(lambda argv=argv, run=run: run(argv), n)
            cells.append(f"{med:.1f} ({p90:.1f})")
        print(f"| {name:<28} | {cells[0]:>15} | {cells[1]:>15} |")
    print(f"load average after: {os.getloadavg()[0]:.2f}")
    for sbx in sandboxes:
        sbx.close()
        shutil.rmtree(sbx.workspace)


if __name__ == "__main__":
    main()
