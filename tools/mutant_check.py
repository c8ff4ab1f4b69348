"""Check mutmut's mutants against a few chosen test files, in one process (TESTING.md).

mutmut forks one process per mutant and runs every test that executes the mutated function,
which on a loaded machine takes seconds per mutant. This collects the chosen tests once and, for
each mutant name read from stdin, switches mutmut's trampoline to it (`MUTANT_UNDER_TEST`, read on
every call) and runs the tests in order until one fails. A failing test is a kill exactly as
mutmut counts it; a mutant that passes here may still be killed by a test not chosen, so
"survived" here is an upper bound on mutmut's survivors. Needs `mutants/` from a `mutmut run`.

    PYTHONPATH=mutants/src OMP_NUM_THREADS=1 python tools/mutant_check.py OUT tests/test_x.py ... < names

Appends "killed NAME SECONDS TEST", "timeout NAME SECONDS TEST" or "survived NAME SECONDS" per
mutant to OUT. A mutant that runs longer than LIMIT seconds (MUTANT_CHECK_LIMIT, default 120; an
endless loop) is stopped by SIGALRM inside the running test and counted as a timeout, which
mutmut counts as killed.
"""

from __future__ import annotations

import os
import signal
import sys
import time

sys.path[:0] = [os.path.abspath("mutants/src"), os.getcwd()]

import pytest  # noqa: E402
from _pytest.runner import runtestprotocol  # noqa: E402


class _Loop:
    def __init__(self, out_path: str, names: list[str]):
        self.out_path, self.names = out_path, names

    @pytest.hookimpl(tryfirst=True)
    def pytest_runtestloop(self, session: pytest.Session) -> bool:
        items = session.items

        def first_failure() -> str | None:
            for i, item in enumerate(items):
                nextitem = items[i + 1] if i + 1 < len(items) else None
                if any(r.failed for r in runtestprotocol(item, nextitem=nextitem, log=False)):
                    return item.nodeid
            return None

        os.environ["MUTANT_UNDER_TEST"] = ""
        clean = first_failure()
        if clean is not None:
            print(f"the unmutated code fails {clean}; fix that first", file=sys.stderr)
            session.testsfailed = 1
            return True
        limit = int(os.environ.get("MUTANT_CHECK_LIMIT", "120"))

        def stop(signum: int, frame: object) -> None:
            raise TimeoutError(f"mutant ran past {limit} s")

        signal.signal(signal.SIGALRM, stop)
        with open(self.out_path, "a") as out:
            for name in self.names:
                os.environ["MUTANT_UNDER_TEST"] = name
                start = time.time()
                signal.alarm(limit)
                try:
                    failed = first_failure()
                except BaseException as err:  # a mutant that breaks the test harness itself
                    failed = f"harness:{type(err).__name__}"
                finally:
                    signal.alarm(0)
                if failed and time.time() - start >= limit:
                    out.write(f"timeout {name} {time.time() - start:.2f} {failed}\n")
                    out.flush()
                    continue
                verdict = (
                    f"killed {name} {time.time() - start:.2f} {failed}"
                    if failed
                    else f"survived {name} {time.time() - start:.2f}"
                )
                out.write(verdict + "\n")
                out.flush()
        os.environ["MUTANT_UNDER_TEST"] = ""
        return True


def main() -> int:
    out_path, files = sys.argv[1], sys.argv[2:]
    names = [line.strip() for line in sys.stdin if line.strip()]
    return int(pytest.main([*files, "-q", "-p", "no:cacheprovider"], plugins=[_Loop(out_path, names)]))


if __name__ == "__main__":
    raise SystemExit(main())
