"""Per-module mutation scores from mutmut's result files (`make mutation` prints this table).

mutmut keeps one `mutants/<source>.meta` JSON per mutated file, mapping each mutant to the exit
code of its test run (None: not run yet). Score = (killed + timeout) / (mutants that ran), where
"survived" and "no tests" count against it. Run from the repository root after `mutmut run`.
"""

from __future__ import annotations

import json
import sys
from collections import Counter
from pathlib import Path

from mutmut.stats import status_by_exit_code

COLUMNS = ["killed", "timeout", "survived", "no tests", "suspicious", "not checked"]


def module_counts(root: Path = Path("mutants")) -> dict[str, Counter]:
    rows = {}
    for meta in sorted(root.rglob("*.py.meta")):
        codes = json.loads(meta.read_text())["exit_code_by_key"]
        if codes:
            rows[str(meta.relative_to(root))[: -len(".meta")]] = Counter(
                status_by_exit_code[c] for c in codes.values()
            )
    return rows


def main() -> int:
    rows = module_counts()
    if not rows:
        print("no mutmut results under mutants/: run `make mutation` first", file=sys.stderr)
        return 1
    total: Counter = Counter()
    print(f"{'module':40} " + " ".join(f"{c:>11}" for c in COLUMNS) + "   score")
    for name, c in [*rows.items(), ("total", None)]:
        if c is None:
            c = total
        else:
            total.update(c)
        ran = sum(c.values()) - c["not checked"]
        score = f"{100 * (c['killed'] + c['timeout']) / ran:6.1f}%" if ran else "      -"
        print(f"{name:40} " + " ".join(f"{c[k]:>11}" for k in COLUMNS) + f"   {score}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
