"""Check mutmut's mutants against a few chosen test files, in one process (TESTING.md).

mutmut forks one process per mutant and runs every test that executes the mutated function,
which on a loaded machine takes seconds per mutant. This collects the chosen tests once and, for
each mutant name read from stdin, switches mutmut's trampoline to it (`MUTANT_UNDER_TEST`, read on
every call) and runs the tests in order until one fails. A failing test is a kill exactly as
mutmut counts it; a mutant that passes here may still be killed by a test not chosen, so
"survived" here is an upper bound on mutmut's survivors. Needs `mutants/` from a `mutmut run`.

    PYTHONPATH=mutants/src OMP_NUM_THREADS=1 python tools/mutant_check.py OUT tests/test_x.py ... < names

Appends "killed NAME SECONDS TEST", "timeout NAME SECONDS TEST" or "survived NAME SECONDS" per
mutant to OUT. With `--record` before OUT, each kill (and timeout) is also written into mutmut's
record (`mutants/src/<module>.py.meta`, exit code 1 = killed, 36 = timeout, as mutmut writes them),
so `mutmut results` and tools/mutation_scores.py count it; a survivor here leaves mutmut's verdict
alone, since a test not chosen might still kill it. A mutant that runs longer than LIMIT seconds (MUTANT_CHECK_LIMIT, default 120; an
endless loop) is stopped by SIGALRM inside the running test and counted as a timeout, which
mutmut counts as killed.
"""

from __future__ import annotations

import json
import os
import re
import signal
import sys
import time
from pathlib import Path

sys.path[:0] = [os.path.abspath("mutants/src"), os.getcwd()]

import pytest  # noqa: E402
from _pytest.runner import runtestprotocol  # noqa: E402


def record(name: str, exit_code: int, seconds: float) -> None:
    """Write one verdict into mutmut's meta file of the mutant's module."""
    parts = re.split(r"\.x[_\u01c1]", name, maxsplit=1)[0].split(".")
    meta = Path("mutants/src", *parts).with_suffix(".py.meta")
    if not meta.exists():  # a package's own functions live in its __init__.py
        meta = Path("mutants/src", *parts, "__init__.py.meta")
    data = json.loads(meta.read_text())
    if name not in data["exit_code_by_key"]:
        raise KeyError(f"{name} is not a known mutant of {meta}")
    data["exit_code_by_key"][name] = exit_code
    data.setdefault("durations_by_key", {})[name] = seconds
    meta.write_text(json.dumps(data, indent=4))


class _Loop:
    def __init__(self, out_path: str, names: list[str], record: bool = False):
        self.out_path, self.names, self.record = out_path, names, record

    @pytest.hookimpl(tryfirst=True)
    def pytest_runtestloop(self, session: pytest.Session) -> bool:
        items = session.items

        def first_failure() -> str | None:
            try:
                for i, item in enumerate(items):
                    nextitem = items[i + 1] if i + 1 < len(items) else None
                    if any(r.failed for r in runtestprotocol(item, nextitem=nextitem, log=False)):
                        return item.nodeid
                return None
            finally:
                # stopping early leaves the fixtures of `nextitem` set up; when the next mutant
                # starts again at items[0], in another module, pytest would fail that test's
                # setup ("previous item was not torn down properly"): a false kill
                session._setupstate.teardown_exact(None)

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
                seconds = time.time() - start
                if failed and seconds >= limit:
                    out.write(f"timeout {name} {seconds:.2f} {failed}\n")
                    out.flush()
                    if self.record:
                        record(name, 36, seconds)
                    continue
                if failed and self.record:
                    record(name, 1, seconds)
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
    args = sys.argv[1:]
    record_kills = args[:1] == ["--record"]
    out_path, files = args[record_kills], args[record_kills + 1 :]
    names = [line.strip() for line in sys.stdin if line.strip()]
    loop = _Loop(out_path, names, record_kills)
    return int(pytest.main([*files, "-q", "-p", "no:cacheprovider"], plugins=[loop]))


if __name__ == "__main__":
    raise SystemExit(main())
