from fractions import Fraction

import pytest

from temper.tasks import GeneralPoints, GeneralPointsConfig, Task
from temper.tasks.base import Problem
from temper.tasks.general_points import REASONS, search_trace, solvable, solve

TASK = GeneralPoints()
ID_RULE = "A=1 J=10 Q=10 K=10."
OOD_RULE = "A=1 J=11 Q=12 K=13."


def hand(cards: list[str], faces: tuple[int, int, int], split: str = "test") -> Problem:
    names = {"A": 1, "J": faces[0], "Q": faces[1], "K": faces[2]}
    values = [names[c] if c in names else int(c) for c in cards]
    data = {"cards": cards, "values": values, "target": 24, "face_values": list(faces)}
    return Problem("general_points", split, ",".join(cards), "", data)


P = hand(["3", "8", "K", "A"], (10, 10, 10))


def grade(completion: str, problem: Problem = P) -> tuple[float, bool, bool, str]:
    s = TASK.score(problem, completion)
    assert s.details["reason"] in REASONS and "answer" in s.details
    return s.reward, s.correct, s.parsed, s.details["reason"]


def test_is_a_task():
    assert isinstance(TASK, Task)
    assert TASK.name == "general_points"


@pytest.mark.parametrize(
    "answer",
    [
        "(10-1)*8/3",
        "8*(10-1)/3",
        "8/3*(10-1)",
        "(10 - 1) * 8 / 3",
        "((10-1)*8)/3",
        "(((10-1)))*(8/3)",
        "(10-1)*8/3=24",
        "(10-1)*8/3 = 24",
        "(10-1)*8/3=024",
    ],
)
def test_correct_in_equivalent_forms(answer):
    assert grade(f"Answer: {answer}") == (1.0, True, True, "correct")


def test_answer_line_tolerance():
    assert grade("10-1=9, 9*8=72, 72/3=24\n  Answer:  (10-1)*8/3  \n<|end|>")[3] == "correct"
    assert grade("Answer: 3*8\nAnswer: (10-1)*8/3")[3] == "correct"
    assert grade("Answer: (10-1)*8/3\nAnswer: 3*8")[3] == "wrong_cards"


@pytest.mark.parametrize(
    ("completion", "reason", "parsed"),
    [
        ("", "no_answer", False),
        ("(10-1)*8/3", "no_answer", False),
        ("answer: (10-1)*8/3", "no_answer", False),
        ("Answer:", "no_answer", False),
        ("Answer: (K-A)*8/3", "syntax_error", False),
        ("Answer: (10-1)×8/3", "syntax_error", False),
        ("Answer: (10-1)*8/3)", "syntax_error", False),
        ("Answer: (10-1)*8/3==24", "syntax_error", False),
        ("Answer: (10-1)*8/3=twenty-four", "syntax_error", False),
        ("Answer: (10-1)*8/3=", "syntax_error", False),
        ("Answer: (10-1)*8/3\nso that is 24", "syntax_error", False),
        ("Answer: -1+10*8/3*... ", "syntax_error", False),
        ("Answer: 8/(1-1)", "division_by_zero", True),
        ("Answer: 3/(10-10)*8*1", "division_by_zero", True),
        ("Answer: 999999*999999*999999*999999", "too_large", True),
        ("Answer: 12345678-3", "too_large", True),
        ("Answer: " + "+".join(["1"] * 60), "too_large", True),
        ("Answer: (10-8+1)*8", "wrong_cards", True),
        ("Answer: 3*8", "wrong_cards", True),
        ("Answer: 24", "wrong_cards", True),
        ("Answer: (13-1)*8/3", "wrong_face_value", True),  # K read as 13 under K=10
        ("Answer: (10-1)*8/4", "wrong_cards", True),  # a number card wrong
        ("Answer: (10-1)*8/3*1", "wrong_cards", True),  # one literal too many
        ("Answer: 10+8+3+1", "wrong_value", True),
        ("Answer: (10-1)*8/3=25", "wrong_value", True),
        ("Answer: 10+8+3+1=24", "wrong_value", True),
    ],
)
def test_failure_reasons(completion, reason, parsed):
    assert grade(completion) == (0.0, False, parsed, reason)


@pytest.mark.parametrize("completion", [None, "\x00" * 1000, "Answer: " + "(" * 5000, "Answer: 1/0" * 10])
def test_garbage_never_raises(completion):
    assert grade(completion)[:2] == (0.0, False)


