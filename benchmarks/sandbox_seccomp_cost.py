"""What the seccomp filter costs per sandboxed call, measured paired so that load cancels out.

    PYTHONPATH=src python benchmarks/sandbox_seccomp_cost.py [--n 40]

1. Tier A with and without bwrap's `--seccomp` (the filter argument removed from the command line),
   alternating call by call, for `true` and `python3 -c pass`: the medians and the median paired
   difference.
2. A bare `fork()` + `_exit()` loop, the child installing the filter (`prctl(PR_SET_SECCOMP)`, as
   tier B's launcher does) or not, alternating; and the `prctl` alone, timed inside the child.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

from temper.sandbox import Limits, Sandbox, probe, tier_b_exec
from temper.sandbox import sandbox as sandbox_mod


def tier_a_paired(n: int) -> None:
    sbx = Sandbox(limits=Limits(wall_s=30), tier="bwrap")
    with_filter = sandbox_mod.Sandbox._argv

    def without_filter(self, argv, status_fd, filter_fd=None):
        a = with_filter(self, argv, status_fd, filter_fd)
        i = a.index("--seccomp")
        return a[:i] + a[i + 2 :]

    for argv in (["/bin/true"], ["/usr/bin/python3", "-c", "pass"]):
        ms: dict[str, list[float]] = {"filter": [], "none": []}
        for i in range(n + 1):  # the first pair warms up and is dropped
            for kind in ("filter", "none") if i % 2 else ("none", "filter"):
                sandbox_mod.Sandbox._argv = with_filter if kind == "filter" else without_filter
                t = time.perf_counter()
                assert sbx.run_cmd(argv).exit_code == 0
                if i:
                    ms[kind].append((time.perf_counter() - t) * 1000)
        sandbox_mod.Sandbox._argv = with_filter
        diff = statistics.median(a - b for a, b in zip(ms["filter"], ms["none"]))
        meds = {k: round(statistics.median(v), 1) for k, v in ms.items()}
        print(f"tier A {argv[-1]!r}: median ms {meds}, median paired difference {diff:+.1f} ms")
    sbx.close()


def fork_loop(n: int) -> None:
    prog = tier_b_exec.seccomp_program()
    r, w = os.pipe()
    total: dict[bool, list[float]] = {True: [], False: []}
    install = []
    for i in range(2 * n):
        apply = bool(i % 2)
        t = time.perf_counter()
        pid = os.fork()
        if pid == 0:
            if apply:
                tier_b_exec.libc.prctl(tier_b_exec.PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0)
                s = time.perf_counter()
                tier_b_exec.apply_seccomp(prog)
                os.write(w, f"{(time.perf_counter() - s) * 1000}\n".encode())
            os._exit(0)
        os.waitpid(pid, 0)
        total[apply].append((time.perf_counter() - t) * 1000)
        if apply:
            install.append(float(os.read(r, 100)))
    meds = {("filter" if k else "none"): round(statistics.median(v), 2) for k, v in total.items()}
    print(
        f"fork + _exit + reap: median ms {meds}; prctl(PR_SET_SECCOMP) alone {statistics.median(install):.2f} ms"
    )


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=40)
    n = ap.parse_args().n
    print(f"load average {os.getloadavg()[0]:.2f}")
    if "bwrap" in probe().tiers:
        tier_a_paired(n)
    fork_loop(5 * n)
    print(f"load average after: {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
