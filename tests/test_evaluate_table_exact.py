"""Exact tests of the eval table's cells (`temper.evaluate.table_rows`) and of `stop_warnings`:
mixed k, missing metrics, the verifier-error column's defaults. Written against the mutants
mutmut left alive (TESTING.md)."""

from temper.evaluate import RATES, stop_warnings, table_rows


def metric(v, lo, hi):
    return {"value": v, "lo": lo, "hi": hi}


def test_rates():
    assert RATES == {
        "greedy_accuracy": "greedy acc",
        "pass@k": "pass@k",
        "mean@k": "mean@k",
        "parse_rate": "parse rate",
        "truncation_rate": "trunc rate",
    }


def test_rows_with_different_k_missing_metrics_and_verifier_errors():
    a = {
        "n_problems": 4,
        "k": 2,
        "verifier_errors": 1,
        "graded": 12,
        "metrics": {
            "greedy_accuracy": metric(0.25, 0.0, 0.5),
            "pass@2": metric(0.5, 0.25, 0.75),
            "mean@2": metric(0.375, 0.125, 0.625),
            "parse_rate": metric(1.0, 1.0, 1.0),
            "truncation_rate": metric(0.0, 0.0, 0.0),
            "mean_length": metric(12.25, 10.0, 14.5),
        },
    }
    b = {"n_problems": 3, "k": 4, "metrics": {"pass@4": metric(1.0, 0.5, 1.0)}}
    header, rows = table_rows({"base": {"test": a}, "rl": {"ood": b}})
    assert header == [
        "model",
        "split",
        "n",
        "greedy acc",
        "pass@k",
        "mean@k",
        "parse rate",
        "trunc rate",
        "mean length",
        "verifier errors",
    ]
    assert rows == [
        [
            "base",
            "test",
            "4",
            "25.0% [0.0, 50.0]",
            "50.0% [25.0, 75.0]",
            "37.5% [12.5, 62.5]",
            "100.0% [100.0, 100.0]",
            "0.0% [0.0, 0.0]",
            "12.2 [10.0, 14.5]",
            "1 of 12",
        ],
        ["rl", "ood", "3", "–", "100.0% [50.0, 100.0]", "–", "–", "–", "–", "0 of ?"],
    ]


def test_one_k_names_the_columns_and_no_errors_no_column():
    r = {"n_problems": 1, "k": 8, "verifier_errors": 0, "metrics": {}}
    header, rows = table_rows({"m": {"test": r, "ood": dict(r, k=0)}})
    assert header[3:] == ["greedy acc", "pass@8", "mean@8", "parse rate", "trunc rate", "mean length"]
    assert rows[1] == ["m", "ood", "1", "–", "–", "–", "–", "–", "–"]
    header, _ = table_rows({"m": {"test": dict(r, k=0)}})
    assert header == ["model", "split", "n", "greedy acc", "parse rate", "trunc rate", "mean length"]


def test_stop_warnings_group_the_rows_of_each_warning():
    results = {
        "base": {"test": {"stop_warning": "W1"}, "ood": {"stop_warning": None}},
        "sft": {"test": {"stop_warning": "W1"}, "ood": {"stop_warning": "W2"}},
        "rl": {"test": {}},
    }
    assert stop_warnings(results) == ["base test, sft test: W1", "sft ood: W2"]
    assert stop_warnings({}) == []