def test_wrong_value_reports_the_value():
    assert TASK.score(P, "Answer: 10+8+3+1").details["value"] == "22"


def test_same_cards_different_rules():
    """K K 2 2 is solvable under both rules, but the ID answer uses K=10, which OOD forbids."""
    id_hand = hand(["K", "K", "2", "2"], (10, 10, 10))
    ood_hand = hand(["K", "K", "2", "2"], (11, 12, 13), split="ood")
    assert grade("Answer: 10+10+2+2", id_hand)[3] == "correct"
    assert grade("Answer: 10+10+2+2", ood_hand)[3] == "wrong_face_value"
    assert grade("Answer: 13*(2-2/13)", ood_hand)[3] == "correct"
    assert grade("Answer: 13*(2-2/13)", id_hand)[3] == "wrong_face_value"


def test_a_hand_can_be_solvable_under_one_rule_only():
    # J A A A: with J=10 the best is (10+1)*(1+1)=22; with J=11 it is (11+1)*(1+1)=24.
    assert not solvable([10, 1, 1, 1], 24)
    assert solvable([11, 1, 1, 1], 24)


def test_solver():
    assert solvable([8, 8, 3, 3], 24)  # 8/(3-8/3): needs exact fractions
    assert solvable([1, 5, 5, 5], 24)  # 5*(5-1/5)
    assert not solvable([1, 1, 1, 1], 24)
    assert solvable([1, 2, 3, 4], 24) and not solvable([1, 1, 2, 2], 24)  # at most (2+1)*(2+1)
    assert solvable([4, 6], 24) and not solvable([5, 5], 24)
    assert solve([3, 8, 10, 1], 24) == solve([1, 10, 8, 3], 24)
    assert solve([3, 8, 10, 1], 24).expression == "(10-1)*8/3"
    assert solve([3, 8, 10, 1], 24).steps == ("10-1=9", "9*8=72", "72/3=24")
    assert solve([8, 8, 3, 3], 24).expression == "8/(3-8/3)"
    with pytest.raises(ValueError):
        solve([1, 1, 1, 1], 24)


def test_formats():
    assert TASK.demonstration(P) == "10-1=9, 9*8=72, 72/3=24\nAnswer: (10-1)*8/3"
    assert TASK.corpus_text(P) == "3 8 10 1 to 24: 10-1=9, 9*8=72, 72/3=24; (10-1)*8/3=24"
    fractional = hand(["8", "3", "8", "3"], (10, 10, 10))
    assert TASK.demonstration(fractional) == ("8/3=8/3, 3-(8/3)=1/3, 8/(1/3)=24\nAnswer: 8/(3-8/3)")


@pytest.mark.parametrize("split", ["train", "test", "ood"])
def test_sampled_problems(split):
    rule = OOD_RULE if split == "ood" else ID_RULE
    for p in TASK.sample(split, 300, seed=1):
        cards = " ".join(p.data["cards"])
        assert p.prompt == f"Cards: {cards}. {rule} Make 24 using each value once with + - * / ( )."
        assert TASK.score(p, TASK.demonstration(p)).correct
        assert "Answer:" not in TASK.corpus_text(p)
        assert TASK.corpus_text(p).startswith(" ".join(map(str, p.data["values"])) + " to 24: ")
        assert (p.split, p.task, len(p.data["cards"])) == (split, "general_points", 4)
        assert solvable(p.data["values"], 24)


def test_ood_hands_hold_a_face_card_and_use_the_ood_values():
    for p in TASK.sample("ood", 500, seed=2):
        assert {"J", "Q", "K"} & set(p.data["cards"])
        for card, v in zip(p.data["cards"], p.data["values"], strict=True):
            assert v == {"A": 1, "J": 11, "Q": 12, "K": 13}.get(card, v)
            assert card in "JQKA" or int(card) == v


def test_id_values():
    for p in TASK.sample("train", 500, seed=2):
        for card, v in zip(p.data["cards"], p.data["values"], strict=True):
            assert v == {"A": 1, "J": 10, "Q": 10, "K": 10}.get(card, v) and v <= 10


def test_train_and_test_disjoint_by_values():
    train = {tuple(sorted(p.data["values"])) for p in TASK.sample("train", 3000, seed=0)}
    test = {tuple(sorted(p.data["values"])) for p in TASK.sample("test", 1000, seed=0)}
    assert len(test) > 50 and not train & test


def test_seeded_sampling_is_reproducible():
    assert TASK.sample("ood", 40, seed=5) == TASK.sample("ood", 40, seed=5)
    assert TASK.sample("ood", 40, seed=5) != TASK.sample("ood", 40, seed=6)


