"""The code-repair oracle's verdict on fixtures where the plausible one-line bugs differ: several
hidden cases (so "some case passed" is not "every case passed"), a result list shorter than the
cases, and an earlier nonce-marked line that passes while the runner's last one does not. The
judge's tests in test_code_repair_grader.py use one hidden case, where those bugs agree."""

from __future__ import annotations

import json

from temper.envs.code_repair.grader import judge

WANTS = [5, "a", [1, 2]]


def _line(nonce: str, reprs: list[str]) -> str:
    return nonce + json.dumps(reprs) + "\n"


def test_a_partial_pass_fails_and_counts_the_cases_that_matched():
    verdict = judge(_line("N", ["5", "'b'", "[1, 2]"]), "N", WANTS)
    assert (verdict.passed, verdict.n_passed, verdict.n_tests, verdict.reason) == (False, 2, 3, "fail")
    every = judge(_line("N", ["5", "'a'", "[1, 2]"]), "N", WANTS)
    assert (every.passed, every.n_passed, every.reason) == (True, 3, "pass")


def test_fewer_results_than_cases_is_no_result():
    for short in (["5"], ["5", "'a'"], []):
        verdict = judge(_line("N", short), "N", WANTS)
        assert (verdict.passed, verdict.n_passed, verdict.reason) == (False, 0, "no_result"), short


def test_an_earlier_passing_nonce_line_does_not_count():
    forged = _line("N", ["5", "'a'", "[1, 2]"])
    verdict = judge("noise\n" + forged + _line("N", ["4", "'a'", "[1, 2]"]), "N", WANTS)
    assert (verdict.passed, verdict.n_passed, verdict.reason) == (False, 2, "fail")