def test_unknown_split():
    with pytest.raises(ValueError, match="valid splits: train, test, ood"):
        TASK.sample("dev", 1, seed=0)


@pytest.mark.parametrize("n_cards", [2, 3])
def test_fewer_cards(n_cards):
    task = GeneralPoints(GeneralPointsConfig(n_cards=n_cards))
    for split in ("train", "test", "ood"):
        for p in task.sample(split, 100, seed=0):
            assert len(p.data["cards"]) == n_cards
            assert task.score(p, task.demonstration(p)).correct


def test_two_cards_space_is_tiny_but_sampling_works():
    """With J=Q=K=10 only {3, 8} and {4, 6} make 24; each split gets one of them."""
    task = GeneralPoints(GeneralPointsConfig(n_cards=2))
    train = {tuple(sorted(p.data["values"])) for p in task.sample("train", 200, seed=0)}
    test = {tuple(sorted(p.data["values"])) for p in task.sample("test", 200, seed=0)}
    assert train | test == {(3, 8), (4, 6)} and not train & test


def test_max_rank_ten_deals_no_faces_in_distribution_but_ood_still_does():
    task = GeneralPoints(GeneralPointsConfig(max_rank=10))
    assert not any(set(p.data["cards"]) & {"J", "Q", "K"} for p in task.sample("train", 300, seed=0))
    assert all(set(p.data["cards"]) & {"J", "Q", "K"} for p in task.sample("ood", 300, seed=0))


def test_other_target():
    task = GeneralPoints(GeneralPointsConfig(target=10, n_cards=3))
    for p in task.sample("train", 50, seed=0):
        assert "Make 10 " in p.prompt and task.score(p, task.demonstration(p)).correct


def test_empty_split_is_a_clear_error():
    task = GeneralPoints(GeneralPointsConfig(n_cards=2, target=1000))
    with pytest.raises(ValueError, match="no solvable train hand"):
        task.sample("train", 1, seed=0)


@pytest.mark.parametrize(
    "options",
    [
        {"n_cards": 1},
        {"n_cards": 5},
        {"max_rank": 14},
        {"target": 0},
        {"face_values_ood": (11, 12)},
        {"demonstration": "path"},
        {"trace_failures": -1},
    ],
)
def test_invalid_config(options):
    with pytest.raises(ValueError):
        GeneralPointsConfig(**options)


def test_a_card_used_more_times_than_dealt_is_wrong_cards():
    """The cards are a multiset: 10*2+2+2 uses one K and three 2s of the hand K K 2 2, the same set
    of values {10, 2}, and must not pass for it."""
    kk22 = hand(["K", "K", "2", "2"], (10, 10, 10))
    assert grade("Answer: 10*2+2+2", kk22)[3] == "wrong_cards"
    assert grade("Answer: 10+10+2+2", kk22)[3] == "correct"


# ---- the solver, exactly (each case failed on a mutant of the solver; TESTING.md) -------------


@pytest.mark.parametrize(
    "values,target,steps,expression",
    [
        # natural steps first, pairs tried from the highest values down
        ([10, 8, 3, 1], 24, ("10-1=9", "9*8=72", "72/3=24"), "(10-1)*8/3"),
        ([1, 1, 1, 8], 24, ("1+1=2", "2+1=3", "8*3=24"), "8*(1+1+1)"),
        ([4, 4, 10, 10], 24, ("10*10=100", "100-4=96", "96/4=24"), "(10*10-4)/4"),
        ([2, 2, 3], 3, ("3+2=5", "5-2=3"), "3+2-2"),
        # fractions only when no natural route exists; fractional operands in parentheses
        ([1, 5, 5, 5], 24, ("1/5=1/5", "5-(1/5)=24/5", "5*(24/5)=24"), "5*(5-1/5)"),
        ([3, 3, 8, 8], 24, ("8/3=8/3", "3-(8/3)=1/3", "8/(1/3)=24"), "8/(3-8/3)"),
        # negative steps last (only a negative target needs them here)
        ([2, 1], -1, ("1-2=-1",), "1-2"),
        ([3, 2, 1], -3, ("1-2=-1", "3*(-1)=-3"), "3*(1-2)"),
    ],
)
def test_solve_gives_the_simplest_route_in_a_fixed_order(values, target, steps, expression):
    for order in (values, list(reversed(values))):  # the same solution for any order of the cards
        assert solve(order, target) == (steps, expression)


def test_meet_in_the_middle_agrees_with_the_full_reachable_set():
    """`solvable` splits each hand and asks what the other side needs; `_reach` of the whole hand
    is the direct answer. Every 4-card hand of ranks 1..7, to 24 and to 10."""
    from fractions import Fraction
    from itertools import combinations_with_replacement

    from temper.tasks.general_points import _reach

    for target in (24, 10):
        for hand in combinations_with_replacement(range(1, 8), 4):
            direct = Fraction(target) in _reach(tuple(Fraction(v) for v in hand))
            assert solvable(hand, target) == direct, (hand, target)
    assert not solvable([7, 7, 7, 7], 24) and solvable([1, 5, 5, 5], 24)


def test_ood_deals_ranks_up_to_ten_plus_the_faces_and_test_deals_one_to_max_rank():
    from temper.tasks.general_points import GeneralPointsConfig, _ranks

    assert _ranks(GeneralPointsConfig(), "ood") == (1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13)
    assert _ranks(GeneralPointsConfig(), "test") == tuple(range(1, 14))
    assert _ranks(GeneralPointsConfig(max_rank=5), "ood") == (1, 2, 3, 4, 5, 11, 12, 13)
    assert _ranks(GeneralPointsConfig(max_rank=5), "train") == (1, 2, 3, 4, 5)


def test_search_trace_judges_each_shown_step_and_ends_in_the_answer():
    trace = GeneralPoints(GeneralPointsConfig(demonstration="trace")).demonstration(P)
    assert trace == (
        "10 8 3 1\n"
        "10*3=30 [30 8 1] no\n"
        "10+1=11 [11 8 3] no\n"
        "10-1=9 [9 8 3] yes\n"
        "9+8=17 [17 3] no\n"
        "9-8=1 [3 1] no\n"
        "9*8=72 [72 3] yes\n"
        "72/3=24\n"
        "Answer: (10-1)*8/3"
    )
    assert TASK.score(P, trace).correct


def test_search_trace_shows_at_most_the_asked_failures():
    assert search_trace([3, 8, 10, 1], 24, failures=0).splitlines()[1:4] == [
        "10-1=9 [9 8 3] yes",
        "9*8=72 [72 3] yes",
        "72/3=24",
    ]
    assert search_trace([8, 8, 3, 3], 24, failures=0).endswith("8/(1/3)=24\nAnswer: 8/(3-8/3)")
    with pytest.raises(ValueError):
        search_trace([1, 1, 1, 1], 24)


@pytest.mark.parametrize("n_cards,target", [(2, 10), (3, 10), (4, 10), (4, 24)])
def test_every_search_trace_is_correct_and_its_verdicts_true(n_cards, target):
    """Each `[state] yes/no` is the solver's truth for that state, exactly one yes per level ends
    it, and the answer scores correct: a trace never teaches a wrong verdict."""
    task = GeneralPoints(GeneralPointsConfig(n_cards=n_cards, target=target, demonstration="trace"))
    for problem in task.sample("train", 150, seed=1) + task.sample("ood", 50, seed=1):
        trace = task.demonstration(problem)
        assert task.score(problem, trace).correct, trace
        lines = trace.splitlines()
        assert lines[0].split() == [str(v) for v in sorted(problem.data["values"], reverse=True)]
        verdicts = [line for line in lines if line.endswith((" yes", " no"))]
        assert sum(line.endswith(" yes") for line in verdicts) == n_cards - 2
        for line in verdicts:
            state, verdict = line[line.index("[") + 1 : line.index("]")], line.rsplit(" ", 1)[1]
            values = [Fraction(v) for v in state.split()]
            assert solvable(values, target) == (verdict == "yes"), line


def test_random_id_faces_state_a_fresh_rule_per_problem_and_keep_the_splits():
    task = GeneralPoints(GeneralPointsConfig(target=10, random_id_faces=True))
    train, test = task.sample("train", 300, seed=0), task.sample("test", 100, seed=0)
    rules = {tuple(p.data["face_values"]) for p in train}
    assert len(rules) > 100 and (11, 12, 13) not in rules
    for p in train + test:
        faces = p.data["face_values"]
        assert f"J={faces[0]} Q={faces[1]} K={faces[2]}." in p.prompt
        names = dict(zip(("J", "Q", "K"), faces, strict=True)) | {"A": 1}
        assert p.data["values"] == [names.get(c) or int(c) for c in p.data["cards"]]
        assert task.score(p, task.demonstration(p)).correct
    key = lambda p: tuple(sorted(p.data["values"]))  # noqa: E731
    assert not {key(p) for p in train} & {key(p) for p in test}
    ood = task.sample("ood", 50, seed=0)
    assert all(p.data["face_values"] == [11, 12, 13] for p in ood)
    assert ood == GeneralPoints(GeneralPointsConfig(target=10)).sample("ood", 50, seed=0)


def test_a_face_card_valued_by_another_rule_is_wrong_face_value():
    """The OOD failure the rule shift is about: K written as 10 (the ID rule) under K=13."""
    ood = hand(["K", "2", "Q", "A"], (11, 12, 13), "ood")  # 13 2 12 1
    assert TASK.score(ood, "Answer: 13*2-12/1").details["reason"] == "wrong_value"
    assert TASK.score(ood, "Answer: 10*2+10/1").details["reason"] == "wrong_face_value"
    assert TASK.score(ood, "Answer: 10*3+10/1").details["reason"] == "wrong_cards"
    no_faces = hand(["3", "8", "10", "A"], (10, 10, 10))
    assert TASK.score(no_faces, "Answer: (13-1)*8/3").details["reason"] == "wrong_cards"


# ---- exact cases, folded in from test_general_points_config_exact.py ---------------------------
# Exact bounds of `GeneralPointsConfig`: each limit accepted at its edge and refused one past it,
# with the whole message. Written against the mutants mutmut left alive (TESTING.md).


@pytest.mark.parametrize(
    "options, message",
    [
        ({"n_cards": 1}, "n_cards must be 2, 3 or 4"),
        ({"n_cards": 5}, "n_cards must be 2, 3 or 4"),
        ({"target": 0}, "target must be a positive integer"),
        ({"max_rank": 0}, "max_rank must be in 1..13"),
        ({"max_rank": 14}, "max_rank must be in 1..13"),
        ({"face_values_id": (10, 10)}, "face_values_id must be three positive values for J, Q, K"),
        ({"face_values_ood": (1, 0, 1)}, "face_values_ood must be three positive values for J, Q, K"),
        ({"test_fraction": 0.0}, "test_fraction must be in (0, 1)"),
        ({"test_fraction": 1.0}, "test_fraction must be in (0, 1)"),
        ({"test_fraction": 1.5}, "test_fraction must be in (0, 1)"),
    ],
)
def test_refused_past_each_limit(options, message):
    with pytest.raises(ValueError) as err:
        GeneralPointsConfig(**options)
    assert str(err.value) == message


def test_accepted_at_each_edge():
    c = GeneralPointsConfig(
        n_cards=2,
        target=1,
        max_rank=1,
        face_values_id=[1, 1, 1],
        face_values_ood=(1, 2, 3),
        test_fraction=0.99,
    )
    assert (c.n_cards, c.target, c.max_rank) == (2, 1, 1)
    assert c.face_values_id == (1, 1, 1) and isinstance(c.face_values_id, tuple)
    assert c.face_values_ood == (1, 2, 3)
    assert GeneralPointsConfig(n_cards=4, max_rank=13, face_values_ood=[2, 2, 2]).face_values_ood == (2, 2, 2)


def test_each_failure_score_keeps_the_answer_read():
    from temper.tasks.base import Score
    from temper.tasks.general_points import GeneralPoints

    task = GeneralPoints()
    (p,) = task.sample("test", 1, 0)
    values, target = p.data["values"], p.data["target"]
    assert task.score(p, "Answer: 1+2=x") == Score(
        0.0, False, False, {"reason": "syntax_error", "answer": "1+2=x"}
    )
    assert task.score(p, "Answer: (1") == Score(0.0, False, False, {"reason": "syntax_error", "answer": "(1"})
    assert task.score(p, "Answer: 1/0") == Score(
        0.0, False, True, {"reason": "division_by_zero", "answer": "1/0"}
    )
    wrong = "+".join(["1"] * (len(values) + 1))
    assert task.score(p, f"Answer: {wrong}") == Score(
        0.0, False, True, {"answer": wrong, "value": str(len(values) + 1), "reason": "wrong_cards"}
    )
    summed = "+".join(map(str, values))
    assert sum(values) != target  # (the hand of seed 0: 10 9 3 5, target 24)
    assert task.score(p, f"Answer: {summed}") == Score(
        0.0, False, True, {"answer": summed, "value": str(sum(values)), "reason": "wrong_value"}
    )
